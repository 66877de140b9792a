package session

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Root tests with the real kernel (server/warmpool) on the real runtime
// rootfs, real volumes and the real manager: what a session's answer says
// of the Python state is what happened to it.

// poolStarter is the server's Starter in miniature: every policy is one
// hand-made template (package server, which turns policies into templates,
// sits above this package).
type poolStarter struct {
	pool *warmpool.Pool
	tpl  warmpool.Template
}

func (p poolStarter) StartKernel(ctx context.Context, policy, runtime, ws string, o warmpool.KernelOptions) (Kernel, error) {
	k, err := p.pool.StartKernel(ctx, nsjail.Spec{Rootfs: p.tpl.Rootfs, Env: p.tpl.Env, Limits: p.tpl.Limits, Workspace: ws}, o)
	if err != nil {
		return nil, err
	}
	return k, nil
}

func newPoolStarter(t *testing.T) poolStarter {
	t.Helper()
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: nsjailtest.StateRoot, CgroupParent: nsjailtest.CgroupParent})
	tpl := warmpool.Template{Name: "default", Rootfs: rootfs,
		Env:    []string{"PATH=" + inside.DefaultPath, "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "LANG=C.UTF-8"},
		Limits: nsjail.Limits{MemoryBytes: 512 << 20, Pids: 64, CPUs: 1, StdoutBytes: 64 << 10, StderrBytes: 64 << 10}}
	cfg := config.Default()
	pool, err := warmpool.New(r, warmpool.Config{Size: 1, MaxIdle: time.Hour, Preload: cfg.PoolPreload,
		WorkRoot: t.TempDir(), WorkspaceBytes: 64 << 20, WorkspaceInodes: cfg.WorkspaceInodes,
		Forks: nsjailtest.TemplateForks(t, cfg.PoolTemplateForks)}, []warmpool.Template{tpl},
		slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The first kernel comes from the pool: the volume bound over a warm
	// sandbox's workspace.
	for deadline := time.Now().Add(2 * time.Minute); pool.Stats().Ready < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool not ready: %+v", pool.Stats())
		}
	}
	if r.HostUID() != testUID || r.HostGID() != testUID {
		t.Fatalf("the runner's sandbox user %d:%d is not the volumes' %d", r.HostUID(), r.HostGID(), testUID)
	}
	return poolStarter{pool, tpl}
}

// realExec runs code with timeout (0: none of its own) and returns the
// result and the session block.
func (e *realEnv) realExec(id, code string, timeout time.Duration) (*nsjail.Result, ExecInfo) {
	e.t.Helper()
	r, err := e.m.Begin(id)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.End()
	res, info, err := r.Exec(context.Background(), warmpool.KernelExec{Code: code, Timeout: timeout})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.Result, info
}

func (e *realEnv) wantOut(res *nsjail.Result, status nsjail.Status, stdout string) {
	e.t.Helper()
	if res.Status != status || string(res.Stdout) != stdout {
		e.t.Fatalf("got %s stdout %q stderr %q, want %s stdout %q", res.Status, res.Stdout, res.Stderr, status, stdout)
	}
}

func wantInfo(t *testing.T, got ExecInfo, state, reason string, gen int64) {
	t.Helper()
	if got.State != state || got.Reason != reason || got.KernelGeneration != gen {
		t.Fatalf("session block %+v, want %s/%s generation %d", got, state, reason, gen)
	}
}

func TestRealKernelStateFilesAndRestart(t *testing.T) {
	var starter poolStarter
	e := newRealEnv(t, func() Starter { starter = newPoolStarter(t); return starter })
	if _, err := e.m.Create(Spec{ID: "s", Policy: "default", Kernel: true}); err != nil {
		t.Fatal(err)
	}
	e.put("s", "data.csv", "a,b\n1,2\n3,4\n")

	res, info := e.realExec("s", "import csv\nrows = list(csv.reader(open('data.csv')))\nprint(len(rows))", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "3\n")
	wantInfo(t, info, StateNew, ReasonFirst, 1)

	res, info = e.realExec("s", "print(rows[1])\nopen('/workspace/out.txt', 'w').write('kept')", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "['1', '2']\n")
	wantInfo(t, info, StatePreserved, "", 1)
	if got, err := e.get("s", "out.txt"); err != nil || got != "kept" {
		t.Fatalf("the code's file through the file API: %q, %v", got, err)
	}

	// A timeout the code ignores kills the kernel: the answer says so,
	// the next one says why its state is new, and the files survive.
	res, info = e.realExec("s", "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", time.Second)
	if res.Status != nsjail.StatusTimeout || info.KernelEnded != warmpool.EndTimeout {
		t.Fatalf("a timeout ignoring SIGINT: %s, session block %+v", res.Status, info)
	}
	res, info = e.realExec("s", "print('rows' in globals(), open('out.txt').read(), open('data.csv').read().count(','))", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "False kept 3\n")
	wantInfo(t, info, StateNew, warmpool.EndTimeout, 2)
	res, info = e.realExec("s", "x = 42", 0)
	wantInfo(t, info, StatePreserved, "", 2)

	// A restarted worker: the kernel is gone, the files are not.
	e.m.Close()
	e.open(starter)
	res, info = e.realExec("s", "print('x' in globals(), open('out.txt').read())", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "False kept\n")
	wantInfo(t, info, StateRestarted, ReasonWorkerRestart, 3)

	// Idle timeout: the janitor stops the kernel, keeps the files.
	e.realExec("s", "y = 1", 0)
	e.clock.Add(e.cfg.IdleTimeout)
	e.m.Tidy()
	if st := e.m.Stats(); st.IdleKernels != 0 {
		t.Fatalf("stats after the idle timeout: %+v", st)
	}
	res, info = e.realExec("s", "print('y' in globals(), open('out.txt').read())", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "False kept\n")
	wantInfo(t, info, StateNew, ReasonIdleTimeout, 4)

	if err := e.m.Delete("s"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "s")); !os.IsNotExist(err) {
		t.Fatalf("session directory after Delete: %v", err)
	}
}

func TestRealKernelDisabledAndDeleteWhileRunning(t *testing.T) {
	var starter poolStarter
	e := newRealEnv(t, func() Starter { starter = newPoolStarter(t); return starter })
	if _, err := e.m.Create(Spec{ID: "off", Policy: "default", Kernel: false}); err != nil {
		t.Fatal(err)
	}
	res, info := e.realExec("off", "x = 1\nopen('f', 'w').write('1')", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "")
	wantInfo(t, info, StateNew, ReasonNoKernel, 1)
	res, info = e.realExec("off", "print('x' in globals(), open('f').read())", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "False 1\n")
	wantInfo(t, info, StateNew, ReasonNoKernel, 2)
	if st := e.m.Stats(); st.IdleKernels != 0 {
		t.Fatalf("a kernel: false session keeps a kernel: %+v", st)
	}
	// Created only now: its kernel is started ahead when a warm sandbox is
	// ready, and would count in the IdleKernels above.
	if _, err := e.m.Create(Spec{ID: "on", Policy: "default", Kernel: true}); err != nil {
		t.Fatal(err)
	}

	// Delete while code runs: the execution ends, the kernel's sandbox is
	// destroyed, the volume removed (the cleanup checks for a mount or a
	// loop device left behind).
	run, err := e.m.Begin("on")
	if err != nil {
		t.Fatal(err)
	}
	type out struct {
		res  *warmpool.KernelResult
		info ExecInfo
		err  error
	}
	done := make(chan out)
	go func() {
		res, info, err := run.Exec(context.Background(), warmpool.KernelExec{Code: "open('started', 'w').close()\nimport time\ntime.sleep(600)"})
		done <- out{res, info, err}
	}()
	v := run.Volume()
	for {
		if _, err := os.Stat(filepath.Join(v.Path(), "started")); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.m.Interrupt("on"); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || o.res.Result.Status == nsjail.StatusSucceeded || o.info.KernelEnded != "" {
		t.Fatalf("interrupted execution: %+v %v", o, o.err)
	}
	run.End()
	// Again, deleted this time.
	run, err = e.m.Begin("on")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		res, info, err := run.Exec(context.Background(), warmpool.KernelExec{Code: "open('started2', 'w').close()\nimport time\ntime.sleep(600)"})
		done <- out{res, info, err}
	}()
	for {
		if _, err := os.Stat(filepath.Join(v.Path(), "started2")); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.m.Delete("on"); err != nil {
		t.Fatal(err)
	}
	o = <-done
	if o.err != nil || o.info.KernelEnded == "" || o.info.State != StatePreserved {
		t.Fatalf("execution of a deleted session: %+v %v", o.info, o.err)
	}
	run.End()
}

// A spare kernel on the real pool and volumes (SECURITY.md case 62): the
// kernel started in a spare volume before any session is adopted by the
// next session of its kind, and its /workspace is that session's volume
// (the spare's directory renamed with the bind in place): a file put
// before the first execution is read by it, one the code writes is read
// through the file API. It has run nothing before: its first execution
// says new, first_execution. Close closes the spare that replaces it
// (the cleanup finds no mount or loop device left).
func TestRealSpareKernel(t *testing.T) {
	var starter poolStarter
	e := newRealEnv(t, func() Starter { starter = newPoolStarter(t); return starter })
	e.m.Close()
	e.cfg.SpareKernels, e.cfg.SparePolicy, e.cfg.SpareRuntime = 1, "default", config.DefaultRuntime
	e.open(starter)
	waitReal := func() {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); e.m.Stats().SpareKernels < 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no spare kernel ready: %+v, pool %+v", e.m.Stats(), starter.pool.Stats())
			}
		}
	}
	waitReal()
	before := time.Now() // the kernel's clock (the sessions' is a fake one)
	info, err := e.m.Create(Spec{ID: "s", Policy: "default", Kernel: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Kernel.State != KernelIdle || info.Kernel.StartedAt == nil || !info.Kernel.StartedAt.Before(before) {
		t.Fatalf("created with a spare kernel ready: %+v (create called at %s), want an idle kernel started before", info.Kernel, before)
	}
	if st := e.m.Stats(); st.SpareKernels != 0 {
		t.Fatalf("the spare kernel still counted after its adoption: %+v", st)
	}
	e.put("s", "in.txt", "from the API")
	res, xinfo := e.realExec("s", "names = [k for k in globals() if not k.startswith('_')]\nimport os\nprint(names, os.getcwd(), sorted(os.listdir('.')), open('in.txt').read())\nopen('out.txt', 'w').write('from the code')", 0)
	e.wantOut(res, nsjail.StatusSucceeded, "[] /workspace ['in.txt', 'lost+found'] from the API\n")
	wantInfo(t, xinfo, StateNew, ReasonFirst, 1)
	if got, err := e.get("s", "out.txt"); err != nil || got != "from the code" {
		t.Fatalf("the code's file through the file API: %q, %v", got, err)
	}
	// The refill starts the next one once the pool has refilled.
	waitReal()
	if err := e.m.Delete("s"); err != nil {
		t.Fatal(err)
	}
}
