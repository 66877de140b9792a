package server

// Output over the cap and event streams on the real runtime: cold, warm
// and session kernel executions alike.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

// tenMB prints 10 MB of numbered lines, then the line that matters.
const tenMB = "for i in range(100000):\n    print('%099d' % i)\nprint('LAST LINE')\n"

// wantHeadAndTail checks an answer of tenMB: the head and the tail kept,
// what was cut between them counted.
func wantHeadAndTail(t *testing.T, how string, r *ExecutionResponse, capBytes int64) {
	t.Helper()
	total := int64(100000*100 + len("LAST LINE\n"))
	if r.Status != "succeeded" || !r.StdoutTruncated || int64(len(r.Stdout)) != capBytes ||
		r.StdoutOmittedBytes != total-capBytes || r.StderrOmittedBytes != 0 {
		t.Fatalf("%s: status %s truncated %v kept %d omitted %d (stderr %q)", how, r.Status, r.StdoutTruncated,
			len(r.Stdout), r.StdoutOmittedBytes, r.Stderr)
	}
	if !strings.HasPrefix(r.Stdout, fmt.Sprintf("%099d\n%099d\n", 0, 1)) || !strings.HasSuffix(r.Stdout, fmt.Sprintf("%099d\nLAST LINE\n", 99999)) {
		t.Fatalf("%s: the head or the tail is missing: %q … %q", how, r.Stdout[:120], r.Stdout[len(r.Stdout)-120:])
	}
}

// A 10 MB output keeps its last line, cold, warm and in a session.
func TestOutputKeepsItsTail(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	cold := newSessionEnv(t, rootfs, noPool)
	wantHeadAndTail(t, "cold", cold.execute(ExecutionRequest{Code: tenMB}), cold.cfg.MaxStdoutBytes)

	cold.createSession(SessionRequest{ID: "tail"})
	wantHeadAndTail(t, "session", cold.sessionExec("tail", SessionExecutionRequest{Code: tenMB}), cold.cfg.MaxStdoutBytes)

	warm := newEnv(t, rootfs, func(c *config.Config) { c.PoolSize = 1 })
	waitPoolReady(t, warm)
	wantHeadAndTail(t, "warm", warm.execute(ExecutionRequest{Code: tenMB}), warm.cfg.MaxStdoutBytes)
	if st := warm.srv.PoolStats(); st.Taken != 1 {
		t.Fatalf("the warm pool did not serve it: %+v", st)
	}
}

func waitPoolReady(t *testing.T, e *testEnv) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for e.srv.PoolStats().Ready < 2 { // one per policy
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.srv.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// printSleepPrint writes its first line at once and its second 2 s later.
const printSleepPrint = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')\n"

// wantRunning fails unless GET says the execution is still running.
func (e *testEnv) wantRunning(id string) {
	e.t.Helper()
	code, _, body := e.do("GET", "/v1/executions/"+id, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"status":"running"`) {
		e.t.Fatalf("execution %s is not running: %d %s", id, code, body)
	}
}

// An event stream read live: the first line arrives while the code is
// still running, then the second, then the result.
func TestEventStreamLive(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	s := e.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "py-live", Code: printSleepPrint})
	s.wantText("stdout", "first\n")
	e.wantRunning("py-live")
	texts, r := s.rest()
	s.end()
	if texts["stdout"] != "second\n" || len(texts) != 1 {
		t.Fatalf("events after the first line: %q", texts)
	}
	if r.Status != "succeeded" || r.Stdout != "first\nsecond\n" || r.StdoutOmittedBytes != 0 {
		t.Fatalf("result %+v", r)
	}
}

// A dropped connection resumes with Last-Event-ID: the rest, then the
// result; the execution, named, went on meanwhile.
func TestEventStreamResumedAfterDrop(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	s := e.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "py-resume", Code: printSleepPrint})
	first := s.next()
	var seen struct{ Text string }
	if json.Unmarshal([]byte(first.data), &seen); first.typ != "stdout" || !strings.HasPrefix(seen.Text, "first") {
		t.Fatalf("first event %+v", first)
	}
	s.close()
	r := e.openEvents("GET", "/v1/executions/py-resume/events", nil, "Last-Event-ID", first.id)
	texts, resp := r.rest()
	r.end()
	if seen.Text+texts["stdout"] != "first\nsecond\n" {
		t.Fatalf("events after %s (%q): %q", first.id, seen.Text, texts)
	}
	if resp.Status != "succeeded" || resp.Stdout != "first\nsecond\n" {
		t.Fatalf("result %+v", resp)
	}
}

// respond-async: 202 at once, the execution goes on, its events and GET
// give the result.
func TestRespondAsyncThenEvents(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	code, h, body := e.do("POST", "/v1/executions", ExecutionRequest{Code: printSleepPrint}, "Prefer", "respond-async")
	if code != http.StatusAccepted || !strings.HasPrefix(h.Get("Location"), "/v1/executions/ex-") {
		t.Fatalf("respond-async: %d %v %s", code, h, body)
	}
	loc := h.Get("Location")
	id := strings.TrimPrefix(loc, "/v1/executions/")
	s := e.openEvents("GET", loc+"/events", nil)
	s.wantText("stdout", "first\n")
	e.wantRunning(id)
	texts, r := s.rest()
	if texts["stdout"] != "second\n" || r.ID != id || r.Status != "succeeded" {
		t.Fatalf("result %+v", r)
	}
	code, _, body = e.do("GET", loc, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"stdout":"first\nsecond\n"`) {
		t.Fatalf("GET %s: %d %s", loc, code, body)
	}
}

// A session's execution streams as a single-shot one does, through its
// kernel's output pipes; the code waits for the test's file "go".
func TestSessionExecutionStreamed(t *testing.T) {
	e := newSessionEnv(t, nsjailtest.RuntimeRootfs(t), nil)
	e.createSession(SessionRequest{ID: "stream"})
	e.sessionExec("stream", SessionExecutionRequest{Code: "n = 41"})
	s := e.openEvents("POST", "/v1/sessions/stream/executions",
		SessionExecutionRequest{ID: "sx-1", Code: "import os, sys, time\nprint('first', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint(n + 1)\nprint('oops', file=sys.stderr)\n"})
	s.wantText("stdout", "first\n")
	e.wantRunning("sx-1")
	// A busy session refuses as usual (409), before any stream or 202.
	for _, hdr := range [][]string{{"Accept", "text/event-stream"}, {"Prefer", "respond-async"}} {
		code, h, body := e.do("POST", "/v1/sessions/stream/executions", SessionExecutionRequest{Code: "1"}, hdr...)
		if code != http.StatusConflict || h.Get("Content-Type") != "application/json" || !strings.Contains(string(body), "session_busy") {
			t.Fatalf("%v on a busy session: %d %s", hdr, code, body)
		}
	}
	if code, body := e.put("stream", "go", nil); code >= 300 {
		t.Fatalf("PUT go: %d %s", code, body)
	}
	texts, r := s.rest()
	s.end()
	if texts["stdout"] != "42\n" || texts["stderr"] != "oops\n" {
		t.Fatalf("events after the first line: %q", texts)
	}
	if r.Status != "succeeded" || r.Session == nil || r.Session.State != "preserved" || r.Stdout != "first\n42\n" {
		t.Fatalf("result %+v session %+v", r, r.Session)
	}
}

// A client that vanishes, or stops reading while the code floods its
// output, never blocks the execution: it ends, its answer whole.
func TestVanishedEventClientDoesNotBlock(t *testing.T) {
	e := newEnv(t, nsjailtest.RuntimeRootfs(t), func(c *config.Config) { c.WriteTimeout = config.Duration(time.Second) })
	post := func(id, code string) net.Conn {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		body := fmt.Sprintf(`{"id":%q,"code":%q}`, id, code)
		fmt.Fprintf(conn, "POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return conn
	}
	post("stalled", tenMB) // never read
	gone := post("gone", printSleepPrint)
	buf := make([]byte, 1)
	gone.Read(buf) // the stream started: the execution is admitted
	gone.Close()
	e.waitStatus("stalled", "succeeded")
	e.waitStatus("gone", "succeeded")
	code, _, body := e.do("GET", "/v1/executions/stalled", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `LAST LINE\n"`) {
		t.Fatalf("GET stalled: %d %.300s", code, body)
	}
}
