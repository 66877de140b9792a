package server

// A session's execution or file request meeting a delete, a drain, a
// failed kernel start or its own retry, through the HTTP API on the real
// runtime. The kernel starts go through a gate (gatedStarter) so that each
// meeting happens at the moment the test names, not by luck of timing.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// gatedStarter holds every kernel start at its gate: entered gets the
// start's context, and the start goes on (the server's own starter) when
// the test sends nil on gate, or fails with the error sent. A start whose
// context is cancelled (a delete, a drain, a test that failed and ends)
// may stop waiting, as the pool's own start does.
type gatedStarter struct {
	inner   session.Starter
	entered chan context.Context
	gate    chan error
}

// gated returns a gatedStarter and the setup that puts it in a server.
func gated() (*gatedStarter, func(*Server)) {
	g := &gatedStarter{entered: make(chan context.Context), gate: make(chan error, 1)}
	return g, func(s *Server) { g.inner, s.starter = s.starter, g }
}

func (g *gatedStarter) StartKernel(ctx context.Context, policy, runtime, ws string, o warmpool.KernelOptions) (session.Kernel, error) {
	if o.WarmOnly {
		// No kernel is started ahead at Create: these tests gate the
		// start an execution makes.
		return nil, warmpool.ErrNoWarmSandbox
	}
	select {
	case g.entered <- ctx:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case err := <-g.gate:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.inner.StartKernel(ctx, policy, runtime, ws, o)
}

// reply is an HTTP answer received in the background.
type reply struct {
	code int
	body []byte
}

// async sends a request in the background.
func (e *testEnv) async(method, path string, body any) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		code, _, data := e.do(method, path, body)
		ch <- reply{code, data}
	}()
	return ch
}

// wantRefusal checks an error answer's status and that its body says msg.
func wantRefusal(t *testing.T, what string, r reply, status int, msg string) {
	t.Helper()
	if r.code != status || !strings.Contains(string(r.body), msg) {
		t.Fatalf("%s = %d %s, want %d with %q", what, r.code, r.body, status, msg)
	}
}

// wantNoExecution checks that the execution id is free: nothing stored.
func (e *testEnv) wantNoExecution(id string) {
	e.t.Helper()
	if code, _, body := e.do("GET", "/v1/executions/"+id, nil); code != http.StatusNotFound {
		e.t.Fatalf("GET /v1/executions/%s = %d %s, want 404 (the id free again)", id, code, body)
	}
}

// A session deleted while its execution's kernel starts: the execution is
// answered 404 (the session is gone), not a sandbox_error of a kernel
// start that failed because of the delete; its id is free, the delete
// done, nothing left behind.
func TestSessionDeletedWhileItsKernelStarts(t *testing.T) {
	g, wrap := gated()
	e := newEnvWith(t, nsjailtest.RuntimeRootfs(t), nil, wrap)
	e.createSession(SessionRequest{ID: "doomed"})
	exec := e.async("POST", "/v1/sessions/doomed/executions", SessionExecutionRequest{ID: "ex-doomed", Code: "print(1)"})
	ctx := <-g.entered
	deleted := e.async("DELETE", "/v1/sessions/doomed", nil)
	<-ctx.Done() // the delete cancels the execution
	// The start goes on, for real, with its context cancelled (or gives
	// up on it).
	g.gate <- nil
	wantRefusal(t, "the execution", <-exec, http.StatusNotFound, `no session \"doomed\"`)
	if r := <-deleted; r.code != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.code, r.body)
	}
	e.wantNoExecution("ex-doomed")
	if _, err := os.Lstat(filepath.Join(e.cfg.SessionsDir, "doomed")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("session directory after the delete: %v", err)
	}
}

// The drain's grace ends while a session's kernel starts: the execution is
// refused 503 (nothing ran; another worker may take it), not answered
// sandbox_error, and its id is free.
func TestSessionExecutionRefusedByTheDrain(t *testing.T) {
	g, wrap := gated()
	e := newEnvWith(t, nsjailtest.RuntimeRootfs(t), nil, wrap)
	e.createSession(SessionRequest{ID: "drained"})
	exec := e.async("POST", "/v1/sessions/drained/executions", SessionExecutionRequest{ID: "ex-drained", Code: "print(1)"})
	ctx := <-g.entered
	over, cancel := context.WithCancel(context.Background())
	cancel() // no grace: the drain cancels what runs at once
	drained := make(chan int)
	go func() { drained <- e.srv.Drain(over) }()
	<-ctx.Done()
	g.gate <- ctx.Err() // as the pool's start fails on its cancelled context
	r := <-exec
	wantRefusal(t, "the execution", r, http.StatusServiceUnavailable, "shutting down")
	if n := <-drained; n != 1 {
		t.Fatalf("the drain cancelled %d executions, want 1", n)
	}
	e.wantNoExecution("ex-drained")
	// The drain keeps the files for the next worker; this test is the
	// last one.
	if err := volume.Remove(filepath.Join(e.cfg.SessionsDir, "drained", "volume")); err != nil {
		t.Fatal(err)
	}
}

// A kernel start that fails (a passing failure of the worker's) refuses
// the execution 503 with Retry-After and frees its id: the client's retry
// of the same request runs it, in a new kernel.
func TestSessionKernelStartFailureFreesTheID(t *testing.T) {
	g, wrap := gated()
	e := newEnvWith(t, nsjailtest.RuntimeRootfs(t), nil, wrap)
	t.Cleanup(e.deleteSessions)
	e.createSession(SessionRequest{ID: "flaky"})
	req := SessionExecutionRequest{ID: "ex-flaky", Code: "print('ran')"}
	exec := e.async("POST", "/v1/sessions/flaky/executions", req)
	<-g.entered
	g.gate <- errors.New("no sandbox: a passing failure")
	r := <-exec
	wantRefusal(t, "the execution", r, http.StatusServiceUnavailable, "nothing ran: ")
	wantRefusal(t, "the execution", r, http.StatusServiceUnavailable, "no sandbox: a passing failure")
	e.wantNoExecution("ex-flaky")

	exec = e.async("POST", "/v1/sessions/flaky/executions", req)
	<-g.entered
	g.gate <- nil
	r = <-exec
	var resp ExecutionResponse
	if r.code != http.StatusOK || json.Unmarshal(r.body, &resp) != nil {
		t.Fatalf("the retry = %d %s", r.code, r.body)
	}
	wantExecStatus(t, &resp, "succeeded")
	wantState(t, &resp, session.StateNew, session.ReasonFirst, 1)
	if resp.Stdout != "ran\n" {
		t.Fatalf("the retry's stdout %q", resp.Stdout)
	}
}

// A client's retry of a named session execution, sent while its original
// holds the session (reserved, its kernel not started yet), gets the
// original's answer, never 409 session_busy: the id is claimed before the
// session is reserved, so the retry finds it live and waits. The code runs
// once.
func TestSessionRetryWhileItsOriginalRunsGetsItsAnswer(t *testing.T) {
	g, gate := gated()
	reserved, resume := make(chan struct{}), make(chan struct{})
	e := newEnvWith(t, nsjailtest.RuntimeRootfs(t), nil, func(s *Server) {
		gate(s)
		s.reserve = func(m *session.Manager, id string) (*session.Run, error) {
			run, err := m.Begin(id)
			if err == nil {
				reserved <- struct{}{}
				<-resume
			}
			return run, err
		}
	})
	t.Cleanup(e.deleteSessions)
	var once sync.Once
	release := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(release) // before the sessions are deleted, should the test fail
	e.createSession(SessionRequest{ID: "twins"})
	req := SessionExecutionRequest{ID: "ex-twin", Code: "print('once')"}
	original := e.async("POST", "/v1/sessions/twins/executions", req)
	<-reserved
	retry := e.async("POST", "/v1/sessions/twins/executions", req)
	waitFor(t, func() bool {
		select {
		case r := <-retry:
			t.Fatalf("the retry was answered while its original held the session: %d %s", r.code, r.body)
		default:
		}
		return len(e.srv.waiters) == 1 // it waits for the original
	})
	release()
	<-g.entered
	g.gate <- nil
	ro, rr := <-original, <-retry
	var vo, vr ExecutionResponse
	if ro.code != http.StatusOK || rr.code != http.StatusOK || json.Unmarshal(ro.body, &vo) != nil || json.Unmarshal(rr.body, &vr) != nil {
		t.Fatalf("the original = %d %s; the retry = %d %s", ro.code, ro.body, rr.code, rr.body)
	}
	wantExecStatus(t, &vo, "succeeded")
	if vo.Stdout != "once\n" || vr.Stdout != vo.Stdout || !vr.StartedAt.Equal(vo.StartedAt) {
		t.Fatalf("two answers: %q at %v and %q at %v", vo.Stdout, vo.StartedAt, vr.Stdout, vr.StartedAt)
	}
	if st := e.srv.SessionStats(); st.KernelStarts["new/first_execution"] != 1 {
		t.Fatalf("kernel starts %v: the code ran more than once", st.KernelStarts)
	}
}

// SECURITY.md case 49: a session deleted while an upload into its volume
// trickles: the delete cuts the upload (404: the session is gone, nothing
// written), rather than wait for its pace or read_timeout, and the volume
// goes only once the upload let go of it.
func TestSessionDeleteCutsItsUploads(t *testing.T) {
	e := newSessionEnv(t, shellRootfs(t), func(c *config.Config) { c.ReadTimeout = config.Duration(10 * time.Minute) })
	e.createSession(SessionRequest{ID: "cut", Kernel: new(bool)})
	c := startUpload(t, e, "/v1/sessions/cut/files/slow.bin", 10<<20, strings.Repeat("s", 1000))
	waitFor(t, func() bool { return len(e.srv.uploads) == 1 })
	deleted := e.async("DELETE", "/v1/sessions/cut", nil)
	code, body := readResponse(t, c)
	wantRefusal(t, "the upload", reply{code, []byte(body)}, http.StatusNotFound, `no session \"cut\"`)
	if r := <-deleted; r.code != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.code, r.body)
	}
	if _, err := os.Lstat(filepath.Join(e.cfg.SessionsDir, "cut")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("session directory after the delete: %v", err)
	}
}
