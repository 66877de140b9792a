// Package server is sandboxd's execution API: it turns an HTTP request into
// one sandboxed run and back. Data flows one way: request → policy →
// workspace (package workspace) → sandbox (the warmpool.Sandboxer, or the
// warm pool of package warmpool built on it) → result (stored in package
// results). A session's execution takes the same path with the session's
// volume (package volume) for workspace and its kernel (package session,
// on the warm pool's kernels) for sandbox. Its own files are the HTTP API
// (routes, guard, limits, listeners, OpenAPI, the legacy endpoint, the
// session and file API), the request's validation and policy, admission,
// the execution's orchestration and the result store's glue.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/rootfs"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/sessionid"
	"github.com/sandboxd/sandboxd/server/stream"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// Deps are what a Server needs. All fields are required.
type Deps struct {
	// Config is the validated configuration.
	Config config.Config
	// Sandbox runs every execution: cold ones, the warm pool's cold
	// fallbacks among them, through its Run, and with the warm pool on
	// (pool_size > 0) it also pre-starts the pool's sandboxes. Whatever
	// wraps the runner sees every execution that runs cold.
	Sandbox warmpool.Sandboxer
	// ResolveRootfs returns the unpacked image of the runtime name, whose
	// reference is ref (Config.RuntimeImages), unpacking it into
	// Config.RootfsCache first if needed: its RootfsPath, Digest and
	// Labels are used. Prepare calls it once per runtime.
	ResolveRootfs func(ctx context.Context, name, ref string) (rootfs.Image, error)
	// Logger receives one line per event.
	Logger *slog.Logger
	// MCP, optional, builds the handler of /mcp (the Model Context
	// Protocol) on api, the API's routes without the guard: the guard runs
	// once, on /mcp itself, and the tools call the routes in-process.
	// maxBody bounds an MCP request as it bounds an API request.
	// cmd/sandboxd passes server/mcp's; without it /mcp answers 404.
	MCP func(api http.Handler, maxBody int64) http.Handler
}

// Server is the execution API. Create it with New, call Prepare (the API
// answers 503 on executions until it succeeds), serve Handler, and Drain
// before exit.
type Server struct {
	cfg      config.Config
	policies Policies
	sandbox  warmpool.Sandboxer
	resolve  func(ctx context.Context, name, ref string) (rootfs.Image, error)
	log      *slog.Logger
	// createWorkspace is workspace.Create; the unit tests, which run
	// without root and so cannot mount a tmpfs, give a plain directory
	// instead.
	createWorkspace func(root, run string, o workspace.Options, req workspace.Request) (*workspace.Workspace, error)
	// starter starts session kernels (and profiles' kernels):
	// kernelStarter, on the warm pool; the API tests give a fake.
	starter session.Starter
	// reserve is (*session.Manager).Begin; the API tests hold an
	// execution right after it reserved its session.
	reserve func(m *session.Manager, id string) (*session.Run, error)

	live      *liveTable
	results   *results.Store
	admission *Admission
	decoding  decodeSlots
	uploads   decodeSlots   // session file uploads streaming at once
	etags     etagCache     // SHA-256 of session files served
	waiters   chan struct{} // retries waiting for a live execution (existing)
	streams   *stream.Registry
	attached  decodeSlots // event streams attached by GET (events.go)
	metrics   *metrics
	handler   http.Handler
	mcp       http.Handler // /mcp, nil without Deps.MCP
	// mcpCalls bounds the /mcp calls served at once (mcp_route.go).
	mcpCalls chan struct{}
	// owner is this worker's owner token (sessionid.Token of worker_id;
	// "" without one): its generated session ids carry it.
	owner string
	// fwd forwards other owners' session requests (forward.go); nil
	// without peers_source.
	fwd *forwarder

	mu       sync.Mutex
	runtimes map[string]*preparedRuntime // by name, set once Prepare succeeds (runtimes.go)
	prepErr  error
	pool     *warmpool.Pool // set by Prepare (Size 0 with pool_size 0: cold starts)
	manager  *session.Manager
	sessErr  error // why there is no manager
	// releaseAnchor lets go of the freezer anchor held from Prepare to
	// Drain (holdFreezerAnchor; nil: none held).
	releaseAnchor func() error
	draining      bool           // under mu: once set, inFlight gets no new Add
	inFlight      sync.WaitGroup // executions between admission and cleanup
	cleanups      sync.WaitGroup // workspace removals after the response
}

// New checks deps and builds a Server. It opens the result store in
// Config.ResultsDir, where the executions a dead worker left queued or
// running are answered interrupted; Close closes it.
func New(d Deps) (*Server, error) {
	var errs []error
	if d.Sandbox == nil {
		errs = append(errs, errors.New("deps: Sandbox is required"))
	}
	if d.ResolveRootfs == nil {
		errs = append(errs, errors.New("deps: ResolveRootfs is required"))
	}
	if d.Logger == nil {
		errs = append(errs, errors.New("deps: Logger is required"))
	}
	if err := d.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      d.Config,
		policies: PoliciesFromConfig(d.Config),
		sandbox:  d.Sandbox,
		resolve:  d.ResolveRootfs,
		log:      d.Logger,
		live:     newLiveTable(),
		metrics:  newMetrics(),
		decoding: make(decodeSlots, d.Config.MaxDecoding),
		uploads:  make(decodeSlots, d.Config.MaxDecoding),
		// As many retries may wait as there can be live executions.
		waiters:  make(chan struct{}, d.Config.MaxConcurrent+d.Config.MaxQueued),
		mcpCalls: make(chan struct{}, mcpCallLimit(d.Config.MaxConcurrent, d.Config.MaxQueued)),
		streams:  stream.NewRegistry(stream.DefaultLimits, finishedStreams, streamLinger),
		// SECURITY.md case 53: as many as stored answers may stream.
		attached: make(decodeSlots, d.Config.MaxStreams),
	}
	if d.Config.WorkerID != "" {
		s.owner = sessionid.Token(d.Config.WorkerID)
	}
	s.createWorkspace = workspace.Create
	s.starter = kernelStarter{s}
	s.reserve = (*session.Manager).Begin
	store, err := results.Open(d.Config.ResultsDir, results.Options{
		MaxBytes: d.Config.ResultsMaxBytes,
		MaxCount: d.Config.ResultsMax,
		TTL:      time.Duration(d.Config.ResultsTTLMS) * time.Millisecond,
		// SECURITY.md case 32: slow readers of stored answers hold fds
		// (at most two each) and cannot exhaust the worker's.
		MaxReaders: d.Config.MaxStreams,
		Logger:     d.Logger,
		Interrupted: func(e results.Entry, now time.Time) []byte {
			d.Logger.Warn("execution interrupted by the worker's stop", "execution_id", e.ID, "run", e.Run)
			text, typ := interruptedDocument(e, now)
			s.metrics.executions.WithLabelValues(typ, StatusInterrupted).Inc()
			return text
		},
	})
	if err != nil {
		return nil, err
	}
	s.results = store
	if s.fwd, err = newForwarder(d.Config, d); err != nil {
		store.Close()
		return nil, fmt.Errorf("session forwarding: %w", err)
	}
	if s.fwd != nil {
		d.Logger.Info("session forwarding", "peers_source", d.Config.PeersSource, "worker_id", d.Config.WorkerID, "owner_token", s.owner)
	}
	s.metrics.registerResults(store.Stats)
	s.admission = NewAdmission(d.Config.MaxConcurrent, d.Config.MaxQueued, func(running, queued int) {
		s.metrics.inFlight.Set(float64(running))
		s.metrics.queued.Set(float64(queued))
	})
	s.metrics.reg.MustRegister(&poolCollector{size: d.Config.PoolSize, stats: s.PoolStats},
		&sessionCollector{stats: s.SessionStats})
	api := s.router()
	s.handler = s.deadlines(s.guard(api))
	if d.MCP != nil {
		s.mcp = d.MCP(api, s.maxBody())
	}
	return s, nil
}

// route is one API endpoint; the OpenAPI test checks the document against
// this table.
type route struct {
	method, path string
	handle       httprouter.Handle
}

func (s *Server) routes() []route {
	return []route{
		{http.MethodPost, "/v1/executions", s.handleCreate},
		{http.MethodGet, "/v1/executions/:id", s.handleGet},
		{http.MethodGet, "/v1/executions/:id/events", s.handleEvents},
		{http.MethodGet, "/v1/executions/:id/artifacts/*name", s.handleGetArtifact},
		{http.MethodDelete, "/v1/executions/:id", s.handleCancel},
		{http.MethodGet, "/v1/policies", s.handlePolicies},
		{http.MethodGet, "/v1/capacity", s.handleCapacity},
		{http.MethodGet, "/v1/runtimes", s.handleRuntimes},
		{http.MethodGet, "/healthz", s.handleHealthz},
		{http.MethodGet, "/readyz", s.handleReadyz},
		{http.MethodGet, "/metrics", s.handleMetrics},
		{http.MethodGet, "/openapi.json", s.handleOpenAPI},
		{http.MethodPost, "/execute", s.handleLegacyExecute},
		{http.MethodPost, "/v1/sessions", s.handleCreateSession},
		{http.MethodGet, "/v1/sessions", s.handleListSessions},
		{http.MethodGet, "/v1/sessions/:id", s.handleGetSession},
		{http.MethodDelete, "/v1/sessions/:id", s.handleDeleteSession},
		{http.MethodPost, "/v1/sessions/:id/executions", s.handleSessionExecute},
		{http.MethodPost, "/v1/sessions/:id/interrupt", s.handleInterrupt},
		// A session's execution by the routes above, checked to be the
		// session's: forwarded to its owner (session_executions.go).
		{http.MethodGet, "/v1/sessions/:id/executions/:eid", s.sessionExecution(s.handleGet)},
		{http.MethodGet, "/v1/sessions/:id/executions/:eid/events", s.sessionExecution(s.handleEvents)},
		{http.MethodGet, "/v1/sessions/:id/executions/:eid/artifacts/*name", s.sessionExecution(s.handleGetArtifact)},
		{http.MethodDelete, "/v1/sessions/:id/executions/:eid", s.sessionExecution(s.handleCancel)},
		// httprouter takes a route and a catch-all below it: /files lists,
		// /files/*path is a file (GET with ?profile=1: its profile).
		{http.MethodGet, "/v1/sessions/:id/files", s.handleListFiles},
		{http.MethodPut, "/v1/sessions/:id/files/*path", s.handlePutFile},
		{http.MethodGet, "/v1/sessions/:id/files/*path", s.handleGetFile},
		{http.MethodDelete, "/v1/sessions/:id/files/*path", s.handleDeleteFile},
		// MCP over Streamable HTTP, stateless: POST only (mcp_route.go).
		{http.MethodPost, "/mcp", s.handleMCP},
	}
}

func (s *Server) router() http.Handler {
	r := httprouter.New()
	for _, rt := range s.routes() {
		h := rt.handle
		if strings.HasPrefix(rt.path, "/v1/sessions/:id") {
			h = s.forwarding(h) // another owner's session: to its worker
		}
		r.Handle(rt.method, rt.path, h)
	}
	r.NotFound = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint")
	})
	r.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
	})
	r.PanicHandler = func(w http.ResponseWriter, r *http.Request, v any) {
		if v == http.ErrAbortHandler {
			// A forwarded answer broken midway (forward.go): net/http
			// drops the connection, so the client sees it cut, not ended.
			panic(v)
		}
		s.log.Error("handler panic", "path", r.URL.Path, "panic", fmt.Sprint(v))
		writeError(w, http.StatusInternalServerError, "internal error")
	}
	return r
}

// Handler is the HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// Prepare resolves every runtime's rootfs and finds its interpreter;
// executions are refused with 503 until it has succeeded for all of them.
func (s *Server) Prepare(ctx context.Context) error {
	runtimes, err := s.resolveRuntimes(ctx)
	if err != nil {
		err = fmt.Errorf("runtime rootfs: %w", err)
		s.mu.Lock()
		s.prepErr = err
		s.mu.Unlock()
		s.log.Error("rootfs not ready", "err", err)
		return err
	}
	// A policy keeps pool_size warm sandboxes on its own runtime and
	// runtime_pool_size.NAME on each other one (none by default: a second
	// image costs nothing until asked for).
	var templates []warmpool.Template
	for _, name := range s.policies.Names() {
		pol := s.policies[name]
		for _, rt := range s.cfg.RuntimeNames() {
			if size := s.cfg.TemplateSize(pol.Runtime, rt); size > 0 {
				t := pol.Template(s.cfg, runtimes[rt].image.RootfsPath)
				t.Name, t.Size = templateName(name, rt), size
				templates = append(templates, t)
			}
		}
	}
	// The pool's cold fallbacks run through s.sandbox, as every cold
	// execution does. Built with pool_size 0 too: session kernels then
	// start cold through it.
	pool, err := warmpool.New(s.sandbox, warmpool.Config{
		Size:             s.cfg.PoolSize,
		MaxIdle:          time.Duration(s.cfg.PoolMaxIdle),
		Preload:          s.cfg.PoolPreload,
		WorkRoot:         s.cfg.WorkRoot,
		WorkspaceBytes:   s.cfg.WorkspaceBytes,
		WorkspaceInodes:  s.cfg.WorkspaceInodes,
		Forks:            s.cfg.PoolTemplateForks,
		TemplateMaxForks: s.cfg.PoolTemplateMaxForks,
		TemplateMaxAge:   time.Duration(s.cfg.PoolTemplateMaxAge),
	}, templates, s.log)
	if err != nil {
		err = fmt.Errorf("warm pool: %w", err)
		s.mu.Lock()
		s.prepErr = err
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	if s.draining {
		// Drain already ran: nothing would ever close this pool.
		s.mu.Unlock()
		pool.Close()
		return errors.New("shutting down")
	}
	s.runtimes, s.prepErr, s.pool = runtimes, nil, pool
	s.mu.Unlock()
	for _, name := range s.cfg.RuntimeNames() {
		r := runtimes[name]
		s.log.Info("rootfs ready", "runtime", name, "rootfs", r.image.RootfsPath, "python", r.python, "digest", r.image.Digest)
	}
	s.log.Info("warm pool", "pool_size", s.cfg.PoolSize, "templates", len(templates))
	s.holdFreezerAnchor()
	s.openSessions()
	return nil
}

// holdFreezerAnchor holds the cgroup v1 freezer anchor (cgroup/anchor.go)
// until Drain. Every execution's sandbox is frozen when its runner says
// it is done (nsjail.Spec.Done), and session kernels idle frozen: with the
// anchor held no freeze or thaw flips the kernel-wide freezer state, which
// costs 1.5 ms each on the reference VM.
func (s *Server) holdFreezerAnchor() {
	release, err := s.sandbox.HoldFreezerAnchor()
	if err != nil {
		s.log.Debug("no freezer anchor; freezing sandboxes costs more", "error", err)
		return
	}
	s.mu.Lock()
	keep := !s.draining && s.releaseAnchor == nil
	if keep {
		s.releaseAnchor = release
	}
	s.mu.Unlock()
	if !keep {
		if err := release(); err != nil {
			s.log.Warn("unable to release the freezer anchor", "error", err)
		}
	}
}

// openSessions opens the session manager on sessions_dir: the sessions a
// previous worker left come back (their files; their kernels are gone).
// Without it (no loop devices, say) single-shot executions still work and
// the session API answers 503 with the reason.
func (s *Server) openSessions() {
	s.mu.Lock()
	if s.manager != nil {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	// The spare kernels are the default type's, in spare volumes (at most
	// that many), and come only from its warm sandboxes: without those
	// (pool_size 0, no warm workspace) none would ever start.
	spareKernels := min(s.cfg.SessionSpareKernels, s.cfg.SessionSpareVolumes)
	dyn, ok := s.policies[TypeDynamic]
	if !ok || s.cfg.PoolSize == 0 || s.cfg.WorkspaceBytes == 0 {
		spareKernels = 0
	}
	m, err := session.Open(session.Config{
		Root:             s.cfg.SessionsDir,
		MaxSessions:      s.cfg.MaxSessions,
		Retention:        time.Duration(s.cfg.SessionRetention),
		IdleTimeout:      time.Duration(s.cfg.SessionIdleTimeout),
		MaxIdleTimeout:   time.Duration(s.cfg.SessionMaxIdleTimeout),
		IdleMemoryBudget: s.cfg.SessionIdleMemoryBytes,
		MaxBytes:         s.cfg.SessionMaxBytes,
		MaxFiles:         s.cfg.SessionMaxFiles,
		SpareVolumes:     s.cfg.SessionSpareVolumes,
		SpareKernels:     spareKernels,
		SparePolicy:      TypeDynamic,
		SpareRuntime:     dyn.Runtime,
		SpareMaxAge:      time.Duration(s.cfg.PoolMaxIdle),
		Owner:            s.owner,
		UID:              s.sandbox.HostUID(),
		GID:              s.sandbox.HostGID(),
	}, s.starter, s.log)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.sessErr = fmt.Errorf("sessions_dir %s: %w", s.cfg.SessionsDir, err)
		s.log.Error("sessions unavailable", "err", s.sessErr)
		return
	}
	if s.draining {
		m.Close()
		s.sessErr = errors.New("shutting down")
		return
	}
	s.manager, s.sessErr = m, nil
	s.log.Info("sessions open", "sessions_dir", s.cfg.SessionsDir, "sessions", len(m.List()))
}

// kernelStarter starts the session manager's kernels: the policy's
// sandbox, as a single-shot execution of it gets (spec), from the warm
// pool when one is ready.
type kernelStarter struct{ s *Server }

func (k kernelStarter) StartKernel(ctx context.Context, policy, runtime, ws string, o warmpool.KernelOptions) (session.Kernel, error) {
	kern, err := k.s.startKernel(ctx, policy, runtime, ws, o)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return kern, nil
}

// templateName names the warm template of policy on runtime: policy
// names are fixed and runtime names have no '/', so two never collide.
func templateName(policy, runtime string) string { return policy + "/" + runtime }

// startKernel starts a kernel of policy on runtime ("": the policy's) on
// the workspace ws.
func (s *Server) startKernel(ctx context.Context, policy, runtime, ws string, o warmpool.KernelOptions) (*warmpool.Kernel, error) {
	pol, ok := s.policies[policy]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q", policy)
	}
	rootfs, python, e := s.runtimeOr503(cmp.Or(runtime, pol.Runtime))
	if e != nil {
		return nil, e
	}
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	p := &plan{run: newRunName(), policy: pol, env: pol.BaseEnv()}
	spec := s.spec(p, rootfs, python, ws, nil, nil)
	spec.Logger = s.log.With("run", p.run, "policy", pol.Name)
	return pool.StartKernel(ctx, spec, o)
}

// SessionStats is the session manager's state (zero without one).
func (s *Server) SessionStats() session.Stats {
	s.mu.Lock()
	m := s.manager
	s.mu.Unlock()
	if m == nil {
		return session.Stats{}
	}
	return m.Stats()
}

// PoolStats is the warm pool's state (zero while it is off or not built).
func (s *Server) PoolStats() warmpool.Stats {
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	if pool == nil {
		return warmpool.Stats{}
	}
	return pool.Stats()
}

// checkReachable fails unless root is a directory that every user can reach:
// the sandbox's root is an unprivileged host uid, and a rootfs under a 0700
// directory fails every start with "permission denied" otherwise.
func checkReachable(root string) error {
	fi, err := os.Stat(root)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", root)
	}
	for d := root; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s: %s is mode %v; the sandbox cannot reach the rootfs (needs o+x on every parent)", root, d, fi.Mode().Perm())
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// findPython returns "python" when the image has it on PATH, else "python3"
// (Debian images ship only python3).
func findPython(root string) string {
	for _, d := range []string{"usr/local/bin", "usr/bin", "bin"} {
		if _, err := os.Lstat(filepath.Join(root, d, "python")); err == nil {
			return "python"
		}
	}
	return "python3"
}

// isDraining tells whether Drain began.
func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// enter registers a live execution unless the server is draining.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.inFlight.Add(1)
	return true
}

// ready is nil once the runtimes are ready, else why not yet (Prepare
// readies them all at once).
func (s *Server) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runtimes == nil {
		if s.prepErr != nil {
			return s.prepErr
		}
		return errors.New("the runtime rootfs is being prepared")
	}
	return nil
}

// Drain stops admitting executions, lets the live ones finish until ctx is
// done, then cancels the rest and waits for their cleanup, closes the
// session manager (kernels stopped, files kept for the next worker), and
// finally closes the warm pool (its ready sandboxes are ended and
// removed). It returns the number of executions it had to cancel.
func (s *Server) Drain(ctx context.Context) int {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.inFlight.Wait(); close(done) }()
	n := 0
	select {
	case <-done:
	case <-ctx.Done():
		n = s.live.cancelAll()
		s.log.Warn("grace period over, cancelling executions", "cancelled", n)
		<-done
	}
	s.mu.Lock()
	pool, m, release := s.pool, s.manager, s.releaseAnchor
	s.releaseAnchor = nil
	s.mu.Unlock()
	if m != nil {
		m.Close()
	}
	if release != nil {
		if err := release(); err != nil {
			s.log.Warn("unable to release the freezer anchor", "error", err)
		}
	}
	if pool != nil {
		pool.Close()
	}
	s.cleanups.Wait()
	// The sandboxes themselves are removed in the background too, by the
	// Runner (*nsjail.Runner.WaitForCleanup) that ran them.
	s.sandbox.WaitForCleanup()
	s.log.Info("drained", "cancelled", n)
	return n
}

// SweepOrphans clears what a worker killed with SIGKILL left behind (SECURITY.md
// case 22): its sandboxes (containers, cgroups, state, via Runner.Sweep) and
// then its workspaces and their tmpfs mounts. Call it on start, before
// serving and before the warm pool starts anything.
func SweepOrphans(r *nsjail.Runner, workRoot string, log *slog.Logger) error {
	sandboxes, err := r.Sweep()
	if err != nil {
		return fmt.Errorf("sweep orphan sandboxes: %w", err)
	}
	workspaces, err := workspace.Sweep(workRoot)
	if err != nil {
		return err
	}
	log.Info("swept orphans", "sandboxes", len(sandboxes), "workspaces", len(workspaces),
		"state_root", r.StateRoot(), "work_root", workRoot)
	return nil
}

// ClaimAndSweep is a worker's start before it serves: it claims the
// runner's state root and cgroup parent (Runner.Claim: a second worker on
// them fails here, and nothing of the live one is touched), then clears
// what a worker killed with SIGKILL left (SweepOrphans). `sandboxd serve`
// calls it on start and holds the claim until it exits; `sandboxd
// supervise` calls it after its serve child died without draining, and
// releases it at once (SECURITY.md case 60).
func ClaimAndSweep(r *nsjail.Runner, workRoot string, log *slog.Logger) (release func(), err error) {
	release, err = r.Claim()
	if err != nil {
		return nil, err
	}
	if err := SweepOrphans(r, workRoot, log); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// Close closes the result store; call it after Drain, once the HTTP server
// has stopped (a request still in flight then gets 503). Stored results stay
// on disk for the next worker.
func (s *Server) Close() error {
	s.fwd.close()
	return s.results.Close()
}
