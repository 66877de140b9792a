package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/rootfs"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/volume"
)

// Every test binary gets its own state root and cgroup parent (the same the
// pool tests use), so the leftover check at the end sees only what this
// binary created.
var (
	testStateRoot    = nsjailtest.StateRoot
	testCgroupParent = nsjailtest.CgroupParent
)

func TestMain(m *testing.M) {
	if os.Getenv(crashWorkerEnv) != "" {
		crashWorker() // never returns
	}
	code := nsjailtest.RunAndCheck(m, [2]string{crashStateRoot, crashCgroupParent})
	removeTestRuntimes()
	nsjailtest.RemoveUnmounted(shDir)
	os.Exit(code)
}

// countingSandbox is the real runner, counting the sandboxes it runs cold
// (the warm pool's fallbacks too; not its pre-started ones), so a rejection
// test can assert that none started, and keeping their specs.
type countingSandbox struct {
	*nsjail.Runner
	started atomic.Int64
	mu      sync.Mutex
	specs   []nsjail.Spec
}

func (c *countingSandbox) Run(ctx context.Context, spec nsjail.Spec) (*nsjail.Result, error) {
	c.started.Add(1)
	c.mu.Lock()
	c.specs = append(c.specs, spec)
	c.mu.Unlock()
	return c.Runner.Run(ctx, spec)
}

func (c *countingSandbox) lastSpec() nsjail.Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.specs[len(c.specs)-1]
}

var (
	shOnce sync.Once
	shDir  string
	shErr  error
)

// shellRootfs is the busybox rootfs with /usr/bin/python a shim that runs
// main.py with /bin/sh (nsjailtest.WritePythonShim). It lets the API's own paths (admission, cancel,
// artifacts, limits, workspaces) run in real sandboxes without the Python
// runtime image; the Python contract tests use RuntimeRootfs.
func shellRootfs(t testing.TB) string {
	t.Helper()
	bb := nsjailtest.BusyboxRootfs(t)
	shOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sandboxd-servertest-rootfs-")
		if err != nil {
			shErr = err
			return
		}
		if out, err := exec.Command("cp", "-a", bb+"/.", dir).CombinedOutput(); err != nil {
			shErr = fmt.Errorf("copy busybox rootfs: %v: %s", err, out)
			return
		}
		shErr = nsjailtest.WritePythonShim(dir, CodePath)
		shDir = dir
	})
	if shErr != nil {
		t.Fatalf("shell rootfs: %v", shErr)
	}
	return shDir
}

var quietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// testEnv is one server on a real runner behind an httptest server that
// runs the production http.Server settings (Server.HTTPServer).
type testEnv struct {
	t       *testing.T
	srv     *Server
	sandbox *countingSandbox
	http    *httptest.Server
	cfg     config.Config
	logs    *syncBuffer // the server's log lines, warnings and up
	// token, when set, is sent as the bearer token by do and send unless
	// the request carries an Authorization of its own.
	token string
}

// syncBuffer is a bytes.Buffer safe for concurrent log writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// noPool is the mod of a test's cold server, the baseline its warm one is
// compared with: without a pool even when SANDBOXD_TEST_POOL_SIZE gives
// the others one (nsjailtest.PoolSize).
func noPool(c *config.Config) { c.PoolSize = 0 }

// newEnv starts a server on rootfs with cfg adjusted by mod. The work root is
// a fresh temp dir unless mod sets one.
func newEnv(t *testing.T, rootfs string, mod func(*config.Config)) *testEnv {
	t.Helper()
	return newEnvWith(t, rootfs, mod, nil)
}

// newEnvWith is newEnv with setup, when not nil, run on the server before
// it is prepared and served: a test replaces its hooks (starter, reserve).
func newEnvWith(t *testing.T, rootfs string, mod func(*config.Config), setup func(*Server)) *testEnv {
	t.Helper()
	return newEnvOn(t, rootfs, mod, setup, nil)
}

// newEnvOn is newEnvWith served on ln (nil: a new loopback port), for
// workers whose addresses must be known before they start (peers).
func newEnvOn(t *testing.T, rootfs string, mod func(*config.Config), setup func(*Server), ln net.Listener) *testEnv {
	t.Helper()
	nsjailtest.RequireRoot(t)
	cfg := config.Default()
	cfg.WorkRoot = filepath.Join(t.TempDir(), "work")
	cfg.ResultsDir = filepath.Join(t.TempDir(), "results")
	cfg.SessionsDir = filepath.Join(t.TempDir(), "sessions")
	cfg.StateRoot = testStateRoot
	cfg.PythonImage = "dir:" + rootfs
	// No pool (the pool tests turn it on), unless SANDBOXD_TEST_POOL_SIZE
	// asks for one on a Python rootfs (nsjailtest.PoolSize).
	cfg.PoolSize = nsjailtest.PoolSize(t, rootfs)
	// EXECUTION_POOL_TEMPLATE_FORKS in the test's environment chooses
	// zygotes or template forks (unset: the config's default; a test's mod
	// may still choose: TestPoolThroughAPI runs both).
	cfg.PoolTemplateForks = nsjailtest.TemplateForks(t, cfg.PoolTemplateForks)
	// A spare session kernel takes a warm sandbox whenever the pool has
	// refilled: the pool tests count what the pool served. The spare
	// kernel tests turn it on.
	cfg.SessionSpareKernels = 0
	if mod != nil {
		mod(&cfg)
	}
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: testCgroupParent, Logger: quietLog})
	cs := &countingSandbox{Runner: r}
	logs := &syncBuffer{}
	srv, err := New(Deps{
		Config:        cfg,
		Sandbox:       cs,
		ResolveRootfs: dirRootfs(rootfs),
		Logger:        slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(srv)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &testEnv{t: t, srv: srv, sandbox: cs, cfg: cfg, logs: logs}
	e.http = serveForTest(t, srv, logs, e.wantNoWorkspaces, ln)
	return e
}

// serveForTest serves srv's API on a test listener. When the test ends it
// logs the server's log lines if the test failed, drains and closes the
// server, then runs leftovers (a check that nothing outlived it).
func serveForTest(t *testing.T, srv *Server, logs *syncBuffer, leftovers func(), ln net.Listener) *httptest.Server {
	hs := httptest.NewUnstartedServer(nil)
	if ln != nil {
		hs.Listener.Close()
		hs.Listener = ln
	}
	hs.Config = srv.HTTPServer(nil)
	hs.Start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Drain(ctx)
		hs.Close()
		srv.Close()
		leftovers()
	})
	return hs
}

// do sends a request and returns the status, headers and body.
func (e *testEnv) do(method, path string, body any, hdr ...string) (int, http.Header, []byte) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.http.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// execute POSTs req to /v1/executions and decodes a 200 answer.
func (e *testEnv) execute(req ExecutionRequest) *ExecutionResponse {
	e.t.Helper()
	code, _, body := e.do("POST", "/v1/executions", req)
	if code != http.StatusOK {
		e.t.Fatalf("POST /v1/executions = %d: %s", code, body)
	}
	var resp ExecutionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		e.t.Fatalf("decode response: %v\n%s", err, body)
	}
	return &resp
}

func wantExecStatus(t *testing.T, r *ExecutionResponse, want string) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("status = %s, want %s (exit %d, signal %v, limits %v, error %q)\nstdout: %s\nstderr: %s",
			r.Status, want, r.ExitCode, r.Signal, r.LimitsHit, r.Error, r.Stdout, r.Stderr)
	}
}

// workspaces lists what is left under the work root once the background
// removals of finished executions are done.
func (e *testEnv) workspaces() []string {
	e.srv.cleanups.Wait()
	entries, _ := os.ReadDir(e.cfg.WorkRoot)
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

func (e *testEnv) wantNoWorkspaces() {
	e.t.Helper()
	e.wantNoSessionMounts()
	if ws := e.workspaces(); len(ws) > 0 {
		e.t.Fatalf("workspaces left under %s: %v", e.cfg.WorkRoot, ws)
	}
	if m := mountsUnder(e.cfg.WorkRoot); len(m) > 0 {
		e.t.Fatalf("mounts left under %s: %v", e.cfg.WorkRoot, m)
	}
}

// mountsUnder lists the mount points strictly below dir.
func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// waitStatus polls GET until the execution reports status.
func (e *testEnv) waitStatus(id, status string) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		code, _, body := e.do("GET", "/v1/executions/"+id, nil)
		if code == http.StatusOK {
			var v struct{ Status string }
			json.Unmarshal(body, &v)
			if v.Status == status {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("execution %s never reached status %s", id, status)
}

// newRecorder serves one request on srv's handler without a listener.
func newRecorder(srv *Server, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Host = "127.0.0.1"
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// otherConfig is e's config for a second server beside e's: its own result
// store (a results_dir is one worker's).
func (e *testEnv) otherConfig() config.Config {
	cfg := e.cfg
	cfg.ResultsDir = filepath.Join(e.t.TempDir(), "results")
	cfg.SessionsDir = filepath.Join(e.t.TempDir(), "sessions")
	return cfg
}

// wantNoSessionMounts fails if a session volume is still mounted under
// sessions_dir once the server is drained (a test must delete the sessions
// it made), and unmounts it: t.TempDir's removal must never walk into a
// mounted volume.
func (e *testEnv) wantNoSessionMounts() {
	e.t.Helper()
	if e.cfg.SessionsDir == "" {
		return
	}
	e.srv.mu.Lock()
	drained := e.srv.draining
	e.srv.mu.Unlock()
	var left []string
	for _, m := range mountsUnder(e.cfg.SessionsDir) {
		// Until the drain closes it, the manager keeps spare volumes
		// ready (session_spare_volumes); Close removes them.
		if !drained && strings.Contains(m, "/.spare-") {
			continue
		}
		left = append(left, m)
	}
	if len(left) == 0 {
		return
	}
	e.t.Errorf("session volumes left mounted: %v", left)
	entries, _ := os.ReadDir(e.cfg.SessionsDir)
	for _, en := range entries {
		volume.Remove(filepath.Join(e.cfg.SessionsDir, en.Name(), "volume"))
	}
}

// dirRootfs resolves every runtime to the unpacked rootfs dir (as a dir:
// reference resolves in `serve`: no digest, no labels).
func dirRootfs(dir string) func(context.Context, string, string) (rootfs.Image, error) {
	return func(context.Context, string, string) (rootfs.Image, error) {
		return rootfs.Image{RootfsPath: dir, Labels: map[string]string{}}, nil
	}
}

// pacedBody is an 8 MiB upload body sent at a steady pace, 1 MiB every
// 100 ms: longer than a short read_timeout, but never behind the pace
// uploads must keep (1 MiB/s).
func pacedBody() io.Reader {
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("p"), 1<<20)
		for range 8 {
			pw.Write(chunk)
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	return pr
}
