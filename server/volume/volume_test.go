package volume_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/volume"
)

// testRoot holds every volume of this test binary, so that the check at the
// end finds any mount or loop device a test left behind.
var testRoot string

func TestMain(m *testing.M) {
	if dir := os.Getenv("VOLUME_CRASH_DIR"); dir != "" {
		crashyWorker(dir, os.Getenv("VOLUME_CRASH_AT"))
		return
	}
	var err error
	if testRoot, err = os.MkdirTemp("", "sandboxd-volume-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The sandbox's mapped root binds a volume by path: it must search here.
	os.Chmod(testRoot, 0o711)
	code := nsjailtest.RunAndCheck(m)
	if left := leftovers(testRoot); len(left) > 0 {
		// Not removed: RemoveAll would delete through a mount.
		fmt.Fprintln(os.Stderr, "LEFTOVERS after the suite:", strings.Join(left, "; "))
		code = 1
	} else {
		os.RemoveAll(testRoot)
	}
	os.Exit(code)
}

// leftovers lists the mounts and loop devices under root.
func leftovers(root string) []string {
	var left []string
	info, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], root) {
			left = append(left, "mount "+f[4])
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, _ := os.ReadFile(f); strings.HasPrefix(string(b), root) {
			left = append(left, "loop device of "+strings.TrimSpace(string(b)))
		}
	}
	return left
}

// crashyWorker runs in a child process: it creates (or removes) the volume
// dir and exits with code 3 at the crash point, like a killed worker.
func crashyWorker(dir, at string) {
	volume.SetCrashPoint(at)
	var err error
	if at == "create" {
		_, err = volume.Create(dir, volume.Options{UID: testUID, GID: testGID, MaxBytes: 8 << 20, MaxFiles: 100})
	} else {
		err = volume.Remove(dir)
	}
	fmt.Fprintln(os.Stderr, "crash point not reached:", err)
	os.Exit(1)
}

// The sandbox user as the host sees it with nsjail's default id base
// (Runner.HostUID; the sandbox tests check they agree).
const (
	testUID = 1<<30 + inside.UID
	testGID = 1<<30 + inside.GID
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes filesystems, loop devices and mounts")
	}
}

// newVolume creates a volume under testRoot, removed when t ends.
func newVolume(t testing.TB, opts volume.Options) *volume.Volume {
	t.Helper()
	requireRoot(t)
	if opts.UID == 0 {
		opts.UID, opts.GID = testUID, testGID
	}
	dir, err := os.MkdirTemp(testRoot, "vol-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	v, err := volume.Create(filepath.Join(dir, "v"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := v.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
		os.Remove(dir)
	})
	return v
}

func usage(t testing.TB, v *volume.Volume) volume.Usage {
	t.Helper()
	u, err := v.Usage()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func put(t testing.TB, v *volume.Volume, p string, data []byte) {
	t.Helper()
	if _, _, err := v.Put(p, bytes.NewReader(data)); err != nil {
		t.Fatalf("Put(%s): %v", p, err)
	}
}

func read(t testing.TB, v *volume.Volume, p string) []byte {
	t.Helper()
	f, _, err := v.OpenFile(p)
	if err != nil {
		t.Fatalf("OpenFile(%s): %v", p, err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// loopsOf counts the loop devices backed by v's image.
func loopsOf(t testing.TB, v *volume.Volume) int {
	t.Helper()
	var img unix.Stat_t
	if err := unix.Stat(filepath.Join(v.Dir(), "volume.img"), &img); err != nil {
		t.Fatal(err)
	}
	n := 0
	devs, _ := filepath.Glob("/sys/block/loop*/loop")
	for _, d := range devs {
		fd, err := unix.Open("/dev/"+filepath.Base(filepath.Dir(d)), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Device == img.Dev && info.Inode == img.Ino {
			n++
		}
	}
	return n
}

// mountsAt counts the mounts on dir in this mount namespace.
func mountsAt(dir string) int {
	info, _ := os.ReadFile("/proc/self/mountinfo")
	n := 0
	for _, line := range strings.Split(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

func fsDev(t testing.TB, v *volume.Volume) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(v.Path(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

func duKiB(t testing.TB, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks / 2
}

func TestCreateMountsAnEmptyVolumeWithExactQuota(t *testing.T) {
	v := newVolume(t, volume.Options{})
	if got := usage(t, v); got != (volume.Usage{MaxBytes: volume.DefaultMaxBytes, MaxFiles: volume.DefaultMaxFiles}) {
		t.Fatalf("usage of an empty default volume = %+v", got)
	}
	var fsst unix.Statfs_t
	if err := unix.Statfs(v.Path(), &fsst); err != nil {
		t.Fatal(err)
	}
	if fsst.Type != unix.EXT4_SUPER_MAGIC || int64(fsst.Bavail)*fsst.Bsize != volume.DefaultMaxBytes || fsst.Ffree != volume.DefaultMaxFiles {
		t.Fatalf("statfs: type %x, %d bytes and %d inodes available; want ext4 with exactly %d and %d",
			fsst.Type, int64(fsst.Bavail)*fsst.Bsize, fsst.Ffree, volume.DefaultMaxBytes, volume.DefaultMaxFiles)
	}
	const want = unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC | unix.ST_NOATIME
	if fsst.Flags&want != want {
		t.Fatalf("mount flags %#x, want nosuid, nodev, noexec, noatime", fsst.Flags)
	}
	var root unix.Stat_t
	if err := unix.Stat(v.Path(), &root); err != nil {
		t.Fatal(err)
	}
	if root.Uid != testUID || root.Gid != testGID || root.Mode&0o7777 != 0o700 {
		t.Fatalf("volume root %d:%d %o, want %d:%d 0700", root.Uid, root.Gid, root.Mode&0o7777, testUID, testGID)
	}
	img := filepath.Join(v.Dir(), "volume.img")
	if kib := duKiB(t, img); kib > 1024 {
		t.Errorf("empty image uses %d KiB of host disk, want it sparse", kib)
	}
	t.Logf("empty %d MiB / %d-file volume: image %d KiB on disk", volume.DefaultMaxBytes>>20, volume.DefaultMaxFiles, duKiB(t, img))
	if loopsOf(t, v) != 1 || mountsAt(v.Path()) != 1 {
		t.Fatalf("%d loop devices, %d mounts; want 1 and 1", loopsOf(t, v), mountsAt(v.Path()))
	}
	// Direct I/O: the image's pages are not cached a second time.
	sys := fmt.Sprintf("/sys/dev/block/%d:%d/loop/", unix.Major(fsDev(t, v)), unix.Minor(fsDev(t, v)))
	for file, want := range map[string]string{"dio": "1", "autoclear": "1"} {
		if b, err := os.ReadFile(sys + file); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s%s = %q, %v; want %s", sys, file, b, err, want)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(v.Dir()))
	if len(entries) != 1 {
		t.Fatalf("parent holds %v, want the volume only (no temporary leftovers)", entries)
	}
	if _, err := volume.Create(v.Dir(), volume.Options{UID: testUID, GID: testGID}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create over an existing volume: %v, want fs.ErrExist", err)
	}
}

// Whatever the quota, an empty volume offers exactly it: the ballast takes
// up what mke2fs rounds up and what ext4 keeps for itself.
func TestQuotaIsExactForAnyGeometry(t *testing.T) {
	for _, c := range []struct{ bytes, files int64 }{
		{volume.MinBytes, volume.MinFiles},
		{volume.MinBytes + 1, 1000},
		{volume.MinBytes, 100_000},
		{3 << 30, volume.MinFiles},
		{64 << 20, 33_333},
	} {
		t.Run(fmt.Sprintf("%d_bytes_%d_files", c.bytes, c.files), func(t *testing.T) {
			v := newVolume(t, volume.Options{MaxBytes: c.bytes, MaxFiles: c.files})
			wantBytes := (c.bytes + 4095) / 4096 * 4096
			if got := usage(t, v); got != (volume.Usage{MaxBytes: wantBytes, MaxFiles: c.files}) {
				t.Fatalf("usage %+v, want 0/0 of %d/%d", got, wantBytes, c.files)
			}
		})
	}
}

func TestCreateRefusesBadOptions(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(testRoot, "bad")
	for name, o := range map[string]volume.Options{
		"root owner":     {UID: 0, GID: 0},
		"tiny":           {MaxBytes: 4096, UID: testUID, GID: testGID},
		"too many files": {MaxFiles: volume.MaxFilesLimit + 1, UID: testUID, GID: testGID},
		"negative":       {MaxBytes: -1, UID: testUID, GID: testGID},
	} {
		if _, err := volume.Create(dir, o); err == nil {
			t.Errorf("%s: Create succeeded", name)
		}
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refused Creates left %s: %v", dir, err)
	}
	if _, err := volume.Create("relative/dir", volume.Options{UID: testUID, GID: testGID}); err == nil {
		t.Fatal("Create with a relative dir succeeded")
	}
}

// A worker restart: Close (or the worker's death) leaves the image; Open
// mounts it again, or reuses a mount that is still there.
func TestCloseAndOpenKeepTheFiles(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 16 << 20, MaxFiles: 100})
	put(t, v, "data/a.csv", []byte("a,b\n1,2\n"))
	before := usage(t, v)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if mountsAt(v.Path()) != 0 || loopsOf(t, v) != 0 {
		t.Fatalf("after Close: %d mounts, %d loop devices", mountsAt(v.Path()), loopsOf(t, v))
	}
	if _, err := v.Usage(); !errors.Is(err, volume.ErrNotMounted) {
		t.Fatalf("Usage of a closed volume: %v, want ErrNotMounted", err)
	}
	if _, _, err := v.OpenFile("data/a.csv"); !errors.Is(err, volume.ErrNotMounted) {
		t.Fatalf("OpenFile on a closed volume: %v, want ErrNotMounted", err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	v2, err := volume.Open(v.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, v2, "data/a.csv"); string(got) != "a,b\n1,2\n" {
		t.Fatalf("after reopening: %q", got)
	}
	if got := usage(t, v2); got != before {
		t.Fatalf("usage after reopening %+v, before %+v", got, before)
	}
	// Still mounted (a worker that restarted without Close): reused.
	v3, err := volume.Open(v.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if mountsAt(v3.Path()) != 1 || loopsOf(t, v3) != 1 {
		t.Fatalf("Open of a mounted volume: %d mounts, %d loop devices, want 1 and 1", mountsAt(v3.Path()), loopsOf(t, v3))
	}
	if string(read(t, v3, "data/a.csv")) != "a,b\n1,2\n" {
		t.Fatal("reused mount lost the file")
	}
}

// Two loop devices over one image would be two ext4 drivers writing one
// disk: concurrent Opens must end with exactly one mount.
func TestConcurrentOpensMountOnce(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 100})
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := volume.Open(v.Dir())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if mountsAt(v.Path()) != 1 || loopsOf(t, v) != 1 {
		t.Fatalf("%d mounts, %d loop devices, want 1 and 1", mountsAt(v.Path()), loopsOf(t, v))
	}
}

func TestOpenRefusesWhatIsNotAVolume(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if _, err := volume.Open(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open of an empty dir: %v, want fs.ErrNotExist", err)
	}
	if _, err := volume.Open(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open of a missing dir: %v, want fs.ErrNotExist", err)
	}
}

func TestRemoveDeletesEverything(t *testing.T) {
	requireRoot(t)
	parent, err := os.MkdirTemp(testRoot, "rm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(parent)
	v, err := volume.Create(filepath.Join(parent, "v"), volume.Options{UID: testUID, GID: testGID, MaxBytes: 8 << 20, MaxFiles: 100})
	if err != nil {
		t.Fatal(err)
	}
	put(t, v, "x", []byte("x"))
	if err := v.Remove(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Fatalf("after Remove the parent holds %v", entries)
	}
	if left := leftovers(parent); len(left) > 0 {
		t.Fatalf("after Remove: %v", left)
	}
	if err := v.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close after Remove: %v", err)
	}
	if _, err := volume.Open(v.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after Remove: %v, want fs.ErrNotExist", err)
	}
}

// A worker killed in the middle of Create or Remove leaves a leftover that
// Open does not take for a volume and Sweep removes, mount and all.
func TestInterruptedCreateAndRemoveAreSwept(t *testing.T) {
	requireRoot(t)
	root, err := os.MkdirTemp(testRoot, "sweep-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(root)
	crash := func(dir, at string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "VOLUME_CRASH_DIR="+dir, "VOLUME_CRASH_AT="+at)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("crashing %s: %v: %s", at, err, out)
		}
	}
	keep, err := volume.Create(filepath.Join(root, "keep"), volume.Options{UID: testUID, GID: testGID, MaxBytes: 8 << 20, MaxFiles: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Remove()
	put(t, keep, "f", []byte("kept"))

	crash(filepath.Join(root, "born"), "create")
	if _, err := volume.Open(filepath.Join(root, "born")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after a crashed Create: %v, want fs.ErrNotExist", err)
	}
	dying, err := volume.Create(filepath.Join(root, "dying"), volume.Options{UID: testUID, GID: testGID, MaxBytes: 8 << 20, MaxFiles: 100})
	if err != nil {
		t.Fatal(err)
	}
	crash(dying.Dir(), "remove")
	if _, err := volume.Open(dying.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after a crashed Remove: %v, want fs.ErrNotExist", err)
	}
	crashed := 0
	for _, l := range leftovers(root) {
		if strings.HasPrefix(l, "mount ") && (strings.Contains(l, "/.creating-born-") || strings.Contains(l, "/.removing-dying-")) {
			crashed++
		}
	}
	if crashed != 2 {
		t.Fatalf("want the crashed Create's and Remove's mounts left before the sweep, got %v", leftovers(root))
	}

	names, err := volume.Sweep(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "keep" {
		t.Fatalf("Sweep = %v, want [keep]", names)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 1 || entries[0].Name() != "keep" {
		t.Fatalf("after Sweep the root holds %v, want keep only", entries)
	}
	for _, l := range leftovers(root) {
		if !strings.Contains(l, "/keep/") {
			t.Fatalf("after Sweep: %v, want keep's mount and loop device only", leftovers(root))
		}
	}
	if string(read(t, keep, "f")) != "kept" {
		t.Fatal("Sweep touched a complete volume")
	}
}

// Close while something still uses the volume (a sandbox's bind, or here an
// open file) unmounts it lazily: the filesystem and its loop device live
// on. Open must then refuse rather than attach the image a second time, and
// succeed once the last user is gone.
func TestOpenRefusesAnImageStillInUse(t *testing.T) {
	v := newVolume(t, volume.Options{MaxBytes: 8 << 20, MaxFiles: 100})
	put(t, v, "f", []byte("f"))
	f, _, err := v.OpenFile("f")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	_, err = volume.Open(v.Dir())
	if err == nil || loopsOf(t, v) != 1 {
		f.Close()
		t.Fatalf("Open of an image still attached: %v, %d loop devices; want an error and 1", err, loopsOf(t, v))
	}
	f.Close()
	// The last user gone, the loop device detaches itself (autoclear).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err = volume.Open(v.Dir()); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Open after the last user left: %v", err)
	}
	if string(read(t, v, "f")) != "f" || loopsOf(t, v) != 1 {
		t.Fatal("reopened volume lost its file or has two loop devices")
	}
}

// MoveParentTo carries a mounted volume, files and mount, with the
// directory that holds it to a new directory; it never replaces what is
// there, and the old path holds nothing after.
func TestMoveParentToKeepsTheMountAndRefusesToReplace(t *testing.T) {
	requireRoot(t)
	parent, err := os.MkdirTemp(testRoot, "mv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(parent)
	os.Chmod(parent, 0o711)
	spare := filepath.Join(parent, "spare")
	if err := os.Mkdir(spare, 0o711); err != nil {
		t.Fatal(err)
	}
	v, err := volume.Create(filepath.Join(spare, "volume"), volume.Options{UID: testUID, GID: testGID, MaxBytes: 8 << 20, MaxFiles: 100})
	if err != nil {
		t.Fatal(err)
	}
	put(t, v, "x", []byte("x"))
	taken := filepath.Join(parent, "taken")
	if err := os.Mkdir(taken, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := v.MoveParentTo(spare, taken); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("MoveParentTo an existing directory: %v, want fs.ErrExist", err)
	}
	os.Remove(taken)
	if _, err := v.MoveParentTo(spare, "relative"); err == nil {
		t.Fatal("MoveParentTo a relative path: no error")
	}
	sub := filepath.Join(parent, "s1")
	defer os.Remove(sub)
	if _, err := v.MoveParentTo(parent, sub); err == nil {
		t.Fatal("MoveParentTo of a directory that does not hold the volume: no error")
	}
	moved, err := v.MoveParentTo(spare, sub)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := moved.Remove(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := os.Lstat(spare); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the old directory after MoveParentTo: %v", err)
	}
	if moved.Dir() != filepath.Join(sub, "volume") {
		t.Fatalf("moved volume's directory: %s", moved.Dir())
	}
	if mountsAt(moved.Path()) != 1 || loopsOf(t, moved) != 1 {
		t.Fatalf("after MoveParentTo: %d mounts, %d loop devices at the new path, want 1 and 1", mountsAt(moved.Path()), loopsOf(t, moved))
	}
	if got := read(t, moved, "x"); string(got) != "x" {
		t.Fatalf("file after MoveParentTo: %q", got)
	}
	if u := usage(t, moved); u.MaxBytes != 8<<20 || u.MaxFiles != 100 {
		t.Fatalf("quota after MoveParentTo: %+v", u)
	}
	// Open finds it at its new place (a restarted worker), reusing the mount.
	again, err := volume.Open(moved.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if mountsAt(again.Path()) != 1 {
		t.Fatalf("Open after MoveParentTo: %d mounts", mountsAt(again.Path()))
	}
}
