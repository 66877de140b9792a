package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"golang.org/x/sys/unix"
)

// SECURITY.md case 73: the server writes a request straight into a warm
// sandbox's workspace, where a process of that sandbox (before its
// hand-off: a compromised template's fork) could have planted links.
// Write follows none: a layout name already taken fails the write, and a
// link anywhere else is neither written through nor chowned through.
// Runs without root (as root, the chown goes to another uid, which shows
// the chown did not reach the link's target); TestWriteRacedByRenames
// has the links made while Write runs.
func TestWriteFollowsNoLink(t *testing.T) {
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 54321, 54321
	}
	o := Options{UID: uid, GID: gid}
	req := Request{Code: "print(1)\n", Input: []byte(`{}`), Files: []File{{Path: "a/b.csv", Data: []byte("x,y\n")}}}
	outside := t.TempDir()
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	owner := func() uint32 {
		var st syscall.Stat_t
		if err := syscall.Stat(target, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid
	}
	before := owner()

	for _, name := range inside.LayoutDirs {
		t.Run("layout "+name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			if err := Write(dir, o, req); err == nil {
				t.Fatalf("Write over a link at %s succeeded", name)
			}
			entries, err := os.ReadDir(outside)
			if err != nil || len(entries) != 1 {
				t.Fatalf("the link's target dir now holds %v (%v)", entries, err)
			}
		})
	}
	t.Run("stray link", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(target, filepath.Join(dir, "stray")); err != nil {
			t.Fatal(err)
		}
		if err := Write(dir, o, req); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, inside.InputDir, "a/b.csv")); err != nil || string(b) != "x,y\n" {
			t.Fatalf("the request's file: %q, %v", b, err)
		}
		if b, err := os.ReadFile(target); err != nil || string(b) != "host" || owner() != before {
			t.Fatalf("the link's target changed: %q, owner %d (was %d), %v", b, owner(), before, err)
		}
	})
	t.Run("laid out already", func(t *testing.T) {
		dir := t.TempDir()
		for _, d := range inside.LayoutDirs {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		err := Write(dir, o, req)
		if !errors.Is(err, fs.ErrExist) {
			t.Fatalf("Write into a workspace already laid out: %v, want it to exist already", err)
		}
	})
}

// SECURITY.md case 73, raced: the warm sandbox's process is alive while
// the server writes into the workspace it owns, and swaps the "input"
// directory the server just made with a link to a host directory, again
// and again (renameat2 RENAME_EXCHANGE), while Write runs: Write may fail,
// but never writes or chowns anything outside the workspace (a walk and
// chown by path chowned the link's target within a few dozen attempts),
// and never blocks. As root only: the chown to another uid is what shows.
func TestWriteRacedByRenames(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the chown to another uid is what the test watches")
	}
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Options{UID: 54321, GID: 54321}
	req := Request{Code: "print(1)\n", Input: []byte(`{}`), Files: []File{{Path: "a/b.csv", Data: []byte("x")}}}
	failed := 0
	for i := range 2000 {
		dir := filepath.Join(base, fmt.Sprint("ws-", i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		evil := filepath.Join(dir, "evil")
		if err := os.Symlink(outside, evil); err != nil {
			t.Fatal(err)
		}
		var stop atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			in := filepath.Join(dir, inside.InputDir)
			for !stop.Load() {
				unix.Renameat2(unix.AT_FDCWD, in, unix.AT_FDCWD, evil, unix.RENAME_EXCHANGE)
			}
		}()
		if Write(dir, o, req) != nil {
			failed++
		}
		stop.Store(true)
		<-done
		var st syscall.Stat_t
		if err := syscall.Lstat(outside, &st); err != nil || st.Uid == 54321 {
			t.Fatalf("attempt %d: the host directory the link leads to was chowned (%v)", i, err)
		}
		if err := syscall.Stat(target, &st); err != nil || st.Uid == 54321 {
			t.Fatalf("attempt %d: a host file the link leads to was chowned (%v)", i, err)
		}
		if entries, err := os.ReadDir(outside); err != nil || len(entries) != 1 {
			t.Fatalf("attempt %d: the host directory now holds %v (%v)", i, entries, err)
		}
	}
	t.Logf("Write failed in %d of 2000 raced attempts (refused, as it should when it loses the race)", failed)
}
