package workspace

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// SECURITY.md case 73: the server writes a request straight into a warm
// sandbox's workspace, where a process of that sandbox (before its
// hand-off: a compromised template's fork) could have planted links.
// Write follows none: a layout name already taken fails the write, and a
// link anywhere else is neither written through nor chowned through.
// Runs without root (as root, the chown goes to another uid, which shows
// Lchown did not reach the link's target).
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
	t.Run("taken file name", func(t *testing.T) {
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
