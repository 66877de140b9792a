package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Spare volumes on the fake disk: taken by Create, refilled in the
// background, removed by Close and by the next Open's sweep, never adopted
// as sessions. (real_test.go runs them on real volumes.)

func TestIsSpareName(t *testing.T) {
	for name, want := range map[string]bool{
		".spare-0123456789abcdef":  true,
		".spare-0123456789abcde":   false, // short
		".spare-0123456789abcdeF":  false, // not lower-case hex
		".spare-0123456789abcdeg":  false,
		".spare-":                  false,
		"spare-0123456789abcdef":   false,
		".spare-0123456789abcdef0": false,
	} {
		if got := isSpareName(name); got != want {
			t.Errorf("isSpareName(%q) = %v, want %v", name, got, want)
		}
	}
}

// spareDirs lists root's spare directories.
func spareDirs(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), sparePrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// waitSpares waits until the manager holds n ready spares (the refill runs
// in the background) and root holds exactly their directories.
func waitSpares(t *testing.T, m *Manager, root string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		ready := len(m.spares)
		m.mu.Unlock()
		if ready == n && len(spareDirs(t, root)) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready, %v on disk; want %d", ready, spareDirs(t, root), n)
		}
	}
}

func TestCreateTakesASpareAndTheRefillReplacesIt(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 2 })
	waitSpares(t, e.m, e.root, 2)
	before := spareDirs(t, e.root)
	e.create(Spec{ID: "s1", Kernel: true})
	if creates, moves := e.disk.counts(); moves != 1 {
		t.Fatalf("Create with spares ready: %d moves (%d creates), want the volume moved from a spare", moves, creates)
	}
	// The session's volume is a former spare, its directory gone.
	if _, err := os.Stat(filepath.Join(e.root, "s1", volumeName, "volume.json")); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, e.m, e.root, 2)
	after := spareDirs(t, e.root)
	if n := len(slices.DeleteFunc(slices.Clone(before), func(d string) bool { return slices.Contains(after, d) })); n != 1 {
		t.Fatalf("spares before %v, after %v: want exactly one taken", before, after)
	}
	if creates, _ := e.disk.counts(); creates != 3 {
		t.Fatalf("%d volumes made, want 3 (two spares, one refill)", creates)
	}
	// A spare is never a session, and a session's works as any.
	if ids := infoIDs(e.m.List()); ids != "s1" {
		t.Fatalf("sessions: %q", ids)
	}
	e.wantExec("s1", "x", ExecInfo{State: StateNew, Reason: ReasonFirst, KernelGeneration: 1})
	if err := e.m.Delete("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "s1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleted session's directory: %v", err)
	}
}

func TestNoSparesWhenDisabled(t *testing.T) {
	e := newEnv(t, nil) // SpareVolumes 0
	e.create(Spec{ID: "s1"})
	e.m.wakeSpares()
	e.m.Tidy()
	if creates, moves := e.disk.counts(); creates != 1 || moves != 0 {
		t.Fatalf("%d creates, %d moves; want the session's volume made by Create alone", creates, moves)
	}
	if d := spareDirs(t, e.root); len(d) != 0 {
		t.Fatalf("spares with session_spare_volumes 0: %v", d)
	}
}

// Concurrent Creates each get a volume of their own, from a spare or made.
func TestConcurrentCreatesNeverShareASpare(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 2 })
	waitSpares(t, e.m, e.root, 2)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			if _, err := e.m.Create(Spec{ID: fmt.Sprintf("s%d", i), Policy: "p"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i := range 6 {
		if _, err := os.Stat(filepath.Join(e.root, fmt.Sprintf("s%d", i), volumeName, "volume.json")); err != nil {
			t.Errorf("session s%d's volume: %v", i, err)
		}
	}
	if _, moves := e.disk.counts(); moves < 2 {
		t.Fatalf("%d spares taken, want at least the 2 ready", moves)
	}
	waitSpares(t, e.m, e.root, 2)
}

// A spare that cannot be moved is removed, and Create makes the volume; a
// refill that fails is retried at the next wake.
func TestSpareFailuresFallBackToCreate(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 1 })
	waitSpares(t, e.m, e.root, 1)
	e.disk.set(false, true)
	e.create(Spec{ID: "s1"})
	if creates, moves := e.disk.counts(); moves != 1 || creates < 2 {
		t.Fatalf("%d creates, %d moves: want a failed move, then the volume made", creates, moves)
	}
	if _, err := os.Stat(filepath.Join(e.root, "s1", volumeName, "volume.json")); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, e.m, e.root, 1) // the failed spare removed, a new one made

	// No volume can be made: Create says so, and the refill gives up
	// until woken.
	e.disk.set(true, false)
	e.m.mu.Lock()
	taken := e.m.spares
	e.m.spares = nil
	e.m.mu.Unlock()
	for _, sp := range taken {
		if err := e.m.removeSpareDir(sp.dir); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.Create(Spec{ID: "s2", Policy: "p"}); err == nil {
		t.Fatal("Create without spares on a disk that makes no volume: no error")
	}
	e.disk.set(false, false)
	e.m.wakeSpares() // the janitor's round
	waitSpares(t, e.m, e.root, 1)
	e.create(Spec{ID: "s2"})
}

// A directory in the way of a new session's is never replaced by a
// spare's (RENAME_NOREPLACE): Create says ErrExists and the spare stays
// ready, where it was.
func TestADirectoryInTheWayKeepsTheSpare(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 1 })
	waitSpares(t, e.m, e.root, 1)
	before := spareDirs(t, e.root)
	if err := os.Mkdir(filepath.Join(e.root, "s1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.root, "s1", "keep"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(Spec{ID: "s1", Policy: "p"}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create over a directory in the way: %v, want ErrExists", err)
	}
	if b, err := os.ReadFile(filepath.Join(e.root, "s1", "keep")); err != nil || string(b) != "k" {
		t.Fatalf("the directory in the way after a refused Create: %q, %v", b, err)
	}
	e.m.mu.Lock()
	ready := len(e.m.spares)
	e.m.mu.Unlock()
	if after := spareDirs(t, e.root); ready != 1 || !slices.Equal(before, after) {
		t.Fatalf("spares before %v, after %v (%d ready): want the same one kept", before, after, ready)
	}
	e.create(Spec{ID: "s2"})
	if _, moves := e.disk.counts(); moves != 2 {
		t.Fatalf("%d moves: want the kept spare taken by the next session", moves)
	}
}

func TestCloseRemovesTheSpares(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 3 })
	waitSpares(t, e.m, e.root, 3)
	e.m.Close()
	if d := spareDirs(t, e.root); len(d) != 0 {
		t.Fatalf("spares after Close: %v", d)
	}
	e.reopen()
	waitSpares(t, e.m, e.root, 3)
}

// What a killed worker leaves of spares is removed by the next Open:
// complete, half-made, empty, and a session directory that got a spare's
// volume but no record yet. A .spare-* entry the manager would not have
// made is left alone.
func TestOpenSweepsSpareLeftovers(t *testing.T) {
	e := newEnv(t, nil)
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
	complete, half, empty := sparePrefix+"0000000000000001", sparePrefix+"0000000000000002", sparePrefix+"0000000000000003"
	mk(complete + "/volume/mnt")
	write(complete+"/volume/volume.json", "{}")
	mk(half + "/.creating-volume-1234/mnt")
	mk(empty)
	mk("moved/volume/mnt")
	write("moved/volume/volume.json", "{}")
	// Not ours: a record in a spare's directory; a name no spare has.
	withRecord := sparePrefix + "0000000000000004"
	mk(withRecord + "/volume/mnt")
	write(withRecord+"/"+recordName, `{"format":1,"id":"x"}`)
	mk(sparePrefix + "elsewhere/volume")

	e.reopen()
	for _, gone := range []string{complete, half, empty, "moved"} {
		if _, err := os.Lstat(filepath.Join(e.root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Open: %v, want removed", gone, err)
		}
	}
	for _, kept := range []string{withRecord + "/" + recordName, sparePrefix + "elsewhere/volume"} {
		if _, err := os.Lstat(filepath.Join(e.root, kept)); err != nil {
			t.Errorf("%s after Open: %v, want left alone", kept, err)
		}
	}
	if ids := infoIDs(e.m.List()); ids != "" {
		t.Fatalf("sessions after Open: %q, want none (a spare is never a session)", ids)
	}
}

func TestConfigRefusesNegativeSpares(t *testing.T) {
	cfg := testConfig(t.TempDir(), newFakeClock())
	cfg.SpareVolumes = -1
	if err := cfg.check(); err == nil || !strings.Contains(err.Error(), "spare volumes must be >= 0, got: -1") {
		t.Fatalf("check: %v", err)
	}
}

// spareKernelEnv is a manager keeping volumes spares, kernels of them with
// a kernel of the "default" policy on the "default" runtime; warm
// sandboxes come only once the test gives some (setWarm).
func spareKernelEnv(t *testing.T, volumes, kernels int) *env {
	return newEnv(t, func(c *Config) {
		c.SpareVolumes, c.SpareKernels = volumes, kernels
		c.SparePolicy, c.SpareRuntime = "default", "default"
	})
}

// readySpareKernel is spareKernelEnv with warm sandboxes, once its spares
// and their kernel are ready.
func readySpareKernel(t *testing.T) (*env, *fakeKernel) {
	e := spareKernelEnv(t, 2, 1)
	e.starter.setWarm(10)
	waitSpares(t, e.m, e.root, 2)
	return e, waitSpareKernels(t, e.m, 1)[0]
}

func (st *fakeStarter) setWarm(n int) {
	st.mu.Lock()
	st.warm = n
	st.mu.Unlock()
}

// waitSpareKernels waits until the manager's spares hold n live kernels
// and returns them.
func waitSpareKernels(t *testing.T, m *Manager, n int) []*fakeKernel {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		var ks []*fakeKernel
		for _, sp := range m.spares {
			if sp.live() {
				ks = append(ks, sp.kernel.(*fakeKernel))
			}
		}
		m.mu.Unlock()
		if st := m.Stats(); len(ks) == n && st.SpareKernels == n {
			return ks
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spare kernels ready, want %d", len(ks), n)
		}
	}
}

// A spare kernel starts only from a warm sandbox (retried until one is
// ready), is adopted by a session of its kind as the kernel started ahead
// (its first execution says new, first_execution, generation 1), and is
// replaced by the refill.
func TestSpareKernelIsAdoptedBySessionOfItsKind(t *testing.T) {
	e := spareKernelEnv(t, 2, 1)
	waitSpares(t, e.m, e.root, 2)
	if st := e.m.Stats(); st.SpareKernels != 0 || st.SpareKernelsWanted != 1 {
		t.Fatalf("no warm sandbox yet: stats %+v, want 0 of 1 spare kernels", st)
	}
	e.starter.setWarm(2)
	k := waitSpareKernels(t, e.m, 1)[0]
	e.starter.mu.Lock()
	warm := e.starter.warm
	e.starter.mu.Unlock()
	if warm != 1 {
		t.Fatalf("%d warm sandboxes left, want one taken by the spare kernel", warm)
	}

	info := e.create(Spec{ID: "s1", Kernel: true, Runtime: "default"})
	if info.Kernel.State != KernelIdle || info.Kernel.StartedAt == nil || !info.Kernel.StartedAt.Equal(k.started) || info.Kernel.Generation != 1 {
		t.Fatalf("created with a spare kernel ready: kernel %+v, want the spare's, idle, generation 1", info.Kernel)
	}
	e.wantExec("s1", "x", ExecInfo{State: StateNew, Reason: ReasonFirst, KernelGeneration: 1})
	if execs, closes, _ := k.counts(); execs != 1 || closes != 0 {
		t.Fatalf("the spare kernel ran %d executions, closed %d times: want it the session's", execs, closes)
	}
	if n := e.m.Stats().KernelStarts[StateNew+"/"+ReasonFirst]; n != 1 {
		t.Fatalf("kernel starts new/first_execution: %d, want 1", n)
	}
	if next := waitSpareKernels(t, e.m, 1)[0]; next == k {
		t.Fatal("the adopted kernel is still a spare")
	}
	if err := e.m.Delete("s1"); err != nil {
		t.Fatal(err)
	}
	if _, closes, _ := k.counts(); closes != 1 {
		t.Fatalf("the adopted kernel closed %d times by Delete, want 1", closes)
	}
}

// A spare kernel serves only sessions of its policy and runtime that want
// a kernel: other sessions take a spare without one, or make their own
// volume, and start their own kernel.
func TestSpareKernelIsNotAdoptedByAnotherKind(t *testing.T) {
	e, k := readySpareKernel(t)
	for i, spec := range []Spec{
		{ID: "other-policy", Policy: "skill", Runtime: "default", Kernel: true},
		{ID: "other-runtime", Runtime: "slim", Kernel: true},
		{ID: "no-kernel", Runtime: "default"},
	} {
		info := e.create(spec)
		if info.Kernel.StartedAt != nil && info.Kernel.StartedAt.Equal(k.started) {
			t.Fatalf("%s adopted the spare kernel", spec.ID)
		}
		_, got := e.exec(spec.ID, "x")
		if spec.Kernel && (got.State != StateNew || got.Reason != ReasonFirst) {
			t.Fatalf("%s: first execution %+v", spec.ID, got)
		}
		if execs, closes, _ := k.counts(); execs != 0 || closes != 0 {
			t.Fatalf("after %s: the spare kernel ran %d executions, closed %d times", spec.ID, execs, closes)
		}
		if i == 0 {
			waitSpares(t, e.m, e.root, 2)
		}
	}
	if ks := waitSpareKernels(t, e.m, 1); ks[0] != k {
		t.Fatal("the spare kernel was replaced")
	}
}

// A spare kernel that ended before a session took it is closed: the
// session takes its volume as a plain spare and starts its own kernel,
// and the refill starts a new spare kernel.
func TestEndedSpareKernelIsNeverAdopted(t *testing.T) {
	e, k := readySpareKernel(t)
	k.end(warmpool.EndOOM)
	info := e.create(Spec{ID: "s1", Kernel: true, Runtime: "default"})
	if info.Kernel.StartedAt != nil && info.Kernel.StartedAt.Equal(k.started) {
		t.Fatal("the ended spare kernel was adopted")
	}
	e.wantExec("s1", "x", ExecInfo{State: StateNew, Reason: ReasonFirst, KernelGeneration: 1})
	// The refill (woken by the Create) closes it and starts another.
	if ks := waitSpareKernels(t, e.m, 1); ks[0] == k {
		t.Fatal("the ended spare kernel counts as ready")
	}
	if execs, closes, _ := k.counts(); execs != 0 || closes != 1 {
		t.Fatalf("the ended spare kernel: %d executions, closed %d times; want none, closed once", execs, closes)
	}
}

// Concurrent Creates of the spare kind never share a spare kernel.
func TestConcurrentCreatesNeverShareASpareKernel(t *testing.T) {
	e := spareKernelEnv(t, 3, 3)
	e.starter.setWarm(100)
	waitSpares(t, e.m, e.root, 3)
	spares := waitSpareKernels(t, e.m, 3)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			if _, err := e.m.Create(Spec{ID: fmt.Sprintf("s%d", i), Policy: "default", Runtime: "default", Kernel: true}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	holders := map[Kernel]string{}
	for i := range 6 {
		id := fmt.Sprintf("s%d", i)
		_, got := e.exec(id, "x")
		if got.State != StateNew || got.Reason != ReasonFirst {
			t.Fatalf("%s: first execution %+v", id, got)
		}
		e.m.mu.Lock()
		k := e.m.sessions[id].kernel
		e.m.mu.Unlock()
		if other, ok := holders[k]; ok {
			t.Fatalf("sessions %s and %s share a kernel", other, id)
		}
		holders[k] = id
	}
	adopted := 0
	for _, k := range spares {
		if _, ok := holders[k]; ok {
			adopted++
		}
	}
	if adopted == 0 {
		t.Fatal("no spare kernel adopted by six creates")
	}
}

// Close closes the spares' kernels before it removes their volumes.
func TestCloseClosesTheSpareKernels(t *testing.T) {
	e, k := readySpareKernel(t)
	e.m.Close()
	if _, closes, _ := k.counts(); closes != 1 {
		t.Fatalf("spare kernel closed %d times by Close, want 1", closes)
	}
	if d := spareDirs(t, e.root); len(d) != 0 {
		t.Fatalf("spares after Close: %v", d)
	}
}

func TestConfigRefusesMoreSpareKernelsThanVolumes(t *testing.T) {
	cfg := testConfig(t.TempDir(), newFakeClock())
	cfg.SpareVolumes, cfg.SpareKernels, cfg.SparePolicy, cfg.SpareRuntime = 1, 2, "default", "default"
	if err := cfg.check(); err == nil || !strings.Contains(err.Error(), "spare kernels must be in 0..1 (the spare volumes), got: 2") {
		t.Fatalf("check: %v", err)
	}
	cfg.SpareKernels, cfg.SparePolicy = 1, ""
	if err := cfg.check(); err == nil || !strings.Contains(err.Error(), "spare kernels: policy must be") {
		t.Fatalf("check without a policy: %v", err)
	}
}

// A spare kernel older than SpareMaxAge is closed and replaced at the
// refill's next wake, as the pool retires its warm sandboxes.
func TestAgedSpareKernelIsReplaced(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.SpareVolumes, c.SpareKernels = 1, 1
		c.SparePolicy, c.SpareRuntime = "default", "default"
		c.SpareMaxAge = 50 * time.Millisecond
	})
	e.starter.setWarm(100)
	k := waitSpareKernels(t, e.m, 1)[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e.m.wakeSpares() // the janitor's round
		if _, closes, _ := k.counts(); closes == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an aged spare kernel was not retired")
		}
	}
	if execs, _, _ := k.counts(); execs != 0 {
		t.Fatalf("the retired spare kernel ran %d executions", execs)
	}
	if ks := waitSpareKernels(t, e.m, 1); ks[0] == k {
		t.Fatal("the retired spare kernel still counts as ready")
	}
}

// A directory in the way of a new session's keeps the spare it would have
// taken with its kernel: the kernel neither closed nor run, and adopted by
// the next session.
func TestADirectoryInTheWayKeepsTheSpareKernel(t *testing.T) {
	e := spareKernelEnv(t, 1, 1)
	e.starter.setWarm(10)
	waitSpares(t, e.m, e.root, 1)
	k := waitSpareKernels(t, e.m, 1)[0]
	if err := os.Mkdir(filepath.Join(e.root, "s1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(Spec{ID: "s1", Policy: "default", Runtime: "default", Kernel: true}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create over a directory in the way: %v, want ErrExists", err)
	}
	if execs, closes, _ := k.counts(); execs != 0 || closes != 0 {
		t.Fatalf("the kept spare's kernel: %d executions, closed %d times", execs, closes)
	}
	info := e.create(Spec{ID: "s2", Kernel: true, Runtime: "default"})
	if info.Kernel.StartedAt == nil || !info.Kernel.StartedAt.Equal(k.started) {
		t.Fatalf("the next session did not adopt the kept spare kernel: %+v", info.Kernel)
	}
}

// Close during a spare kernel's start cancels the start, and the kernel
// that start returns is closed with its spare: nothing is left.
func TestCloseDuringASpareKernelStart(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SpareVolumes = 1 })
	e.m.Close()
	started := make(chan struct{})
	var once sync.Once
	e.starter.hook = func(ctx context.Context) {
		once.Do(func() { close(started) })
		<-ctx.Done() // held until Close cancels it
	}
	e.starter.setWarm(10)
	e.cfg.SpareKernels, e.cfg.SparePolicy, e.cfg.SpareRuntime = 1, "default", "default"
	e.reopen()
	<-started
	e.m.Close()
	ks := e.starter.all()
	if len(ks) != 1 {
		t.Fatalf("%d kernels started, want the one in flight at Close", len(ks))
	}
	if _, closes, _ := ks[0].counts(); closes != 1 {
		t.Fatalf("the kernel started during Close closed %d times, want 1", closes)
	}
	if d := spareDirs(t, e.root); len(d) != 0 {
		t.Fatalf("spares after Close: %v", d)
	}
}
