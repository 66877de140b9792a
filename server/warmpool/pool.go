// Package warmpool keeps pre-started, single-use sandboxes whose Python has
// already imported the data stack, one set per template (a policy's shape),
// and runs an execution in one of them when it matches (Claim: the
// server writes the request straight into the claimed sandbox's
// workspace); otherwise the server runs the execution cold. Each warm
// sandbox's first process is zygote.py, or a fork of a template (fork.go);
// how the pool and it talk is protocol.go. A warm sandbox (or a cold one)
// can also become a session's long-lived kernel (kernel.go).
package warmpool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/workspace"
	"golang.org/x/sys/unix"
)

// Sandboxer runs the worker's sandboxes: *nsjail.Runner, or a wrapper of
// one. The server runs its cold executions through it (Run), and the pool
// its pre-started sandboxes (Prestart).
type Sandboxer interface {
	// Run runs spec cold; the error is non-nil only when nothing was
	// started (see nsjail.Runner.Run).
	Run(ctx context.Context, spec nsjail.Spec) (*nsjail.Result, error)
	// Prestart starts a sandbox that waits for its execution (see
	// nsjail.Runner.Prestart).
	Prestart(spec nsjail.Spec, files ...*os.File) (*nsjail.Pending, error)
	// HostUID and HostGID are the sandbox user as the host sees it: a
	// workspace must be owned by them to be writable inside.
	HostUID() int
	HostGID() int
	// WaitForCleanup blocks until every finished sandbox has been removed
	// (see nsjail.Runner.WaitForCleanup); a drain waits for it.
	WaitForCleanup()
	// HoldFreezerAnchor keeps freezing cheap while sandboxes may be
	// frozen: session kernels idle frozen, and every execution's sandbox
	// is frozen on its done word (see nsjail.Runner.HoldFreezerAnchor).
	HoldFreezerAnchor() (release func() error, err error)
}

// Config configures the warm pool. Nothing is defaulted but ExecForkWait:
// the server passes its config's values (server/config sets the defaults
// and checks them).
type Config struct {
	// Size is the number of ready sandboxes kept per template whose own
	// Size is 0 (0 with no template sized: the pool is off, and every
	// execution takes the cold path).
	Size int
	// MaxIdle retires a ready sandbox that waited this long, so a long-idle
	// worker does not hold memory forever and preloads stay fresh after an
	// image or config change. Required (> 0) when Size > 0.
	MaxIdle time.Duration
	// Preload lists the modules imported before hand-off (none when empty).
	Preload []string
	// WorkRoot is where the warm sandboxes' workspaces live. Required when
	// Size > 0.
	WorkRoot string
	// WorkspaceBytes, when > 0, mounts a tmpfs of this size on every warm
	// workspace, as the server does on its own (see workspace.Mount); when 0
	// the workspaces are plain directories (tests: no session volume can
	// be bound on one).
	WorkspaceBytes int64
	// WorkspaceInodes is the tmpfs's nr_inodes. Required (> 0) when
	// WorkspaceBytes > 0: tmpfs reads 0 as unlimited.
	WorkspaceInodes int64
	// Forks makes each warm sandbox a fork of a template that imported
	// the preload once per templateKey (fork.go; TEMPLATE.md), instead of a
	// zygote that imports it itself. The sandboxer must be a Forker.
	Forks bool
	// TemplateMaxForks and TemplateMaxAge rotate a template (a new one is
	// started, the old one stopped once its forks have ended) after it
	// made this many forks or lived this long (0: no bound).
	TemplateMaxForks int
	TemplateMaxAge   time.Duration
	// ExecForkWait bounds how long an execution that found its pool
	// empty waits for its template's fork lock before it runs cold
	// (forkForExecution). Not a server setting: 0 means
	// defaultExecForkWait; tests set their own.
	ExecForkWait time.Duration
}

// Stats is the pool's state, for /metrics.
type Stats struct {
	Ready, Starting, Taken, RefillFailures, Retired uint64
	// FallbackDead, FallbackEnv and FallbackWrite count executions that
	// matched a template but ran cold: the warm sandbox had died, the
	// request sets a variable a warm sandbox cannot apply, or the request
	// could not be written into the claimed sandbox's workspace (the claim
	// released: Claim.Release). The request always fits a workspace
	// (server/config), so a write fails only when the sandbox, which owns
	// the workspace, filled it or put names in the way: a sign of a
	// compromised template (SECURITY.md case 73).
	FallbackDead, FallbackEnv, FallbackWrite uint64
	// IdleMemoryBytes sums what the ready sandboxes' cgroups account.
	IdleMemoryBytes int64
	// TakenBy is Taken by template name (a policy on a runtime).
	TakenBy map[string]uint64
	// With Config.Forks: Templates is the number of template processes
	// running (retired ones included until they end), TemplatesStarted
	// and TemplateForks count those started (rotations included) and the
	// forks they made (for the pool and on demand).
	Templates                       int
	TemplatesStarted, TemplateForks uint64
	// TemplatesAhead counts the templates started ahead of a rotation
	// (rotatesSoon), TemplatesStarted included.
	TemplatesAhead uint64
	// ExecForks and KernelForks count the executions and the session
	// kernels forked from their template on demand (Config.Forks, no
	// ready warm sandbox: Claim, StartKernel): not taken from the pool (not
	// in Taken) and not cold. FallbackFork counts those whose fork failed
	// (the template broken, refused or not startable) and that ran cold
	// instead.
	ExecForks, KernelForks, FallbackFork uint64
}

// Pool keeps pre-started, single-use sandboxes whose Python has already
// imported the data stack, and serves an execution from one of them when it
// matches a template; otherwise it runs the execution cold. A sandbox is
// never reused: after its one execution it is destroyed and the pool
// refills in the background.
type Pool struct {
	sandboxer Sandboxer
	cfg       Config
	log       *slog.Logger

	mu        sync.Mutex
	templates []*templatePool
	// sources are the template pools' template processes, one per
	// templateKey (Config.Forks).
	sources []*forkSource
	closed  bool
	wg      sync.WaitGroup
	stop    chan struct{}
	stats   Stats
	// retiring tracks the retirements that run in the background: of
	// sandboxes found dead at hand-off or given up on, and of templates.
	retiring sync.WaitGroup
}

type templatePool struct {
	t Template
	// src is the template process this pool's forks come from, with
	// Config.Forks: shared with every template pool of the same
	// templateKey.
	src     *forkSource
	ready   []*warmSandbox
	refill  chan struct{}
	backoff time.Duration
	taken   uint64 // under Pool.mu: Stats.TakenBy
}

// forkSource is a template process (and its successor) and its fork
// lock, shared by the template pools whose Templates have one templateKey:
// a template process holds nothing of a policy but what its key says, so
// the policies of one runtime with the same environment and rlimits (the
// server's two, by default) fork from one template, whose pages their
// forks all share (TEMPLATE.md section 12, M2).
type forkSource struct {
	// t is the first of its Templates: the template process is started
	// with its rootfs, environment and limits (the key's part of them).
	t Template
	// forking is the template's fork lock (a semaphore of one: holding
	// it is having sent its one value), held for the template's part of
	// each fork (makeFork): by each pool's refill, by an execution or a
	// session kernel forked on demand, and by Close as it stops proc. It
	// guards proc (its start, rotation and retirement, and its control
	// socket: one request at a time) and keeps one fork of the template
	// between nsjail's PrepareShell and EndFork at a time, which cgroup
	// v2's shells rely on (tpl-<id>/cgroup.procs is the template's in
	// between: SECURITY.md case 70). A channel rather than a sync.Mutex
	// so that a request's wait for it ends with its request or the
	// pool's Close (lockFork).
	forking chan struct{}
	// proc is the running template process, with Config.Forks (nil
	// until the first fork, or after one broke). Under forking.
	proc *templateProc
	// forkErr is the last startFork's error (nil after a fork made).
	// Under Pool.mu.
	forkErr error
	// next is proc's successor, started ahead when proc is about to
	// rotate (rotatesSoon): it imports the preload meanwhile and forks
	// nothing until it becomes proc. Under forking.
	next *templateProc
}

// templateKey is what a template process takes of a Template (fork.go's
// startTemplate: its rootfs, environment and limits): everything but the
// limits each fork's shell sets for its execution (its cgroup's memory,
// pids and CPU, and the timeout), which the template never has
// (nsjail.Runner.StartTemplate). What must be the same for every fork:
// the rootfs and environment T imported the preload in (server.Policy's
// BaseEnv has thread counts from the policy's CPUs: policies whose CPUs
// round up differently get a template each) and the rlimits (a fork
// cannot raise a hard rlimit above its template's). The rest of T's
// sandbox, its tmpfs sizes and output bounds, no fork uses (G joins its
// shell's mount namespace, and its output goes to its own pipes): kept
// in the key anyway, so that T is started exactly as every fork's
// Template asks.
type templateKey struct {
	rootfs string
	env    string
	limits nsjail.Limits
}

func templateKeyOf(t Template) templateKey {
	// As the process gets it: one value per name, the last (runc's
	// prepareEnv), whatever the order.
	vars := envMap(t.Env)
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	lim := t.Limits
	lim.Timeout, lim.MemoryBytes, lim.Pids, lim.CPUs = 0, 0, 0, 0
	return templateKey{rootfs: t.Rootfs, env: fmt.Sprintf("%q", env), limits: lim}
}

type warmSandbox struct {
	pending   *nsjail.Pending
	workspace string
	// control is the pool's end of ControlFD (the hand-off message, a
	// kernel's executions); peer is the sandbox's end, which the pool keeps
	// open until the hand-off is known to be read: bytes unread in it
	// outlive the sandbox then (SECURITY.md case 34).
	control *net.UnixConn
	peer    *os.File
	// exit delivers the code's process's wait status, as the zygote got it
	// from the kernel; it closes without a value if the zygote died.
	exit    <-chan syscall.WaitStatus
	readyAt time.Time
}

// dead reports whether the warm sandbox can no longer run an execution
// (SECURITY.md case 34): its zygote was killed (by the host, the OOM killer)
// or has exited, or its code's process has exited (the zygote reported it).
// A code's process killed after this check never reads its hand-off, which
// runWarm sees in the pipe.
func (w *warmSandbox) dead() bool { return w.deadWhy() != "" }

// deadWhy says why w can no longer be handed off ("" while it can), for
// the log.
func (w *warmSandbox) deadWhy() string {
	select {
	case <-w.exit:
		return "its exit report arrived: the process it would hand off has ended"
	default:
	}
	if !w.pending.Alive() {
		return "its process (or a template fork's template) is gone, a zombie or being killed"
	}
	return ""
}

// New starts filling each template's size (Template.Size, else cfg.Size) of
// sandboxes in the background. With every size 0 it starts nothing and
// Claim finds nothing.
func New(sandboxer Sandboxer, cfg Config, templates []Template, log *slog.Logger) (*Pool, error) {
	if cfg.Size < 0 {
		return nil, fmt.Errorf("pool size must be >= 0, got: %d", cfg.Size)
	}
	enabled := cfg.Size > 0
	for _, t := range templates {
		if t.Size < 0 {
			return nil, fmt.Errorf("template %s: size must be >= 0, got: %d", t.Name, t.Size)
		}
		enabled = enabled || t.Size > 0
	}
	if enabled {
		if cfg.WorkRoot == "" {
			return nil, errors.New("pool work root is required when the pool is enabled")
		}
		if cfg.MaxIdle <= 0 {
			return nil, fmt.Errorf("pool max idle must be > 0 when the pool is enabled, got: %s", cfg.MaxIdle)
		}
		if cfg.WorkspaceBytes > 0 && cfg.WorkspaceInodes <= 0 {
			return nil, fmt.Errorf("pool workspace inodes must be > 0 with a workspace tmpfs, got: %d", cfg.WorkspaceInodes)
		}
		if _, ok := sandboxer.(Forker); cfg.Forks && !ok {
			return nil, fmt.Errorf("template forks need a sandboxer that starts templates (%T does not)", sandboxer)
		}
	}
	p := &Pool{sandboxer: sandboxer, cfg: cfg, log: log, stop: make(chan struct{})}
	if !enabled {
		return p, nil
	}
	if err := os.MkdirAll(cfg.WorkRoot, 0o711); err != nil {
		return nil, fmt.Errorf("unable to create pool work root: %w", err)
	}
	sources := map[templateKey]*forkSource{}
	for _, t := range templates {
		if t.Size == 0 {
			t.Size = cfg.Size
		}
		if t.Size == 0 {
			continue
		}
		key := templateKeyOf(t)
		src := sources[key]
		if src == nil {
			src = &forkSource{t: t, forking: make(chan struct{}, 1)}
			sources[key] = src
			p.sources = append(p.sources, src)
		}
		tp := &templatePool{t: t, src: src, refill: make(chan struct{}, 1)}
		p.templates = append(p.templates, tp)
		p.wg.Add(1)
		go p.keepFull(tp)
	}
	return p, nil
}

// Stats returns the pool's current state.
func (p *Pool) Stats() Stats {
	st, ready := p.counts()
	for _, w := range ready {
		st.IdleMemoryBytes += w.pending.MemoryBytes()
	}
	return st
}

// Ready is Stats().Ready without Stats' reads of every ready sandbox's
// cgroup (a benchmark that polls it measures the pool, not itself).
func (p *Pool) Ready() uint64 {
	st, _ := p.counts()
	return st.Ready
}

// counts is Stats but for IdleMemoryBytes, and the ready sandboxes.
func (p *Pool) counts() (Stats, []*warmSandbox) {
	p.mu.Lock()
	st := p.stats
	var ready []*warmSandbox
	st.TakenBy = make(map[string]uint64, len(p.templates))
	for _, tp := range p.templates {
		ready = append(ready, tp.ready...)
		st.TakenBy[tp.t.Name] += tp.taken
	}
	st.Ready = uint64(len(ready))
	p.mu.Unlock()
	return st, ready
}

// Claim is a ready sandbox taken for one execution whose request is not
// written yet (Pool.Claim): the caller writes it straight into Workspace
// and calls exactly one of Run, or Release if it cannot (a claim neither
// ran nor released holds its sandbox, workspace and fds for good). One
// goroutine's: its methods take no lock. That spares a warm execution the
// request's own tmpfs and its copy into the sandbox's, ~0.5 ms of a warm
// `print(1)`'s few (TEMPLATE.md section 12, M5).
type Claim struct {
	p        *Pool
	w        *warmSandbox
	tp       *templatePool
	onDemand bool // forked for this execution (forkForExecution)
	used     bool
}

// Claim takes a ready sandbox that can run spec, given the workspace the
// sandbox brings (spec.Workspace is not looked at), or, when none is ready
// and code (the source of the file spec runs, not written yet) imports
// part of the preload, forks one on demand (forkForExecution); nil when
// spec is to run cold.
func (p *Pool) Claim(ctx context.Context, spec nsjail.Spec, code string) *Claim {
	w, tp := p.take(func(t Template) (bool, bool) { return t.matches(&spec) })
	onDemand := false
	if w == nil && p.cfg.Forks && codeImportsPreload([]byte(code), p.cfg.Preload) {
		w, tp = p.forkForExecution(ctx, &spec)
		onDemand = w != nil
	}
	if w == nil {
		return nil
	}
	return &Claim{p: p, w: w, tp: tp, onDemand: onDemand}
}

// Workspace is the claimed sandbox's workspace, empty until the caller
// writes the request in. It is the caller's to collect from and remove
// after a Run that delivered; otherwise the pool removes it.
func (c *Claim) Workspace() string { return c.w.workspace }

// Release ends a claim the caller will not Run (its request could not be
// written: the sandbox filled its workspace or put names in the way,
// SECURITY.md case 73), counted in Stats.FallbackWrite: the sandbox is
// retired and its workspace removed, in the background.
func (c *Claim) Release() {
	if c.used {
		return
	}
	c.used = true
	c.p.mu.Lock()
	c.p.stats.FallbackWrite++
	c.p.mu.Unlock()
	// In the background, as dropDead's: a sandbox that does not exit when
	// told would hold the caller for retireGrace.
	p := c.p
	p.retiring.Add(1)
	go func() {
		defer p.retiring.Done()
		p.retire(c.w)
		if !c.onDemand {
			c.tp.wakeRefill()
		}
	}()
}

// Run hands spec to the claimed sandbox, in its workspace (spec.Workspace
// is set to c.Workspace(), the request written in), and waits. res is the
// result; what the code left in /workspace is in c.Workspace(), which is
// hostile (see package workspace): the caller collects from it and then
// removes it. delivered is false when the sandbox had died before its
// code's process read the hand-off: nothing of the execution ran, the pool
// removes the sandbox and its workspace, and the caller runs the execution
// cold from its own copy of the request. The error is non-nil only when
// nothing ran (see nsjail.Runner.Run).
func (c *Claim) Run(ctx context.Context, spec nsjail.Spec) (res *nsjail.Result, delivered bool, err error) {
	if c.used {
		return nil, false, errors.New("warm pool: a claim runs once")
	}
	c.used = true
	spec.Workspace = c.w.workspace
	p := c.p
	res, delivered, err = p.runWarm(ctx, c.w, spec)
	if !c.onDemand {
		p.refillAfter(c.tp, res)
	}
	if err != nil {
		return nil, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !delivered:
		p.stats.FallbackDead++
	case c.onDemand:
		p.stats.ExecForks++
	default:
		p.stats.Taken++
		c.tp.taken++
	}
	return res, delivered, nil
}

// refillAfter wakes tp's refill once the execution that took one of its
// sandboxes is over: when res's sandbox is gone (Result.Ended), or now
// when it is already. Making a sandbox ready is CPU-heavy (a fork, a
// libcontainer start), and so is the end of the one it replaces (the
// kill, the exit of an interpreter that mapped the whole data stack),
// which comes after the answer (nsjail.Spec.Done): started at once, the
// refill would compete with both, and with the answer still on its way,
// for a small VM's CPUs (TEMPLATE.md section 12, M5: the warm print(1)
// round trip's p90 was lower in seven alternated pairs of eight with the
// refill waiting, throughput unchanged).
func (p *Pool) refillAfter(tp *templatePool, res *nsjail.Result) {
	if res == nil || res.Ended == nil {
		tp.wakeRefill()
		return
	}
	go func() {
		select {
		case <-res.Ended:
			tp.wakeRefill()
		case <-p.stop:
		}
	}()
}

// defaultExecForkWait is Config.ExecForkWait's default: other forks hold
// the lock a few ms each, and a template's start and import (~1.5 s) is
// not worth waiting for.
const defaultExecForkWait = 100 * time.Millisecond

// forkForExecution makes a fork of spec's template for this execution,
// with Config.Forks, when the pool had none ready (a burst larger than the
// pool, or a refill that cannot keep up); its caller asks it only for code
// that imports part of the preload (codeImportsPreload): a
// fork is ready in ~50 ms and spares the import, where a cold pandas step
// costs ~600 ms, mostly its import, in CPU as much as in time; code that
// imports none of it starts cold about as cheaply as a fork of the
// template (TEMPLATE.md section 12, "Forks on demand"). It returns nil,
// and the execution runs cold, when the pool has no such template, its fork
// lock stays busy for Config.ExecForkWait, it runs no template that has answered
// a fork already and is not due to rotate (a template's start or import
// would cost more than the cold run), or the fork fails.
func (p *Pool) forkForExecution(ctx context.Context, spec *nsjail.Spec) (*warmSandbox, *templatePool) {
	f, ok := p.sandboxer.(Forker)
	if !ok || !p.cfg.Forks {
		return nil, nil
	}
	tp := p.templateFor(func(t Template) bool {
		shape, env := t.matches(spec)
		return shape && env
	})
	if tp == nil {
		return nil, nil
	}
	w, err := p.makeFork(ctx, cmp.Or(p.cfg.ExecForkWait, defaultExecForkWait), f, tp, false, func() error {
		if err := ctx.Err(); err != nil {
			return err // the request ended while it waited
		}
		if tp.src.proc == nil || tp.src.proc.forks == 0 || p.rotates(tp.src.proc) {
			return errNoTemplate
		}
		return nil
	})
	switch {
	case err == nil:
		return w, tp
	case errors.Is(err, errNoTemplate), errors.Is(err, errPoolClosed),
		err == context.DeadlineExceeded, err == context.Canceled: // lockFork's and fork's own, unwrapped: not a failure's cause
		// Not now (the lock stayed busy, the request ended): cold.
	default:
		p.mu.Lock()
		p.stats.FallbackFork++
		p.mu.Unlock()
		cmp.Or(spec.Logger, p.log).Warn("no fork could be made for an execution; running it cold", "error", err)
	}
	return nil, nil
}

// templateFor is the first template pool whose template matches.
func (p *Pool) templateFor(matches func(Template) bool) *templatePool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tp := range p.templates {
		if matches(tp.t) {
			return tp
		}
	}
	return nil
}

// closeControl closes both ends of w's ControlFD channel held by the pool.
func (w *warmSandbox) closeControl() {
	w.control.Close()
	w.peer.Close()
}

// take finds a ready sandbox of a template that matches (see
// Template.Matches); one whose environment alone differs is counted.
func (p *Pool) take(matches func(Template) (shape, env bool)) (*warmSandbox, *templatePool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil
	}
	envDiffers := false
	for _, tp := range p.templates {
		shape, env := matches(tp.t)
		if shape && !env {
			envDiffers = true
		}
		if !shape || !env || len(tp.ready) == 0 {
			continue
		}
		w := tp.ready[0]
		tp.ready = tp.ready[1:]
		return w, tp
	}
	if envDiffers {
		p.stats.FallbackEnv++
	}
	return nil, nil
}

func (tp *templatePool) wakeRefill() {
	select {
	case tp.refill <- struct{}{}:
	default:
	}
}

// runWarm hands spec's file over to the warm sandbox, its request in
// its workspace already, and waits; what the code leaves stays in the warm
// workspace, laid out as after a cold run, for the caller to collect.
// delivered is false when the sandbox had died before its code's process
// read the hand-off: nothing of the execution ran, and the caller runs it
// cold.
func (p *Pool) runWarm(ctx context.Context, w *warmSandbox, spec nsjail.Spec) (res *nsjail.Result, delivered bool, err error) {
	h, _ := handoffOf(&spec) // Matches took it
	msg, err := EncodeHandoff(h)
	if err != nil {
		p.retire(w)
		return nil, false, err
	}
	var rights []byte
	if h.Events {
		// The execution's events pipe goes with the message (SCM_RIGHTS);
		// a message never read takes it along when the socket closes.
		rights = unix.UnixRights(int(spec.ExtraFiles[0].Fd()))
	}
	sb, out, errOut := w.pending.Handoff(nsjail.HandoffOptions{Timeout: spec.Limits.Timeout, Logger: spec.Logger, ExitReport: w.exit,
		Output: spec.Output, Done: spec.Done})
	if len(out)+len(errOut) > 0 {
		p.log.Warn("warm sandbox wrote output before hand-off (dropped)", "sandbox", sb.ID(),
			"stdout", truncateForLog(out), "stderr", truncateForLog(errOut))
	}
	if why := w.deadWhy(); why != "" {
		p.dropDead(w, sb, spec.Logger, false, why)
		return nil, false, nil
	}
	// The peer stays open until the sandbox is gone, so that what is left
	// unread in it tells whether the code's process ever took the hand-off.
	if err := writeMessage(w.control, msg, rights); err != nil {
		p.dropDead(w, sb, spec.Logger, false, fmt.Sprintf("the hand-off failed: %v", err))
		return nil, false, nil
	}
	res = sb.Wait(ctx)
	unread, uerr := pipeUnread(w.peer)
	w.closeControl()
	if uerr == nil && unread > 0 {
		// The code's process never read the whole message (it runs the
		// code only after MessageEnd): none of the execution ran.
		p.dropDead(w, sb, spec.Logger, true, "the hand-off was never read")
		return nil, false, nil
	}
	if uerr != nil {
		p.log.Warn("warm pool: unable to check the hand-off pipe", "sandbox", sb.ID(), "error", uerr)
	}
	// w.workspace is hostile now: the caller's collector opens everything
	// in it with O_NOFOLLOW and never follows a link.
	return res, true, nil
}

// writeMessage writes msg on the control socket with rights (SCM_RIGHTS,
// or nil) attached to its first byte.
func writeMessage(c *net.UnixConn, msg, rights []byte) error {
	n, _, err := c.WriteMsgUnix(msg, rights, nil)
	if err == nil && n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	return err
}

// dropDead ends a warm sandbox that died before its code ran, handed sb,
// and removes its workspace (which holds only the request), or only
// removes the workspace once the sandbox was waited for.
func (p *Pool) dropDead(w *warmSandbox, sb *nsjail.Sandbox, log *slog.Logger, waited bool, why string) {
	cmp.Or(log, p.log).Warn("warm sandbox found dead at hand-off; running the execution cold", "sandbox", sb.ID(), "why", why)
	p.retiring.Add(1)
	go func() {
		defer p.retiring.Done()
		if !waited {
			// As retire, for a sandbox already handed off.
			w.closeControl()
			ctx, cancel := context.WithTimeout(context.Background(), retireGrace)
			sb.Wait(ctx)
			cancel()
			workspace.Remove(w.workspace)
		} else if err := workspace.Remove(w.workspace); err != nil {
			p.log.Warn("warm pool: unable to remove a dead sandbox's workspace", "workspace", w.workspace, "error", err)
		}
	}()
}

// pipeUnread is the number of bytes in f's receive queue, not read yet
// (FIONREAD, alias TIOCINQ and SIOCINQ: f is the sandbox's end of the
// ControlFD socketpair, or either end of a pipe).
func pipeUnread(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	n, ierr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
		return 0, err
	}
	return n, ierr
}

func truncateForLog(b []byte) string {
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}

// keepFull keeps tp at its Size of ready sandboxes until Close, retiring those
// idle longer than MaxIdle.
func (p *Pool) keepFull(tp *templatePool) {
	defer p.wg.Done()
	tick := time.NewTicker(min(p.cfg.MaxIdle/4, 30*time.Second))
	defer tick.Stop()
	for {
		p.retireIdle(tp)
		for p.need(tp) {
			if !p.startOne(tp) {
				// Back off so a broken image or config does not spin.
				tp.backoff = min(max(2*tp.backoff, 100*time.Millisecond), 30*time.Second)
				select {
				case <-p.stop:
					return
				case <-time.After(tp.backoff):
				}
				continue
			}
			tp.backoff = 0
		}
		select {
		case <-p.stop:
			return
		case <-tp.refill:
		case <-tick.C:
		}
	}
}

func (p *Pool) need(tp *templatePool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && len(tp.ready) < tp.t.Size
}

func (p *Pool) retireIdle(tp *templatePool) {
	p.mu.Lock()
	var old []*warmSandbox
	keep := tp.ready[:0]
	for _, w := range tp.ready {
		if time.Since(w.readyAt) > p.cfg.MaxIdle {
			old = append(old, w)
		} else {
			keep = append(keep, w)
		}
	}
	tp.ready = keep
	p.stats.Retired += uint64(len(old))
	p.mu.Unlock()
	for _, w := range old {
		p.retire(w)
	}
}

// retireGrace bounds the wait for a retired warm sandbox to exit by itself.
const retireGrace = 5 * time.Second

// retire ends an unused warm sandbox: EOF on its control pipe makes the
// code's process, then the zygote, exit 0; a bounded wait kills it otherwise.
func (p *Pool) retire(w *warmSandbox) {
	w.control.Close()
	w.pending.Retire(retireGrace, w.exit)
	w.peer.Close()
	workspace.Remove(w.workspace)
}

// startOne starts one warm sandbox and waits until its preload is done.
func (p *Pool) startOne(tp *templatePool) bool {
	p.mu.Lock()
	p.stats.Starting++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.stats.Starting--
		p.mu.Unlock()
	}()
	var w *warmSandbox
	var err error
	if f, ok := p.sandboxer.(Forker); ok && p.cfg.Forks {
		w, err = p.makeFork(context.Background(), 0, f, tp, true, nil)
	} else {
		w, err = p.start(tp.t)
	}
	if errors.Is(err, errPoolClosed) {
		return true // keepFull sees the stop and returns
	}
	if err != nil {
		p.mu.Lock()
		p.stats.RefillFailures++
		p.mu.Unlock()
		p.log.Error("warm pool: unable to start a sandbox", "policy", tp.t.Name, "error", err)
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.retiring.Add(1)
		go func() {
			defer p.retiring.Done()
			p.retire(w)
		}()
		return true
	}
	tp.ready = append(tp.ready, w)
	return true
}

var errPoolClosed = errors.New("pool closed")

// readyTimeout bounds the preload; a stack that takes longer is broken.
const readyTimeout = 2 * time.Minute

func (p *Pool) start(t Template) (*warmSandbox, error) {
	ws, err := workspace.CreateWarm(p.cfg.WorkRoot, workspace.Options{
		Bytes: p.cfg.WorkspaceBytes, Inodes: p.cfg.WorkspaceInodes, UID: p.sandboxer.HostUID(), GID: p.sandboxer.HostGID(),
	})
	if err != nil {
		return nil, err
	}
	spec := nsjail.Spec{
		Rootfs:    t.Rootfs,
		Args:      zygoteArgs(p.cfg.Preload),
		Env:       slices.Clone(t.Env),
		Cwd:       inside.Workspace,
		Workspace: ws,
		Limits:    t.Limits,
		// A refill must take little CPU from running executions
		// (cgroup.BackgroundShares).
		Background: true,
	}
	w, err := p.launch(context.Background(), p.stop, spec)
	if err != nil {
		workspace.Remove(ws)
		return nil, err
	}
	return w, nil
}

// launch starts spec, a zygote's (zygoteArgs), and waits until its
// preload is done (bounded by readyTimeout, ctx and stop, which makes it
// errPoolClosed). spec.Workspace is the caller's to remove.
func (p *Pool) launch(ctx context.Context, stop <-chan struct{}, spec nsjail.Spec) (*warmSandbox, error) {
	ctl, ctlPeer, err := controlPair()
	if err != nil {
		return nil, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		ctl.Close()
		ctlPeer.Close()
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		ctl.Close()
		ctlPeer.Close()
		readyR.Close()
		readyW.Close()
		return nil, err
	}
	// No deadline runs until the hand-off, which sets the execution's; until
	// then the pool's own timer applies.
	pending, err := p.sandboxer.Prestart(spec, zygoteFiles(ctlPeer, readyW, statusW)...)
	readyW.Close()
	statusW.Close()
	if err != nil {
		ctl.Close()
		ctlPeer.Close()
		readyR.Close()
		statusR.Close()
		return nil, err
	}
	if err := pending.OpenCounters(); err != nil {
		p.log.Debug("warm pool: counters not opened ahead (the hand-off opens them)", "sandbox", pending.ID(), "error", err)
	}
	w := &warmSandbox{pending: pending, workspace: spec.Workspace, control: ctl, peer: ctlPeer, exit: readExitReport(statusR)}
	got := make(chan error, 1)
	go func() { got <- readReady(readyR) }()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case err = <-got:
	case <-timer.C:
		err = fmt.Errorf("preload did not finish within %s", readyTimeout)
	case <-stop:
		err = errPoolClosed
	case <-ctx.Done():
		err = ctx.Err()
	}
	readyR.Close()
	if err != nil {
		ctl.Close()
		res := pending.Retire(time.Second, nil)
		ctlPeer.Close()
		if err == errPoolClosed || ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("warm sandbox did not become ready: %v (status %s, stderr: %s)", err, res.Status, truncateForLog(res.Stderr))
	}
	w.readyAt = time.Now()
	return w, nil
}

// Close stops refilling and retires every ready sandbox. Executions already
// handed off are not affected.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stop)
	var all []*warmSandbox
	for _, tp := range p.templates {
		all = append(all, tp.ready...)
		tp.ready = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
	for _, w := range all {
		p.retire(w)
	}
	// A template's forks are in its pid namespace: it is stopped only once
	// every fork handed off has ended (the server closes its sessions'
	// kernels first). A kernel's fork in flight ends at the stop; none
	// starts after it (lockFork checks the stop once it holds the lock).
	for _, src := range p.sources {
		src.forking <- struct{}{}
		for _, proc := range []*templateProc{src.proc, src.next} {
			if proc != nil {
				p.retireTemplate(proc)
			}
		}
		src.proc, src.next = nil, nil
		src.unlockFork()
	}
	p.retiring.Wait()
}
