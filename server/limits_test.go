package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

func TestClip(t *testing.T) {
	if got := clip("short"); got != "short" {
		t.Errorf("clip(short) = %q", got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := clip(long)
	if len(got) > maxEchoBytes+32 || !strings.HasSuffix(got, "…(2000 bytes)") || !strings.HasPrefix(got, "éé") {
		t.Errorf("clip(long) = %q (%d bytes)", got, len(got))
	}
	if got := clip("a\xffb"); got != "a\uFFFDb" {
		t.Errorf("clip(invalid UTF-8) = %q", got)
	}
}

// Client strings echoed in errors and logs are clipped: a 1 MiB field name,
// id, path or env name gives a short error body and a short log line.
func TestEchoedStringsAreClipped(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	huge := strings.Repeat("n", 1<<20)
	cases := []struct {
		name, method, path string
		body               any
		status             int
	}{
		{"unknown field", "POST", "/v1/executions", `{"code":"true","` + huge + `":1}`, 400},
		{"id", "POST", "/v1/executions", ExecutionRequest{Code: "true", ID: huge}, 400},
		{"path", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: huge + "/../x"}}}, 400},
		{"deep path", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: strings.Repeat("d/", 9) + huge}}}, 400},
		{"duplicate path", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: huge}, {Path: huge}}}, 400},
		{"path with bad base64", "POST", "/v1/executions", ExecutionRequest{Code: "true", Files: []File{{Path: huge, ContentBase64: "!"}}}, 400},
		{"env name", "POST", "/v1/executions", ExecutionRequest{Code: "true", Env: map[string]string{huge: "x"}}, 400},
		{"type", "POST", "/v1/executions", ExecutionRequest{Code: "true", Type: huge}, 400},
		{"get id", "GET", "/v1/executions/" + huge[:60000], nil, 404},
		{"delete id", "DELETE", "/v1/executions/" + huge[:60000], nil, 404},
		{"host", "GET", "/v1/policies", nil, 403},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.name == "host" {
				hdr = []string{"Host", huge[:60000]}
			}
			before := len(e.logs.String())
			code, _, body := e.do(c.method, c.path, c.body, hdr...)
			if code != c.status || len(body) > 1024 {
				t.Fatalf("%d, %d bytes: %.300s", code, len(body), body)
			}
			for _, line := range strings.Split(e.logs.String()[before:], "\n") {
				if len(line) > 2048 {
					t.Errorf("log line of %d bytes: %.300s", len(line), line)
				}
			}
		})
	}
	if n := e.sandbox.started.Load(); n != 0 {
		t.Fatalf("%d sandboxes started", n)
	}
}

// startBody sends a POST's headers and the first bytes of its body, and
// leaves the rest unsent: the request holds a decoding turn until it is
// finished or times out.
func startBody(t *testing.T, e *testEnv, contentLength int, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", contentLength, first)
	return c
}

// readResponse reads one HTTP response from c.
func readResponse(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// SECURITY.md case 32: bodies being received and decoded at once are
// bounded by max_decoding; beyond it a request gets 429 with Retry-After
// (after a short wait) instead of another buffer in the worker.
func TestDecodingIsBounded(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) { c.MaxDecoding = 1 })
	rest := `"echo held"}`
	held := startBody(t, e, len(`{"code":`)+len(rest), `{"code":`)
	// The held request has its turn once its handler runs; until then a
	// second request may still get the turn first.
	waitFor(t, func() bool { return len(e.srv.decoding) == 1 })
	code, h, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: "echo second"})
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(string(body), "max_decoding") {
		t.Fatalf("second body while the first is received: %d %q %s", code, h.Get("Retry-After"), body)
	}
	io.WriteString(held, rest)
	if code, body := readResponse(t, held); code != 200 || !strings.Contains(body, `"stdout":"held\n"`) {
		t.Fatalf("held request: %d %s", code, body)
	}
	// The turn is back.
	wantExecStatus(t, e.execute(ExecutionRequest{Code: "true"}), "succeeded")
	_, _, metrics := e.do("GET", "/metrics", nil)
	if !strings.Contains(string(metrics), `reason="over_capacity"} 1`) {
		t.Errorf("the refusal is not counted")
	}
}

// SECURITY.md case 32, slowloris: a client that sends its headers byte by
// byte, one that sends nothing, one that trickles its body and an idle
// keep-alive connection are all disconnected by the configured timeouts;
// a trickled body gives back its decoding turn.
func TestSlowClientsAreDisconnected(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.MaxDecoding = 1
		c.ReadHeaderTimeout = config.Duration(500 * time.Millisecond)
		c.ReadTimeout = config.Duration(time.Second)
		c.IdleTimeout = config.Duration(time.Second)
	})
	addr := e.http.Listener.Addr().String()
	// closedWithin reports whether the server closes c within d, while
	// send (if any) keeps writing to it.
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := io.Copy(io.Discard, c)
		// EOF: closed by the server. A reset too: a server that closes
		// while bytes the trickling client sent since its last read are
		// still unread makes the kernel answer with RST (seen once in CI,
		// 0.5 s into "headers byte by byte"). A timeout is an error.
		return err == nil || errors.Is(err, syscall.ECONNRESET)
	}
	t.Run("headers byte by byte", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// 100 s worth of header at 10 bytes/s, if nothing stopped it.
		header := "GET /v1/policies HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + strings.Repeat("a", 1000)
		go func() {
			for i := range len(header) {
				if _, err := c.Write([]byte{header[i]}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		if !closedWithin(c, 10*time.Second) {
			t.Fatal("a client sending its headers byte by byte was not disconnected")
		}
	})
	t.Run("silent", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !closedWithin(c, 10*time.Second) {
			t.Fatal("a connection that never sent a byte was not closed")
		}
	})
	t.Run("body byte by byte", func(t *testing.T) {
		body := `{"code": "` + strings.Repeat(" ", 1000) + `true"}`
		c := startBody(t, e, len(body), body[:1])
		go func() {
			for i := 1; i < len(body); i++ {
				if _, err := c.Write([]byte{body[i]}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "read_timeout") {
				t.Fatalf("trickled body: %d %s", resp.StatusCode, b)
			}
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("a client trickling its body was not cut off")
		}
		// Its decoding turn is back.
		wantExecStatus(t, e.execute(ExecutionRequest{Code: "true"}), "succeeded")
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		if code, _ := readResponse(t, c); code != 200 {
			t.Fatalf("healthz = %d", code)
		}
		if !closedWithin(c, 10*time.Second) {
			t.Fatal("an idle keep-alive connection was not closed")
		}
	})
	if n := e.sandbox.started.Load(); n != 1 {
		t.Fatalf("%d sandboxes started, want 1", n)
	}
}

// The timeouts bound the client, never the execution: a synchronous POST
// whose run outlasts read_timeout and write_timeout still gets its answer,
// and the connection then serves the next request.
func TestLongExecutionOutlivesTimeouts(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.DynamicTimeoutMS = 5000
		c.ReadHeaderTimeout = config.Duration(200 * time.Millisecond)
		c.ReadTimeout = config.Duration(300 * time.Millisecond)
		c.WriteTimeout = config.Duration(300 * time.Millisecond)
	})
	resp := e.execute(ExecutionRequest{Code: "sleep 1.5; echo done"})
	wantExecStatus(t, resp, "succeeded")
	if resp.Stdout != "done\n" {
		t.Fatalf("stdout %q", resp.Stdout)
	}
	code, _, body := e.do("POST", "/execute", LegacyRequest{Code: "sleep 1; echo legacy"})
	if code != 200 || !strings.Contains(string(body), `"output":"legacy\n"`) {
		t.Fatalf("legacy: %d %s", code, body)
	}
	// DELETE waits for the cancelled run's cleanup; its answer arrives too.
	done := e.post(ExecutionRequest{ID: "long", Code: "sleep 1009"})
	e.waitStatus("long", StatusRunning)
	waitFor(t, func() bool { return e.sandbox.started.Load() == 3 })
	time.Sleep(500 * time.Millisecond) // past both timeouts
	if code, _, body := e.do("DELETE", "/v1/executions/long", nil); code != 200 || !strings.Contains(string(body), `"cancelled"`) {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	wantExecStatus(t, <-done, "cancelled")
}

// SECURITY.md case 33: the workspace tmpfs has workspace_inodes inodes, so
// code creating empty files (no bytes, only inodes and dentries in the
// kernel's slab) gets ENOSPC at the limit.
func TestWorkspaceInodeLimit(t *testing.T) {
	e := newEnv(t, shellRootfs(t), func(c *config.Config) {
		c.MaxInputFiles = 10
		c.WorkspaceInodes = 200
	})
	resp := e.execute(ExecutionRequest{Code: `df -i /workspace | tail -1
i=0; while touch /workspace/output/f$i; do i=$((i+1)); done; echo "created=$i"
df -i /workspace | tail -1`, Files: []File{{Path: "d/a.csv"}, {Path: "d/b.csv"}}})
	wantExecStatus(t, resp, "succeeded")
	lines := strings.Split(strings.TrimSpace(resp.Stdout), "\n")
	if len(lines) != 3 || !strings.Contains(resp.Stderr, "No space left on device") {
		t.Fatalf("stdout %q stderr %q", resp.Stdout, resp.Stderr)
	}
	// df -i: filesystem, inodes, used, free, use%, mount point.
	before, after := strings.Fields(lines[0]), strings.Fields(lines[2])
	if len(before) != 6 || len(after) != 6 || before[1] != "200" || after[3] != "0" {
		t.Fatalf("df -i before %q after %q", lines[0], lines[2])
	}
	// The layout (root, code/, main.py, input/, output/, artifacts/), d/
	// and its two files take 9; the code gets every other one.
	if lines[1] != "created=191" {
		t.Fatalf("%s, want created=191 (df -i before: %s)", lines[1], lines[0])
	}
}

// SECURITY.md case 33 through the warm pool and Python: a warm sandbox's
// workspace has the same inode limit, and os.open fails with ENOSPC there.
func TestWorkspaceInodeLimitWarm(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	e := newEnv(t, rootfs, func(c *config.Config) {
		c.PoolSize = 1
		c.PoolPreload = []string{}
		c.MaxInputFiles = 10
		c.WorkspaceInodes = 300
	})
	waitFor(t, func() bool { return e.srv.PoolStats().Ready >= 2 })
	resp := e.execute(ExecutionRequest{Code: `import errno, os
total = os.statvfs("/workspace").f_files
n = 0
try:
    while True:
        os.close(os.open(f"/workspace/output/f{n}", os.O_CREAT | os.O_WRONLY))
        n += 1
except OSError as e:
    print(total, n, errno.errorcode[e.errno])
`})
	wantExecStatus(t, resp, "succeeded")
	if e.srv.PoolStats().Taken != 1 {
		t.Fatalf("the pool did not serve it: %+v", e.srv.PoolStats())
	}
	// 300 inodes less the layout (6, no input) leave 294.
	if resp.Stdout != "300 294 ENOSPC\n" {
		t.Fatalf("stdout %q stderr %q", resp.Stdout, resp.Stderr)
	}
}

// BenchmarkDecodeMaxBody measures what decoding and validating the largest
// accepted body allocates (the alloc/body metric: bytes allocated per body
// byte), the factor server/README.md uses for the worst case of
// max_decoding bodies at once.
func BenchmarkDecodeMaxBody(b *testing.B) {
	cfg := config.Default()
	cfg.PoolSize = 0
	srv, err := New(Deps{Config: cfg, Sandbox: &countingSandbox{}, Logger: quietLog,
		ResolveRootfs: dirRootfs("")})
	if err != nil {
		b.Fatal(err)
	}
	// code and one file at their limits, the file's content as base64.
	content := strings.Repeat("A", int(cfg.MaxInputBytes)/3*4)
	body, _ := json.Marshal(ExecutionRequest{Code: strings.Repeat("x", int(cfg.MaxCodeBytes)), Files: []File{{Path: "data.bin", ContentBase64: content}}})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		req := httptest.NewRequest("POST", "/v1/executions", bytes.NewReader(body))
		var er ExecutionRequest
		done, e := srv.decodeBody(httptest.NewRecorder(), req, &er)
		if e != nil {
			b.Fatal(e.msg)
		}
		if _, e := srv.validate(&er); e != nil {
			b.Fatal(e.msg)
		}
		done()
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(body)), "alloc/body")
}
