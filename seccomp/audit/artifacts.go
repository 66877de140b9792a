// Package audit renders sandboxd's seccomp profile (package seccomp, the
// policy the sandboxes run under) into what a security reviewer reads, and
// compares profiles: SECCOMP.md (Markdown), profile.json (Docker/OCI JSON),
// pfc/<arch>.pfc (libseccomp's PFC export), the same two of the template
// profile derived from it (template.json, pfc/template-<arch>.pfc; its
// additions are SECCOMP.md's last section), and a diff of two JSON
// profiles by syscall and architecture. Nothing here runs in the worker's sandbox
// path; tools/seccompgen and `sandboxd seccomp` use it.
package audit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/sandboxd/sandboxd/seccomp"
)

// Artifacts renders every committed audit file of p and of the template
// profile over it (seccomp.TemplateOf), keyed by its path
// relative to the seccomp/ directory. The output depends only on the profile
// and on libseccomp's version (which the files name), so it is
// byte-reproducible.
func Artifacts(p *seccomp.Profile) (map[string][]byte, error) {
	out := map[string][]byte{}
	md, err := Markdown(p)
	if err != nil {
		return nil, err
	}
	out["SECCOMP.md"] = md
	js, err := JSON(p)
	if err != nil {
		return nil, err
	}
	out["profile.json"] = js
	if out["template.json"], err = TemplateJSON(p); err != nil {
		return nil, err
	}
	for _, a := range p.Arches {
		pfc, err := PFC(p, a)
		if err != nil {
			return nil, fmt.Errorf("PFC for %s: %w", a, err)
		}
		out[filepath.Join("pfc", string(a)+".pfc")] = pfc
		if pfc, err = TemplatePFC(p, a); err != nil {
			return nil, fmt.Errorf("template PFC for %s: %w", a, err)
		}
		out[filepath.Join("pfc", "template-"+string(a)+".pfc")] = pfc
	}
	return out, nil
}

// CheckArtifacts compares the files under dir with Artifacts(p) and returns
// the relative paths that are missing or differ, plus files in pfc/ that
// the profile no longer produces.
func CheckArtifacts(p *seccomp.Profile, dir string) ([]string, error) {
	want, err := Artifacts(p)
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

// WriteArtifacts writes Artifacts(p) under dir, removing stale pfc files.
func WriteArtifacts(p *seccomp.Profile, dir string) error {
	files, err := Artifacts(p)
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
