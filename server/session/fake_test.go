package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// The fakes below stand for the kernel and the volume in the unit tests of
// the manager's own logic, which need no root. The root tests
// (real_test.go) use real volumes, and real kernels where k12 is merged.

// fakeKernel runs "code" that says what to do:
//
//	""/anything   succeed
//	"end:R"       the kernel ends during the execution, reason R
//	"block"       wait until the context is cancelled or the kernel ends
type fakeKernel struct {
	started time.Time
	memory  int64
	// running is closed when a "block" execution has started.
	running chan struct{}

	mu         sync.Mutex
	ended      chan struct{}
	reason     string
	closes     int
	execs      int
	interrupts int
	workspace  string
}

func newFakeKernel(workspace string, memory int64) *fakeKernel {
	return &fakeKernel{started: time.Now(), memory: memory, ended: make(chan struct{}), running: make(chan struct{}), workspace: workspace}
}

func (k *fakeKernel) end(reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.ended:
	default:
		k.reason = reason
		close(k.ended)
	}
}

func (k *fakeKernel) Exec(ctx context.Context, e warmpool.KernelExec) (*warmpool.KernelResult, error) {
	if ended(k) {
		return nil, warmpool.ErrKernelEnded
	}
	k.mu.Lock()
	k.execs++
	k.mu.Unlock()
	res := &warmpool.KernelResult{Result: &nsjail.Result{Status: nsjail.StatusSucceeded}}
	switch {
	case strings.HasPrefix(e.Code, "end:"):
		k.end(strings.TrimPrefix(e.Code, "end:"))
		res.Ended = k.EndReason()
	case e.Code == "block":
		close(k.running)
		select {
		case <-ctx.Done():
			k.end(warmpool.EndCancelled)
		case <-k.ended:
		}
		res.Ended = k.EndReason()
	}
	return res, nil
}

func (k *fakeKernel) Interrupt() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.interrupts++
	return nil
}

func (k *fakeKernel) Close() {
	k.end(warmpool.EndClosed)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closes++
}

func (k *fakeKernel) Ended() <-chan struct{} { return k.ended }

func (k *fakeKernel) EndReason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reason
}

func (k *fakeKernel) StartedAt() time.Time { return k.started }
func (k *fakeKernel) MemoryBytes() int64   { return k.memory }

func (k *fakeKernel) counts() (execs, closes, interrupts int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.execs, k.closes, k.interrupts
}

// fakeStarter starts fakeKernels and keeps them.
type fakeStarter struct {
	mu      sync.Mutex
	kernels []*fakeKernel
	fail    error
	memory  int64
	// hook, when set, runs in StartKernel before the kernel is returned.
	hook func(ctx context.Context)
	// warm is how many warm sandboxes there are for WarmOnly starts (a
	// session's kernel started ahead, at its creation); none by default.
	warm int
}

func (st *fakeStarter) StartKernel(ctx context.Context, policy, runtime, workspace string, o warmpool.KernelOptions) (Kernel, error) {
	if o.WarmOnly {
		st.mu.Lock()
		none := st.warm == 0
		if !none {
			st.warm--
		}
		st.mu.Unlock()
		if none {
			return nil, warmpool.ErrNoWarmSandbox
		}
	}
	if st.hook != nil {
		st.hook(ctx)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.fail != nil {
		return nil, st.fail
	}
	if _, err := os.Stat(workspace); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	k := newFakeKernel(workspace, st.memory)
	st.kernels = append(st.kernels, k)
	return k, nil
}

func (st *fakeStarter) last() *fakeKernel {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.kernels) == 0 {
		return nil
	}
	return st.kernels[len(st.kernels)-1]
}

func (st *fakeStarter) all() []*fakeKernel {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]*fakeKernel(nil), st.kernels...)
}

// fakeDisk makes plain directories for volumes: dir/volume.json and
// dir/mnt, like package volume's layout, without loop devices.
type fakeDisk struct {
	mu       sync.Mutex
	failOpen map[string]bool // base names of session dirs whose volume does not open
	// creates and moves count the calls; failCreate and failMove make
	// them fail.
	creates, moves       int
	failCreate, failMove bool
}

type fakeWorkspace struct{ dir string }

func (w fakeWorkspace) Path() string { return filepath.Join(w.dir, "mnt") }
func (w fakeWorkspace) Usage() (volume.Usage, error) {
	return volume.Usage{MaxBytes: 1 << 20, MaxFiles: 100}, nil
}
func (w fakeWorkspace) Volume() *volume.Volume { return nil }

func (d *fakeDisk) Create(dir string, o volume.Options) (workspace, error) {
	d.mu.Lock()
	d.creates++
	fail := d.failCreate
	d.mu.Unlock()
	if fail {
		return nil, errors.New("fake: no volume today")
	}
	if err := os.Mkdir(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "mnt"), 0o700); err != nil {
		return nil, err
	}
	return fakeWorkspace{dir}, os.WriteFile(filepath.Join(dir, "volume.json"), []byte("{}"), 0o600)
}

func (d *fakeDisk) Open(dir string) (workspace, error) {
	d.mu.Lock()
	fail := d.failOpen[filepath.Base(filepath.Dir(dir))]
	d.mu.Unlock()
	if fail {
		return nil, errors.New("fake: the volume does not open")
	}
	if _, err := os.Stat(filepath.Join(dir, "volume.json")); err != nil {
		return nil, err
	}
	return fakeWorkspace{dir}, nil
}

func (d *fakeDisk) Sweep(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".creating-") || strings.HasPrefix(e.Name(), ".removing-") {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *fakeDisk) MoveParent(from string, ws workspace, dir string) (workspace, error) {
	d.mu.Lock()
	d.moves++
	fail := d.failMove
	d.mu.Unlock()
	if fail {
		return nil, errors.New("fake: the move failed")
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil, fs.ErrExist
	}
	vol := ws.(fakeWorkspace).dir
	if filepath.Dir(vol) != from {
		return nil, errors.New("fake: from does not hold the volume")
	}
	if err := os.Rename(from, dir); err != nil {
		return nil, err
	}
	return fakeWorkspace{filepath.Join(dir, filepath.Base(vol))}, nil
}

func (d *fakeDisk) counts() (creates, moves int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.creates, d.moves
}

func (d *fakeDisk) set(failCreate, failMove bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failCreate, d.failMove = failCreate, failMove
}

func (d *fakeDisk) Remove(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return os.RemoveAll(dir)
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// env is a manager on fakes in a temporary root.
type env struct {
	t       *testing.T
	root    string
	clock   *fakeClock
	starter *fakeStarter
	disk    *fakeDisk
	cfg     Config
	m       *Manager
}

// testConfig is a manager's Config on root with server/config's default
// values, on clock; the janitor runs when the test says (Tidy), not on its
// own.
func testConfig(root string, clock *fakeClock) Config {
	return Config{Root: root, UID: 1 << 30, GID: 1 << 30, MaxSessions: 64, Retention: 24 * time.Hour,
		IdleTimeout: 20 * time.Minute, MaxIdleTimeout: 2 * time.Hour, IdleMemoryBudget: 4 << 30,
		Now: clock.Now, JanitorInterval: time.Hour}
}

func newEnv(t *testing.T, edit func(*Config)) *env {
	t.Helper()
	root := filepath.Join(t.TempDir(), "sessions")
	e := &env{t: t, root: root, clock: newFakeClock(), starter: &fakeStarter{}, disk: &fakeDisk{failOpen: map[string]bool{}}}
	e.cfg = testConfig(root, e.clock)
	if edit != nil {
		edit(&e.cfg)
	}
	e.reopen()
	t.Cleanup(func() { e.m.Close() })
	return e
}

// reopen closes the manager (if any) and opens a new one on the same root,
// as a restarted worker would.
func (e *env) reopen() {
	e.t.Helper()
	if e.m != nil {
		e.m.Close()
	}
	m, err := open(e.cfg, e.starter, slog.New(slog.NewTextHandler(e.t.Output(), nil)), e.disk)
	if err != nil {
		e.t.Fatal(err)
	}
	e.m = m
}

func (e *env) create(spec Spec) Info {
	e.t.Helper()
	if spec.Policy == "" {
		spec.Policy = "default"
	}
	info, err := e.m.Create(spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return info
}

// exec runs code in session id (Begin, Exec, End).
func (e *env) exec(id, code string) (*warmpool.KernelResult, ExecInfo) {
	e.t.Helper()
	r, err := e.m.Begin(id)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.End()
	res, info, err := r.Exec(context.Background(), warmpool.KernelExec{Code: code})
	if err != nil {
		e.t.Fatal(err)
	}
	return res, info
}

// wantExec runs code and checks what the answer says of the state.
func (e *env) wantExec(id, code string, want ExecInfo) {
	e.t.Helper()
	_, got := e.exec(id, code)
	want.ID = id
	if got != want {
		e.t.Fatalf("exec %q: session block %+v, want %+v", code, got, want)
	}
}
