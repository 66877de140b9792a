package warmpool_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"golang.org/x/sys/unix"
)

// kernelEnv is a pool for kernels and what a session's spec needs.
type kernelEnv struct {
	r      *nsjail.Runner
	pool   *warmpool.Pool
	rootfs string
	tpl    warmpool.Template
	// workRoot holds the warm workspaces.
	workRoot string
	// forks: the warm sandboxes are template forks (kernelsOnForks, or
	// EXECUTION_POOL_TEMPLATE_FORKS through poolConfig).
	forks bool
}

// newKernelEnv makes a pool of size ready sandboxes (0: every kernel is
// cold) with tmpfs warm workspaces, as the server keeps them.
func newKernelEnv(t testing.TB, size int) *kernelEnv {
	t.Helper()
	return newKernelEnvForks(t, size, nil)
}

// newKernelEnvForks is newKernelEnv with Config.Forks set to *forks (nil:
// poolConfig's, or kernelsOnForks).
func newKernelEnvForks(t testing.TB, size int, forks *bool) *kernelEnv {
	t.Helper()
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	workRoot := t.TempDir()
	cfg := poolConfig(t, size, workRoot, 64<<20)
	cfg.Forks = cfg.Forks || kernelsOnForks
	if forks != nil {
		cfg.Forks = *forks
	}
	pool, err := warmpool.New(r, cfg, []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &kernelEnv{r: r, pool: pool, rootfs: rootfs, tpl: tpl, workRoot: workRoot, forks: cfg.Forks}
}

// kernelsOnForks makes newKernelEnv's warm sandboxes template forks
// (TestKernelsOnForks; the tests of this package run one at a time).
var kernelsOnForks bool

// TestKernelsOnForks runs the warm kernel tests with template forks as
// the pool's warm sandboxes (Config.Forks): a session's kernel from a fork
// keeps its state, idles frozen in the shell's cgroup, sees its volume,
// and is signalled by the pidfd of its own process.
func TestKernelsOnForks(t *testing.T) {
	requireTemplates(t)
	kernelsOnForks = true
	defer func() { kernelsOnForks = false }()
	t.Run("KeepsStateAcrossExecutions", TestKernelKeepsStateAcrossExecutions)
	t.Run("IdlesFrozen", TestKernelIdlesFrozen)
	t.Run("WorkspaceIsTheVolume", TestKernelWorkspaceIsTheVolume)
	t.Run("RequestAfterTheHandOffDeadline", TestKernelRequestAfterTheHandOffDeadline)
	t.Run("ReadOnlyIgnoresPlantedModules", TestReadOnlyKernelIgnoresPlantedModules)
	t.Run("IsSignalledByPidfd", TestKernelIsSignalledByPidfd)
}

// sessionDir is a directory standing in for a session's volume, owned by
// the sandbox user and, as a volume is, the root of a mount (bound on
// itself; unmounted at the end).
func (e *kernelEnv) sessionDir(t testing.TB) string {
	t.Helper()
	dir := e.plainDir(t)
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// plainDir is a directory owned by the sandbox user, not a mount root.
func (e *kernelEnv) plainDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "session")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, e.r.HostUID(), e.r.HostGID()); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (e *kernelEnv) spec(ws string) nsjail.Spec {
	return nsjail.Spec{Rootfs: e.rootfs, Env: e.tpl.Env, Workspace: ws, Limits: e.tpl.Limits}
}

// start starts a kernel on ws, closed when t ends; warm says whether it
// must come from the pool (which is waited for) or be cold.
func (e *kernelEnv) start(t testing.TB, ws string, warm bool, o warmpool.KernelOptions) *warmpool.Kernel {
	t.Helper()
	if warm {
		waitReadyTB(t, e.pool, 1)
	}
	k, err := e.pool.StartKernel(context.Background(), e.spec(ws), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	if k.Warm() != warm {
		t.Fatalf("kernel warm = %v, want %v (pool %+v)", k.Warm(), warm, e.pool.Stats())
	}
	return k
}

func waitReadyTB(t testing.TB, p *warmpool.Pool, n uint64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for p.Stats().Ready < n {
		if time.Now().After(deadline) {
			t.Fatalf("pool not ready: %+v", p.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run runs code and fails t unless the kernel answered.
func run(t testing.TB, k *warmpool.Kernel, code string, timeout ...time.Duration) *warmpool.KernelResult {
	t.Helper()
	e := warmpool.KernelExec{Code: code}
	if len(timeout) > 0 {
		e.Timeout = timeout[0]
	}
	kr, err := k.Exec(context.Background(), e)
	if err != nil {
		t.Fatalf("Exec(%q): %v", code, err)
	}
	return kr
}

// want checks an execution's status, exit code and stdout.
func want(t testing.TB, kr *warmpool.KernelResult, status nsjail.Status, exit int, stdout string) {
	t.Helper()
	r := kr.Result
	if r.Status != status || r.ExitCode != exit || string(r.Stdout) != stdout {
		t.Fatalf("got %s/%d stdout %q (stderr %q, ended %q), want %s/%d stdout %q",
			r.Status, r.ExitCode, r.Stdout, r.Stderr, kr.Ended, status, exit, stdout)
	}
}

func wantAlive(t testing.TB, kr *warmpool.KernelResult) {
	t.Helper()
	if kr.Ended != "" {
		t.Fatalf("the kernel ended (%s): %s %q", kr.Ended, kr.Result.Status, kr.Result.Stderr)
	}
}

// waitFile waits for the code to create name in the host directory dir
// (its /workspace): the execution is then running.
func waitFile(t testing.TB, dir, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A request sent long after the kernel's hand-off is sent: the hand-off's
// write deadline does not outlive it (it did, and every execution sent
// kernelAckTimeout after the start killed the kernel as broken).
func TestKernelRequestAfterTheHandOffDeadline(t *testing.T) {
	// Short enough to sleep past, long enough for the hand-off itself.
	// Under the v2 VM's emulation (5-27x slower, tools/v2vm) on a busy
	// host, 5 s is within a slow hand-off's reach: the suspected cause of
	// one failure there, where the ready fork was counted dead at its
	// hand-off and the kernel started from a fork made on demand.
	ack := 5 * time.Second
	if os.Getenv("V2VM") == "1" {
		ack = 20 * time.Second
	}
	defer warmpool.SetKernelAckTimeout(ack)()
	e := newKernelEnv(t, 1)
	k := e.start(t, e.sessionDir(t), true, warmpool.KernelOptions{})
	want(t, run(t, k, "x = 1"), nsjail.StatusSucceeded, 0, "")
	time.Sleep(ack + time.Second) // past the hand-off's deadline
	kr := run(t, k, "print(x + 1)")
	want(t, kr, nsjail.StatusSucceeded, 0, "2\n")
	wantAlive(t, kr)
}

// A notebook's life in one kernel, warm and cold: state persists across
// executions (a variable, an import, a DataFrame, a function), each
// execution's output is its own, sys.exit and exceptions end the cell but
// not the kernel, the environment is the execution's only.
func TestKernelKeepsStateAcrossExecutions(t *testing.T) {
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			e := newKernelEnv(t, map[bool]int{true: 1, false: 0}[warm])
			ws := e.sessionDir(t)
			if err := os.WriteFile(filepath.Join(ws, "data.csv"), []byte("k,v\na,1\nb,2\na,3\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			k := e.start(t, ws, warm, warmpool.KernelOptions{})
			if k.StartedAt().IsZero() || k.MemoryBytes() <= 0 {
				t.Fatalf("started at %v, memory %d", k.StartedAt(), k.MemoryBytes())
			}

			kr := run(t, k, "import os, pandas as pd\nx = 41\ndf = pd.read_csv('data.csv')\ndef f(): return x + 1\nprint(os.getcwd(), len(df))")
			want(t, kr, nsjail.StatusSucceeded, 0, "/workspace 3\n")
			wantAlive(t, kr)
			kr = run(t, k, "print(f(), df.groupby('k')['v'].sum().to_dict(), pd.__name__, __name__)")
			want(t, kr, nsjail.StatusSucceeded, 0, "42 {'a': 4, 'b': 2} pandas __main__\n")
			if kr.Result.Usage.WallMS < 0 || kr.Result.FinishedAt.Before(kr.Result.StartedAt) || kr.Result.Usage.PeakMemoryBytes <= 0 {
				t.Errorf("usage %+v, %v..%v", kr.Result.Usage, kr.Result.StartedAt, kr.Result.FinishedAt)
			}

			kr = run(t, k, "import sys\nprint('bye')\nsys.exit(3)")
			want(t, kr, nsjail.StatusFailed, 3, "bye\n")
			wantAlive(t, kr)

			kr = run(t, k, "y = 1\ndef g():\n    raise ValueError('boom')\ng()")
			want(t, kr, nsjail.StatusFailed, 1, "")
			wantAlive(t, kr)
			for _, s := range []string{"Traceback (most recent call last):", `File "<cell 4>", line 4, in <module>`,
				"    g()", `File "<cell 4>", line 3, in g`, "    raise ValueError('boom')", "ValueError: boom"} {
				if !strings.Contains(string(kr.Result.Stderr), s) {
					t.Errorf("traceback lacks %q:\n%s", s, kr.Result.Stderr)
				}
			}
			if strings.Contains(string(kr.Result.Stderr), "zygote") || strings.Contains(string(kr.Result.Stderr), "<string>") {
				t.Errorf("traceback shows the kernel's own frames:\n%s", kr.Result.Stderr)
			}

			kr = run(t, k, "def broken(:\n")
			want(t, kr, nsjail.StatusFailed, 1, "")
			if !strings.Contains(string(kr.Result.Stderr), "SyntaxError") {
				t.Errorf("stderr %q", kr.Result.Stderr)
			}

			kr, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "import os, sys\nprint(os.environ.get('SESSION_VAR'), y, file=sys.stderr)", Env: map[string]string{"SESSION_VAR": "v1"}})
			if err != nil {
				t.Fatal(err)
			}
			want(t, kr, nsjail.StatusSucceeded, 0, "")
			if string(kr.Result.Stderr) != "v1 1\n" {
				t.Fatalf("stderr %q", kr.Result.Stderr)
			}
			kr = run(t, k, "print(os.environ.get('SESSION_VAR'))")
			want(t, kr, nsjail.StatusSucceeded, 0, "None\n")
		})
	}
}

// Interrupt raises KeyboardInterrupt in the running code and the state
// survives; a second execution meanwhile is refused; the interrupt is
// answered by the kernel process, found by its pidfd.
func TestKernelInterrupt(t *testing.T) {
	e := newKernelEnv(t, 0)
	ws := e.sessionDir(t)
	k := e.start(t, ws, false, warmpool.KernelOptions{})
	run(t, k, "z = 'kept'")
	done := make(chan *warmpool.KernelResult, 1)
	go func() {
		kr, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "open('running', 'w').close()\nwhile True:\n    pass", Timeout: time.Hour})
		if err != nil {
			t.Error(err)
		}
		done <- kr
	}()
	waitFile(t, ws, "running")
	if _, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "print(1)"}); !errors.Is(err, warmpool.ErrKernelBusy) {
		t.Fatalf("a second execution: %v, want ErrKernelBusy", err)
	}
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	kr := <-done
	if kr == nil {
		t.FailNow()
	}
	want(t, kr, nsjail.StatusFailed, 130, "")
	wantAlive(t, kr)
	if !strings.Contains(string(kr.Result.Stderr), "KeyboardInterrupt") {
		t.Fatalf("stderr %q", kr.Result.Stderr)
	}
	want(t, run(t, k, "print(z)"), nsjail.StatusSucceeded, 0, "kept\n")
	// Nothing runs: an interrupt is a no-op, and the next cell is not hit.
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, k, "print(z)"), nsjail.StatusSucceeded, 0, "kept\n")
}

// interruptedEarly runs a sleeping execution in a kernel holding z, with
// set's hook interrupting it before the kernel has read its request; the
// interrupt must be the execution's (KeyboardInterrupt, the kernel and z
// kept).
func interruptedEarly(t *testing.T, set func(func(*warmpool.Kernel))) *warmpool.KernelResult {
	e := newKernelEnv(t, 0)
	k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
	run(t, k, "z = 'kept'")
	set(func(k *warmpool.Kernel) {
		if err := k.Interrupt(); err != nil {
			t.Error(err)
		}
	})
	kr, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "import time\ntime.sleep(3600)", Timeout: 30 * time.Second})
	set(nil)
	if err != nil {
		t.Fatal(err)
	}
	want(t, kr, nsjail.StatusFailed, 130, "")
	wantAlive(t, kr)
	if !strings.Contains(string(kr.Result.Stderr), "KeyboardInterrupt") {
		t.Fatalf("stderr %q", kr.Result.Stderr)
	}
	want(t, run(t, k, "print(z)"), nsjail.StatusSucceeded, 0, "kept\n")
	return kr
}

// An interrupt that comes as an execution begins, before it awaits its
// reply (the session already says busy, the kernel is still frozen), is
// the execution's: it was answered as done and dropped, and the code ran
// on to its timeout.
func TestKernelInterruptWhileTheExecutionBegins(t *testing.T) {
	interruptedEarly(t, warmpool.SetWhilePreparing)
}

// An interrupt that comes before the kernel has read the execution's
// request (the kernel is thawed, the request on its way) is the
// execution's: raised as its code starts, never dropped as a late one of
// the execution before.
func TestKernelInterruptBeforeTheRequest(t *testing.T) {
	kr := interruptedEarly(t, warmpool.SetBeforeSend)
	// Raised by the zygote's guard as the cell starts: none of its frames
	// shows, in the text or the typed error.
	le := kr.Events.Error
	if strings.Contains(string(kr.Result.Stderr), "<string>") || strings.Contains(string(kr.Result.Stderr), "__enter__") ||
		le == nil || le.Type != "KeyboardInterrupt" || len(le.Traceback) != 0 || strings.Contains(le.Text, "__enter__") {
		t.Errorf("the guard's frame shows: stderr %q, error %+v", kr.Result.Stderr, le)
	}
}

// A SIGINT the pool sent for an execution that reaches the kernel only
// after its reply (here: sent between executions, to the frozen kernel)
// does not interrupt the next execution.
func TestKernelLateInterruptDropped(t *testing.T) {
	e := newKernelEnv(t, 0)
	k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
	run(t, k, "z = 'kept'")
	if err := warmpool.LateInterrupt(k); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, k, "import time\ntime.sleep(0.2)\nprint(z)"), nsjail.StatusSucceeded, 0, "kept\n")
}

// A timeout interrupts the code; the kernel lives on when it stops, and
// is killed (EndTimeout) when it does not.
func TestKernelTimeout(t *testing.T) {
	e := newKernelEnv(t, 0)
	k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
	kr := run(t, k, "v = 7\nwhile True:\n    pass", time.Second)
	if kr.Result.Status != nsjail.StatusTimeout || !slices.Contains(kr.Result.LimitsHit, nsjail.LimitTimeout) {
		t.Fatalf("status %s, limits %v", kr.Result.Status, kr.Result.LimitsHit)
	}
	wantAlive(t, kr)
	want(t, run(t, k, "print(v)"), nsjail.StatusSucceeded, 0, "7\n")

	kr = run(t, k, "print('stubborn', flush=True)\ntry:\n    while True: pass\nexcept KeyboardInterrupt:\n    while True: pass", time.Second)
	if kr.Result.Status != nsjail.StatusTimeout || kr.Ended != warmpool.EndTimeout || string(kr.Result.Stdout) != "stubborn\n" {
		t.Fatalf("status %s, ended %q, stdout %q", kr.Result.Status, kr.Ended, kr.Result.Stdout)
	}
	if k.EndReason() != warmpool.EndTimeout {
		t.Fatalf("end reason %q", k.EndReason())
	}
	if _, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "print(v)"}); !errors.Is(err, warmpool.ErrKernelEnded) {
		t.Fatalf("Exec after the end: %v", err)
	}
	if err := k.Interrupt(); !errors.Is(err, warmpool.ErrKernelEnded) {
		t.Fatalf("Interrupt after the end: %v", err)
	}
}

// The kernel's ends the worker decides: OOM, the pids limit, its own exit,
// a cancelled context, Close.
func TestKernelEnds(t *testing.T) {
	e := newKernelEnv(t, 0)
	cases := []struct {
		name, code string
		status     nsjail.Status
		ended      string
		limit      string
	}{
		{"oom", "x = bytearray(2 * 1024 * 1024 * 1024)", nsjail.StatusOOM, warmpool.EndOOM, nsjail.LimitMemory},
		{"pids", `import threading, time
ts = []
try:
    for i in range(500):
        t = threading.Thread(target=time.sleep, args=(2,)); t.start(); ts.append(t)
except RuntimeError as e:
    print("refused")`, nsjail.StatusSucceeded, warmpool.EndPids, nsjail.LimitPids},
		{"exit", "import os\nos._exit(5)", nsjail.StatusFailed, warmpool.EndExited, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
			kr := run(t, k, c.code)
			if kr.Result.Status != c.status || kr.Ended != c.ended || (c.limit != "" && !slices.Contains(kr.Result.LimitsHit, c.limit)) {
				t.Fatalf("status %s, ended %q, limits %v, want %s, %q, %q (stderr %q)", kr.Result.Status, kr.Ended, kr.Result.LimitsHit,
					c.status, c.ended, c.limit, kr.Result.Stderr)
			}
		})
	}
	// A cancelled execution (the client went away) is interrupted, as at
	// a timeout: the session's state survives unless the code ignores
	// the interrupt.
	t.Run("cancelled", func(t *testing.T) {
		ws := e.sessionDir(t)
		k := e.start(t, ws, false, warmpool.KernelOptions{})
		cancelled := func(name, code string) *warmpool.KernelResult {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				waitFile(t, ws, name)
				cancel()
			}()
			kr, err := k.Exec(ctx, warmpool.KernelExec{Code: code + "\nopen(" + fmt.Sprintf("%q", name) + ", 'w').close()\nwhile True: pass"})
			if err != nil {
				t.Fatal(err)
			}
			if kr.Result.Status != nsjail.StatusCancelled {
				t.Fatalf("status %s, ended %q", kr.Result.Status, kr.Ended)
			}
			return kr
		}
		kr := cancelled("running", "kept = 1")
		wantAlive(t, kr)
		if kr.Result.ExitCode != 130 || !strings.Contains(string(kr.Result.Stderr), "KeyboardInterrupt") {
			t.Fatalf("exit code %d, stderr %q", kr.Result.ExitCode, kr.Result.Stderr)
		}
		want(t, run(t, k, "print(kept)"), nsjail.StatusSucceeded, 0, "1\n")
		kr = cancelled("stubborn", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
		if kr.Ended != warmpool.EndCancelled {
			t.Fatalf("a cancelled execution ignoring SIGINT: ended %q", kr.Ended)
		}
	})
	t.Run("closed", func(t *testing.T) {
		k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
		k.Close()
		k.Close()
		<-k.Ended()
		if k.EndReason() != warmpool.EndClosed || k.MemoryBytes() != 0 {
			t.Fatalf("end reason %q, memory %d", k.EndReason(), k.MemoryBytes())
		}
	})
}

// The session's volume is bound over a warm sandbox's workspace: the code
// sees its files and its writes land in the volume; the bind is nosuid,
// nodev, noexec and locked (the code cannot unmount it to reach the tmpfs
// below); a read-only kernel cannot write; Close unbinds it and leaves the
// volume mounted and intact.
func TestKernelWorkspaceIsTheVolume(t *testing.T) {
	e := newKernelEnv(t, 1)
	v, err := volume.Create(filepath.Join(t.TempDir(), "vol"), volume.Options{UID: e.r.HostUID(), GID: e.r.HostGID(), MaxBytes: 16 << 20, MaxFiles: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Remove() })
	if _, _, err := v.Put("in/data.txt", strings.NewReader("from the host")); err != nil {
		t.Fatal(err)
	}
	k := e.start(t, v.Path(), true, warmpool.KernelOptions{})
	kr := run(t, k, `import ctypes, os
print(open("/workspace/in/data.txt").read())
open("/workspace/out.txt", "w").write("from the kernel")
flags = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == "/workspace"]
print(flags)
libc = ctypes.CDLL(None, use_errno=True)
print(libc.umount2(b"/workspace", 2), ctypes.get_errno() != 0)`)
	lines := strings.Split(string(kr.Result.Stdout), "\n")
	if kr.Result.Status != nsjail.StatusSucceeded || len(lines) < 3 || lines[0] != "from the host" || lines[2] != "-1 True" {
		t.Fatalf("stdout %q (stderr %q)", kr.Result.Stdout, kr.Result.Stderr)
	}
	for _, f := range []string{"nosuid", "nodev", "noexec"} {
		if !strings.Contains(lines[1], f) {
			t.Errorf("the workspace mounts are %s, want %s", lines[1], f)
		}
	}
	got, err := os.ReadFile(filepath.Join(v.Path(), "out.txt"))
	if err != nil || string(got) != "from the kernel" {
		t.Fatalf("the volume holds %q, %v", got, err)
	}
	want(t, run(t, k, `print(open("/workspace/out.txt").read())`), nsjail.StatusSucceeded, 0, "from the kernel\n")
	if n := countMounts(t, e.workRoot, "ext4"); n != 1 {
		t.Fatalf("%d volume binds under the pool's work root, want the kernel's", n)
	}
	k.Close()
	// The pool's next warm sandbox has its tmpfs there; nothing else may be.
	if n := countMounts(t, e.workRoot, "ext4"); n != 0 {
		t.Fatalf("%d volume binds are left under the pool's work root after Close", n)
	}
	if u, err := v.Usage(); err != nil || u.Files == 0 {
		t.Fatalf("volume after Close: %+v %v", u, err)
	}

	ro := e.start(t, v.Path(), true, warmpool.KernelOptions{ReadOnly: true})
	kr = run(t, ro, `import errno
print(open("/workspace/out.txt").read())
try:
    open("/workspace/new.txt", "w")
except OSError as e:
    print(errno.errorcode[e.errno])`)
	want(t, kr, nsjail.StatusSucceeded, 0, "from the kernel\nEROFS\n")
	ro.Close()

	// On a directory of a filesystem mounted exec, suid: the bind's own
	// flags are what the code gets.
	plain := e.start(t, e.sessionDir(t), true, warmpool.KernelOptions{})
	kr = run(t, plain, `print([l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == "/workspace"][-1])`)
	for _, f := range []string{"nosuid", "nodev", "noexec"} {
		if !strings.Contains(string(kr.Result.Stdout), f) {
			t.Errorf("the bound workspace is mounted %q, want %s", kr.Result.Stdout, f)
		}
	}
}

// A cold kernel's workspace is bound read-only when asked.
func TestColdKernelReadOnly(t *testing.T) {
	e := newKernelEnv(t, 0)
	ws := e.sessionDir(t)
	k := e.start(t, ws, false, warmpool.KernelOptions{ReadOnly: true})
	kr := run(t, k, `import errno, os
print(os.listdir("/workspace"))
try:
    open("/workspace/new.txt", "w")
except OSError as e:
    print(errno.errorcode[e.errno])`)
	want(t, kr, nsjail.StatusSucceeded, 0, "[]\nEROFS\n")
}

// countMounts counts the mounts of type fstype in the worker's namespace
// below root.
func countMounts(t testing.TB, root, fstype string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		_, after, ok := strings.Cut(l, " - ")
		f := strings.Fields(l)
		if ok && len(f) > 4 && strings.HasPrefix(f[4], root+"/") && strings.HasPrefix(after, fstype+" ") {
			n++
		}
	}
	return n
}

// BenchmarkKernelExecPrint measures print(1) in a live kernel: request,
// run, reply, output and counters.
func BenchmarkKernelExecPrint(b *testing.B) {
	e := newKernelEnv(b, 0)
	k := e.start(b, e.sessionDir(b), false, warmpool.KernelOptions{})
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		kr, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "print(1)"})
		lat = append(lat, time.Since(start))
		if err != nil || kr.Result.Status != nsjail.StatusSucceeded {
			b.Fatalf("%v %+v", err, kr)
		}
	}
	reportLatency(b, lat)
}

// BenchmarkKernelStartWarm measures a warm kernel's start (bind, hand-off,
// answer) and its first print(1), with the pool refilled between
// iterations, as a new session on an idle worker.
func BenchmarkKernelStartWarm(b *testing.B) {
	e := newKernelEnv(b, 1)
	ws := e.sessionDir(b)
	var lat []time.Duration
	for b.Loop() {
		b.StopTimer()
		waitReadyTB(b, e.pool, 1)
		b.StartTimer()
		start := time.Now()
		k, err := e.pool.StartKernel(context.Background(), e.spec(ws), warmpool.KernelOptions{})
		if err != nil {
			b.Fatal(err)
		}
		kr, err := k.Exec(context.Background(), warmpool.KernelExec{Code: "print(1)"})
		lat = append(lat, time.Since(start))
		if err != nil || kr.Result.Status != nsjail.StatusSucceeded || !k.Warm() {
			b.Fatalf("%v %+v warm=%v", err, kr, k.Warm())
		}
		b.StopTimer()
		k.Close()
		b.StartTimer()
	}
	reportLatency(b, lat)
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// An execution reports its own memory peak, not the kernel's lifetime
// one; the kernel keeps the sources of its newest cells only (tracebacks
// show their lines), within a budget.
func TestKernelPerExecutionPeakAndBoundedSources(t *testing.T) {
	e := newKernelEnv(t, 0)
	k := e.start(t, e.sessionDir(t), false, warmpool.KernelOptions{})
	big := run(t, k, "b = bytearray(192 << 20)\nb[::4096] = b'x' * len(b[::4096])\ndel b")
	want(t, big, nsjail.StatusSucceeded, 0, "")
	small := run(t, k, "print(1)")
	want(t, small, nsjail.StatusSucceeded, 0, "1\n")
	if p := big.Result.Usage.PeakMemoryBytes; p < 192<<20 {
		t.Fatalf("the 192 MiB execution's peak: %d", p)
	}
	if p := small.Result.Usage.PeakMemoryBytes; p >= big.Result.Usage.PeakMemoryBytes-(128<<20) {
		t.Fatalf("print(1) after a 192 MiB execution peaked at %d (the kernel's lifetime peak?)", p)
	}

	// Three cells of 1.5 M characters each, then one that reads the
	// budget from the zygote's globals and what linecache holds.
	for range 3 {
		want(t, run(t, k, "#"+strings.Repeat("x", 3<<19)+"\ny = 1"), nsjail.StatusSucceeded, 0, "")
	}
	kr := run(t, k, `import linecache, sys
f = sys._getframe()
while "_CELL_SOURCE_BUDGET" not in f.f_globals:
    f = f.f_back
budget = f.f_globals["_CELL_SOURCE_BUDGET"]
cells = {k: v[0] for k, v in linecache.cache.items() if k.startswith("<cell ")}
print(sum(cells.values()) <= budget, "<cell 3>" in cells, "<cell 5>" in cells, "<cell 6>" in cells)
1/0`)
	if kr.Result.ExitCode != 1 || string(kr.Result.Stdout) != "True False True True\n" ||
		!strings.Contains(string(kr.Result.Stderr), "    1/0\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", kr.Result.ExitCode, kr.Result.Stdout, kr.Result.Stderr)
	}
}

// SECURITY.md case 45: a read-only kernel (a profile's) does not import
// a module the session planted in its workspace; a session's own kernel
// does, as an interactive interpreter would.
func TestReadOnlyKernelIgnoresPlantedModules(t *testing.T) {
	e := newKernelEnv(t, 1)
	ws := e.sessionDir(t)
	// colorsys is in the standard library and not preloaded.
	if err := os.WriteFile(filepath.Join(ws, "colorsys.py"), []byte("print('planted')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const probe = "import colorsys\nprint(colorsys.__file__.startswith('/workspace'))"
	for _, warm := range []bool{true, false} {
		ro := e.start(t, ws, warm, warmpool.KernelOptions{ReadOnly: true})
		want(t, run(t, ro, probe), nsjail.StatusSucceeded, 0, "False\n")
		ro.Close()
	}
	rw, err := e.pool.StartKernel(context.Background(), e.spec(ws), warmpool.KernelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	want(t, run(t, rw, probe), nsjail.StatusSucceeded, 0, "planted\nTrue\n")
}

// SECURITY.md case 48: a workspace that is not the root of a mount (a
// volume unmounted by an operator or lazily detached leaves the plain
// directory below) is refused, warm or cold, before anything starts; the
// pool keeps its ready sandbox.
func TestKernelRefusesAnUnmountedWorkspace(t *testing.T) {
	for _, size := range []int{1, 0} {
		e := newKernelEnv(t, size)
		if size > 0 {
			waitReadyTB(t, e.pool, 1)
		}
		plain := e.plainDir(t)
		k, err := e.pool.StartKernel(context.Background(), e.spec(plain), warmpool.KernelOptions{})
		if err == nil {
			k.Close()
			t.Fatalf("pool of size %d: a kernel started on a plain directory", size)
		}
		if !strings.Contains(err.Error(), "not mounted") {
			t.Errorf("pool of size %d: %v", size, err)
		}
		if st := e.pool.Stats(); st.Ready != uint64(size) {
			t.Errorf("pool of size %d after the refusal: %+v", size, st)
		}
	}
}

// TestKernelForkedOnDemand: with template forks (Config.Forks), a
// session's kernel requested while the pool has no ready warm sandbox is
// a fork of its template made then, not a cold zygote: its process is a
// fork of the template's (its command line is template.py's, a cold
// kernel's is zygote.py's), it is counted in KernelForks and
// TemplateForks, not in Taken, its workspace is the session's volume and
// it keeps its state; kernels asked for at once are each forked (side by
// side past the template's part of each: fork.go makeFork). Without forks
// such a kernel is cold, as it always was.
func TestKernelForkedOnDemand(t *testing.T) {
	requireTemplates(t)
	for _, forks := range []bool{true, false} {
		t.Run(map[bool]string{true: "forks", false: "zygotes"}[forks], func(t *testing.T) {
			e := newKernelEnvForks(t, 1, &forks)
			// The pool's one ready sandbox is taken by a kernel that runs
			// nothing: its refill is woken only after a first execution or
			// at its end (the pool's ticker may refill it all the same:
			// a kernel that found a ready one is set aside below).
			e.start(t, e.sessionDir(t), true, warmpool.KernelOptions{})
			taken := 0 // kernels that found a ready sandbox all the same
			startDrained := func(ws string) (*warmpool.Kernel, time.Duration) {
				t.Helper()
				for ; taken < 3; taken++ {
					start := time.Now()
					k, err := e.pool.StartKernel(context.Background(), e.spec(ws), warmpool.KernelOptions{})
					took := time.Since(start)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(k.Close)
					if !k.Warm() {
						return k, took
					}
				}
				t.Fatalf("every kernel found a ready warm sandbox: %+v", e.pool.Stats())
				return nil, 0
			}
			before := e.pool.Stats()
			ws := e.sessionDir(t)
			k, took := startDrained(ws)
			st := e.pool.Stats()
			t.Logf("kernel started in %s (forked: %v)", took, k.Forked())
			if k.Forked() != forks {
				t.Fatalf("forked = %v with Config.Forks %v; stats %+v", k.Forked(), forks, st)
			}
			wantForks := uint64(0)
			if forks {
				wantForks = 1
			}
			if st.KernelForks != before.KernelForks+wantForks || st.TemplateForks < before.TemplateForks+wantForks ||
				st.FallbackFork != 0 || st.FallbackDead != 0 || (!forks && st.TemplateForks != 0) {
				t.Fatalf("stats before %+v, after %+v", before, st)
			}
			// Not a take: only the kernels that found a ready sandbox are.
			if st.Taken != before.Taken+uint64(taken) {
				t.Fatalf("%d kernels found a ready sandbox; stats before %+v, after %+v", taken, before, st)
			}
			pid, err := warmpool.KernelPid(k)
			if err != nil || pid == 0 {
				t.Fatalf("kernel pid %d: %v", pid, err)
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Split(string(cmdline), "\x00")
			wantSource, wantWho := warmpool.ZygoteArgs(nil)[3], "a zygote's child"
			if forks {
				wantSource, wantWho = warmpool.TemplateArgs(nil)[3], "a fork of the template"
			}
			if len(args) < 4 || args[3] != wantSource {
				t.Fatalf("the kernel process %d is not %s: %d args, %.80q", pid, wantWho, len(args), args)
			}
			want(t, run(t, k, `import pandas as pd
x = 41
open("/workspace/from_kernel.txt", "w").write("hello")`), nsjail.StatusSucceeded, 0, "")
			kr := run(t, k, "print(x + 1, pd.__name__)")
			want(t, kr, nsjail.StatusSucceeded, 0, "42 pandas\n")
			wantAlive(t, kr)
			if b, err := os.ReadFile(filepath.Join(ws, "from_kernel.txt")); err != nil || string(b) != "hello" {
				t.Fatalf("the session's volume holds %q, %v", b, err)
			}
			if !forks {
				return
			}
			// Three at once (and the refill, if its ticker fires, beside
			// them): each is a fork, or a take of what the refill made,
			// never cold.
			before = e.pool.Stats()
			errs := make(chan error, 3)
			for range 3 {
				ws := e.sessionDir(t)
				go func() {
					k, err := e.pool.StartKernel(context.Background(), e.spec(ws), warmpool.KernelOptions{})
					if err == nil {
						defer k.Close()
						if !k.Forked() && !k.Warm() {
							err = errors.New("a cold kernel")
						} else if kr, xerr := k.Exec(context.Background(), warmpool.KernelExec{Code: "print(1)"}); xerr != nil {
							err = xerr
						} else if string(kr.Result.Stdout) != "1\n" {
							err = fmt.Errorf("stdout %q", kr.Result.Stdout)
						}
					}
					errs <- err
				}()
			}
			for range 3 {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			st = e.pool.Stats()
			if got := (st.KernelForks - before.KernelForks) + (st.Taken - before.Taken); got != 3 || st.FallbackFork != 0 {
				t.Fatalf("3 kernels: stats before %+v, after %+v", before, st)
			}
		})
	}
}
