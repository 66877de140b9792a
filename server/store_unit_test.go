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
