package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
