package server

import (
	"bufio"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
)

//go:embed zygote.py
var zygoteSource string

// PoolConfig configures the warm pool. The zero value disables it.
type PoolConfig struct {
	// Size is the number of ready sandboxes kept per template (0 disables
	// the pool; every execution then takes the cold path).
	Size int
	// MaxIdle retires a ready sandbox that waited this long (default 10m),
	// so a long-idle worker does not hold memory forever and preloads stay
	// fresh after an image or config change.
	MaxIdle time.Duration
	// Preload lists the modules imported before hand-off (config.DefaultPreload
	// when nil).
	Preload []string
	// WorkRoot is where the warm sandboxes' workspaces live.
	WorkRoot string
	// WorkspaceBytes, when > 0, mounts a tmpfs of this size on every warm
	// workspace, as the server does on its own (see mountWorkspace); when 0
	// the workspaces are plain directories and WorkRoot must be on the same
	// filesystem as the server's workspaces (entries are renamed).
	WorkspaceBytes int64
	// WorkspaceInodes is the tmpfs's nr_inodes (default: the config's).
	WorkspaceInodes int64
}

// Template describes the sandboxes of one policy: a request whose Spec has
// the same rootfs, limits (timeout aside) and base environment can be served
// by one of them.
type Template struct {
	Name   string
	Rootfs string
	Env    []string
	Limits nsjail.Limits
}

// PoolStats is the pool's state, for /metrics.
type PoolStats struct {
	Ready, Starting, Taken, RefillFailures, Retired uint64
	// IdleMemoryBytes sums what the ready sandboxes' cgroups account.
	IdleMemoryBytes int64
}

// Pool keeps pre-started, single-use sandboxes whose Python has already
// imported the data stack, and serves an execution from one of them when it
// matches a template; otherwise it runs the execution cold. A sandbox is
// never reused: after its one execution it is destroyed and the pool
// refills in the background.
type Pool struct {
	runner *nsjail.Runner
	cfg    PoolConfig
	log    *slog.Logger

	mu        sync.Mutex
	templates []*templatePool
	closed    bool
	wg        sync.WaitGroup
	stop      chan struct{}
	stats     PoolStats
}

type templatePool struct {
	t       Template
	ready   []*warmSandbox
	refill  chan struct{}
	backoff time.Duration
}

type warmSandbox struct {
	sb        *nsjail.Sandbox
	workspace string
	control   *os.File // fd 3 of the zygote: the hand-off message
	readyAt   time.Time
}

// readExitReport delivers the status the zygote writes on fd 5 just before
// it exits ("N\n"); the channel closes without a value when the pipe ends
// otherwise (the code closed fd 5, or died).
func readExitReport(r *os.File) <-chan int {
	ch := make(chan int, 1)
	go func() {
		defer close(ch)
		defer r.Close()
		// Up to the newline, not EOF: the zygote holds the pipe until the
		// kernel has torn it down, which is what the report saves waiting for.
		line, err := bufio.NewReaderSize(io.LimitReader(r, 16), 16).ReadString('\n')
		if err != nil {
			return
		}
		code, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || code < 0 || code > 255 {
			return
		}
		ch <- code
	}()
	return ch
}

// NewPool starts filling cfg.Size sandboxes for each template in the
// background. With cfg.Size == 0 it starts nothing and Run is the cold path.
func NewPool(runner *nsjail.Runner, cfg PoolConfig, templates []Template, log *slog.Logger) (*Pool, error) {
	if cfg.Size < 0 {
		return nil, fmt.Errorf("pool size must be >= 0, got: %d", cfg.Size)
	}
	if cfg.MaxIdle == 0 {
		cfg.MaxIdle = 10 * time.Minute
	}
	if cfg.Preload == nil {
		cfg.Preload = config.DefaultPreload
	}
	cfg.WorkspaceInodes = cmp.Or(cfg.WorkspaceInodes, config.Default().WorkspaceInodes)
	for _, m := range cfg.Preload {
		if m == "" || strings.ContainsAny(m, ", \t\n") {
			return nil, fmt.Errorf("preload module name %q is invalid", m)
		}
	}
	if cfg.Size > 0 && cfg.WorkRoot == "" {
		return nil, errors.New("pool work root is required when the pool is enabled")
	}
	p := &Pool{runner: runner, cfg: cfg, log: log, stop: make(chan struct{})}
	if cfg.Size == 0 {
		return p, nil
	}
	if err := os.MkdirAll(cfg.WorkRoot, 0o711); err != nil {
		return nil, fmt.Errorf("unable to create pool work root: %w", err)
	}
	for _, t := range templates {
		tp := &templatePool{t: t, refill: make(chan struct{}, 1)}
		p.templates = append(p.templates, tp)
		p.wg.Add(1)
		go p.keepFull(tp)
	}
	return p, nil
}

// HostUID and HostGID are the runner's (see nsjail.Runner.HostUID), so a
// Pool is a drop-in Sandboxer.
func (p *Pool) HostUID() int { return p.runner.HostUID() }

// HostGID is the host gid of the sandbox group.
func (p *Pool) HostGID() int { return p.runner.HostGID() }

// Stats returns the pool's current state.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	st := p.stats
	var ready []*warmSandbox
	for _, tp := range p.templates {
		ready = append(ready, tp.ready...)
	}
	st.Ready = uint64(len(ready))
	p.mu.Unlock()
	for _, w := range ready {
		st.IdleMemoryBytes += w.sb.MemoryBytes()
	}
	return st
}

// Run serves spec from a ready sandbox when one matches, else cold.
func (p *Pool) Run(ctx context.Context, spec nsjail.Spec) (*nsjail.Result, error) {
	w, tp, extraEnv := p.take(&spec)
	if w == nil {
		return p.runner.Run(ctx, spec)
	}
	// Refill once this execution is done: starting a sandbox and importing
	// the data stack is CPU-heavy, and on a small VM it would compete with
	// the execution it replaces.
	defer tp.wakeRefill()
	return p.runWarm(ctx, w, spec, extraEnv)
}

// take finds a ready sandbox for spec. It matches when spec runs
// `python[3] FILE` in the template's rootfs with its limits (timeout aside)
// and every template variable in spec.Env with the same value; the other
// variables of spec.Env travel with the hand-off.
func (p *Pool) take(spec *nsjail.Spec) (*warmSandbox, *templatePool, map[string]string) {
	if spec.Workspace == "" || len(spec.Args) != 2 || (spec.Args[0] != "python3" && spec.Args[0] != "python") ||
		spec.Stdin != nil || len(spec.ExtraFiles) > 0 {
		return nil, nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, nil
	}
	for _, tp := range p.templates {
		extra, ok := matches(tp.t, spec)
		if !ok || len(tp.ready) == 0 {
			continue
		}
		w := tp.ready[0]
		tp.ready = tp.ready[1:]
		p.stats.Taken++
		return w, tp, extra
	}
	return nil, nil, nil
}

func (tp *templatePool) wakeRefill() {
	select {
	case tp.refill <- struct{}{}:
	default:
	}
}

func matches(t Template, spec *nsjail.Spec) (map[string]string, bool) {
	a, b := t.Limits, spec.Limits
	a.Timeout, b.Timeout = 0, 0
	if t.Rootfs != spec.Rootfs || a != b || spec.Hostname != "" {
		return nil, false
	}
	base := envMap(t.Env)
	extra := map[string]string{}
	for k, v := range envMap(spec.Env) {
		if bv, ok := base[k]; ok {
			if bv != v {
				return nil, false
			}
			delete(base, k)
			continue
		}
		extra[k] = v
	}
	if len(base) > 0 { // the template sets something the request does not
		return nil, false
	}
	return extra, true
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// runWarm moves the request's workspace contents into the warm sandbox's
// bound workspace, hands the file over, waits, and moves everything back so
// the caller collects results exactly where it would after a cold run.
func (p *Pool) runWarm(ctx context.Context, w *warmSandbox, spec nsjail.Spec, extraEnv map[string]string) (*nsjail.Result, error) {
	// Two tmpfs workspaces: the request files (small, written by the
	// server) are copied in; the results stay in the warm workspace, which
	// the Result names and the caller collects from and removes.
	if err := moveIntoWorkspace(spec.Workspace, w.workspace); err != nil {
		w.control.Close() // the zygote exits 0 on EOF
		w.sb.Wait(context.Background())
		removeWorkspace(w.workspace)
		return nil, fmt.Errorf("unable to move the workspace into the warm sandbox: %w", err)
	}
	msg, err := json.Marshal(map[string]any{
		"path": spec.Args[1], "argv": []string{spec.Args[1]},
		"cwd": cmp.Or(spec.Cwd, "/"), "env": extraEnv,
	})
	if err != nil {
		return nil, err
	}
	w.sb.SetLogger(spec.Logger)
	if err := w.sb.SetNice(0); err != nil {
		p.log.Warn("warm pool: unable to restore the sandbox's priority", "sandbox", w.sb.ID(), "error", err)
	}
	if out, errOut := w.sb.Handoff(spec.Limits.Timeout); len(out)+len(errOut) > 0 {
		p.log.Warn("warm sandbox wrote output before hand-off (dropped)", "sandbox", w.sb.ID(),
			"stdout", truncateForLog(out), "stderr", truncateForLog(errOut))
	}
	_, werr := w.control.Write(msg)
	w.control.Close()
	res := w.sb.Wait(ctx)
	if werr != nil && res.Status == nsjail.StatusSucceeded {
		res.Status = nsjail.StatusSandboxError
		res.Error = fmt.Sprintf("unable to hand the execution to the warm sandbox: %v", werr)
	}
	// w.workspace is hostile now: the caller's collector opens everything
	// in it with O_NOFOLLOW and never follows a link.
	res.Workspace = w.workspace
	return res, nil
}

func truncateForLog(b []byte) string {
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}

// keepFull keeps tp at cfg.Size ready sandboxes until Close, retiring those
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
	return !p.closed && len(tp.ready) < p.cfg.Size
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

// retire ends an unused warm sandbox: EOF on its control pipe makes the
// zygote exit 0; a bounded wait kills it otherwise.
func (p *Pool) retire(w *warmSandbox) {
	w.control.Close()
	w.sb.Handoff(5 * time.Second)
	w.sb.Wait(context.Background())
	removeWorkspace(w.workspace)
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
	w, err := p.start(tp.t)
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
		go p.retire(w)
		return true
	}
	tp.ready = append(tp.ready, w)
	return true
}

var errPoolClosed = errors.New("pool closed")

// readyTimeout bounds the preload; a stack that takes longer is broken.
const readyTimeout = 2 * time.Minute

func (p *Pool) start(t Template) (*warmSandbox, error) {
	ws, err := os.MkdirTemp(p.cfg.WorkRoot, warmPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(ws, p.runner.HostUID(), p.runner.HostGID()); err != nil {
		os.RemoveAll(ws)
		return nil, err
	}
	if p.cfg.WorkspaceBytes > 0 {
		if err := mountWorkspace(ws, p.cfg.WorkspaceBytes, p.cfg.WorkspaceInodes, p.runner.HostUID(), p.runner.HostGID()); err != nil {
			os.RemoveAll(ws)
			return nil, err
		}
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		removeWorkspace(ws)
		return nil, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		removeWorkspace(ws)
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		readyR.Close()
		readyW.Close()
		removeWorkspace(ws)
		return nil, err
	}
	spec := nsjail.Spec{
		Rootfs:     t.Rootfs,
		Args:       []string{"python3", "-c", zygoteSource, strings.Join(p.cfg.Preload, ",")},
		Env:        slices.Clone(t.Env),
		Cwd:        inside.Workspace,
		Workspace:  ws,
		Limits:     t.Limits,
		ExtraFiles: []*os.File{ctlR, readyW, statusW},
	}
	// The zygote waits for its hand-off with no deadline of its own; Handoff
	// sets the execution's. Until then the pool's own timer applies.
	spec.Limits.Timeout = 365 * 24 * time.Hour
	sb, err := p.runner.Start(spec)
	ctlR.Close()
	readyW.Close()
	statusW.Close()
	if err != nil {
		ctlW.Close()
		readyR.Close()
		statusR.Close()
		removeWorkspace(ws)
		return nil, err
	}
	sb.SetExitReport(readExitReport(statusR))
	// Preload on idle CPU only: a refill must not slow running executions.
	if err := sb.SetNice(19); err != nil {
		p.log.Warn("warm pool: unable to lower the preload's priority", "sandbox", sb.ID(), "error", err)
	}
	w := &warmSandbox{sb: sb, workspace: ws, control: ctlW}
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		n, err := readyR.Read(b)
		if n == 1 && b[0] == 'R' {
			err = nil
		} else if err == nil {
			err = errors.New("unexpected ready byte")
		}
		got <- err
	}()
	select {
	case err = <-got:
	case <-time.After(readyTimeout):
		err = fmt.Errorf("preload did not finish within %s", readyTimeout)
	case <-p.stop:
		err = errPoolClosed
	}
	readyR.Close()
	if err != nil {
		ctlW.Close()
		sb.Handoff(time.Second)
		res := sb.Wait(context.Background())
		removeWorkspace(ws)
		if err == errPoolClosed {
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
}
