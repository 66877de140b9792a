package warmpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// ZygoteArgs is zygoteArgs, for the tests of package warmpool_test.
var ZygoteArgs = zygoteArgs

// TemplateSource is template.py, for the tests of package warmpool_test.
var TemplateSource = templateSource

// ReadyPid is the host pid of the zygote of p's first ready sandbox.
func ReadyPid(p *Pool) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tp := range p.templates {
		if len(tp.ready) > 0 {
			r, ok := p.sandboxer.(*nsjail.Runner)
			if !ok {
				return 0, errors.New("the pool's sandboxer is not an *nsjail.Runner")
			}
			return nsjailtest.InitPid(r.StateRoot(), tp.ready[0].pending.ID())
		}
	}
	return 0, errors.New("no ready warm sandbox")
}

// ReadyForkPids is, when p's first ready sandbox is a template fork
// (Config.Forks), the host pids of its template T, which reports G's exit as a
// zygote reports its child's, and of G, the code's process; ok is false
// for a zygote's sandbox.
func ReadyForkPids(p *Pool) (f, g int, ok bool, err error) {
	p.mu.Lock()
	var w *warmSandbox
	for _, tp := range p.templates {
		if len(tp.ready) > 0 {
			w = tp.ready[0]
			break
		}
	}
	p.mu.Unlock()
	if w == nil {
		return 0, 0, false, errors.New("no ready warm sandbox")
	}
	fd, ok, err := w.pending.GPidfd()
	if !ok || err != nil {
		return 0, 0, ok, err
	}
	defer unix.Close(fd)
	g, err = pidfdPid(fd)
	if err != nil {
		return 0, 0, true, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g))
	if err != nil {
		return 0, 0, true, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(l, "PPid:"); found {
			f, err = strconv.Atoi(strings.TrimSpace(v))
			return f, g, true, err
		}
	}
	return 0, 0, true, errors.New("no PPid in G's status")
}

// pidfdPid is the host pid of the process pidfd fd refers to (its fdinfo).
func pidfdPid(fd int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Pid in the pidfd's fdinfo")
}

// ReadExitReport is readExitReport: T's report of G's wait status is the
// zygote's (template.py's G is zygote.py's code).
var ReadExitReport = readExitReport

// ZygoteSource is zygote.py.
var ZygoteSource = zygoteSource

// KernelPid is the host pid of the process k's pidfd refers to (from the
// pidfd's fdinfo), 0 once k has ended.
func KernelPid(k *Kernel) (int, error) {
	k.mu.Lock()
	fd := k.pidfd
	k.mu.Unlock()
	if fd < 0 {
		return 0, nil
	}
	return pidfdPid(fd)
}

// KernelCPUNS is the CPU time k's sandbox has used so far (its cgroup's).
func KernelCPUNS(k *Kernel) (uint64, error) {
	st, err := k.sb.Stats()
	return st.CPUUsageNS, err
}

// SetBeforeSend sets the hook run between an execution's start and the
// sending of its request (nil: none).
func SetBeforeSend(f func(*Kernel)) { beforeSend = f }

// SetWhilePreparing sets the hook run as an execution begins, before the
// kernel is thawed and the reply awaited (nil: none).
func SetWhilePreparing(f func(*Kernel)) { whilePreparing = f }

// LateInterrupt sends k a SIGINT as await does, whether or not an
// execution runs: one that reaches the kernel after its reply.
func LateInterrupt(k *Kernel) error { return k.signal(unix.SIGINT) }

// SetKernelAckTimeout sets kernelAckTimeout until the returned restore.
func SetKernelAckTimeout(d time.Duration) (restore func()) {
	old := kernelAckTimeout
	kernelAckTimeout = d
	return func() { kernelAckTimeout = old }
}

// TemplateArgs is templateArgs: template.py's command line.
var TemplateArgs = templateArgs

// ForkFromPrelude starts a template of t for p (its sandboxer, preload
// and work root) whose T first runs prelude (what a preload could leave
// behind), and makes one fork of it ready as the refill does (fork, the
// template's first request); the fork, if made, and the template are then
// ended. It returns fork's error.
func ForkFromPrelude(p *Pool, t Template, prelude string) error {
	f, ok := p.sandboxer.(Forker)
	if !ok {
		return fmt.Errorf("%T starts no templates", p.sandboxer)
	}
	ctl, peer, err := controlPair()
	if err != nil {
		return err
	}
	args := templateArgs(p.cfg.Preload)
	args[3] = prelude + "\n" + args[3]
	tpl, err := f.StartTemplate(nsjail.Spec{Rootfs: t.Rootfs, Args: args, Env: slices.Clone(t.Env), Limits: t.Limits}, peer)
	peer.Close()
	if err != nil {
		ctl.Close()
		return err
	}
	defer func() {
		ctl.Close() // EOF: T exits
		tpl.Stop(10 * time.Second)
	}()
	ws, err := workspace.CreateWarm(p.cfg.WorkRoot, workspace.Options{
		Bytes: p.cfg.WorkspaceBytes, Inodes: p.cfg.WorkspaceInodes, UID: p.sandboxer.HostUID(), GID: p.sandboxer.HostGID(),
	})
	if err != nil {
		return err
	}
	spec := nsjail.Spec{Rootfs: t.Rootfs, Args: []string{"python3"}, Cwd: inside.Workspace, Workspace: ws, Limits: t.Limits}
	w, _, err := p.fork(context.Background(), f, &templateProc{tpl: tpl, ctl: ctl, started: time.Now()}, spec, &forkLock{}) // no pool lock: a template of its own
	if err != nil {
		workspace.Remove(ws)
		return err
	}
	p.retire(w)
	return nil
}
