package warmpool

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/workspace"
	"golang.org/x/sys/unix"
)

// A kernel is a session's long-lived Python: the process a warm sandbox's
// zygote forked, told by its hand-off to loop over executions instead of
// running one file, so that variables, imports and loaded data persist
// between them, as in a notebook. Its sandbox is the same single-use
// sandbox as an execution's (namespaces, cgroup limits, seccomp, uid 10001)
// with the session's volume at /workspace, and is destroyed when the kernel
// ends. Everything the kernel says is untrusted: the code runs in that very
// process (SECURITY.md, the kernel cases).

// Why a kernel ended (KernelResult.Ended, Kernel.EndReason).
const (
	EndTimeout   = "timeout"   // an execution outlived its timeout and the interrupt
	EndOOM       = "oom"       // the OOM killer ended it
	EndPids      = "pids"      // an execution hit the pids limit
	EndExited    = "exited"    // it exited by itself (os._exit, a crash)
	EndProtocol  = "protocol"  // it broke the kernel protocol
	EndClosed    = "closed"    // Close ended it (idle timeout, budget, session deleted, drain)
	EndCancelled = "cancelled" // the execution was cancelled (client gone, drain) and did not stop at the interrupt
)

// Kernel errors: nothing of the execution ran.
var (
	ErrKernelEnded = errors.New("kernel has ended")
	ErrKernelBusy  = errors.New("kernel is running an execution")
)

// KernelOptions shape a kernel's sandbox.
type KernelOptions struct {
	// ReadOnly binds the workspace read-only (a profile of a file reads,
	// never writes) and keeps it off the kernel's sys.path: such a kernel
	// runs the worker's code on the session's files, which must not
	// import a module the session planted (SECURITY.md case 45).
	ReadOnly bool
	// WarmOnly starts the kernel only from a warm sandbox, else fails
	// with ErrNoWarmSandbox: a session's kernel started ahead of its
	// first execution (at its creation) only moves work the pool did
	// already, never starts a cold sandbox outside admission.
	WarmOnly bool
	// RefillNow wakes the template's refill as the kernel starts, not
	// after its first execution: a kernel started ahead of any request
	// (a session manager's spare) has no execution a refill could slow,
	// and its first may come much later.
	RefillNow bool
}

// ErrNoWarmSandbox: StartKernel with WarmOnly found no warm sandbox ready.
var ErrNoWarmSandbox = errors.New("no warm sandbox ready")

// KernelExec is one execution in a kernel.
type KernelExec struct {
	// Code is the Python source, run as a notebook cell in the kernel's
	// persistent namespace.
	Code string
	// Env is set in os.environ for the execution and restored after it.
	Env map[string]string
	// Timeout: the code is interrupted (KeyboardInterrupt) at it, and the
	// kernel killed if it does not stop within a grace period.
	Timeout time.Duration
	// Logger, when set, receives the execution's log lines.
	Logger *slog.Logger
	// Output, when set, is given the execution's output as it is read
	// (streaming; see nsjail.OutputFunc).
	Output nsjail.OutputFunc
	// Display and Figures are the runner's: the value of a final
	// expression, the pyplot figures saved as artifacts.
	Display, Figures bool
	// OnEvent, when set, gets the execution's runner events as they are
	// read (runner.Reader).
	OnEvent runner.EventFunc
}

// KernelResult is what one execution in a kernel did.
type KernelResult struct {
	// Result is the execution's, as a cold run would report it: status,
	// exit code (1 for an uncaught exception, N for sys.exit(N)), its own
	// stdout and stderr within the limits, limits hit, usage.
	Result *nsjail.Result
	// Ended is "" when the kernel lives on with its state, else why it
	// ended during the execution (End*).
	Ended string
	// Events is what the runner reported on the execution's events fd:
	// the code's word, untrusted (SECURITY.md case 50).
	Events runner.Outcome
}

// Kernel is a running session kernel.
type Kernel struct {
	w   *warmSandbox
	sb  *nsjail.Sandbox
	log *slog.Logger
	lim nsjail.Limits // the spec's, zero fields defaulted where used
	// warm: from a ready warm sandbox of the pool; forked: from a fork of
	// its template made for it (StartKernel); neither: cold.
	warm, forked bool
	startedAt    time.Time
	// bound is the host directory the session's volume is bound on (a warm
	// kernel's workspace), mntID that bind's mount id; warmWS is removed
	// after the unbind. All empty for a cold kernel.
	bound  string
	mntID  uint64
	warmWS string
	// refill wakes the template's refill, once: after the first execution
	// (a refill's import must not slow it) or at the end.
	refill     func()
	refillOnce sync.Once

	// busy is held by the running Exec; seq is its counter.
	busy sync.Mutex
	seq  uint64

	// cancel kills the sandbox (its Wait's context).
	cancel context.CancelFunc
	// ended is closed once the sandbox is gone, the workspace unbound and
	// everything released; reason is set before.
	ended      chan struct{}
	readerDone chan struct{}

	mu sync.Mutex
	// pidfd refers to the kernel process (-1 once the kernel ended).
	pidfd int
	// waiting is the execution awaiting its reply (nil between them).
	waiting *awaitedReply
	// sigintSent: a SIGINT was sent since the last request; one may still
	// reach the kernel after it answered (the next request drops it).
	sigintSent bool
	// preparing: an Exec has begun and awaits no reply yet (it thaws the
	// kernel, makes its pipes); interruptEarly: Interrupt came meanwhile,
	// and Exec sends the SIGINT once its reply is awaited. (Dropped before,
	// an interrupt the API had answered 204 was lost: the code ran on to
	// its timeout.)
	preparing, interruptEarly bool
	// killedFor is why the worker killed the kernel (End*), first wins.
	killedFor string
	reason    string
	// report is the kernel process's wait status, from the zygote.
	report     syscall.WaitStatus
	haveReport bool
	// final holds the cgroup's counters as the kernel ended (read at the
	// exit report or before a kill): the cgroup is removed after.
	final     cgroup.Stats
	haveFinal bool
	// oomSeen is the cgroup's OOM kill count after the last execution: an
	// OOM kill beyond it that ends the kernel makes EndOOM.
	oomSeen uint64

	// idle holds the counters read at the end of the last execution (as
	// its freeze began), or after the hand-off's answer, when haveIdle. The kernel idled frozen since, so
	// they are the next execution's "before": one cgroup read (~0.2 ms,
	// ten files on v1) less per execution. What a thread left running did
	// between that read and the freeze counts for the next execution.
	// Guarded by busy (only Exec uses them).
	idle     cgroup.Stats
	haveIdle bool
}

// awaitedReply is an execution's slot for its reply line.
type awaitedReply struct {
	ch       chan replyLine // buffered: one send
	answered bool
}

// replyLine is what the reader saw on ControlFD for the execution: a line
// (with its MessageEnd), or why none came.
type replyLine struct {
	line []byte
	err  error
}

const (
	// kernelInterruptGrace is how long an execution interrupted at its
	// timeout has to answer before the kernel is killed.
	kernelInterruptGrace = 2 * time.Second
)

// kernelAckTimeout bounds the kernel's answer to its hand-off (no user
// code has run yet: it only sets up its streams and cwd). A variable so
// that a test can see the hand-off's write deadline end with it.
var kernelAckTimeout = 30 * time.Second

// errDiedBeforeHandoff: a warm sandbox that died before its kernel
// answered the hand-off (none of the session ran): start one cold instead.
var errDiedBeforeHandoff = errors.New("the warm sandbox died before its kernel took the hand-off")

// StartKernel starts a kernel for spec (spec.Workspace is the session's
// volume, spec.Args ignored): from a ready warm sandbox of a matching
// template when there is one (no import on the request path), whose
// workspace then gets spec.Workspace bound over it; else, with
// Config.Forks, from a fork of that template made now (tens of ms and a
// few MiB, not a cold zygote's import and ~80 MiB), handed off the same
// way; else, or when no fork can be made (the template broken, refused,
// not startable), cold. WarmOnly never makes a fork: it starts nothing
// the pool did not make already (SECURITY.md case 61). It works on a pool
// of Size 0 (always cold: it has no template). spec.Workspace must be the
// root of a mount (openVolumeRoot).
func (p *Pool) StartKernel(ctx context.Context, spec nsjail.Spec, o KernelOptions) (*Kernel, error) {
	spec.Args = zygoteArgs(p.cfg.Preload)
	spec.Cwd = inside.Workspace
	spec.WorkspaceReadOnly = o.ReadOnly
	if spec.Workspace == "" {
		return nil, errors.New("a kernel needs a workspace")
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Stdin != nil {
		return nil, errors.New("a kernel has no stdin")
	}
	root, err := openVolumeRoot(spec.Workspace)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	log := cmp.Or(spec.Logger, p.log)
	// Only a tmpfs warm workspace is a (shared) mount a volume can be
	// bound on.
	if p.cfg.WorkspaceBytes > 0 {
		if w, tp := p.take(func(t Template) (bool, bool) { ok := t.MatchesKernel(&spec); return ok, ok }); w != nil {
			k, err := p.startWarmKernel(ctx, w, tp, root, spec, o, false)
			if !errors.Is(err, errDiedBeforeHandoff) {
				return k, err
			}
			tp.wakeRefill()
			p.mu.Lock()
			p.stats.FallbackDead++
			p.mu.Unlock()
			log.Warn("warm sandbox found dead at a kernel's hand-off; starting the kernel from a fork or cold", "error", err)
		}
	}
	if o.WarmOnly {
		return nil, ErrNoWarmSandbox
	}
	if p.cfg.WorkspaceBytes > 0 && p.cfg.Forks {
		k, err := p.startForkedKernel(ctx, root, spec, o)
		switch {
		case err == nil:
			return k, nil
		case errors.Is(err, errNoTemplate):
		case errors.Is(err, errForkFailed):
			p.mu.Lock()
			p.stats.FallbackFork++
			p.mu.Unlock()
			log.Warn("no fork could be made for a session's kernel; starting it cold", "error", err)
		default:
			return nil, err
		}
	}
	return p.startColdKernel(ctx, spec, o)
}

// errNoTemplate: the pool has no template for the kernel (its policy's
// pool size is 0, or the pool is off): it starts cold, as without forks.
var errNoTemplate = errors.New("no template of the pool matches the kernel")

// errForkFailed: no fork of the kernel's template could be made (the
// template broken, refused to fork, could not be started; the fork died
// before its hand-off): the kernel starts cold instead.
var errForkFailed = errors.New("the kernel's fork failed")

// startForkedKernel starts a kernel for spec from a fork of its template
// (Template.MatchesKernel, as take finds one) made on the request path
// (with Config.Forks, when the pool had no ready warm sandbox for it), as
// startWarmKernel does from a ready one. errNoTemplate: the pool has no
// such template; errForkFailed: no fork could be made now; errPoolClosed
// or ctx's error: the pool closed, or the request ended, before the fork.
func (p *Pool) startForkedKernel(ctx context.Context, root int, spec nsjail.Spec, o KernelOptions) (*Kernel, error) {
	f, ok := p.sandboxer.(Forker)
	if !ok {
		return nil, errNoTemplate
	}
	tp := p.templateFor(func(t Template) bool { return t.MatchesKernel(&spec) })
	if tp == nil {
		return nil, errNoTemplate
	}
	// The template's fork lock: another fork may be in the template's
	// part of its own (ms; a template's start and import after a rotation
	// or a failure, ~1.5 s).
	w, err := p.makeFork(ctx, 0, f, tp, false, func() error {
		if err := ctx.Err(); err != nil {
			return err // the request ended while it waited
		}
		p.mu.Lock()
		lastErr := tp.src.forkErr
		p.mu.Unlock()
		if tp.src.proc == nil && tp.src.next == nil && lastErr != nil {
			// The refill's last fork failed and left no template: this
			// one would most likely fail as well, after a template's
			// start and import on the request path. The refill retries,
			// backing off.
			return fmt.Errorf("%w: the template's last fork failed and none runs: %w", errForkFailed, lastErr)
		}
		return nil
	})
	switch {
	case err == nil:
	case errors.Is(err, errForkFailed), errors.Is(err, errPoolClosed), ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, err
	default:
		return nil, fmt.Errorf("%w: %w", errForkFailed, err)
	}
	k, err := p.startWarmKernel(ctx, w, tp, root, spec, o, true)
	if errors.Is(err, errDiedBeforeHandoff) {
		return nil, fmt.Errorf("%w: %w", errForkFailed, err)
	}
	return k, err
}

// startWarmKernel binds the volume root (openVolumeRoot's fd for
// spec.Workspace) over w's workspace and hands w off as a kernel. w is a
// ready sandbox taken from tp's, or, onDemand, a fork of tp's template
// made for this kernel (startForkedKernel), which took nothing from the
// pool: no refill to wake, counted in KernelForks, not Taken.
func (p *Pool) startWarmKernel(ctx context.Context, w *warmSandbox, tp *templatePool, root int, spec nsjail.Spec, o KernelOptions,
	onDemand bool) (*Kernel, error) {
	if why := w.deadWhy(); why != "" {
		p.retiring.Add(1)
		go func() {
			defer p.retiring.Done()
			p.retire(w)
		}()
		return nil, fmt.Errorf("%w (%s)", errDiedBeforeHandoff, why)
	}
	mntID, err := bindVolume(root, w.workspace, o.ReadOnly)
	if err != nil {
		p.retiring.Add(1)
		go func() {
			defer p.retiring.Done()
			p.retire(w)
		}()
		return nil, fmt.Errorf("unable to bind the session's workspace into the warm sandbox: %w", err)
	}
	bind := &warmBind{dir: w.workspace, mntID: mntID, refill: tp.wakeRefill, onDemand: onDemand}
	if onDemand {
		bind.refill = nil
	}
	// On an error the kernel has ended, its workspace unbound and removed.
	k, err := p.handOffKernel(ctx, w, spec, o, bind)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if onDemand {
		p.stats.KernelForks++
	} else {
		p.stats.Taken++
		tp.taken++
	}
	p.mu.Unlock()
	return k, nil
}

// warmBind is a warm kernel's volume bind, undone when it ends; onDemand:
// the warm sandbox is a fork made for this kernel.
type warmBind struct {
	dir      string
	mntID    uint64
	refill   func()
	onDemand bool
}

// startColdKernel starts a zygote with the session's volume as its
// workspace and waits for its preload (on the request path: the pool had
// no warm sandbox for it). libcontainer binds spec.Workspace by its path,
// which StartKernel found a mount root just before.
func (p *Pool) startColdKernel(ctx context.Context, spec nsjail.Spec, o KernelOptions) (*Kernel, error) {
	w, err := p.launch(ctx, nil, spec)
	if err != nil {
		return nil, err
	}
	k, err := p.handOffKernel(ctx, w, spec, o, nil)
	if errors.Is(err, errDiedBeforeHandoff) {
		return nil, fmt.Errorf("the kernel's sandbox died at its start: %w", err)
	}
	return k, err
}

// handOffKernel turns the ready sandbox w into a kernel: it opens a pidfd
// for the kernel process, hands it off without a deadline, sends the
// kernel hand-off and waits for its answer. bind is the warm sandbox's
// volume bind (nil for a cold kernel). On an error the kernel has ended
// (its sandbox waited for, the bind undone); errDiedBeforeHandoff says
// none of the session ran.
func (p *Pool) handOffKernel(ctx context.Context, w *warmSandbox, spec nsjail.Spec, o KernelOptions, bind *warmBind) (*Kernel, error) {
	log := cmp.Or(spec.Logger, p.log)
	pidfd, perr := kernelPidfd(w.pending)
	msg, err := EncodeHandoff(Handoff{Cwd: inside.Workspace, Kernel: true, CwdOnPath: !o.ReadOnly})
	if err == nil {
		err = perr
	}
	report := make(chan syscall.WaitStatus, 1)
	sb, out, errOut := w.pending.Handoff(nsjail.HandoffOptions{NoDeadline: true, Logger: spec.Logger, ExitReport: report})
	if len(out)+len(errOut) > 0 {
		log.Warn("kernel's sandbox wrote output before hand-off (dropped)", "sandbox", sb.ID(),
			"stdout", truncateForLog(out), "stderr", truncateForLog(errOut))
	}
	life, cancel := context.WithCancel(context.Background())
	k := &Kernel{
		w: w, sb: sb, log: log.With("sandbox", sb.ID()), lim: spec.Limits, warm: bind != nil && !bind.onDemand,
		forked: bind != nil && bind.onDemand,
		cancel: cancel, ended: make(chan struct{}), readerDone: make(chan struct{}), pidfd: pidfd,
	}
	if perr != nil {
		k.pidfd = -1
	}
	if bind != nil {
		k.bound, k.mntID, k.warmWS, k.refill = bind.dir, bind.mntID, bind.dir, bind.refill
	}
	go k.relayExitReport(w.exit, report)
	go k.watch(life)
	go k.read()
	if err != nil {
		k.kill(EndProtocol)
		<-k.ended
		w.peer.Close()
		return nil, err
	}
	if err := k.handOff(ctx, msg); err != nil {
		k.kill(EndProtocol)
		<-k.ended
		unread, uerr := pipeUnread(w.peer)
		w.peer.Close()
		if uerr == nil && unread > 0 {
			return nil, fmt.Errorf("%w (%v)", errDiedBeforeHandoff, err)
		}
		return nil, err
	}
	// The kernel took it: from now on, an EOF on control means every
	// holder of the kernel's end closed it.
	w.peer.Close()
	k.startedAt = time.Now()
	// One read of the counters for both: the OOM kills so far (an OOM
	// kill before here failed the hand-off, with oomSeen 0) and the first
	// execution's "before" (the kernel idles from its answer on; see idle),
	// which that execution then does not read again.
	if st, err := sb.Stats(); err == nil {
		k.mu.Lock()
		k.oomSeen = st.OOMKills
		k.mu.Unlock()
		k.idle, k.haveIdle = st, true
	}
	if o.RefillNow {
		k.wakeRefill()
	}
	return k, nil
}

// handOff sends the kernel hand-off and waits for its answer.
func (k *Kernel) handOff(ctx context.Context, msg []byte) error {
	wait, _ := k.expect() // no Exec prepares before the hand-off
	defer k.unexpect()
	if err := k.w.control.SetWriteDeadline(time.Now().Add(kernelAckTimeout)); err != nil {
		return err
	}
	_, err := k.w.control.Write(msg)
	// The deadline is a point in time: left set, it would fail every
	// request written to this kernel after it ("write unix: i/o timeout"
	// on the first execution more than kernelAckTimeout after the start).
	if cerr := k.w.control.SetWriteDeadline(time.Time{}); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("the kernel hand-off failed: %w", err)
	}
	timer := time.NewTimer(kernelAckTimeout)
	defer timer.Stop()
	select {
	case r := <-wait.ch:
		if r.err != nil {
			return fmt.Errorf("the kernel did not answer its hand-off: %w", r.err)
		}
		reply, err := DecodeKernelReply(r.line)
		if err != nil {
			return err
		}
		if reply.Seq != KernelReadySeq || reply.ExitCode != 0 {
			return fmt.Errorf("the kernel answered its hand-off with %+v", reply)
		}
		return nil
	case <-k.ended:
		return errors.New("the kernel ended before it answered its hand-off")
	case <-timer.C:
		return fmt.Errorf("the kernel did not answer its hand-off within %s", kernelAckTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kernelPidfd opens a pidfd for the kernel process of the ready sandbox p:
// the zygote's only child (it forked nothing else, and no code has run).
// Signals then go to that process, never to a pid that could be reused
// after it exited (SECURITY.md case 41).
func kernelPidfd(p *nsjail.Pending) (int, error) {
	if fd, ok, err := p.GPidfd(); ok {
		// A template fork: its G is the kernel process itself (T, outside
		// the sandbox, is what reports its exit).
		return fd, err
	}
	zpid, err := p.Pid()
	if err != nil {
		return -1, err
	}
	// The zygote is not reaped before Handoff's Sandbox is waited for, so
	// zpid is the zygote's.
	only := func() (int, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", zpid, zpid))
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) != 1 {
			return 0, fmt.Errorf("the zygote has %d children, want its kernel only", len(f))
		}
		return strconv.Atoi(f[0])
	}
	kpid, err := only()
	if err != nil {
		return -1, err
	}
	fd, err := unix.PidfdOpen(kpid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open of the kernel: %w", err)
	}
	// Still the zygote's child after the open: the pidfd is of that
	// process (a child stays listed, as a zombie, until the zygote reaps it).
	if again, err := only(); err != nil || again != kpid {
		unix.Close(fd)
		return -1, fmt.Errorf("the kernel process changed while its pidfd was opened (%v)", err)
	}
	return fd, nil
}

// relayExitReport passes the zygote's report of the kernel process's exit
// on to the sandbox's Wait, noting it and the cgroup's counters first
// (the cgroup is removed after Wait).
func (k *Kernel) relayExitReport(in <-chan syscall.WaitStatus, out chan<- syscall.WaitStatus) {
	defer close(out)
	ws, ok := <-in
	if !ok {
		return
	}
	st, err := k.sb.Stats()
	k.mu.Lock()
	k.report, k.haveReport = ws, true
	if err == nil && !k.haveFinal {
		k.final, k.haveFinal = st, true
	}
	k.mu.Unlock()
	out <- ws
}

// watch waits for the sandbox's end, then says why it ended, releases the
// pidfd and the control socket, unbinds the workspace and removes the warm
// workspace, and closes ended.
func (k *Kernel) watch(life context.Context) {
	res := k.sb.Wait(life)
	k.mu.Lock()
	switch {
	case k.killedFor != "":
		k.reason = k.killedFor
	case k.haveReport && k.report.Signaled() && k.report.Signal() == unix.SIGKILL && k.final.OOMKills > k.oomSeen,
		!k.haveReport && res.Status == nsjail.StatusOOM:
		k.reason = EndOOM
	default:
		k.reason = EndExited
	}
	if k.pidfd >= 0 {
		unix.Close(k.pidfd)
		k.pidfd = -1
	}
	k.mu.Unlock()
	k.w.control.Close()
	<-k.readerDone
	if k.bound != "" {
		if err := unbindVolume(k.bound, k.mntID); err != nil {
			// Never remove a directory the volume may still be bound on.
			k.log.Error("unable to unbind the session's workspace; keeping the warm workspace", "workspace", k.bound, "error", err)
		} else if err := workspace.Remove(k.warmWS); err != nil {
			k.log.Warn("unable to remove a kernel's warm workspace", "workspace", k.warmWS, "error", err)
		}
	}
	k.wakeRefill()
	k.log.Info("kernel ended", "reason", k.reason)
	close(k.ended)
}

func (k *Kernel) wakeRefill() {
	k.refillOnce.Do(func() {
		if k.refill != nil {
			k.refill()
		}
	})
}

// read frames what the kernel writes on ControlFD: one line per awaited
// reply. Anything else (bytes while no reply is awaited, a second line, a
// line past maxKernelReplyBytes) kills the kernel: SECURITY.md case 39.
func (k *Kernel) read() {
	defer close(k.readerDone)
	var line []byte
	chunk := make([]byte, maxKernelReplyBytes)
	for {
		n, err := k.w.control.Read(chunk)
		if n > 0 {
			if !k.takeBytes(&line, chunk[:n]) {
				return
			}
		}
		if err != nil {
			k.deliver(replyLine{err: fmt.Errorf("control socket: %w", err)})
			return
		}
	}
}

// takeBytes adds b to the line being read and delivers it when complete;
// false when the kernel broke the protocol (and is being killed).
func (k *Kernel) takeBytes(line *[]byte, b []byte) bool {
	k.mu.Lock()
	awaited := k.waiting != nil && !k.waiting.answered
	k.mu.Unlock()
	if !awaited {
		k.log.Warn("kernel wrote on its control socket while no reply was awaited; killing it", "bytes", truncateForLog(b))
		k.kill(EndProtocol)
		return false
	}
	*line = append(*line, b...)
	i := bytes.IndexByte(*line, MessageEnd)
	switch {
	case i >= 0 && i != len(*line)-1:
		k.log.Warn("kernel wrote past its reply; killing it", "bytes", truncateForLog(*line))
		k.kill(EndProtocol)
		return false
	case i >= 0:
		k.deliver(replyLine{line: *line})
		*line = nil
	case len(*line) >= maxKernelReplyBytes:
		k.log.Warn("kernel reply too long; killing it", "bytes", truncateForLog(*line))
		k.kill(EndProtocol)
		return false
	}
	return true
}

// deliver hands r to the awaited reply, if any, once.
func (k *Kernel) deliver(r replyLine) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.waiting != nil && !k.waiting.answered {
		k.waiting.answered = true
		k.waiting.ch <- r
	}
}

// expect opens the slot for the next reply; early says an Interrupt came
// while the execution was being prepared.
func (k *Kernel) expect() (a *awaitedReply, early bool) {
	a = &awaitedReply{ch: make(chan replyLine, 1)}
	k.mu.Lock()
	k.waiting = a
	early = k.interruptEarly
	k.preparing, k.interruptEarly = false, false
	k.mu.Unlock()
	return a, early
}

// prepare marks an execution begun (until expect, or done on a return
// before it).
func (k *Kernel) prepare() (done func()) {
	k.mu.Lock()
	k.preparing, k.interruptEarly = true, false
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.preparing, k.interruptEarly = false, false
		k.mu.Unlock()
	}
}

// unexpect closes it: a reply that comes later breaks the protocol.
func (k *Kernel) unexpect() {
	k.mu.Lock()
	k.waiting = nil
	k.mu.Unlock()
}

// kill ends the kernel's sandbox for reason, reading its counters first;
// the first reason wins. It does not wait (see ended).
func (k *Kernel) kill(reason string) {
	k.mu.Lock()
	// A kernel whose exit was reported is gone already: its report says why.
	first := k.killedFor == "" && k.reason == "" && !k.haveReport
	if first {
		k.killedFor = reason
	}
	k.mu.Unlock()
	if !first {
		return
	}
	if st, err := k.sb.Stats(); err == nil {
		k.mu.Lock()
		if !k.haveFinal {
			k.final, k.haveFinal = st, true
		}
		k.mu.Unlock()
	}
	k.cancel()
}

// signal sends sig to the kernel process by its pidfd.
func (k *Kernel) signal(sig unix.Signal) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pidfd < 0 {
		return ErrKernelEnded
	}
	if sig == unix.SIGINT {
		k.sigintSent = true
	}
	return unix.PidfdSendSignal(k.pidfd, sig, nil, 0)
}

// Exec runs one execution. The error is non-nil only when nothing ran
// (ErrKernelEnded, ErrKernelBusy).
func (k *Kernel) Exec(ctx context.Context, e KernelExec) (*KernelResult, error) {
	if !k.busy.TryLock() {
		return nil, ErrKernelBusy
	}
	defer k.busy.Unlock()
	if k.dying() {
		// Ending already (its exit was reported, or it is being killed):
		// nothing of this execution runs; EndReason answers once it returns.
		<-k.ended
	}
	select {
	case <-k.ended:
		return nil, ErrKernelEnded
	default:
	}
	defer k.wakeRefill()
	defer k.prepare()()
	log := k.log
	if e.Logger != nil {
		log = e.Logger.With("sandbox", k.sb.ID())
	}
	if whilePreparing != nil {
		whilePreparing(k)
	}
	// It idled frozen (SECURITY.md case 47): thawed now, after the
	// caller's snapshot of the workspace and before the request exists,
	// so an Interrupt (which signals only while a reply is awaited)
	// never targets a frozen kernel.
	if err := k.thaw(log); err != nil {
		return nil, err
	}
	k.seq++
	seq := k.seq
	msg, err := EncodeKernelRequest(KernelRequest{Seq: seq, Code: e.Code, Env: e.Env, Display: e.Display, Figures: e.Figures,
		DropInterrupt: k.takeSigintSent()})
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("unable to create the execution's stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("unable to create the execution's stderr pipe: %w", err)
	}
	evR, evW, err := runner.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return nil, err
	}
	// The execution's own memory peak, not the kernel's lifetime one
	// (pids.peak cannot be reset: PidsPeak is the kernel's).
	if err := k.sb.ResetMemoryPeak(); err != nil {
		log.Debug("unable to reset the kernel's memory peak; reporting its lifetime peak", "error", err)
	}
	before := k.idle
	if !k.haveIdle {
		if before, err = k.sb.Stats(); err != nil {
			log.Warn("unable to read the kernel's cgroup counters", "error", err)
		}
	}
	k.haveIdle = false
	res := &nsjail.Result{ID: k.sb.ID(), StartedAt: time.Now()}
	stdout := nsjail.NewCapture(outR, cmp.Or(k.lim.StdoutBytes, nsjail.DefaultLimits.StdoutBytes), e.Output.ForStream(nsjail.StreamStdout))
	stderr := nsjail.NewCapture(errR, cmp.Or(k.lim.StderrBytes, nsjail.DefaultLimits.StderrBytes), e.Output.ForStream(nsjail.StreamStderr))
	events := runner.NewReader(evR, runner.Want{Display: e.Display, Figures: e.Figures}, e.OnEvent)
	wait, early := k.expect()
	if early {
		// Thawed by now, the request not yet sent: noted by the kernel
		// and raised as the cell starts (as TestKernelInterruptBeforeTheRequest).
		if err := k.signal(unix.SIGINT); err != nil {
			log.Debug("unable to send an interrupt that came before the request", "error", err)
		}
	}
	if beforeSend != nil {
		beforeSend(k)
	}
	sent := make(chan error, 1)
	go func() {
		sent <- k.send(msg, outW, errW, evW)
		// Only the kernel holds the write ends now: the streams end with it.
		outW.Close()
		errW.Close()
		evW.Close()
	}()
	o := k.await(ctx, seq, wait, sent, e.Timeout, log)
	k.unexpect()
	res.FinishedAt = time.Now()
	// Frozen while the output and counters are read, done before Exec
	// returns: whatever the code left running stops before the caller
	// collects the workspace's artifacts (SECURITY.md case 47).
	frozen := k.freeze()
	out, errOut := stdout.Stop(), stderr.Stop()
	ev := events.Stop()

	after, ended := k.countersAfter()
	if !ended {
		if after, err = k.sb.Stats(); err != nil {
			log.Warn("unable to read the kernel's cgroup counters", "error", err)
			after = before
		} else {
			k.idle, k.haveIdle = after, true
		}
	}
	o.OOMKills = after.OOMKills - min(after.OOMKills, before.OOMKills)
	o.PidsLimitHits = after.PidsLimitHits - min(after.PidsLimitHits, before.PidsLimitHits)
	o.StdoutTruncated, o.StderrTruncated = out.Truncated, errOut.Truncated
	res.Stdout, res.Stderr = out.Bytes, errOut.Bytes
	res.StdoutBytes, res.StderrBytes = out.Total, errOut.Total
	res.StdoutTruncated, res.StderrTruncated = out.Truncated, errOut.Truncated
	res.Status, res.LimitsHit = nsjail.Classify(o)
	res.ExitCode, res.Signal = o.ExitCode, o.Signal
	res.Usage = nsjail.Usage{
		WallMS:          res.FinishedAt.Sub(res.StartedAt).Milliseconds(),
		CPUMS:           int64((after.CPUUsageNS - min(after.CPUUsageNS, before.CPUUsageNS)) / 1e6),
		PeakMemoryBytes: after.MemoryPeakBytes,
		PidsPeak:        after.PidsPeak,
	}
	if err := <-frozen; err != nil {
		// Left running, the code would run idle: end the kernel instead.
		log.Error("unable to freeze the kernel after its execution; killing it", "error", err)
		k.kill(EndProtocol)
		<-k.ended
	}
	if !ended && o.PidsLimitHits > 0 {
		// Threads or processes may be left half-made: end the kernel.
		k.kill(EndPids)
		<-k.ended
	}
	k.mu.Lock()
	k.oomSeen = max(k.oomSeen, after.OOMKills)
	k.mu.Unlock()
	kr := &KernelResult{Result: res, Events: ev}
	select {
	case <-k.ended:
		kr.Ended = k.EndReason()
	default:
	}
	log.Info("kernel execution finished", "seq", seq, "status", res.Status, "exit_code", res.ExitCode,
		"wall_ms", res.Usage.WallMS, "limits_hit", res.LimitsHit, "kernel_ended", kr.Ended)
	return kr, nil
}

// takeSigintSent says whether a SIGINT was sent since the last request,
// and forgets it: the request then tells the kernel to drop a SIGINT noted
// before it (a late one, for the execution before).
func (k *Kernel) takeSigintSent() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	sent := k.sigintSent
	k.sigintSent = false
	return sent
}

// beforeSend, when set (by tests), runs as an execution is awaited and
// before its request is sent: an Interrupt then comes before the kernel
// has read the request.
var beforeSend func(*Kernel)

// whilePreparing, when set (by tests), runs as an execution begins, before
// the kernel is thawed and its reply awaited.
var whilePreparing func(*Kernel)

// send writes the request line with the execution's stdout, stderr and
// events write ends beside it (SCM_RIGHTS).
func (k *Kernel) send(msg []byte, stdout, stderr, events *os.File) error {
	// The kernel reads its requests at once; a kernel that does not is
	// ended by the execution's timeout, which the caller runs meanwhile.
	return writeMessage(k.w.control, msg, unix.UnixRights(int(stdout.Fd()), int(stderr.Fd()), int(events.Fd())))
}

// await waits for execution seq's reply, interrupting it at its timeout
// or when ctx is done, and killing the kernel when the interrupt is not
// answered within kernelInterruptGrace or when the kernel breaks the
// protocol; it returns when the reply came or the kernel has ended, with
// what is known of the execution's end.
func (k *Kernel) await(ctx context.Context, seq uint64, wait *awaitedReply, sent <-chan error, timeout time.Duration,
	log *slog.Logger) nsjail.Outcome {
	var o nsjail.Outcome
	timer := time.NewTimer(cmp.Or(timeout, k.lim.Timeout, nsjail.DefaultLimits.Timeout))
	defer timer.Stop()
	var grace <-chan time.Time
	done := ctx.Done()
	replies := wait.ch
	protocol := func(why string, args ...any) {
		log.Warn("kernel broke its protocol; killing it: "+why, args...)
		k.kill(EndProtocol)
		replies = nil // whatever it says now is ignored
	}
	// interrupt sends SIGINT and gives the code kernelInterruptGrace to
	// answer, counted from the first interrupt.
	interrupt := func(at string) {
		if err := k.signal(unix.SIGINT); err != nil {
			log.Warn("unable to interrupt the kernel at "+at, "error", err)
		}
		if grace == nil {
			grace = time.After(kernelInterruptGrace)
		}
	}
	for {
		select {
		case err := <-sent:
			sent = nil
			if err != nil {
				protocol("the request could not be sent", "error", err)
			}
		case r := <-replies:
			if r.err != nil {
				// Every holder of the kernel's end closed it: it can never
				// answer. A kernel that died says so on its exit report.
				replies = nil
				grace = time.After(kernelInterruptGrace)
				log.Debug("kernel control socket closed", "error", r.err)
				continue
			}
			reply, err := DecodeKernelReply(r.line)
			if err != nil || reply.Seq != seq {
				protocol("a bad reply", "reply", truncateForLog(r.line), "error", err, "seq", seq)
				continue
			}
			o.Known, o.ExitCode = true, reply.ExitCode
			return o
		case <-timer.C:
			o.KilledFor = nsjail.StatusTimeout
			interrupt("its timeout")
		case <-grace:
			grace = nil
			switch o.KilledFor {
			case nsjail.StatusTimeout:
				k.kill(EndTimeout)
			case nsjail.StatusCancelled:
				k.kill(EndCancelled)
			default:
				protocol("its control socket closed")
			}
		case <-done:
			// The client went away or cancelled the execution: as at a
			// timeout, the code is interrupted and the kernel (the
			// session's state) killed only if it does not stop. Deleting
			// the session or draining the worker closes the kernel
			// outright (Close).
			done = nil
			o.KilledFor = nsjail.StatusCancelled
			interrupt("its cancellation")
		case <-k.ended:
			return k.endedOutcome(o)
		}
	}
}

// endedOutcome completes o for an execution during which the kernel ended.
func (k *Kernel) endedOutcome(o nsjail.Outcome) nsjail.Outcome {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch k.reason {
	case EndClosed, EndCancelled:
		o.KilledFor = nsjail.StatusCancelled
	case EndTimeout:
		o.KilledFor = nsjail.StatusTimeout
	}
	switch {
	case k.haveReport:
		o.Known = true
		o.ExitCode, o.Signal = nsjail.DecodeWaitStatus(k.report)
	case k.reason == EndProtocol:
		// The code broke the protocol: a failure, with no exit code.
		o.Known, o.ExitCode = true, -1
	}
	return o
}

// countersAfter are the counters as the kernel ended, when it has.
func (k *Kernel) countersAfter() (cgroup.Stats, bool) {
	select {
	case <-k.ended:
	default:
		return cgroup.Stats{}, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.final
	if k.reason == EndOOM && st.OOMKills <= k.oomSeen {
		// The counters could not be read at the end; the sandbox's own
		// result said OOM.
		st.OOMKills = k.oomSeen + 1
	}
	return st, true
}

// freeze freezes the kernel's sandbox, between its executions, in the
// background; the channel says how that went (nil too when the kernel is
// ending, or has: nothing idles then). A kernel stays frozen until the
// next Exec thaws it; Close and every kill thaw it after their SIGKILL
// (nsjail's Wait), Interrupt signals only during an execution, and its
// memory is still read from its cgroup (MemoryBytes).
func (k *Kernel) freeze() <-chan error {
	done := make(chan error, 1)
	select {
	case <-k.ended:
		done <- nil
		return done
	default:
	}
	go func() {
		err := k.sb.Freeze()
		if k.dying() {
			err = nil // ending anyway: nothing idles
		}
		done <- err
	}()
	return done
}

// thaw lets the kernel run again before an execution. It fails (and the
// kernel ends) when the kernel cannot be thawed, or when it died while
// frozen (its exit is only reported once its zygote runs again): nothing
// of the execution has run then.
func (k *Kernel) thaw(log *slog.Logger) error {
	if err := k.sb.Thaw(); err != nil {
		log.Error("unable to thaw the kernel; killing it", "error", err)
		k.kill(EndProtocol)
		<-k.ended
		return ErrKernelEnded
	}
	if k.processExited() {
		<-k.ended
		return ErrKernelEnded
	}
	return nil
}

// dying says the kernel is ending: its exit was reported, or it is being
// killed.
func (k *Kernel) dying() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.haveReport || k.killedFor != ""
}

// processExited says the kernel process has exited (its pidfd is
// readable), whether or not its zygote reported it yet.
func (k *Kernel) processExited() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pidfd < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(k.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// Interrupt raises KeyboardInterrupt in the running execution (SIGINT to
// the kernel process, by pidfd); the kernel and its state survive.
func (k *Kernel) Interrupt() error {
	k.mu.Lock()
	running := k.waiting != nil && !k.waiting.answered
	if !running && k.preparing {
		k.interruptEarly = true // sent by Exec once its reply is awaited
	}
	k.mu.Unlock()
	select {
	case <-k.ended:
		return ErrKernelEnded
	default:
	}
	if !running {
		return nil // nothing to interrupt; a late SIGINT would be noted as pending
	}
	return k.signal(unix.SIGINT)
}

// Close ends the kernel (EndClosed unless it had ended already), waits for
// its sandbox to be destroyed and unbinds the workspace. Idempotent.
func (k *Kernel) Close() {
	k.kill(EndClosed)
	<-k.ended
}

// Ended is closed once the kernel has ended; EndReason then says why.
func (k *Kernel) Ended() <-chan struct{} { return k.ended }

// EndReason is why the kernel ended ("" while it runs).
func (k *Kernel) EndReason() string {
	select {
	case <-k.ended:
	default:
		return ""
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reason
}

// StartedAt is when the kernel was handed its session.
func (k *Kernel) StartedAt() time.Time { return k.startedAt }

// Warm reports whether the kernel came from a ready warm sandbox.
func (k *Kernel) Warm() bool { return k.warm }

// Forked reports whether the kernel came from a fork of its template made
// for it on the request path (Config.Forks, no warm sandbox was ready).
func (k *Kernel) Forked() bool { return k.forked }

// MemoryBytes is what the kernel's cgroup accounts now.
func (k *Kernel) MemoryBytes() int64 {
	select {
	case <-k.ended:
		return 0
	default:
	}
	st, _ := k.sb.Stats()
	return st.MemoryCurrentBytes
}

// openVolumeRoot opens src, a session's volume, as an O_PATH fd (no link
// followed) and checks that it is the root of a mount. A volume not
// mounted there (an operator's unmount, a lazy detach, the path reused)
// leaves a plain directory of the host, which bound as /workspace would
// hold neither the session's files nor its quota (SECURITY.md case 48).
// bindVolume clones the tree of this very fd, never the path again.
func openVolumeRoot(src string) (int, error) {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the session's workspace %s: %w", src, err)
	}
	var st unix.Statx_t
	err = unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE, &st)
	switch {
	case err != nil:
		err = fmt.Errorf("statx %s: %w", src, err)
	case st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0:
		err = fmt.Errorf("statx %s: the kernel does not report mount roots (needs Linux 5.8)", src)
	case st.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0:
		err = fmt.Errorf("the session's workspace %s is not mounted (not the root of a mount)", src)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// bindVolume binds the tree of root (openVolumeRoot's fd of a session's
// volume) on dst (a warm sandbox's shared workspace mount), nosuid,
// nodev, noexec (and read-only when readOnly), and returns the bind's
// mount id. The new mount propagates into the sandbox's /workspace, where
// it is locked: the code can neither unmount it nor change its flags
// (SECURITY.md case 40).
func bindVolume(root int, dst string, readOnly bool) (uint64, error) {
	fd, err := unix.OpenTree(root, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return 0, fmt.Errorf("open_tree of the session's workspace: %w", err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return 0, fmt.Errorf("mount_setattr: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return 0, fmt.Errorf("move_mount onto %s: %w", dst, err)
	}
	id, err := mountID(dst)
	if err != nil {
		unix.Unmount(dst, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		return 0, err
	}
	return id, nil
}

// unbindVolume undoes bindVolume: it detaches the bind with mount id id
// from dir, refusing to unmount anything else, and checks it is gone.
func unbindVolume(dir string, id uint64) error {
	top, err := mountID(dir)
	if err != nil {
		return err
	}
	if top != id {
		return fmt.Errorf("the mount on %s is %d, not the session's bind %d", dir, top, id)
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unable to unbind the session's workspace from %s: %w", dir, err)
	}
	if top, err := mountID(dir); err != nil || top == id {
		return fmt.Errorf("the session's workspace is still bound on %s (%v)", dir, err)
	}
	return nil
}

// mountID is the id of the mount at the top of dir.
func mountID(dir string) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return 0, fmt.Errorf("statx %s: %w", dir, err)
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("statx: no mount id on this kernel")
	}
	return st.Mnt_id, nil
}
