package workspace

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// artifactNames returns the names a client sees after the JSON round trip:
// the artifacts' and the omitted entries'.
func artifactNames(t *testing.T, arts []Artifact, omitted []Omitted) (names []string, omittedNames map[string]string) {
	t.Helper()
	data, err := json.Marshal(struct {
		A []Artifact `json:"artifacts"`
		O []Omitted  `json:"artifacts_omitted"`
	}{arts, omitted})
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		A []Artifact `json:"artifacts"`
		O []Omitted  `json:"artifacts_omitted"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	omittedNames = map[string]string{}
	for _, a := range back.A {
		names = append(names, a.Name)
	}
	for _, o := range back.O {
		if _, dup := omittedNames[o.Name]; dup {
			t.Errorf("two omitted entries are named %q", o.Name)
		}
		omittedNames[o.Name] = o.Reason
	}
	return names, omittedNames
}

// SECURITY.md case 30: names that are not valid UTF-8 would collapse into
// one name in JSON (each invalid byte becomes U+FFFD); they are omitted with
// their own reason, each under a distinct quoted name, and valid names,
// U+FFFD itself included, are returned as they are.
func TestArtifactNamesNotUTF8AreOmittedDistinctly(t *testing.T) {
	ws := t.TempDir()
	dir := filepath.Join(ws, "output", "artifacts")
	for _, d := range []string{dir, filepath.Join(dir, "d\xff")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"a\xff.txt", "a\xfe.txt", `a\xff.txt`, "a\uFFFD.txt", "d\xff/inner.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	arts, omitted := CollectArtifacts(ws, ArtifactLimits{MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20, MaxCount: 10},
		func(_ int, r io.Reader) (int64, error) { return io.Copy(io.Discard, r) })
	names, omittedNames := artifactNames(t, arts, omitted)
	if want := []string{`a\xff.txt`, "a\uFFFD.txt"}; !slices.Equal(names, want) {
		t.Errorf("artifacts = %q, want %q", names, want)
	}
	want := map[string]string{`a\xfe.txt`: "name_not_utf8", `a\xff.txt`: "name_not_utf8", `d\xff`: "name_not_utf8"}
	if len(omittedNames) != len(want) {
		t.Errorf("omitted = %q, want %q", omittedNames, want)
	}
	for n, r := range want {
		if omittedNames[n] != r {
			t.Errorf("omitted %q: reason %q, want %q (all: %q)", n, omittedNames[n], r, omittedNames)
		}
	}
}

// An artifact the store could not keep (its disk full, say) is omitted as
// not_stored, the worker's failure, not as unreadable, the code's.
func TestArtifactTheStoreCannotKeepIsNotStored(t *testing.T) {
	ws := t.TempDir()
	dir := filepath.Join(ws, "output", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.csv"), []byte("x,y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	full := func(_ int, r io.Reader) (int64, error) { return 0, syscall.ENOSPC }
	arts, omitted := CollectArtifacts(ws, ArtifactLimits{MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20, MaxCount: 10}, full)
	_, reasons := artifactNames(t, arts, omitted)
	if len(arts) != 0 || reasons["a.csv"] != ReasonNotStored {
		t.Fatalf("artifacts %d, omitted %q, want a.csv %s", len(arts), reasons, ReasonNotStored)
	}
}

// A session's workspace outlives its executions: only what the execution
// created or changed is its artifact or result; files it left alone, even
// a same-size rewrite within the same clock tick, are told apart by their
// stamp (inode, size, mtime, ctime).
func TestCollectSinceTakesOnlyWhatChanged(t *testing.T) {
	ws := t.TempDir()
	dir := filepath.Join(ws, "output", "artifacts")
	write := func(name, data string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kept.txt", "old")
	write("rewritten.txt", "old")
	write("replaced.txt", "old")
	write("d/kept.csv", "1,2\n")
	write("touched.txt", "old")
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "old-link")); err != nil {
		t.Fatal(err)
	}
	result := filepath.Join(ws, "output", "result.json")
	os.WriteFile(result, []byte(`{"old":1}`), 0o644)

	snap := TakeSnapshot(ws)
	write("rewritten.txt", "new") // same size, right after the snapshot
	os.Remove(filepath.Join(dir, "replaced.txt"))
	write("replaced.txt", "new")
	write("d/new.png", "png")
	// mtime set back to what it was: the ctime still moves.
	fi, _ := os.Stat(filepath.Join(dir, "touched.txt"))
	os.Chtimes(filepath.Join(dir, "touched.txt"), fi.ModTime(), fi.ModTime())
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "new-link")); err != nil {
		t.Fatal(err)
	}
	lim := ArtifactLimits{MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20, MaxCount: 10}
	keep := func(_ int, r io.Reader) (int64, error) { return io.Copy(io.Discard, r) }
	arts, omitted := CollectArtifactsSince(ws, lim, snap, keep)
	names, reasons := artifactNames(t, arts, omitted)
	if want := []string{"d/new.png", "replaced.txt", "rewritten.txt", "touched.txt"}; !slices.Equal(names, want) {
		t.Errorf("artifacts %q, want %q", names, want)
	}
	if len(reasons) != 1 || reasons["new-link"] != ReasonSymlink {
		t.Errorf("omitted %q, want only the new link", reasons)
	}
	if res, msg := ReadResultSince(ws, 1<<20, snap); res != nil || msg != "output/result.json was not written by this execution" {
		t.Errorf("unchanged result.json: %s %q", res, msg)
	}
	os.WriteFile(result, []byte(`{"new":2}`), 0o644)
	if res, msg := ReadResultSince(ws, 1<<20, snap); string(res) != `{"new":2}` || msg != "" {
		t.Errorf("rewritten result.json: %s %q", res, msg)
	}
	// Without a snapshot (a single-shot execution), everything counts.
	arts, _ = CollectArtifacts(ws, lim, keep)
	if len(arts) != 6 {
		t.Errorf("CollectArtifacts: %d artifacts, want 6", len(arts))
	}
	// A workspace without output/ snapshots as empty: everything after is new.
	empty := t.TempDir()
	snap = TakeSnapshot(empty)
	os.MkdirAll(filepath.Join(empty, "output", "artifacts"), 0o755)
	os.WriteFile(filepath.Join(empty, "output", "artifacts", "a"), []byte("a"), 0o644)
	if arts, _ := CollectArtifactsSince(empty, lim, snap, keep); len(arts) != 1 {
		t.Errorf("after an empty snapshot: %d artifacts, want 1", len(arts))
	}
}

// SECURITY.md case 51: a PNG artifact's width and height come from the
// first 24 bytes the worker copied, never from the code's word and never by
// decoding the image: a lying header gives the size it claims (the client
// decodes, within its own bounds), a bomb is never inflated, a header that
// is not a PNG's or a size the format forbids gives none.
func TestArtifactPNGSize(t *testing.T) {
	ws := t.TempDir()
	dir := filepath.Join(ws, "output", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ihdr := func(w, h uint32) []byte {
		b := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR")
		b = binary.BigEndian.AppendUint32(b, w)
		b = binary.BigEndian.AppendUint32(b, h)
		return append(b, 8, 6, 0, 0, 0, 1, 2, 3, 4) // depth, colour, ..., a CRC nobody checks
	}
	files := map[string][]byte{
		"chart.png":       ihdr(640, 480),
		"bomb.png":        append(ihdr(1<<30, 1<<30), make([]byte, 4096)...),
		"zero.png":        ihdr(0, 480),
		"huge.png":        ihdr(1<<31, 5),
		"short.png":       ihdr(640, 480)[:20],
		"not-a-png.png":   []byte("GIF89a........................"),
		"png-named.csv":   ihdr(3, 4),
		"other-chunk.png": append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDX"), make([]byte, 8)...),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	discard := func(_ int, r io.Reader) (int64, error) { return io.Copy(io.Discard, r) }
	arts, _ := CollectArtifacts(ws, ArtifactLimits{MaxFileBytes: 1 << 20, MaxTotalBytes: 1 << 20, MaxCount: 20}, discard)
	want := map[string][2]int{"chart.png": {640, 480}, "bomb.png": {1 << 30, 1 << 30}, "png-named.csv": {3, 4}}
	if len(arts) != len(files) {
		t.Fatalf("%d artifacts, want %d", len(arts), len(files))
	}
	for _, a := range arts {
		if got := [2]int{a.Width, a.Height}; got != want[a.Name] {
			t.Errorf("%s: %dx%d, want %v", a.Name, a.Width, a.Height, want[a.Name])
		}
	}
}
