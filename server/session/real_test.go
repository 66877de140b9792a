package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Root tests with real volumes (loop-mounted ext4). The kernel is the fake
// here; kernel_test.go runs the real one.

// testRoot holds every real volume of this test binary, so that the check
// at the end finds any mount or loop device a test left behind.
var testRoot string

// The sandbox user as the host sees it (as in server/volume's tests).
const testUID = 1<<30 + inside.UID

func TestMain(m *testing.M) {
	var err error
	if testRoot, err = os.MkdirTemp("", "sandboxd-session-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The sandbox's mapped root binds a volume by path: it must search here.
	os.Chmod(testRoot, 0o755)
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

// leftovers lists the mounts and loop devices under root that are still
// there after a while. Any sandbox being started on the host, by this test
// or by another process, holds a copy of every host mount between its
// unshare and its pivot_root, so an unmounted volume's loop device may
// outlive the unmount for that long; a leak stays.
func leftovers(root string) []string {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left := leftoversNow(root)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}

// holders names the processes whose mount namespace still shows a mount
// whose source or mount point is below root (a failure's diagnosis).
func holders(root string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		info, err := os.ReadFile(d + "/mountinfo")
		if err != nil || !strings.Contains(string(info), root) {
			continue
		}
		comm, _ := os.ReadFile(d + "/comm")
		ns, _ := os.Readlink(d + "/ns/mnt")
		out = append(out, fmt.Sprintf("%s (%s, %s)", filepath.Base(d), strings.TrimSpace(string(comm)), ns))
	}
	return out
}

func leftoversNow(root string) []string {
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

// realEnv is a manager on real volumes under testRoot, with the fake
// kernel (or the starter given).
type realEnv struct {
	t     *testing.T
	root  string
	clock *fakeClock
	cfg   Config
	m     *Manager
}

func newRealEnv(t *testing.T, starter func() Starter) *realEnv {
	t.Helper()
	nsjailtest.RequireRoot(t)
	base, err := os.MkdirTemp(testRoot, "t-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o755)
	// Checked last, after the manager and the starter (a pool) are
	// closed.
	t.Cleanup(func() {
		if left := leftovers(base); len(left) > 0 {
			t.Errorf("left behind: %s; mount namespaces holding it: %s", strings.Join(left, "; "), strings.Join(holders(base), "; "))
		} else {
			os.RemoveAll(base)
		}
	})
	e := &realEnv{t: t, root: filepath.Join(base, "sessions"), clock: newFakeClock()}
	e.cfg = testConfig(e.root, e.clock)
	e.cfg.UID, e.cfg.GID, e.cfg.MaxBytes, e.cfg.MaxFiles = testUID, testUID, 8<<20, 100
	var st Starter = &fakeStarter{}
	if starter != nil {
		st = starter()
	}
	e.open(st)
	t.Cleanup(func() {
		// Close keeps the volumes mounted for the next worker; the test
		// is the last one: unmount what is left.
		e.m.Close()
		entries, _ := os.ReadDir(e.root)
		for _, en := range entries {
			if v, err := volume.Open(filepath.Join(e.root, en.Name(), volumeName)); err == nil {
				v.Close()
			}
		}
	})
	return e
}

func (e *realEnv) open(starter Starter) {
	e.t.Helper()
	m, err := Open(e.cfg, starter, slog.New(slog.NewTextHandler(e.t.Output(), nil)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.m = m
}

func (e *realEnv) put(id, name, data string) {
	e.t.Helper()
	l, err := e.m.Lend(id)
	if err != nil {
		e.t.Fatal(err)
	}
	defer l.Release()
	if _, _, err := l.Volume.Put(name, strings.NewReader(data)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *realEnv) get(id, name string) (string, error) {
	l, err := e.m.Lend(id)
	if err != nil {
		return "", err
	}
	defer l.Release()
	f, _, err := l.Volume.OpenFile(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

func (e *realEnv) exec(id, code string) ExecInfo {
	e.t.Helper()
	r, err := e.m.Begin(id)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.End()
	_, info, err := r.Exec(context.Background(), warmpool.KernelExec{Code: code})
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

func TestRealVolumeCreateRestartDelete(t *testing.T) {
	e := newRealEnv(t, nil)
	info, err := e.m.Create(Spec{ID: "s1", Policy: "default", Kernel: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Workspace.MaxBytes != 8<<20 || info.Workspace.MaxFiles != 100 || info.Workspace.BytesUsed != 0 {
		t.Fatalf("workspace %+v", info.Workspace)
	}
	e.put("s1", "data.csv", "a,b\n1,2\n")
	if info, _ := e.m.Get("s1"); info.Workspace.BytesUsed == 0 || info.Workspace.FilesUsed != 1 {
		t.Fatalf("workspace after a put: %+v", info.Workspace)
	}
	if x := e.exec("s1", ""); x.State != StateNew || x.Reason != ReasonFirst {
		t.Fatalf("%+v", x)
	}
	for _, p := range []string{e.root, filepath.Join(e.root, "s1")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		// The sandbox's mapped root binds the volume by path.
		if fi.Mode().Perm()&0o001 == 0 {
			t.Fatalf("%s is %o: the sandbox cannot reach its volume", p, fi.Mode().Perm())
		}
	}

	// A restarted worker finds the session, its files, and says the
	// kernel's state is gone.
	e.m.Close()
	e.open(&fakeStarter{})
	if got, err := e.get("s1", "data.csv"); err != nil || got != "a,b\n1,2\n" {
		t.Fatalf("file after a restart: %q, %v", got, err)
	}
	if x := e.exec("s1", ""); x.State != StateRestarted || x.Reason != ReasonWorkerRestart || x.KernelGeneration != 2 {
		t.Fatalf("%+v", x)
	}

	if err := e.m.Delete("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "s1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("session directory after Delete: %v", err)
	}
	if left := leftovers(e.root); len(left) > 0 {
		t.Fatalf("Delete left %s", strings.Join(left, "; "))
	}
}

func TestRealRetentionRemovesTheVolume(t *testing.T) {
	e := newRealEnv(t, nil)
	for _, id := range []string{"old", "new"} {
		if _, err := e.m.Create(Spec{ID: id, Policy: "default", Kernel: true}); err != nil {
			t.Fatal(err)
		}
		e.put(id, "f", id)
		e.exec(id, "")
		e.clock.Add(time.Hour)
	}
	e.clock.Add(e.cfg.Retention - 2*time.Hour) // old: exactly the retention; new: an hour less
	e.m.Tidy()
	if _, err := e.m.Get("old"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired session: %v", err)
	}
	if left := leftovers(filepath.Join(e.root, "old")); len(left) > 0 {
		t.Fatalf("expiry left %s", strings.Join(left, "; "))
	}
	if _, err := os.Lstat(filepath.Join(e.root, "old")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expired session's directory: %v", err)
	}
	if got, err := e.get("new", "f"); err != nil || got != "new" {
		t.Fatalf("the other session's file: %q, %v", got, err)
	}
}

// A worker killed between the volume and the record leaves a session
// directory with a complete, mounted volume and no session.json: the next
// Open removes it, mount and loop device included.
func TestRealHalfCreatedSessionIsSwept(t *testing.T) {
	e := newRealEnv(t, nil)
	e.m.Close()
	half := filepath.Join(e.root, "half")
	if err := os.Mkdir(half, 0o711); err != nil {
		t.Fatal(err)
	}
	if _, err := volume.Create(filepath.Join(half, volumeName), volume.Options{UID: testUID, GID: testUID, MaxBytes: 8 << 20, MaxFiles: 100}); err != nil {
		t.Fatal(err)
	}
	e.open(&fakeStarter{})
	if _, err := os.Lstat(half); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("half-created session after Open: %v", err)
	}
	if left := leftovers(half); len(left) > 0 {
		t.Fatalf("the sweep left %s", strings.Join(left, "; "))
	}
	// The id is free.
	if _, err := e.m.Create(Spec{ID: "half", Policy: "default"}); err != nil {
		t.Fatal(err)
	}
}
