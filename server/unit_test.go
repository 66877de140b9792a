package server

// Fast tests of the request path that need no root: the server runs against
// a fake Sandboxer, which starts nothing and counts what it was asked to
// run, and makes plain directories for workspaces (mounting their tmpfs
// needs root). What the real sandbox and tmpfs do is tested with root
// beside these (reject_test.go, lifecycle_test.go, limits_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// fakeSandbox is a Sandboxer that starts nothing. It keeps the specs it was
// given and answers with result (by default: succeeded, stdout "ok\n").
type fakeSandbox struct {
	started      atomic.Int64
	cleanupWaits atomic.Int64
	mu           sync.Mutex
	specs        []nsjail.Spec
	result       func(ctx context.Context, spec nsjail.Spec) *nsjail.Result
}

func (f *fakeSandbox) Run(ctx context.Context, spec nsjail.Spec) (*nsjail.Result, error) {
	f.started.Add(1)
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
	if f.result != nil {
		return f.result(ctx, spec), nil
	}
	now := time.Now()
	return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, Stdout: []byte("ok\n"),
		StartedAt: now, FinishedAt: now}, nil
}

// HostUID and HostGID are the test's own ids, or an unprivileged pair
// when it runs as root (the session manager refuses root as the sandbox
// user); nothing the fake starts runs as them.
func (f *fakeSandbox) HostUID() int { return unprivileged(os.Getuid()) }
func (f *fakeSandbox) HostGID() int { return unprivileged(os.Getgid()) }

func unprivileged(id int) int {
	if id == 0 {
		return 65534
	}
	return id
}

// Prestart fails: the unit tests run without the warm pool.
func (f *fakeSandbox) Prestart(nsjail.Spec, ...*os.File) (*nsjail.Pending, error) {
	return nil, errors.New("the fake sandbox cannot pre-start")
}

// WaitForCleanup counts the drains that waited for the sandboxes' removal.
func (f *fakeSandbox) WaitForCleanup() { f.cleanupWaits.Add(1) }

// HoldFreezerAnchor holds nothing: nothing is ever frozen here.
func (f *fakeSandbox) HoldFreezerAnchor() (func() error, error) {
	return func() error { return nil }, nil
}

func (f *fakeSandbox) lastSpec() nsjail.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.specs[len(f.specs)-1]
}

// unitEnv is a server on a fake sandbox, served over HTTP with its own
// timeouts (testEnv's helpers apply).
type unitEnv struct {
	*testEnv
	fake *fakeSandbox
	// made counts the workspaces created; wsErr, when set, is what
	// creating one fails with.
	made  atomic.Int64
	wsErr error
}

// newUnitEnv starts a server on a fake sandbox; prepare says whether its
// rootfs is ready (else executions get 503).
func newUnitEnv(t *testing.T, prepare bool, mod func(*config.Config)) *unitEnv {
	t.Helper()
	cfg := config.Default()
	cfg.WorkRoot = filepath.Join(t.TempDir(), "work")
	cfg.ResultsDir = filepath.Join(t.TempDir(), "results")
	cfg.SessionsDir = filepath.Join(t.TempDir(), "sessions")
	cfg.PoolSize = 0
	// The fake starts no template: a pool of it (runtime_pool_size) is
	// one of zygotes, which it never readies.
	cfg.PoolTemplateForks = false
	if mod != nil {
		mod(&cfg)
	}
	fake := &fakeSandbox{}
	logs := &syncBuffer{}
	srv, err := New(Deps{
		Config:  cfg,
		Sandbox: fake,
		// "/" passes Prepare's checks; the fake never looks at it.
		ResolveRootfs: dirRootfs("/"),
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	u := &unitEnv{fake: fake}
	srv.createWorkspace = func(root, run string, _ workspace.Options, req workspace.Request) (*workspace.Workspace, error) {
		u.made.Add(1)
		if u.wsErr != nil {
			return nil, u.wsErr
		}
		return plainWorkspace(root, run, req)
	}
	if prepare {
		if err := srv.Prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	u.testEnv = &testEnv{t: t, srv: srv, cfg: cfg, logs: logs}
	u.http = serveForTest(t, srv, logs, u.wantNoWorkspaces, nil)
	return u
}

// plainWorkspace lays out a workspace as workspace.Create does, in a plain
// directory.
func plainWorkspace(root, run string, req workspace.Request) (*workspace.Workspace, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(root, workspace.ColdPrefix+run+"-")
	if err != nil {
		return nil, err
	}
	for _, d := range inside.LayoutDirs {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, inside.CodeFile), []byte(req.Code), 0o644); err != nil {
		return nil, err
	}
	if req.Input != nil {
		if err := os.WriteFile(filepath.Join(dir, inside.RequestFile), req.Input, 0o644); err != nil {
			return nil, err
		}
	}
	for _, f := range req.Files {
		p := filepath.Join(dir, inside.InputDir, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			return nil, err
		}
	}
	return &workspace.Workspace{Dir: dir}, nil
}

// wantNothingStarted fails unless no sandbox ran and no workspace was made.
func (u *unitEnv) wantNothingStarted(t *testing.T) {
	t.Helper()
	if n, m := u.fake.started.Load(), u.made.Load(); n != 0 || m != 0 {
		t.Fatalf("%d sandboxes started and %d workspaces made for a rejected request", n, m)
	}
}

// wantError fails unless the answer is status with msg in its error.
func wantError(t *testing.T, code int, body []byte, status int, msg string) {
	t.Helper()
	var eb errorBody
	if code != status || json.Unmarshal(body, &eb) != nil || !strings.Contains(eb.Error, msg) {
		t.Fatalf("got %d %s; want %d with %q", code, body, status, msg)
	}
}

// Every rejection of POST /v1/executions that needs no other execution:
// the status, the message, and nothing started.
func TestUnitRejectionsStartNothing(t *testing.T) {
	cases := []struct {
		name   string
		mod    func(*config.Config)
		body   any
		hdr    []string
		status int
		msg    string
	}{
		{"bad json", nil, `{"code": `, nil, 400, "invalid JSON"},
		{"unknown field", nil, `{"code": "x", "image": "y"}`, nil, 400, "unknown field"},
		{"no code", nil, ExecutionRequest{Code: "\n"}, nil, 400, "code is required"},
		{"bad id", nil, ExecutionRequest{ID: "a/b", Code: "x"}, nil, 400, "want " + inside.IDRule},
		{"unknown type", nil, ExecutionRequest{Type: "gpu", Code: "x"}, nil, 400, `unknown type "gpu"`},
		{"timeout above the policy", nil, ExecutionRequest{Code: "x", TimeoutMS: 30_001}, nil, 400, "timeout_ms must be <= 30000"},
		{"env not allowed", nil, ExecutionRequest{Code: "x", Env: map[string]string{"PYTHONPATH": "/tmp"}}, nil, 400, `env "PYTHONPATH" is not allowed`},
		{"env NUL", nil, ExecutionRequest{Code: "x", Env: map[string]string{"TZ": "U\x00TC"}}, nil, 400, "NUL byte"},
		{"file path traversal", nil, ExecutionRequest{Code: "x", Files: []File{{Path: "../x"}}}, nil, 400, "contains .."},
		{"no token", func(c *config.Config) { c.WorkerToken = "tok" }, ExecutionRequest{Code: "x"}, nil, 401, "bearer token"},
		{"wrong token", func(c *config.Config) { c.WorkerToken = "tok" }, ExecutionRequest{Code: "x"}, []string{"Authorization", "Bearer tok2"}, 401, "bearer token"},
		{"foreign Host", nil, ExecutionRequest{Code: "x"}, []string{"Host", "rebind.example"}, 403, "DNS-rebinding"},
		{"Origin", nil, ExecutionRequest{Code: "x"}, []string{"Origin", "http://localhost"}, 403, "CSRF"},
		{"code too large", func(c *config.Config) { c.MaxCodeBytes = 10 }, ExecutionRequest{Code: strings.Repeat("x", 11)}, nil, 413, "max_code_bytes"},
		{"body too large", func(c *config.Config) { c.MaxCodeBytes, c.MaxInputBytes = 10, 10 }, `{"code": "` + strings.Repeat("x", 70_000) + `"}`, nil, 413, "request body"},
		{"input too large", func(c *config.Config) { c.MaxInputBytes = 10 }, ExecutionRequest{Code: "x", Input: json.RawMessage(`"0123456789"`)}, nil, 413, "max_input_bytes"},
		{"too many files", func(c *config.Config) { c.MaxInputFiles = 1 }, ExecutionRequest{Code: "x", Files: []File{{Path: "a"}, {Path: "b"}}}, nil, 413, "max_input_files"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := newUnitEnv(t, true, c.mod)
			code, _, body := u.do("POST", "/v1/executions", c.body, c.hdr...)
			wantError(t, code, body, c.status, c.msg)
			u.wantNothingStarted(t)
		})
	}
}

// 503 before the rootfs is ready and while draining, with Retry-After
// while not ready.
func TestUnitNotReadyAndDraining(t *testing.T) {
	u := newUnitEnv(t, false, nil)
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{Code: "x"})
	wantError(t, code, body, 503, "not ready")
	if h.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if err := u.srv.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	u.srv.Drain(context.Background())
	code, _, body = u.do("POST", "/v1/executions", ExecutionRequest{Code: "x"})
	wantError(t, code, body, 503, "shutting down")
	u.wantNothingStarted(t)
	// The drain waited for the sandboxer's background removals (which
	// every Sandboxer has: a wrapper cannot hide them).
	if n := u.fake.cleanupWaits.Load(); n != 1 {
		t.Fatalf("drain waited for the sandboxes' removal %d times, want 1", n)
	}
}

// 507 when the work root is full: no sandbox, and the id is free again.
func TestUnitWorkRootFull(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	u.wsErr = fmt.Errorf("create workspace: %w", workspace.ErrFull)
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{ID: "full", Code: "x"})
	wantError(t, code, body, 507, "work root is full")
	if h.Get("Retry-After") == "" {
		t.Error("507 without Retry-After")
	}
	if n := u.fake.started.Load(); n != 0 {
		t.Fatalf("%d sandboxes started", n)
	}
	if code, _, body := u.do("GET", "/v1/executions/full", nil); code != 404 {
		t.Fatalf("the refused execution is still known: %d %s", code, body)
	}
	u.wsErr = nil
	wantExecStatus(t, u.execute(ExecutionRequest{ID: "full", Code: "x"}), "succeeded")
}

// 409: an id taken by another request; the retry of the same request gets
// the first answer. One sandbox in all.
func TestUnitConflict(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	first := u.execute(ExecutionRequest{ID: "same", Code: "print(1)"})
	wantExecStatus(t, first, "succeeded")
	code, _, body := u.do("POST", "/v1/executions", ExecutionRequest{ID: "same", Code: "print(2)"})
	wantError(t, code, body, 409, "taken by a different request")
	if again := u.execute(ExecutionRequest{ID: "same", Code: "print(1)"}); !again.FinishedAt.Equal(first.FinishedAt) {
		t.Fatalf("the retry got another execution: %+v", again)
	}
	if n, m := u.fake.started.Load(), u.made.Load(); n != 1 || m != 1 {
		t.Fatalf("%d sandboxes, %d workspaces; want 1", n, m)
	}
}

// 429 when every slot and queue place is taken, with Retry-After; the
// refused request starts nothing.
func TestUnitOverCapacity(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxConcurrent, c.MaxQueued = 1, 0 })
	release := make(chan struct{})
	u.fake.result = func(ctx context.Context, spec nsjail.Spec) *nsjail.Result {
		<-release
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, StartedAt: now, FinishedAt: now}
	}
	running := u.post(ExecutionRequest{Code: "slow"})
	waitFor(t, func() bool { return u.fake.started.Load() == 1 })
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{Code: "x"})
	wantError(t, code, body, 429, "over capacity")
	if h.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	close(release)
	wantExecStatus(t, <-running, "succeeded")
	if n, m := u.fake.started.Load(), u.made.Load(); n != 1 || m != 1 {
		t.Fatalf("%d sandboxes, %d workspaces; want 1", n, m)
	}
}

// 429 while max_decoding bodies are being received; nothing started.
func TestUnitDecodingBusy(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxDecoding = 1 })
	held := startBody(t, u.testEnv, 100, `{"code":`)
	waitFor(t, func() bool { return len(u.srv.decoding) == 1 })
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{Code: "x"})
	wantError(t, code, body, 429, "max_decoding")
	if h.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	held.Close() // its handler reads a truncated body: 400
	waitFor(t, func() bool { return len(u.srv.decoding) == 0 })
	u.wantNothingStarted(t)
}

// 408 for a body that does not arrive within read_timeout; nothing started.
func TestUnitSlowBody(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) {
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
		c.ReadTimeout = config.Duration(300 * time.Millisecond)
	})
	held := startBody(t, u.testEnv, 100, `{"code":`)
	code, text := readResponse(t, held)
	wantError(t, code, []byte(text), 408, "read_timeout")
	u.wantNothingStarted(t)
}

// POST /execute is the dynamic policy with the timeout in seconds, rounded
// up and capped at the policy's maximum instead of refused; its answer is
// the Flask worker's {output, error, status}.
func TestUnitLegacyRequest(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	u.fake.result = func(_ context.Context, spec nsjail.Spec) *nsjail.Result {
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusFailed, ExitCode: 1, LimitsHit: []string{},
			Stdout: []byte("out\n"), Stderr: []byte("Traceback\n"), StartedAt: now, FinishedAt: now}
	}
	dynamic := PoliciesFromConfig(u.cfg)[TypeDynamic]
	for _, c := range []struct {
		body string
		want time.Duration
	}{
		{`{"code": "x", "timeout": 2.5}`, 2500 * time.Millisecond},
		{`{"code": "x", "timeout": 0.0001}`, time.Millisecond},
		{`{"code": "x", "timeout": 3600}`, time.Duration(dynamic.TimeoutMS) * time.Millisecond},
		{`{"code": "x"}`, time.Duration(dynamic.TimeoutMS) * time.Millisecond},
	} {
		code, _, body := u.do("POST", "/execute", c.body)
		var lr LegacyResponse
		if code != 200 || json.Unmarshal(body, &lr) != nil {
			t.Fatalf("%s: %d %s", c.body, code, body)
		}
		if lr != (LegacyResponse{Output: "out\n", Error: "Traceback\n", Status: LegacyError}) {
			t.Errorf("%s: answer %+v", c.body, lr)
		}
		spec := u.fake.lastSpec()
		want := dynamic
		want.TimeoutMS = c.want.Milliseconds()
		job, isJob := runner.JobOf(spec.Args)
		if spec.Limits != want.Limits(u.cfg) || !slices.Equal(spec.Env, dynamic.BaseEnv()) || !isJob || job.Path != CodePath ||
			job.Display || job.Figures {
			t.Errorf("%s: spec %+v, want limits %+v", c.body, spec, want.Limits(u.cfg))
		}
	}
	before := u.fake.started.Load()
	for _, body := range []string{`{"code": "x", "timeout": -1}`, `{"code": ""}`, `{"code": "x", "type": "skill"}`} {
		code, _, resp := u.do("POST", "/execute", body)
		wantError(t, code, resp, 400, "")
	}
	if n := u.fake.started.Load(); n != before {
		t.Fatalf("a refused legacy request started a sandbox")
	}
}

// legacyFrom maps every status to the Flask contract.
func TestLegacyFrom(t *testing.T) {
	sig := "SIGSEGV"
	pol := Policy{TimeoutMS: 1500, MemoryMB: 64}
	for _, c := range []struct {
		name string
		in   ExecutionResponse
		want LegacyResponse
	}{
		{"success", ExecutionResponse{Status: "succeeded", Stdout: "hi\n"}, LegacyResponse{Output: "hi\n", Status: LegacySuccess}},
		{"stderr only whitespace", ExecutionResponse{Status: "succeeded", Stderr: " \n"}, LegacyResponse{Error: " \n", Status: LegacySuccess}},
		{"warning on stderr", ExecutionResponse{Status: "succeeded", Stderr: "warn\n"}, LegacyResponse{Error: "warn\n", Status: LegacyError}},
		{"exit 2", ExecutionResponse{Status: "failed", ExitCode: 2}, LegacyResponse{Status: LegacyError}},
		{"typed error", ExecutionResponse{Status: "failed", ExitCode: 1, Stderr: "Traceback ...\nNameError: x\n",
			Error: &ExecError{Code: &runner.Error{Type: "NameError", Message: "x", Text: "Traceback ...\nNameError: x\n"}}},
			LegacyResponse{Error: "Traceback ...\nNameError: x\n", Status: LegacyError}},
		{"crash", ExecutionResponse{Status: "failed", ExitCode: 139, Signal: &sig, Stderr: "x"},
			LegacyResponse{Error: "x\nexecution crashed with SIGSEGV", Status: LegacyCriticalError}},
		{"timeout", ExecutionResponse{Status: "timeout", ExitCode: 137, Policy: pol, Stdout: "partial"},
			LegacyResponse{Output: "partial", Error: "execution timed out after 1500 ms", Status: LegacyCriticalError}},
		{"oom", ExecutionResponse{Status: "oom", Policy: pol, Stderr: "Killed\n"},
			LegacyResponse{Error: "Killed\nexecution ran out of memory (limit 64 MiB)", Status: LegacyCriticalError}},
		{"cancelled", ExecutionResponse{Status: "cancelled"}, LegacyResponse{Error: "execution was cancelled", Status: LegacyCriticalError}},
		{"sandbox error", ExecutionResponse{Status: "sandbox_error", Error: errorMessage("unable to start sandbox: x")},
			LegacyResponse{Error: "sandbox error: unable to start sandbox: x", Status: LegacyCriticalError}},
	} {
		if got := legacyFrom(&c.in); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// The sandbox's environment is the policy's base, then the request's
// allowlisted extras in name order; LANG alone may be replaced; nothing of
// the worker's own environment.
func TestUnitPolicyEnv(t *testing.T) {
	t.Setenv("SANDBOXD_WORKER_SECRET", "x")
	u := newUnitEnv(t, true, func(c *config.Config) { c.AllowedEnv = []string{"TZ", "LANG", "PYTHONHASHSEED"}; c.DynamicCPUs = 1.5 })
	wantExecStatus(t, u.execute(ExecutionRequest{Code: "x", Env: map[string]string{"TZ": "UTC", "PYTHONHASHSEED": "0", "LANG": "de_DE.UTF-8"}}), "succeeded")
	want := []string{"PATH=" + inside.DefaultPath, "HOME=/tmp", "MPLCONFIGDIR=/tmp/matplotlib", "MPLBACKEND=Agg",
		"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=2", "OPENBLAS_NUM_THREADS=2", "MKL_NUM_THREADS=2",
		"LANG=de_DE.UTF-8", "PYTHONHASHSEED=0", "TZ=UTC"}
	if got := u.fake.lastSpec().Env; !slices.Equal(got, want) {
		t.Fatalf("env\n%q\nwant\n%q", got, want)
	}
	// An allowlisted name is still refused when it is not on this worker's
	// list, and a reserved one can never be (config.ReservedEnv).
	code, _, body := u.do("POST", "/v1/executions", ExecutionRequest{Code: "x", Env: map[string]string{"LC_ALL": "C"}})
	wantError(t, code, body, 400, `env "LC_ALL" is not allowed: allowed names are [TZ LANG PYTHONHASHSEED]`)
	c := u.cfg
	c.AllowedEnv = []string{"LD_PRELOAD"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "allowed_env must not include LD_PRELOAD") {
		t.Fatalf("a reserved name allowed: %v", err)
	}
	if n := u.fake.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

// The policy's thread counts follow its CPU limit, rounded up, at least 1.
func TestPolicyBaseEnvThreads(t *testing.T) {
	for cpus, want := range map[float64]string{0.01: "1", 0.5: "1", 1: "1", 1.01: "2", 4: "4"} {
		env := Policy{CPUs: cpus}.BaseEnv()
		for _, n := range []string{"OMP_NUM_THREADS=", "OPENBLAS_NUM_THREADS=", "MKL_NUM_THREADS="} {
			if !slices.Contains(env, n+want) {
				t.Errorf("cpus %g: %v lacks %s%s", cpus, env, n, want)
			}
		}
	}
}

// Apply: the type's policy, a timeout below its maximum applied, above it
// refused (never silently capped), 0 the default.
func TestPoliciesApply(t *testing.T) {
	ps := PoliciesFromConfig(config.Default())
	for _, c := range []struct {
		typ     string
		timeout int64
		want    int64
		err     string
	}{
		{"", 0, 30_000, ""},
		{"dynamic", 100, 100, ""},
		{"skill", 0, 120_000, ""},
		{"skill", 120_000, 120_000, ""},
		{"skill", 120_001, 0, `timeout_ms must be <= 120000 for type "skill", got: 120001`},
		{"dynamic", -5, 0, "timeout_ms must be > 0, got: -5"},
		{"root", 0, 0, `unknown type "root": want one of [dynamic skill]`},
	} {
		pol, err := ps.Apply(c.typ, c.timeout)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("Apply(%q, %d) = %v, want %q", c.typ, c.timeout, err, c.err)
			}
			continue
		}
		if err != nil || pol.TimeoutMS != c.want {
			t.Errorf("Apply(%q, %d) = %d %v, want %d", c.typ, c.timeout, pol.TimeoutMS, err, c.want)
		}
	}
}

// Admission: slots first, then the queue, then ErrOverCapacity; a queued
// ticket runs when a slot frees; a cancelled wait and Release give the
// place back; Release is idempotent; onChange sees every change.
func TestAdmission(t *testing.T) {
	var mu sync.Mutex
	var seen [][2]int
	a := NewAdmission(2, 1, func(running, queued int) {
		mu.Lock()
		seen = append(seen, [2]int{running, queued})
		mu.Unlock()
	})
	last := func() [2]int { mu.Lock(); defer mu.Unlock(); return seen[len(seen)-1] }
	t1, err1 := a.Reserve()
	t2, err2 := a.Reserve()
	t3, err3 := a.Reserve()
	if err1 != nil || err2 != nil || err3 != nil || !t1.running || !t2.running || t3.running {
		t.Fatalf("two slots then a queue place: %v %v %v", err1, err2, err3)
	}
	if got := last(); got != [2]int{2, 1} {
		t.Fatalf("onChange saw %v, want 2 running 1 queued", got)
	}
	if _, err := a.Reserve(); !errors.Is(err, ErrOverCapacity) {
		t.Fatalf("beyond slots and queue: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := t3.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a queued Wait with every slot busy: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- t3.Wait(context.Background()) }()
	t1.Release()
	if err := <-waited; err != nil || !t3.running {
		t.Fatalf("the queued ticket did not get the freed slot: %v", err)
	}
	mu.Lock()
	handedOver := slices.Contains(seen, [2]int{2, 0})
	mu.Unlock()
	if !handedOver {
		t.Fatalf("onChange never saw 2 running 0 queued: %v", seen)
	}
	t1.Release() // idempotent: must not free t2's or t3's slot
	t4, err := a.Reserve()
	if err != nil || t4.running {
		t.Fatalf("the queue place is free again, the slots are not: %v", err)
	}
	if _, err := a.Reserve(); !errors.Is(err, ErrOverCapacity) {
		t.Fatalf("a second Release freed another slot: %v", err)
	}
	t2.Release()
	if err := t4.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	t3.Release()
	if len(a.slots) != 1 || a.queued != 0 {
		t.Fatalf("%d slots held and %d queued, want t4's slot only", len(a.slots), a.queued)
	}
	t4.Release()
	if got := last(); got != [2]int{0, 0} {
		t.Fatalf("everything released, onChange saw %v", got)
	}

	// No queue: the third is refused at once.
	b := NewAdmission(1, 0, nil)
	u1, _ := b.Reserve()
	if _, err := b.Reserve(); !errors.Is(err, ErrOverCapacity) {
		t.Fatalf("max_queued 0: %v", err)
	}
	u1.Release()
	if u2, err := b.Reserve(); err != nil || !u2.running {
		t.Fatalf("after Release: %v", err)
	}
}

// A limit is never dressed as a Python error: the pids limit's "can't
// start new thread" (a RuntimeError the code saw) leaves the answer's
// error empty, while the same exception without a limit is the code's.
func TestUnitFillEventsLimitNotAnError(t *testing.T) {
	ev := runner.Outcome{Error: &runner.Error{Type: "RuntimeError", Message: "can't start new thread", Traceback: []runner.Frame{}, Text: "t"}}
	for _, c := range []struct {
		limits []string
		want   bool
	}{{[]string{"pids"}, false}, {[]string{"memory"}, false}, {[]string{}, true}} {
		resp := &ExecutionResponse{}
		res := &nsjail.Result{Status: nsjail.StatusFailed, ExitCode: 1, LimitsHit: c.limits}
		fillEvents(resp, res, ev, quietLog)
		if (resp.Error != nil) != c.want {
			t.Errorf("limits %v: error %+v, want one: %v", c.limits, resp.Error, c.want)
		}
	}
}
