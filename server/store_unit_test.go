package server

// Unit tests (fake sandbox, no root) of how stored answers are served:
// streams, retries and their waiters, a store that fails, DELETE.

import (
	"context"
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
	if !strings.Contains(first.Error, "could not be stored") || first.Stdout != "" || len(first.Artifacts) != 0 {
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
