package server

// Unit tests (fake sandbox, no root) of how stored answers are served:
// streams, retries and their waiters, a store that fails, DELETE.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/sandboxd/sandboxd/server/workspace"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/config"
)

// bigArtifact makes the fake sandbox leave an artifact of n bytes.
func (u *unitEnv) bigArtifact(n int) {
	u.fake.result = func(_ context.Context, spec nsjail.Spec) *nsjail.Result {
		os.WriteFile(filepath.Join(spec.Workspace, inside.ArtifactsDir, "big.bin"), make([]byte, n), 0o644)
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, StartedAt: now, FinishedAt: now}
	}
}

// slowGet sends GET path on a raw connection and reads its status line and
// nothing more: once the socket buffers are full the server's stream is
// stuck writing it.
func slowGet(t *testing.T, e *testEnv, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, len("HTTP/1.1 200"))
	if _, err := io.ReadFull(c, status); err != nil || string(status) != "HTTP/1.1 200" {
		t.Fatalf("slow GET %s: %q %v", path, status, err)
	}
	return c
}

// SECURITY.md case 32: answers being streamed at once are bounded by
// max_streams (each holds fds for up to write_timeout); beyond it GET gets
// 503 with Retry-After, and a stream that ends frees its turn.
func TestUnitStreamsAreBounded(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxStreams = 2 })
	u.bigArtifact(16 << 20) // 21 MiB of base64: more than the socket buffers
	wantExecStatus(t, u.execute(ExecutionRequest{ID: "big", Code: "x"}), "succeeded")

	slow := []net.Conn{slowGet(t, u.testEnv, "/v1/executions/big"), slowGet(t, u.testEnv, "/v1/executions/big")}
	var code int
	var h http.Header
	var body []byte
	waitFor(t, func() bool {
		code, h, body = u.do("GET", "/v1/executions/big", nil)
		return code != http.StatusOK
	})
	wantError(t, code, body, http.StatusServiceUnavailable, "max_streams")
	if h.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	// A retry of the POST reads the stored answer too: the same bound.
	code, _, body = u.do("POST", "/v1/executions", ExecutionRequest{ID: "big", Code: "x"})
	wantError(t, code, body, http.StatusServiceUnavailable, "max_streams")

	slow[0].Close()
	waitFor(t, func() bool {
		code, _, _ = u.do("GET", "/v1/executions/big", nil)
		return code == http.StatusOK
	})
	if n := u.fake.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

// A DELETE whose client leaves before the cancelled run has ended is
// answered 202 (the cancel stands), never an empty 200.
func TestUnitCancelClientGone(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the server's drain, even on failure
	u.fake.result = func(context.Context, nsjail.Spec) *nsjail.Result {
		<-release // ends only when the test says, cancelled or not
		now := time.Now()
		return &nsjail.Result{Status: nsjail.StatusCancelled, ExitCode: -1, LimitsHit: []string{}, StartedAt: now, FinishedAt: now}
	}
	running := u.post(ExecutionRequest{ID: "stuck", Code: "x"})
	waitFor(t, func() bool { return u.fake.started.Load() == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "DELETE", "/v1/executions/stuck", nil)
	req.Host = "127.0.0.1"
	rec := httptest.NewRecorder()
	u.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted || !strings.Contains(rec.Body.String(), `"id":"stuck"`) {
		t.Fatalf("DELETE whose client left = %d %q, want 202 with the execution", rec.Code, rec.Body.String())
	}
	free()
	wantExecStatus(t, <-running, "cancelled")
}

// The code never runs twice: when its answer cannot be stored after it ran
// (here: the answer's file cannot be written), a small sandbox_error
// answer is stored instead, so the id stays taken and a retry of the same
// request gets that answer rather than a second run.
func TestUnitUnstoredAnswerKeepsTheID(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	u.fake.result = func(_ context.Context, spec nsjail.Spec) *nsjail.Result {
		os.WriteFile(filepath.Join(spec.Workspace, inside.ArtifactsDir, "a.bin"), []byte("artifact"), 0o644)
		// A directory where the store writes the answer's JSON: Finish
		// fails, root or not.
		os.MkdirAll(filepath.Join(u.cfg.ResultsDir, spec.ID, "doc.json"), 0o700)
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, Stdout: []byte("secret output\n"),
			StartedAt: now, FinishedAt: now}
	}
	req := ExecutionRequest{ID: "once", Code: "x"}
	first := u.execute(req)
	wantExecStatus(t, first, "sandbox_error")
	if !strings.Contains(first.Error.String(), "could not be stored") || first.Stdout != "" || len(first.Artifacts) != 0 {
		t.Fatalf("the unstored answer: %+v", first)
	}
	again := u.execute(req)
	if n := u.fake.started.Load(); n != 1 {
		t.Fatalf("the code ran %d times, want once", n)
	}
	if again.Status != "sandbox_error" || !again.FinishedAt.Equal(first.FinishedAt) {
		t.Fatalf("the retry got %+v", again)
	}
	if code, _, body := u.do("GET", "/v1/executions/once", nil); code != 200 || !strings.Contains(string(body), "could not be stored") {
		t.Fatalf("GET = %d %s", code, body)
	}
}

// An execution that ran and whose answer could not be stored at all stays
// pending in the store (the next worker answers it interrupted): a retry
// is told so at once, neither run again nor left spinning.
func TestUnitRetryOfUnstoredExecution(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	req := ExecutionRequest{ID: "lost", Code: "x"}
	if _, err := u.srv.results.Create("lost", newRunName(), requestHash(&req), nil); err != nil {
		t.Fatal(err)
	}
	code, _, body := u.do("POST", "/v1/executions", req)
	wantError(t, code, body, 500, "could not be stored")
	code, _, body = u.do("POST", "/v1/executions", ExecutionRequest{ID: "lost", Code: "other"})
	wantError(t, code, body, 409, "taken by a different request")
	u.wantNothingStarted(t)
}

// blockRuns makes the fake sandbox's runs wait for the returned release
// (idempotent; called at cleanup too, before the server's drain).
func (u *unitEnv) blockRuns(t *testing.T) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	u.fake.result = func(_ context.Context, spec nsjail.Spec) *nsjail.Result {
		<-ch
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{}, Stdout: []byte("done\n"),
			StartedAt: now, FinishedAt: now}
	}
	return release
}

// postCtx POSTs req with ctx (cancel it to leave) and returns the status.
func (u *unitEnv) postCtx(ctx context.Context, req ExecutionRequest) (int, http.Header, string) {
	data, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, "POST", u.http.URL+"/v1/executions", bytes.NewReader(data))
	resp, err := u.http.Client().Do(hr)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// metric reads one series' value from /metrics ("" when absent).
func (u *unitEnv) metric(series string) string {
	_, _, body := u.do("GET", "/metrics", nil)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// SECURITY.md case 32: retries of a running execution wait on their own
// connection and are bounded. Each waits holding none of its request's
// code; beyond max_concurrent + max_queued waiting ones, a retry gets 429
// with Retry-After; a retry whose client leaves stops waiting (counted as
// client_gone) while the execution goes on, and its result is stored.
func TestUnitRetryWaitersAreBounded(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxConcurrent, c.MaxQueued = 1, 1 })
	release := u.blockRuns(t)
	req := ExecutionRequest{ID: "awaited", Code: strings.Repeat("x", 100_000)}
	first := u.post(req)
	waitFor(t, func() bool { return u.fake.started.Load() == 1 })

	// Two may wait (1 + 1); the first of them leaves.
	leaving, leave := context.WithCancel(context.Background())
	gone := make(chan int, 1)
	go func() { code, _, _ := u.postCtx(leaving, req); gone <- code }()
	waitFor(t, func() bool { return len(u.srv.waiters) == 1 })
	stays := u.post(req)
	waitFor(t, func() bool { return len(u.srv.waiters) == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code, h, body := u.postCtx(ctx, req)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(body, "retries are waiting") {
		t.Fatalf("a retry beyond the waiters' bound = %d %q %s; want 429 with Retry-After", code, h.Get("Retry-After"), body)
	}

	leave()
	<-gone
	waitFor(t, func() bool {
		return u.metric(`sandboxd_requests_rejected_total{reason="client_gone"}`) == "1" && len(u.srv.waiters) == 1
	})
	if v, ok := u.srv.live.get("awaited"); !ok || v.status != StatusRunning {
		t.Fatalf("the execution did not go on after a waiting retry left: %+v %v", v, ok)
	}

	release()
	for _, ch := range []<-chan *ExecutionResponse{first, stays} {
		if r := <-ch; r.Status != "succeeded" || r.Stdout != "done\n" {
			t.Fatalf("answer %+v", r)
		}
	}
	if code, _, body := u.do("GET", "/v1/executions/awaited", nil); code != 200 || !strings.Contains(string(body), `"stdout":"done\n"`) {
		t.Fatalf("GET after the run = %d %s", code, body)
	}
	if n := u.fake.started.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// A waiting retry holds no code: when the run it waited for is refused
// before it starts (here: its workspace), the retry is told to send the
// request again (503 + Retry-After) instead of running without its code.
func TestUnitRetryOfRefusedRunIsSentAgain(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxConcurrent, c.MaxQueued = 1, 1 })
	release := u.blockRuns(t)
	busy := u.post(ExecutionRequest{Code: "first"})
	waitFor(t, func() bool { return u.fake.started.Load() == 1 })
	req := ExecutionRequest{ID: "queued", Code: "second"}
	queued := u.post(req)
	u.waitStatus("queued", StatusQueued)
	retry := make(chan string, 1)
	go func() {
		code, h, body := u.postCtx(context.Background(), req)
		retry <- fmt.Sprint(code, " ", h.Get("Retry-After"), " ", body)
	}()
	waitFor(t, func() bool { return len(u.srv.waiters) == 1 })
	u.wsErr = fmt.Errorf("create workspace: %w", workspace.ErrFull)
	release()
	<-busy
	if r := <-queued; !strings.Contains(r.Status, "Insufficient Storage") {
		t.Fatalf("the queued run = %s", r.Status)
	}
	if got := <-retry; !strings.HasPrefix(got, "503 1 ") || !strings.Contains(got, "send the request again") {
		t.Fatalf("the waiting retry = %s", got)
	}
	if n := u.fake.started.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}
