package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/server/config"
)

// /mcp without Deps.MCP is 404; with it, the handler gets the body whole,
// after the guard, and never a body the API's bounds refuse (too large,
// too slow). No root: a fake sandbox and a stub MCP handler (the real one,
// on a real worker: cmd/sandboxd TestMCP).
func TestUnitMCPRoute(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) {
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
		c.ReadTimeout = config.Duration(300 * time.Millisecond)
		c.WorkerToken = "tok"
	})
	auth := []string{"Authorization", "Bearer tok"}
	code, _, body := u.do("POST", "/mcp", `{"jsonrpc": "2.0"}`, auth...)
	wantError(t, code, body, http.StatusNotFound, "MCP is not enabled")

	var calls atomic.Int64
	u.srv.mcp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		data, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("got "), data...))
	})
	code, _, body = u.do("POST", "/mcp", `{"jsonrpc": "2.0"}`, auth...)
	if code != http.StatusOK || string(body) != `got {"jsonrpc": "2.0"}` {
		t.Fatalf("POST /mcp = %d %s", code, body)
	}
	code, _, body = u.do("POST", "/mcp", `{}`, append(auth, "Origin", "https://evil.example")...)
	wantError(t, code, body, http.StatusForbidden, "Origin")
	code, _, body = u.do("POST", "/mcp", `{}`)
	wantError(t, code, body, http.StatusUnauthorized, "token")
	code, _, body = u.do("GET", "/mcp", nil, auth...)
	if code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /mcp = %d %s", code, body)
	}
	big := `{"x": "` + strings.Repeat("a", int(u.srv.maxBody())) + `"}`
	code, _, body = u.do("POST", "/mcp", big, auth...)
	wantError(t, code, body, http.StatusRequestEntityTooLarge, "more than")
	// A body trickled in slower than read_timeout: 408, the handler never runs.
	held, err := net.Dial("tcp", u.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	fmt.Fprintf(held, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\":")
	code, text := readResponse(t, held)
	wantError(t, code, []byte(text), http.StatusRequestTimeout, "read_timeout")
	if n := calls.Load(); n != 1 {
		t.Fatalf("the MCP handler ran %d times, want 1 (only the accepted request)", n)
	}
	u.wantNothingStarted(t)
}

// SECURITY.md case 55: a JSON-RPC batch is refused before the MCP handler
// sees it, and beyond max_concurrent + max_queued calls served at once a
// call gets 429 with Retry-After; a call that ends frees its place.
func TestUnitMCPBatchesAndConcurrency(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) {
		c.MaxConcurrent, c.MaxQueued = 1, 1
	})
	var calls atomic.Int64
	entered := make(chan struct{}, 4)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	u.srv.mcp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		w.Write([]byte("done"))
	})
	for _, batch := range []string{`[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, " \n\t[]"} {
		code, _, body := u.do("POST", "/mcp", batch)
		wantError(t, code, body, http.StatusBadRequest, "batches are not served")
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the MCP handler ran %d times for batches", n)
	}
	if got := cap(u.srv.mcpCalls); got != 2 {
		t.Fatalf("MCP call limit %d, want max_concurrent + max_queued = 2", got)
	}
	results := make(chan int, 2)
	for range 2 {
		go func() {
			code, _, _ := u.do("POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
			results <- code
		}()
		<-entered
	}
	code, h, body := u.do("POST", "/mcp", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	wantError(t, code, body, http.StatusTooManyRequests, "MCP calls are being served already")
	if h.Get("Retry-After") == "" {
		t.Errorf("429 without Retry-After")
	}
	releaseOnce.Do(func() { close(release) })
	for range 2 {
		if code := <-results; code != http.StatusOK {
			t.Errorf("a call within the bound got %d", code)
		}
	}
	code, _, body = u.do("POST", "/mcp", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if code != http.StatusOK || string(body) != "done" {
		t.Fatalf("after the calls ended: %d %s", code, body)
	}
	<-entered
	if n := calls.Load(); n != 3 {
		t.Fatalf("the MCP handler ran %d times, want 3", n)
	}
}

func TestUnitMCPCallLimit(t *testing.T) {
	for _, c := range []struct{ conc, queued, want int }{{4, 64, 68}, {1, 0, 1}, {0, 0, 1}} {
		if got := mcpCallLimit(c.conc, c.queued); got != c.want {
			t.Errorf("mcpCallLimit(%d, %d) = %d, want %d", c.conc, c.queued, got, c.want)
		}
	}
}
