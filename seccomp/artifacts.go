package seccomp

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// Artifacts renders every committed audit file, keyed by its path relative
// to the seccomp/ directory. The output depends only on the profile and on
// libseccomp's version (which the files name), so it is byte-reproducible.
func (p *Profile) Artifacts() (map[string][]byte, error) {
	out := map[string][]byte{}
	md, err := p.Markdown()
	if err != nil {
		return nil, err
	}
	out["SECCOMP.md"] = md
	js, err := p.JSON()
	if err != nil {
		return nil, err
	}
	out["profile.json"] = js
	for _, a := range p.Arches {
		pfc, err := p.PFC(a)
		if err != nil {
			return nil, fmt.Errorf("PFC for %s: %w", a, err)
		}
		out[filepath.Join("pfc", string(a)+".pfc")] = pfc
	}
	return out, nil
}

// CheckArtifacts compares the files under dir with Artifacts and returns
// the relative paths that are missing or differ, plus files in pfc/ that
// the profile no longer produces.
func (p *Profile) CheckArtifacts(dir string) ([]string, error) {
	want, err := p.Artifacts()
	if err != nil {
		return nil, err
	}
	var stale []string
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, data) {
			stale = append(stale, name)
		}
	}
	extra, _ := filepath.Glob(filepath.Join(dir, "pfc", "*.pfc"))
	for _, f := range extra {
		rel, _ := filepath.Rel(dir, f)
		if _, ok := want[rel]; !ok {
			stale = append(stale, rel)
		}
	}
	sort.Strings(stale)
	return stale, nil
}

// WriteArtifacts writes Artifacts under dir, removing stale pfc files.
func (p *Profile) WriteArtifacts(dir string) error {
	files, err := p.Artifacts()
	if err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "pfc", "*.pfc"))
	for _, f := range old {
		rel, _ := filepath.Rel(dir, f)
		if _, ok := files[rel]; !ok {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}
