package warmpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// Template forks (issue 17, TEMPLATE.md plan step 5): with Config.Forks,
// a warm sandbox is not a zygote that imported the preload itself but a
// fork of a template process (template.py, T) that imported it once for
// the Templates of one templateKey (forkSource). The pool asks T for a
// fork (protocol.go T2), gives the fork's G a shell
// (nsjail.Runner.StartShell: the namespaces, cgroup and seccomp program of
// a cold sandbox of the Template), moves G into it, gives the go-ahead and
// the join (T4), and waits for G's READY: from there on the
// fork is a warmSandbox like any other (nsjail.Shell.Pending), served by
// runWarm and handOffKernel unchanged.

// Forker is a Sandboxer that also starts templates and their forks'
// shells: *nsjail.Runner.
type Forker interface {
	StartTemplate(spec nsjail.Spec, files ...*os.File) (*nsjail.Template, error)
	PrepareShell(t *nsjail.Template) (*nsjail.PreparedShell, error)
	StartShell(ctx context.Context, t *nsjail.Template, spec nsjail.Spec, g *os.File) (*nsjail.Shell, error)
}

// forkTimeout bounds each exchange with T and with a fork before it is
// ready (T's reply, G's pidfd, the shell's start, G's READY): template
// code that stalls one is broken or hostile.
const forkTimeout = 30 * time.Second

// templateProc is one running template process of a forkSource.
type templateProc struct {
	tpl *nsjail.Template
	// ctl is the pool's end of T's control socket (TemplateFD), used
	// only under its fork lock (forkSource.forking):
	// one request at a time.
	ctl *net.UnixConn
	// forks counts the forks asked for; started is when it was started
	// (rotation: Config.TemplateMaxForks, Config.TemplateMaxAge).
	forks   int
	started time.Time
	// inFlight counts its forks being made (startFork), each added under
	// the fork lock while this is its forkSource's proc.
	inFlight sync.WaitGroup
}

// startTemplate starts t's template process. It does not wait for T's
// import of the preload: T reads no request before it is done, so the
// first fork's reply waits for it (within readyTimeout, as a zygote's).
func (p *Pool) startTemplate(f Forker, t Template) (*templateProc, error) {
	ctl, peer, err := controlPair()
	if err != nil {
		return nil, err
	}
	tpl, err := f.StartTemplate(nsjail.Spec{Rootfs: t.Rootfs, Args: templateArgs(p.cfg.Preload),
		Env: slices.Clone(t.Env), Limits: t.Limits}, peer)
	peer.Close()
	if err != nil {
		ctl.Close()
		return nil, err
	}
	p.mu.Lock()
	p.stats.Templates++
	p.stats.TemplatesStarted++
	p.mu.Unlock()
	return &templateProc{tpl: tpl, ctl: ctl, started: time.Now()}, nil
}

// stop ends the template: EOF on its socket, then a bounded wait. Its
// forks die with it (they are in its pid namespace): call it once none is
// in use.
func (tp *templateProc) stop() *nsjail.Result {
	tp.ctl.Close()
	return tp.tpl.Stop(retireGrace)
}

// rotates tells whether tproc has served its share (Config.TemplateMaxForks,
// Config.TemplateMaxAge; 0: no bound).
func (p *Pool) rotates(tproc *templateProc) bool {
	return (p.cfg.TemplateMaxForks > 0 && tproc.forks >= p.cfg.TemplateMaxForks) ||
		(p.cfg.TemplateMaxAge > 0 && time.Since(tproc.started) >= p.cfg.TemplateMaxAge)
}

// rotatesSoon tells whether tproc is within a tenth of its share (forks
// or age) of rotating: its successor is then started ahead (startFork).
func (p *Pool) rotatesSoon(tproc *templateProc) bool {
	return (p.cfg.TemplateMaxForks > 0 && tproc.forks >= p.cfg.TemplateMaxForks-max(1, p.cfg.TemplateMaxForks/10)) ||
		(p.cfg.TemplateMaxAge > 0 && time.Since(tproc.started) >= p.cfg.TemplateMaxAge-p.cfg.TemplateMaxAge/10)
}

// closeShellsGrace bounds how long a closed pool waits for the forks
// still in use (the server ends its sessions' kernels before it closes
// the pool; a fork that outlives that is killed with its template).
const closeShellsGrace = 30 * time.Second

// retireTemplate asks tproc for no more forks and stops it once every
// fork it made has ended (its forks, ready or serving an execution or a
// session's kernel, are in its pid namespace: stopping it earlier would
// kill them), or closeShellsGrace after the pool closed. Close waits for
// it. The template's result arrives on the channel once it has ended.
func (p *Pool) retireTemplate(tproc *templateProc) <-chan *nsjail.Result {
	ended := make(chan *nsjail.Result, 1)
	p.retiring.Add(1)
	go func() {
		defer p.retiring.Done()
		idle := make(chan struct{})
		go func() {
			// The forks being made first: each has its shell counted
			// (WaitShells) or destroyed by the time it is ready or
			// abandoned. Not waited for past the grace at Close: a
			// hostile template can keep a fork's G from ever finishing
			// its exit (a process of G's pid namespace that T never
			// reaps), and only the template's stop ends that; a start
			// racing the stop fails (Template.Stop).
			tproc.inFlight.Wait()
			tproc.tpl.WaitShells()
			close(idle)
		}()
		select {
		case <-idle:
		case <-p.stop:
			select {
			case <-idle:
			case <-time.After(closeShellsGrace):
				p.log.Warn("warm pool: forks still in use at close; ending them with their template", "template", tproc.tpl.ID())
			}
		}
		res := tproc.stop()
		p.mu.Lock()
		p.stats.Templates--
		p.mu.Unlock()
		p.log.Info("warm pool: template ended", "template", tproc.tpl.ID(), "forks", tproc.forks,
			"status", res.Status, "stderr", truncateForLog(res.Stderr))
		ended <- res
	}()
	return ended
}

// lockFork takes tp's template's fork lock (forkSource.forking), or fails with
// ctx's error when ctx ends first, or errPoolClosed when the pool closes.
func (p *Pool) lockFork(ctx context.Context, tp *templatePool) error {
	select {
	case tp.src.forking <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.stop:
		return errPoolClosed
	}
	select {
	case <-p.stop:
		// Both were ready: the pool is closed all the same.
		tp.src.unlockFork()
		return errPoolClosed
	default:
		return nil
	}
}

func (s *forkSource) unlockFork() { <-s.forking }

// forkLock is a template's fork lock as one fork holds it (makeFork):
// fork releases it once the template's part is done, and startFork takes
// it again to retire a template the fork found broken.
type forkLock struct {
	tp   *templatePool
	held bool
	// endFg ends the template's foreground CPU weight that the fork holds
	// with the lock (holdForeground).
	endFg func()
}

// holdForeground makes release, the end of a hold of the template's
// foreground CPU weight (nsjail.Template.HoldForeground), the lock's to
// call at its release: a refill's part in the template (T's clone of G)
// never runs at the background weight with the lock held, which
// a request's fork on demand would wait for (a priority inversion), nor is
// T starved into missing its reply's deadline, which retires it as broken.
// The rest of a refill, the shell's start and G's preparation, runs at the
// background weight. (On v2 T clones G into the shell's cgroup, which is at
// the foreground weight until StartShell sets the shell's limits: made by
// PrepareShell with a mkdir alone, see nsjail/shellcgroup.go.)
func (l *forkLock) holdForeground(release func()) {
	if l.endFg != nil {
		l.endFg()
	}
	l.endFg = release
}

func (l *forkLock) release() {
	if l.endFg != nil {
		l.endFg()
		l.endFg = nil
	}
	if l.held {
		l.held = false
		l.tp.src.unlockFork()
	}
}

// makeFork makes one warm sandbox of tp's template (startFork). It holds
// the template's fork lock only for the template's part of the fork (a
// rotation or a template's start when due, the request to T, G's pidfd,
// the end of cgroup v2's grant: a few ms), not for the shell's start, the
// join and READY (tens of ms): forks of one template are made ready side
// by side. check, if not nil, runs first under the lock; its error is
// returned as is. ctx is the request's (context.Background for the
// refill): its end stops the wait for the lock, which lockWait bounds too
// when > 0, and abandons the fork once past the template's part. The lock
// is released however makeFork ends (a panic in a request's fork, which
// net/http recovers, would otherwise leave it held, and the refill and
// Close waiting for it for good).
func (p *Pool) makeFork(ctx context.Context, lockWait time.Duration, f Forker, tp *templatePool, refill bool, check func() error) (*warmSandbox, error) {
	lockCtx := ctx
	if lockWait > 0 {
		var cancel context.CancelFunc
		lockCtx, cancel = context.WithTimeout(ctx, lockWait)
		defer cancel()
	}
	if err := p.lockFork(lockCtx, tp); err != nil {
		return nil, err
	}
	l := &forkLock{tp: tp, held: true}
	defer l.release()
	if check != nil {
		if err := check(); err != nil {
			return nil, err
		}
	}
	return p.startFork(ctx, f, tp, l, refill)
}

// startFork makes one warm sandbox of t, a fork of tp's template, with
// its own workspace: a refill's at the background CPU weight
// (nsjail.Spec.Background), a request's at the foreground one. The caller
// holds tp's fork lock (l), which fork releases on the way.
func (p *Pool) startFork(ctx context.Context, f Forker, tp *templatePool, l *forkLock, refill bool) (w *warmSandbox, err error) {
	src := tp.src
	defer func() {
		// A request that gave up says nothing of the template.
		if !errors.Is(err, errPoolClosed) && (ctx.Err() == nil || !errors.Is(err, ctx.Err())) {
			p.mu.Lock()
			src.forkErr = err
			p.mu.Unlock()
		}
	}()
	if old := src.proc; old != nil && p.rotates(old) {
		// TEMPLATE.md section 7: what forks share with their template
		// (its address-space layout, its hash secret) is bounded by how
		// many forks, and for how long, one template serves.
		p.log.Info("warm pool: template rotated", "template", old.tpl.ID(), "forks", old.forks,
			"age", time.Since(old.started).Round(time.Second))
		p.retireTemplate(old)
		src.proc = nil
	}
	if src.proc == nil && src.next != nil {
		// Started ahead: it has been importing the preload since, unless
		// it waited so long (an idle pool) that it is due itself.
		if p.rotates(src.next) {
			p.retireTemplate(src.next)
		} else {
			src.proc = src.next
		}
		src.next = nil
	}
	if src.proc == nil {
		proc, err := p.startTemplate(f, src.t)
		if err != nil {
			return nil, fmt.Errorf("unable to start the template: %w", err)
		}
		src.proc = proc
	}
	if src.next == nil && p.rotatesSoon(src.proc) {
		// The successor imports the preload while this one still
		// forks, so the rotation does not stop the refill for the
		// length of an import (~1.5 s, during which the ready sandboxes
		// drain and executions start cold).
		next, err := p.startTemplate(f, src.t)
		if err != nil {
			p.log.Warn("warm pool: unable to start the next template ahead; it starts at the rotation", "error", err)
		} else {
			src.next = next
			p.mu.Lock()
			p.stats.TemplatesAhead++
			p.mu.Unlock()
		}
	}
	ws, err := workspace.CreateWarm(p.cfg.WorkRoot, workspace.Options{
		Bytes: p.cfg.WorkspaceBytes, Inodes: p.cfg.WorkspaceInodes, UID: p.sandboxer.HostUID(), GID: p.sandboxer.HostGID(),
	})
	if err != nil {
		return nil, err
	}
	spec := nsjail.Spec{Rootfs: tp.t.Rootfs, Args: []string{"python3"}, Cwd: inside.Workspace, Workspace: ws, Limits: tp.t.Limits,
		Background: refill}
	tproc := src.proc
	fg := tproc.tpl.HoldForeground()
	if refill {
		l.holdForeground(fg) // until the template's part is done
	} else {
		// A request waits for the whole fork: T's part (its import too,
		// for a template just started) and the shell's start weigh as
		// the execution will.
		defer fg()
	}
	// Counted until the fork is ready or abandoned: a retirement waits
	// for it (retireTemplate), the lock released or not.
	tproc.inFlight.Add(1)
	w, refused, err := func() (*warmSandbox, bool, error) {
		defer tproc.inFlight.Done() // a panic too (net/http recovers a request's)
		return p.fork(ctx, f, tproc, spec, l)
	}()
	if err != nil {
		workspace.Remove(ws)
		if errors.Is(err, errPoolClosed) || (ctx.Err() != nil && errors.Is(err, ctx.Err())) {
			return nil, err
		}
		if refused || errors.Is(err, errTemplateBroken) {
			if !l.held {
				// Found broken after the template's part (the shell
				// says G is no fork of it, G says READY unconfined):
				// the lock again, to retire it unless a rotation or
				// another fork did already.
				if err := p.lockFork(context.Background(), tp); err != nil {
					return nil, err // closed: Close retires it
				}
				l.held = true
				if src.proc != tproc {
					return nil, err
				}
			}
			// A template that refuses (it holds what a fork must not
			// inherit) or breaks the protocol is retired: asked for no
			// more forks once this holds the lock (forks already past
			// the template's part go on, each checked on its own).
			p.log.Error("warm pool: template retired", "template", tproc.tpl.ID(), "error", err)
			first := tproc.forks == 1
			ended := p.retireTemplate(tproc)
			src.proc = nil
			if first {
				// Its first request: no fork of it is in use (this one's
				// shell, if it got one, is destroyed), so it ends within
				// retireGrace. Why it failed is most often in its own
				// stderr (an interpreter or a preload that cannot start),
				// which the refill's failure then says, as a zygote's
				// does (TestFailedWarmStartLogsItsStderr).
				select {
				case res := <-ended:
					err = fmt.Errorf("%w (template status %s, stderr: %s)", err, res.Status, truncateForLog(res.Stderr))
				case <-p.stop:
				}
			}
		}
		return nil, err
	}
	return w, nil
}

// errTemplateBroken: T did not answer its fork request as the protocol
// says.
var errTemplateBroken = errors.New("the template broke the fork protocol")

// fork asks tproc for one fork and makes it ready in a shell of spec.
// refused says T refused to fork. The caller holds the template's fork
// lock (l): fork releases it once it holds G's pidfd and the template's
// grant of the shell's cgroup has ended (SECURITY.md case 70), before the
// shell's start; from there on reqCtx's end abandons the fork with
// reqCtx's error.
func (p *Pool) fork(reqCtx context.Context, f Forker, tproc *templateProc, spec nsjail.Spec, l *forkLock) (w *warmSandbox, refused bool, err error) {
	// The fork's channels; the pool keeps its ends and, of the control
	// socket, the sandbox's end too (runWarm's unread check).
	ctl, ctlPeer, err := controlPair()
	if err != nil {
		return nil, false, err
	}
	var ours, theirs []*os.File // the pool's ends; those sent to T
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	defer func() { closeAll(theirs) }()
	fail := func(e error) (*warmSandbox, bool, error) {
		ctl.Close()
		ctlPeer.Close()
		closeAll(ours)
		return nil, false, e
	}
	// ready, exit report, go-ahead, stdout, stderr: ForkFDs and
	// ForkOutputFDs, in T2's order; the go-ahead's read end is the fork's.
	var ends [5][2]*os.File
	for i := range ends {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		ends[i] = [2]*os.File{r, w}
		ours = append(ours, r, w) // until sorted below
	}
	readyR, reportR, goAheadW, stdoutR, stderrR := ends[0][0], ends[1][0], ends[2][1], ends[3][0], ends[4][0]
	ours = []*os.File{readyR, reportR, goAheadW, stdoutR, stderrR}
	theirs = []*os.File{ends[0][1], ends[1][1], ends[2][0], ends[3][1], ends[4][1]}
	// The shell's id, and on cgroup v2 its cgroup, which T clones G into
	// (TEMPLATE.md section 4): made before the request. Closed whatever
	// happens: once the shell started, the cgroup is the shell's.
	prep, err := f.PrepareShell(tproc.tpl)
	if errors.Is(err, nsjail.ErrTemplateUnusable) {
		err = fmt.Errorf("%w: %v", errTemplateBroken, err) // retired below, a new one started
	}
	if err != nil {
		return fail(err)
	}
	defer prep.Close()
	spec.ID = prep.ID()
	// ctlPeer is sent too but kept: runWarm's unread check reads it. The
	// channels, the cgroup (v2), the outputs: T2's order.
	sent := append([]*os.File{ctlPeer}, theirs[:ForkFDs-1]...)
	if cg := prep.CgroupFile(); cg != nil {
		sent = append(sent, cg)
	}
	sent = append(sent, theirs[ForkFDs-1:]...)

	// Every exchange below ends at the pool's Close, which makes it
	// errPoolClosed, or at its bound; once the template's part is done,
	// also at reqCtx's end, which makes it reqCtx's error (the template's
	// exchange is never cut short by a request: its next reply would be
	// read by another fork).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	// tproc.ctl is touched only under the fork lock: this stops at its
	// release (before cancel on every path).
	stopT := context.AfterFunc(ctx, func() { _ = tproc.ctl.SetDeadline(time.Now()) })
	defer stopT()
	stopIO := context.AfterFunc(ctx, func() { _ = ctl.SetDeadline(time.Now()) })
	defer stopIO()
	closedOr := func(err error) error {
		if ctx.Err() != nil {
			if reqCtx.Err() != nil {
				return reqCtx.Err()
			}
			return errPoolClosed
		}
		return err
	}

	uidMap, gidMap := tproc.tpl.ForkIDMap()
	req, err := EncodeForkRequest(ForkRequest{UIDMap: uidMap, GIDMap: gidMap, Cgroup: prep.CgroupFile() != nil})
	if err != nil {
		return fail(err)
	}
	// T reads its first request only once it has imported the preload.
	replyWithin := forkTimeout
	if tproc.forks == 0 {
		replyWithin = readyTimeout
	}
	tproc.forks++
	if err := sendWithFiles(ctx, tproc.ctl, req, sent); err != nil {
		return fail(closedOr(fmt.Errorf("%w: the fork request: %v", errTemplateBroken, err)))
	}
	closeAll(theirs)
	theirs = nil
	line, _, err := recvLine(ctx, tproc.ctl, replyWithin, maxForkReplyBytes, 0)
	if err != nil {
		return fail(closedOr(fmt.Errorf("%w: its reply: %v", errTemplateBroken, err)))
	}
	reply, err := DecodeForkReply(line)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", errTemplateBroken, err))
	}
	if !reply.Forked {
		_, _, e := fail(fmt.Errorf("the template refused to fork: %s", reply.Refused))
		return nil, true, e
	}
	p.mu.Lock()
	p.stats.TemplateForks++
	p.mu.Unlock()
	// G's pidfd (T3): one message, one fd. A G that ends first (it refuses
	// what an at-fork handler left it: T reports its exit) ends the wait at once, not after forkTimeout with the
	// template's fork lock held.
	msg, gfds, ended, err := recvPidfd(ctx, ctl, reportR)
	if ended {
		// Whatever came meanwhile: G is gone.
		err = errors.New("G ended before it sent its pidfd (the template's log says why)")
	}
	if err != nil || string(msg) != PidfdMessage || len(gfds) != 1 {
		for _, fd := range gfds {
			unix.Close(fd)
		}
		goAheadW.Close() // T may reap whatever G became
		return fail(closedOr(fmt.Errorf("%w: G's pidfd message %q with %d fds (%v)", errTemplateBroken, msg, len(gfds), err)))
	}
	g := os.NewFile(uintptr(gfds[0]), "pidfd-G")
	defer g.Close() // StartShell keeps its own duplicate
	// The template's part is done: its grant of the shell's cgroup (v2)
	// ends before another fork of it may begin; the rest is this fork's.
	if err := prep.EndFork(); err != nil {
		_ = unix.PidfdSendSignal(int(g.Fd()), unix.SIGKILL, nil, 0)
		goAheadW.Close()
		return fail(fmt.Errorf("%w: %v", errTemplateBroken, err))
	}
	stopT()
	l.release()
	if err := reqCtx.Err(); err != nil {
		// Ended during the template's part: no shell for it.
		_ = unix.PidfdSendSignal(int(g.Fd()), unix.SIGKILL, nil, 0)
		goAheadW.Close()
		return fail(err)
	}
	stopReq := context.AfterFunc(reqCtx, cancel)
	defer stopReq()
	shellCtx, shellCancel := context.WithTimeout(ctx, forkTimeout)
	defer shellCancel()
	sh, err := f.StartShell(shellCtx, tproc.tpl, spec, g)
	if err != nil {
		goAheadW.Close()
		if errors.Is(err, nsjail.ErrNotAFork) {
			// The template sent the pidfd of something else (SECURITY.md
			// case 65): it is retired; whatever the pidfd is, it is left
			// alone (the pool kills only its own forks).
			return fail(fmt.Errorf("%w: %v", errTemplateBroken, err))
		}
		// G (the pidfd T sent, found a fork when StartShell got as far as
		// its checks, else a process of T's pid namespace at worst) will
		// never be used: killed through the pidfd, never by pid; T, given
		// the go-ahead, reaps it.
		_ = unix.PidfdSendSignal(int(g.Fd()), unix.SIGKILL, nil, 0)
		return fail(closedOr(err))
	}
	pending := sh.Pending(stdoutR, stderrR) // owns the shell and the two pipes from here
	ours = []*os.File{readyR, reportR, goAheadW}
	abandon := func(e error) (*warmSandbox, bool, error) {
		sh.CloseNamespaces()
		// Through its pidfd: G may not be in the shell's cgroup, whose
		// kill Retire makes.
		_ = unix.PidfdSendSignal(int(g.Fd()), unix.SIGKILL, nil, 0)
		goAheadW.Close()
		ctl.Close()
		pending.Retire(0, nil)
		ctlPeer.Close()
		closeAll(ours)
		return nil, false, e
	}
	err = sh.MoveG()
	// The go-ahead, whatever MoveG did: T may reap G from now on.
	goAheadW.Close()
	if err != nil {
		return abandon(fmt.Errorf("unable to move G into its shell: %w", err))
	}
	join, err := EncodeJoin(JoinOf(sh))
	if err == nil {
		err = sendWithFiles(ctx, ctl, join, sh.NamespaceFiles())
	}
	sh.CloseNamespaces()
	if err != nil {
		return abandon(closedOr(fmt.Errorf("the join: %w", err)))
	}
	got := make(chan error, 1)
	go func() { got <- readReady(readyR) }()
	timer := time.NewTimer(forkTimeout)
	defer timer.Stop()
	select {
	case err = <-got:
	case <-timer.C:
		err = fmt.Errorf("the fork was not ready within %s", forkTimeout)
	case <-ctx.Done():
		err = closedOr(ctx.Err())
	}
	if err == nil {
		// G says so itself, on a pipe its template held too: the host
		// checks (SECURITY.md case 67). A G that said READY unconfined
		// makes its template broken.
		if err = sh.CheckConfined(); err != nil {
			err = fmt.Errorf("%w: %v", errTemplateBroken, err)
		}
	}
	if err != nil {
		if errors.Is(err, errPoolClosed) || (reqCtx.Err() != nil && errors.Is(err, reqCtx.Err())) {
			return abandon(err)
		}
		return abandon(fmt.Errorf("the fork did not become ready: %w", err))
	}
	if !stopIO() {
		// The pool closed, or the request ended, just now: its deadline
		// may be on ctl.
		return abandon(closedOr(errPoolClosed))
	}
	readyR.Close()
	if err := pending.OpenCounters(); err != nil {
		p.log.Debug("warm pool: counters not opened ahead (the hand-off opens them)", "sandbox", pending.ID(), "error", err)
	}
	return &warmSandbox{pending: pending, workspace: spec.Workspace, control: ctl, peer: ctlPeer,
		exit: readExitReport(reportR), readyAt: time.Now()}, false, nil
}

// sendWithFiles writes msg on c with files attached (SCM_RIGHTS) to its
// first byte, within forkTimeout; ctx's end sets c's deadline to now (the
// caller's AfterFunc), and is checked after this one is set.
func sendWithFiles(ctx context.Context, c *net.UnixConn, msg []byte, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_ = c.SetWriteDeadline(time.Now().Add(forkTimeout))
	defer c.SetWriteDeadline(time.Time{})
	if err := ctx.Err(); err != nil {
		return err
	}
	var rights []byte
	if len(fds) > 0 {
		rights = unix.UnixRights(fds...)
	}
	return writeMessage(c, msg, rights)
}

// recvPidfd reads G's pidfd message (T3) from ctl, as recvLine, or ends
// as soon as the exit report is readable (nothing is read from it): G
// ended, and T reported it, or T is gone (EOF: only T holds the write
// end). Without that, a G that ends before the message leaves
// the wait to forkTimeout: the pool's own copy of the sandbox's end of
// ctl keeps ctl from reading EOF.
func recvPidfd(ctx context.Context, ctl *net.UnixConn, report *os.File) (msg []byte, fds []int, ended bool, err error) {
	rc, err := report.SyscallConn()
	if err != nil {
		return nil, nil, false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		err := rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			ended = n > 0
			return ended
		})
		if err == nil && ended {
			cancel()
		}
	}()
	// recvLine ends at its context's end once the deadline is set, as at
	// the pool's Close (fork's stopIO).
	stop := context.AfterFunc(ctx, func() { _ = ctl.SetReadDeadline(time.Now()) })
	msg, fds, err = recvLine(ctx, ctl, forkTimeout, len(PidfdMessage), 1)
	stop()
	// End the watch (a read deadline in the past wakes it) and wait for
	// it, so that ended is settled and report's deadline can be cleared
	// for its reader.
	_ = report.SetReadDeadline(time.Unix(1, 0))
	<-watched
	_ = report.SetReadDeadline(time.Time{})
	return msg, fds, ended, err
}

// recvLine reads one line (up to and including MessageEnd, at most max
// bytes) from c within timeout (and ctx, as sendWithFiles), with the fds
// that came with it: at most
// wantFDs are kept; any more, or a truncated control message, is an error
// and every fd received is closed (a template must not be able to make the
// worker hold fds it did not ask for). The peer writes nothing after the
// line before the pool's next message, so reading whole chunks takes
// nothing of the next.
func recvLine(ctx context.Context, c *net.UnixConn, timeout time.Duration, max, wantFDs int) (line []byte, fds []int, err error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, max)
	oob := make([]byte, unix.CmsgSpace(4*(wantFDs+1)))
	closeFDs := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
		fds = nil
	}
	for !bytes.HasSuffix(line, []byte{MessageEnd}) {
		if len(line) >= max {
			closeFDs()
			return line, nil, fmt.Errorf("a line longer than %d bytes", max)
		}
		n, oobn, flags, _, err := c.ReadMsgUnix(buf[:max-len(line)], oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				got, _ := unix.ParseUnixRights(&m)
				fds = append(fds, got...)
			}
			if perr != nil && err == nil {
				err = perr
			}
		}
		if err == nil && flags&unix.MSG_CTRUNC != 0 {
			err = errors.New("too many fds (control message truncated)")
		}
		if err == nil && n == 0 {
			err = errors.New("EOF")
		}
		if err == nil && len(fds) > wantFDs {
			err = fmt.Errorf("%d fds, want at most %d", len(fds), wantFDs)
		}
		if err != nil {
			closeFDs()
			return line, nil, err
		}
		line = append(line, buf[:n]...)
	}
	return line, fds, nil
}
