package volume_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/server/volume"
)

func TestPutOpenListDelete(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 16 << 20, MaxFiles: 100})
	data := []byte("id,value\n1,2\n")
	size, sum, err := v.Put("data/in.csv", bytes.NewReader(data))
	want := sha256.Sum256(data)
	if err != nil || size != int64(len(data)) || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("Put = %d, %s, %v", size, sum, err)
	}
	f, fi, err := v.OpenFile("data/in.csv")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != int64(len(data)) || !fi.Mode().IsRegular() {
		t.Fatalf("FileInfo %v %d", fi.Mode(), fi.Size())
	}
	if etag, err := volume.SHA256(f); err != nil || etag != sum {
		t.Fatalf("SHA256 = %s, %v; want %s", etag, err, sum)
	}
	if got, _ := io.ReadAll(f); !bytes.Equal(got, data) {
		t.Fatalf("read %q after SHA256: the offset moved", got)
	}
	f.Close()
	// What Put makes belongs to the sandbox user.
	for p, mode := range map[string]uint32{"data": unix.S_IFDIR | 0o755, "data/in.csv": unix.S_IFREG | 0o644} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(v.Path(), p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != testUID || st.Gid != testGID || st.Mode != mode {
			t.Fatalf("%s: %d:%d %o, want %d:%d %o", p, st.Uid, st.Gid, st.Mode, testUID, testGID, mode)
		}
	}
	// Replacing.
	put(t, v, "data/in.csv", []byte("new"))
	if got := read(t, v, "data/in.csv"); string(got) != "new" {
		t.Fatalf("after replacing: %q", got)
	}
	put(t, v, "a.txt", nil)
	put(t, v, "data/sub/report.csv", []byte("r"))
	put(t, v, "data/rest.txt", []byte("rest"))
	names := func(prefix string, limit int) (out []string, truncated bool) {
		entries, truncated, err := v.List(prefix, limit)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		for _, e := range entries {
			out = append(out, e.Name)
		}
		return out, truncated
	}
	for prefix, want := range map[string]string{
		"":          "a.txt data/in.csv data/rest.txt data/sub/report.csv",
		"data/":     "data/in.csv data/rest.txt data/sub/report.csv",
		"data/re":   "data/rest.txt",
		"data/sub":  "data/sub/report.csv",
		"nothing/":  "",
		"a.txt/":    "",
		"a.txt/x":   "",
		"data/in.c": "data/in.csv",
	} {
		if got, _ := names(prefix, 100); strings.Join(got, " ") != want {
			t.Errorf("List(%q) = %v, want %s", prefix, got, want)
		}
	}
	if got, truncated := names("", 2); len(got) != 2 || !truncated {
		t.Errorf("List with limit 2 = %v, truncated %v", got, truncated)
	}
	entries, _, _ := v.List("data/rest.txt", 10)
	if len(entries) != 1 || entries[0].Size != 4 || time.Since(entries[0].ModTime) > time.Hour {
		t.Errorf("entry %+v", entries)
	}
	if _, _, err := v.List("../", 10); !errors.Is(err, volume.ErrBadPath) {
		t.Errorf("List(../): %v, want ErrBadPath", err)
	}

	if err := v.Delete("data/sub"); !errors.Is(err, volume.ErrNotEmpty) {
		t.Fatalf("Delete of a non-empty directory: %v, want ErrNotEmpty", err)
	}
	for _, p := range []string{"data/sub/report.csv", "data/sub"} {
		if err := v.Delete(p); err != nil {
			t.Fatalf("Delete(%s): %v", p, err)
		}
	}
	if err := v.Delete("data/sub"); !errors.Is(err, volume.ErrNotFound) {
		t.Fatalf("second Delete: %v, want ErrNotFound", err)
	}
	if _, _, err := v.OpenFile("data/missing"); !errors.Is(err, volume.ErrNotFound) {
		t.Fatalf("OpenFile of a missing file: %v, want ErrNotFound", err)
	}
	if _, _, err := v.Put("a.txt/x", strings.NewReader("x")); !errors.Is(err, volume.ErrNotRegular) {
		t.Fatalf("Put under a file: %v, want ErrNotRegular", err)
	}
	if _, _, err := v.Put("data", strings.NewReader("x")); !errors.Is(err, volume.ErrNotRegular) {
		t.Fatalf("Put over a directory: %v, want ErrNotRegular", err)
	}
}

// endless is an upload bigger than any quota.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(e.n + int64(i))
	}
	e.n += int64(len(p))
	return len(p), nil
}

// SECURITY.md case 37, at the API: an upload over the quota is ErrQuota
// and leaves the volume as it was: no partial file, no temporary file, no
// directory it made, the same usage.
func TestPutOverQuotaChangesNothing(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 4 << 20, MaxFiles: 20})
	put(t, v, "keep.bin", make([]byte, 1<<20))
	before := usage(t, v)
	if _, _, err := v.Put("big.bin", &endless{}); !errors.Is(err, volume.ErrQuota) {
		t.Fatalf("Put of an endless upload: %v, want ErrQuota", err)
	}
	if _, _, err := v.Put("new/dir/big.bin", io.LimitReader(&endless{}, 5<<20)); !errors.Is(err, volume.ErrQuota) {
		t.Fatalf("Put of 5 MiB into 4: %v, want ErrQuota", err)
	}
	if got := usage(t, v); got != before {
		t.Fatalf("usage after refused uploads %+v, before %+v", got, before)
	}
	entries, _ := os.ReadDir(v.Path())
	if len(entries) != 2 { // keep.bin and lost+found
		t.Fatalf("volume root holds %v after refused uploads", entries)
	}
	// Files: 20 inodes, one used; the 20th file is the last.
	for i := 2; i <= 20; i++ {
		put(t, v, "f"+string(rune('a'+i)), nil)
	}
	before = usage(t, v)
	if before.Files != 20 {
		t.Fatalf("files used %d, want 20", before.Files)
	}
	if _, _, err := v.Put("one-more", strings.NewReader("")); !errors.Is(err, volume.ErrQuota) {
		t.Fatalf("Put of file 21 of 20: %v, want ErrQuota", err)
	}
	v.Delete("fc")
	v.Delete("fd")
	before = usage(t, v)
	// Two inodes free: the directories fit, the file does not; both go.
	if _, _, err := v.Put("d1/d2/x", strings.NewReader("x")); !errors.Is(err, volume.ErrQuota) {
		t.Fatalf("Put needing 3 inodes of 2: %v, want ErrQuota", err)
	}
	if got := usage(t, v); got != before {
		t.Fatalf("usage after a refused Put that made directories %+v, before %+v", got, before)
	}
	if _, err := os.Lstat(filepath.Join(v.Path(), "d1")); !os.IsNotExist(err) {
		t.Fatalf("the refused Put left d1: %v", err)
	}
}

// hostileVolume holds every kind of entry the code in a sandbox (or a race)
// could leave where the API expects a file. Made as root here; the sandbox
// makes the same ones (devices only through mknod as root, which the
// sandbox cannot do, but an image is never trusted further than needed).
func hostileVolume(t *testing.T) *volume.Volume {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 100})
	put(t, v, "real.txt", []byte("real"))
	put(t, v, "dir/inside.txt", []byte("inside"))
	root := v.Path()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var host unix.Stat_t
	must(unix.Stat("/", &host))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "passwd")))
	must(os.Symlink("/etc", filepath.Join(root, "etc")))
	must(os.Symlink("real.txt", filepath.Join(root, "inner-link")))
	must(os.Symlink("dir", filepath.Join(root, "dir-link")))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o666))
	must(unix.Mknod(filepath.Join(root, "sock"), unix.S_IFSOCK|0o666, 0))
	must(unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Mknod(filepath.Join(root, "disk"), unix.S_IFBLK|0o666, int(host.Dev)))
	must(os.Mkdir(filepath.Join(root, "rootdir"), 0o755))
	must(os.WriteFile(filepath.Join(root, "rootdir/secret"), []byte("root's"), 0o644))
	must(os.WriteFile(filepath.Join(root, "rootfile"), []byte("root's"), 0o644))
	return v
}

// guard fails the test if op blocks: a FIFO opened without O_NONBLOCK
// waits for a writer forever.
func guard(t *testing.T, what string, op func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s blocked", what)
		return nil
	}
}

// SECURITY.md case 38: links, FIFOs, sockets, devices, traversal and huge
// names are refused with a typed error, without blocking, and nothing
// outside the volume is read or written.
func TestHostilePathsAreRefused(t *testing.T) {
	v := hostileVolume(t)
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	notRegular, notFound, badPath, tooLong := volume.ErrNotRegular, volume.ErrNotFound, volume.ErrBadPath, volume.ErrNameTooLong
	for p, want := range map[string]error{
		"passwd":                      notRegular, // symlink to a host file
		"etc/passwd":                  notRegular, // symlinked directory component
		"etc/x":                       notRegular,
		"inner-link":                  notRegular, // even to a file inside
		"dir-link/inside.txt":         notRegular,
		"fifo":                        notRegular,
		"sock":                        notRegular,
		"null":                        notRegular,
		"disk":                        notRegular, // the host's root disk
		"dir":                         notRegular,
		"real.txt/x":                  notRegular,
		"lost+found/sandboxd-ballast": notFound, // root's: the quota's ballast
		"rootdir/secret":              notFound,
		"rootfile":                    notFound,
		"../x":                        badPath,
		"dir/../real.txt":             badPath,
		"/etc/passwd":                 badPath,
		"":                            badPath,
		"a\x00b":                      badPath,
		strings.Repeat("n", 4096):     tooLong,
		strings.Repeat("n", 256):      tooLong,
	} {
		name := p
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		err := guard(t, "OpenFile("+name+")", func() error {
			f, _, err := v.OpenFile(p)
			if err == nil {
				f.Close()
			}
			return err
		})
		if !errors.Is(err, want) {
			t.Errorf("OpenFile(%q) = %v, want %v", name, err, want)
		}
		err = guard(t, "Put("+name+")", func() error {
			_, _, err := v.Put(p, strings.NewReader("overwritten"))
			return err
		})
		if p == "dir" || strings.HasPrefix(p, "real.txt/") {
			want = notRegular
		}
		if !errors.Is(err, want) {
			t.Errorf("Put(%q) = %v, want %v", name, err, want)
		}
		if p == "dir" {
			continue // an empty directory may be deleted: not this one
		}
		err = guard(t, "Delete("+name+")", func() error { return v.Delete(p) })
		if !errors.Is(err, want) {
			t.Errorf("Delete(%q) = %v, want %v", name, err, want)
		}
	}
	if got, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(got, passwd) {
		t.Fatal("/etc/passwd changed")
	}
	if _, err := os.Lstat("/etc/x"); !os.IsNotExist(err) {
		t.Fatal("/etc/x was created through the symlinked directory")
	}
	// Every hostile entry is still there (refused, not removed), and the
	// listing shows only the regular files the sandbox user owns.
	for _, name := range []string{"passwd", "etc", "fifo", "sock", "null", "disk", "rootfile"} {
		if _, err := os.Lstat(filepath.Join(v.Path(), name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	entries, _, err := v.List("", 100)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	if strings.Join(names, " ") != "dir/inside.txt real.txt" {
		t.Fatalf("List = %v, want dir/inside.txt real.txt", names)
	}
}

// A FIFO swapped in between the type check and the open: the open must not
// wait for a writer. Forced here by replacing the file in a loop.
func TestFIFOSwapDoesNotBlock(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 100})
	p := filepath.Join(v.Path(), "x")
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			os.Remove(p)
			unix.Mkfifo(p, 0o666)
			os.Remove(p)
			os.WriteFile(p, []byte("x"), 0o644)
			os.Chown(p, testUID, testGID)
		}
	}()
	defer func() { stop.Store(true); <-done }()
	for range 2000 {
		err := guard(t, "OpenFile during FIFO swaps", func() error {
			f, _, err := v.OpenFile("x")
			if err == nil {
				f.Close()
			}
			return err
		})
		if err != nil && !errors.Is(err, volume.ErrNotRegular) && !errors.Is(err, volume.ErrNotFound) {
			t.Fatalf("OpenFile: %v", err)
		}
	}
}

// CVE-2018-15664-style race: the code swaps a directory for a symlink to a
// host directory while the API writes into it. Nothing may land outside.
func TestSymlinkSwapRaceStaysInside(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 1000})
	// Owned by the sandbox user, like another session's volume: only not
	// following the link keeps the API out of it.
	outside := t.TempDir()
	if err := os.Chown(outside, testUID, testGID); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(v.Path(), "d")
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			os.RemoveAll(d)
			os.Mkdir(d, 0o755)
			os.Chown(d, testUID, testGID)
			os.RemoveAll(d)
			os.Symlink(outside, d)
		}
	}()
	for range 2000 {
		v.Put("d/x", strings.NewReader("escaped"))
		if f, _, err := v.OpenFile("d/x"); err == nil {
			f.Close()
		}
		v.Delete("d/x")
	}
	stop.Store(true)
	<-done
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Fatalf("the API wrote outside the volume: %v", entries)
	}
}

// A host crash leaves a journal-less ext4 "not clean", possibly with
// metadata the kernel never wrote back. Open must repair it (e2fsck -p)
// before mounting: here an inode bitmap that says a used inode is free,
// which a plain mount would hand out again, clobbering the file.
func TestOpenRepairsAnUncleanImage(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 100})
	put(t, v, "precious.csv", []byte("precious"))
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(v.Path(), "precious.csv"), &st); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(v.Dir(), "volume.img")
	cmds := "freei <" + itoa(st.Ino) + ">\nssv state 0\n"
	debugfs := exec.Command("debugfs", "-w", "-f", "-", img)
	debugfs.Stdin = strings.NewReader(cmds)
	if out, err := debugfs.CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v: %s", err, out)
	}
	v2, err := volume.Open(v.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		put(t, v2, "new"+itoa(uint64(i)), []byte("new"))
	}
	if got := read(t, v2, "precious.csv"); string(got) != "precious" {
		t.Fatalf("precious.csv now reads %q: its inode was handed out again", got)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// List with a limit returns the first files by name, whatever order the
// directory gives them in, and says it left some out.
func TestListLimitIsByName(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 16 << 20, MaxFiles: 100})
	var all []string
	for i := 40; i > 0; i-- { // created last to first, in several directories
		p := fmt.Sprintf("d%d/f%02d", i%3, i)
		put(t, v, p, nil)
		all = append(all, p)
	}
	slices.Sort(all)
	for _, limit := range []int{1, 5, 39} {
		entries, truncated, err := v.List("", limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name)
		}
		if !slices.Equal(got, all[:limit]) || !truncated {
			t.Errorf("List limit %d = %v truncated %v, want %v truncated", limit, got, truncated, all[:limit])
		}
	}
	if entries, truncated, _ := v.List("", 40); len(entries) != 40 || truncated {
		t.Errorf("List of exactly the limit: %d entries, truncated %v", len(entries), truncated)
	}
}
