package session

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/config"
)

// Open's sweep: the manager's own leftovers go, everything else in
// sessions_dir is left alone and reported (SECURITY.md case 42).
func TestOpenSweepsLeftoversAndLeavesForeignEntriesAlone(t *testing.T) {
	e := newEnv(t, nil)
	keep := e.create(Spec{ID: "keep", Kernel: true}).ID
	e.m.Close()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(e.root, p), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, data string) {
		if err := os.WriteFile(filepath.Join(e.root, p), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Half-created: a volume, no record (and an interrupted record write).
	mk("half/volume/mnt")
	write("half/volume/volume.json", "{}")
	write("half/"+recordTmp+"x", "{")
	// Half-created before the volume: an empty directory.
	mk("empty")
	// Created but not yet synced when the host crashed: the rename of its
	// record reached the disk, the record's data not (writeNewRecord).
	mk("unsynced/volume/mnt")
	write("unsynced/volume/volume.json", "{}")
	write("unsynced/"+recordName, "")
	// A complete session with a half-created volume leftover and an
	// interrupted rewrite of its record.
	mk("keep/.creating-volume-123/mnt")
	write("keep/"+recordTmp+"y", "garbage")
	// Not ours: left alone.
	write("notes.txt", "hello")
	mk("bad name")
	mk(".hidden")
	mk("stranger/data") // no record, but holds what we never make
	if err := os.Symlink("/etc", filepath.Join(e.root, "se-link")); err != nil {
		t.Fatal(err)
	}
	mk("open")
	os.Chmod(filepath.Join(e.root, "open"), 0o777)

	e.reopen()
	for _, gone := range []string{"half", "empty", "unsynced", "keep/.creating-volume-123", "keep/" + recordTmp + "y"} {
		if _, err := os.Lstat(filepath.Join(e.root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Open: %v, want removed", gone, err)
		}
	}
	for _, kept := range []string{"notes.txt", "bad name", ".hidden", "stranger/data", "se-link", "open"} {
		if _, err := os.Lstat(filepath.Join(e.root, kept)); err != nil {
			t.Errorf("%s after Open: %v, want left alone", kept, err)
		}
	}
	if ids := infoIDs(e.m.List()); ids != keep {
		t.Fatalf("sessions after Open: %q", ids)
	}
	// A foreign entry's name stays taken.
	if _, err := e.m.Create(Spec{ID: "stranger", Policy: "p"}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create over a foreign directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "stranger", "data")); err != nil {
		t.Fatalf("a refused Create touched the foreign directory: %v", err)
	}
}

// A session whose record is hostile or whose volume does not open is
// skipped, never deleted: an operator decides.
func TestOpenSkipsSessionsItCannotLoad(t *testing.T) {
	e := newEnv(t, nil)
	for _, id := range []string{"good", "novolume", "badvolume", "unknown", "mismatch", "trailing", "huge", "fifo", "link", "future"} {
		e.create(Spec{ID: id, Kernel: true})
	}
	e.m.Close()
	rec := func(id string) string { return filepath.Join(e.root, id, recordName) }
	valid, err := os.ReadFile(rec("good"))
	if err != nil {
		t.Fatal(err)
	}
	set := func(id, data string) {
		if err := os.WriteFile(rec(id), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.RemoveAll(filepath.Join(e.root, "novolume", volumeName))
	e.disk.failOpen["badvolume"] = true
	set("unknown", strings.Replace(string(valid), `"format"`, `"evil":1,"format"`, 1))
	set("mismatch", strings.Replace(string(valid), `"id":"good"`, `"id":"../good"`, 1))
	set("trailing", string(valid)+"{}")
	set("huge", strings.Replace(string(valid), `"policy":"default"`, `"policy":"`+strings.Repeat("x", maxRecordBytes)+`"`, 1))
	os.Remove(rec("fifo"))
	if err := syscall.Mkfifo(rec("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(rec("link"))
	if err := os.Symlink(rec("good"), rec("link")); err != nil {
		t.Fatal(err)
	}
	// A last use in the future would never expire: it counts from now.
	set("future", strings.Replace(strings.Replace(string(valid), `"id":"good"`, `"id":"future"`, 1), `"last_used_at":"2030`, `"last_used_at":"2999`, 1))

	e.reopen() // must not block on the FIFO
	if ids := infoIDs(e.m.List()); ids != "future,good" {
		t.Fatalf("sessions loaded: %q", ids)
	}
	if info, _ := e.m.Get("future"); !info.LastUsedAt.Equal(e.clock.Now()) {
		t.Fatalf("a future last use loaded as %v", info.LastUsedAt)
	}
	for _, id := range []string{"novolume", "badvolume", "unknown", "mismatch", "trailing", "huge", "fifo", "link"} {
		if _, err := os.Lstat(filepath.Join(e.root, id)); err != nil {
			t.Errorf("skipped session %s was removed: %v", id, err)
		}
		if _, err := e.m.Create(Spec{ID: id, Policy: "p"}); !errors.Is(err, ErrExists) {
			t.Errorf("Create over skipped session %s: %v", id, err)
		}
	}
}

func TestRecordRoundTripAndChecks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s1")
	os.Mkdir(dir, 0o700)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r := record{Format: recordFormat, ID: "s1", Policy: "default", Kernel: true, IdleTimeoutMS: 60000,
		CreatedAt: now, LastUsedAt: now.Add(time.Minute), Generation: 3}
	if err := writeRecord(dir, r); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(dir, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if got != r {
		t.Fatalf("read %+v, wrote %+v", got, r)
	}
	if _, err := readRecord(dir, "s2"); err == nil {
		t.Fatal("a record read under another directory's name was accepted")
	}
	if _, err := readRecord(filepath.Join(t.TempDir()), "x"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing record: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("write left %v", entries)
	}
	for _, bad := range []func(*record){
		func(r *record) { r.Format = 2 },
		func(r *record) { r.Policy = "" },
		func(r *record) { r.Policy = "a\nb" },
		func(r *record) { r.IdleTimeoutMS = 0 },
		func(r *record) { r.CreatedAt = time.Time{} },
		func(r *record) { r.Generation = -1 },
	} {
		b := r
		bad(&b)
		if err := b.check("s1"); err == nil {
			t.Errorf("record %+v accepted", b)
		}
	}
}

func TestRootMustBeTheWorkersOwn(t *testing.T) {
	base := t.TempDir()
	link := filepath.Join(base, "link")
	target := filepath.Join(base, "target")
	os.Mkdir(target, 0o755)
	os.Symlink(target, link)
	if err := prepareRoot(link); err == nil {
		t.Error("a symbolic link as sessions dir was accepted")
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if err := prepareRoot(open); err == nil {
		t.Error("a world-writable sessions dir was accepted")
	}
	if err := prepareRoot("relative"); err == nil {
		t.Error("a relative sessions dir was accepted")
	}
	fresh := filepath.Join(base, "a", "b")
	if err := prepareRoot(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(fresh); fi.Mode().Perm() != 0o755 {
		t.Fatalf("sessions dir made %o, want 755", fi.Mode().Perm())
	}
	tight := filepath.Join(base, "tight")
	os.Mkdir(tight, 0o700)
	if err := prepareRoot(tight); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(tight); fi.Mode().Perm() != 0o755 {
		t.Fatalf("a 0700 sessions dir left %o, want 755 (the sandbox binds volumes by path)", fi.Mode().Perm())
	}
}

// A session's runtime in session.json (SECURITY.md case 57): a record
// written before runtimes existed has none and is on the default runtime;
// one whose name breaks the config's rule (config.RuntimeNameRule) is
// refused: a name that is not a path or an image reference.
func TestUnitRecordRuntime(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s1")
	os.Mkdir(dir, 0o700)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	// As an older worker wrote it: no "runtime" key at all.
	old := `{"format":1,"id":"s1","policy":"dynamic","kernel":true,"idle_timeout_ms":60000,"created_at":"2030-01-01T00:00:00Z","last_used_at":"2030-01-01T00:01:00Z","generation":0}`
	if err := os.WriteFile(filepath.Join(dir, recordName), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readRecord(dir, "s1")
	if err != nil || got.Runtime != "" || got.runtime() != config.DefaultRuntime {
		t.Fatalf("an older record: %+v (runtime %q), %v", got, got.runtime(), err)
	}
	r := record{Format: recordFormat, ID: "s1", Policy: "dynamic", Runtime: "geo", Kernel: true, IdleTimeoutMS: 60000,
		CreatedAt: now, LastUsedAt: now}
	if err := writeRecord(dir, r); err != nil {
		t.Fatal(err)
	}
	if got, err := readRecord(dir, "s1"); err != nil || got != r || got.runtime() != "geo" {
		t.Fatalf("read %+v, wrote %+v: %v", got, r, err)
	}
	for _, bad := range []string{"../geo", "oci-layout:/tmp/x.oci/", "oci-layout:x.oci", "dir:.", "a\nb", "Geo", strings.Repeat("g", 33)} {
		b := r
		b.Runtime = bad
		if err := b.check("s1"); err == nil || !strings.Contains(err.Error(), "runtime must match "+config.RuntimeNameRule) {
			t.Errorf("runtime %q accepted: %v", bad, err)
		}
	}
}
