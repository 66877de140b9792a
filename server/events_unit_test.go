package server

// Streaming and asynchronous answers on the fake sandbox: its "run" writes
// output through the spec's Output as a sandbox's capture does, and waits
// for the test between chunks, so the order of what a client sees is
// decided by the test, never by timing.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/stream"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// sseEvent is one server-sent event as a client parses it.
type sseEvent struct{ id, typ, data string }

// sseStream reads the events of one response.
type sseStream struct {
	t    *testing.T
	resp *http.Response
	r    *bufio.Reader
}

// openEvents sends a request that accepts text/event-stream and wants a
// 200 event stream back.
func (e *testEnv) openEvents(method, path string, body any, hdr ...string) *sseStream {
	e.t.Helper()
	code, resp := e.send(method, path, body, append([]string{"Accept", "text/event-stream"}, hdr...)...)
	if code != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e.t.Fatalf("%s %s = %d %s: %s", method, path, code, resp.Header.Get("Content-Type"), data)
	}
	s := &sseStream{t: e.t, resp: resp, r: bufio.NewReader(resp.Body)}
	e.t.Cleanup(s.close)
	return s
}

// send sends a request and returns its response unread.
func (e *testEnv) send(method, path string, body any, hdr ...string) (int, *http.Response) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = strings.NewReader(string(data))
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
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, resp
}

// next reads the next event, skipping comments; it fails at the end.
func (s *sseStream) next() sseEvent {
	s.t.Helper()
	var ev sseEvent
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			s.t.Fatalf("event stream ended (%v) after %q", err, line)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.typ != "" {
				return ev
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		default:
			s.t.Fatalf("unexpected line in the event stream: %q", line)
		}
	}
}

// want reads the next event and checks its type and, for output, its text.
func (s *sseStream) want(typ, text string) sseEvent {
	s.t.Helper()
	ev := s.next()
	if ev.typ != typ {
		s.t.Fatalf("event %+v, want a %s event", ev, typ)
	}
	if typ == "stdout" || typ == "stderr" {
		var d struct{ Text string }
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil || d.Text != text {
			s.t.Fatalf("%s event data %s, want text %q", typ, ev.data, text)
		}
	}
	return ev
}

// wantText reads events of stream until their texts make text: how the
// code's writes are cut into chunks is the pipe's business (print writes
// its end separately when stdout is unbuffered).
func (s *sseStream) wantText(stream, text string) {
	s.t.Helper()
	got := ""
	for got != text {
		ev := s.next()
		var d struct{ Text string }
		if ev.typ != stream || json.Unmarshal([]byte(ev.data), &d) != nil || !strings.HasPrefix(text, got+d.Text) {
			s.t.Fatalf("event %+v after %s %q, want the rest of %q", ev, stream, got, text)
		}
		got += d.Text
	}
}

// rest reads the events up to the result: the texts of each stream, and
// the answer.
func (s *sseStream) rest() (map[string]string, *ExecutionResponse) {
	s.t.Helper()
	texts := map[string]string{}
	for {
		ev := s.next()
		if ev.typ == "result" {
			var resp ExecutionResponse
			if err := json.Unmarshal([]byte(ev.data), &resp); err != nil {
				s.t.Fatalf("result event data is not an answer: %v\n%s", err, ev.data)
			}
			return texts, &resp
		}
		var d struct{ Text string }
		if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
			s.t.Fatalf("event %+v: %v", ev, err)
		}
		texts[ev.typ] += d.Text
	}
}

// result reads the result event and decodes its answer.
func (s *sseStream) result() (sseEvent, *ExecutionResponse) {
	s.t.Helper()
	ev := s.want("result", "")
	var resp ExecutionResponse
	if err := json.Unmarshal([]byte(ev.data), &resp); err != nil {
		s.t.Fatalf("result event data is not an answer: %v\n%s", err, ev.data)
	}
	return ev, &resp
}

// end checks that the stream is over.
func (s *sseStream) end() {
	s.t.Helper()
	if rest, err := io.ReadAll(s.r); err != nil || len(rest) > 0 {
		s.t.Fatalf("after the result: %q %v", rest, err)
	}
}

func (s *sseStream) close() { s.resp.Body.Close() }

// steps makes the fake sandbox write each chunk through the spec's Output,
// waiting for a value on gate before each one, and return their
// concatenation as stdout.
func steps(f *fakeSandbox, gate chan struct{}, chunks ...[2]string) {
	f.result = func(ctx context.Context, spec nsjail.Spec) *nsjail.Result {
		var out strings.Builder
		for _, c := range chunks {
			select {
			case <-gate:
			case <-ctx.Done():
				return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusCancelled, LimitsHit: []string{}}
			}
			spec.Output(c[0], []byte(c[1]))
			if c[0] == nsjail.StreamStdout {
				out.WriteString(c[1])
			}
		}
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{},
			Stdout: []byte(out.String()), StdoutBytes: int64(out.Len()), StartedAt: now, FinishedAt: now}
	}
}

// The events arrive while the execution runs (GET says running after the
// first), in order, with increasing ids, then the result.
func TestUnitEventStreamLive(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	gate := make(chan struct{})
	steps(u.fake, gate, [2]string{"stdout", "first\n"}, [2]string{"stderr", "warn\n"}, [2]string{"stdout", "second\n"})
	s := u.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "live-1", Code: "x"})
	gate <- struct{}{}
	first := s.want("stdout", "first\n")
	code, _, body := u.do("GET", "/v1/executions/live-1", nil)
	if code != 200 || !strings.Contains(string(body), `"status":"running"`) {
		t.Fatalf("after the first event the execution is not running: %d %s", code, body)
	}
	gate <- struct{}{}
	warn := s.want("stderr", "warn\n")
	gate <- struct{}{}
	second := s.want("stdout", "second\n")
	ev, resp := s.result()
	s.end()
	ids := []string{first.id, warn.id, second.id, ev.id}
	if strings.Join(ids, ",") != "1,2,3,4" {
		t.Fatalf("event ids %v", ids)
	}
	if resp.ID != "live-1" || resp.Status != "succeeded" || resp.Stdout != "first\nsecond\n" {
		t.Fatalf("result %+v", resp)
	}
	// GET answers the same execution.
	if code, _, body := u.do("GET", "/v1/executions/live-1", nil); code != 200 || !strings.Contains(string(body), `"stdout":"first\nsecond\n"`) {
		t.Fatalf("GET after the stream: %d %s", code, body)
	}
}

// A client whose connection dropped resumes after the last id it saw; a
// late client gets every event still held; once the events are gone, the
// result alone.
func TestUnitEventStreamResume(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	gate := make(chan struct{})
	steps(u.fake, gate, [2]string{"stdout", "a\n"}, [2]string{"stdout", "b\n"}, [2]string{"stdout", "c\n"})
	s := u.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "resume-1", Code: "x"})
	gate <- struct{}{}
	a := s.want("stdout", "a\n")
	gate <- struct{}{} // b is written while no client is connected
	s.close()
	waitFor(t, func() bool { return held(u.srv.streams.Get("resume-1"), 1) > 0 })

	r := u.openEvents("GET", "/v1/executions/resume-1/events", nil, "Last-Event-ID", a.id)
	r.want("stdout", "b\n")
	gate <- struct{}{}
	r.want("stdout", "c\n")
	_, resp := r.result()
	r.end()
	if resp.Stdout != "a\nb\nc\n" {
		t.Fatalf("result stdout %q", resp.Stdout)
	}

	late := u.openEvents("GET", "/v1/executions/resume-1/events", nil)
	late.want("stdout", "a\n")
	late.want("stdout", "b\n")
	late.want("stdout", "c\n")
	late.result()
	late.end()

	u.srv.streams.Remove("resume-1", u.srv.streams.Get("resume-1")) // as after streamLinger
	gone := u.openEvents("GET", "/v1/executions/resume-1/events", nil, "Last-Event-ID", "2")
	ev, resp := gone.result()
	gone.end()
	if ev.id != "" || resp.Stdout != "a\nb\nc\n" {
		t.Fatalf("result without events: id %q stdout %q", ev.id, resp.Stdout)
	}

	code, _, body := u.do("GET", "/v1/executions/nope/events", nil)
	wantError(t, code, body, 404, "no execution")
	code, _, body = u.do("GET", "/v1/executions/resume-1/events", nil, "Last-Event-ID", "x1")
	wantError(t, code, body, 400, "Last-Event-ID")
}

// held counts the events hub holds after id after, without waiting.
func held(hub *stream.Hub, after uint64) int {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b, _ := hub.Next(ctx, after, 1<<20)
	return len(b.Events)
}

// respond-async: 202 with a Location as soon as it is admitted, for an
// unnamed execution too; it goes on without its connection, and GET and
// the events give its result.
func TestUnitRespondAsync(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	gate := make(chan struct{})
	steps(u.fake, gate, [2]string{"stdout", "done\n"})
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{Code: "x"}, "Prefer", "respond-async, wait=10")
	var acc accepted
	if code != http.StatusAccepted || json.Unmarshal(body, &acc) != nil || acc.Status != "running" ||
		h.Get("Location") != "/v1/executions/"+acc.ID || h.Get("Preference-Applied") != "respond-async" {
		t.Fatalf("respond-async: %d %v %s", code, h, body)
	}
	code, _, body = u.do("GET", h.Get("Location"), nil)
	if code != 200 || !strings.Contains(string(body), `"status":"running"`) {
		t.Fatalf("GET while it runs: %d %s", code, body)
	}
	s := u.openEvents("GET", h.Get("Location")+"/events", nil)
	gate <- struct{}{}
	s.want("stdout", "done\n")
	_, resp := s.result()
	if resp.ID != acc.ID || resp.Status != "succeeded" {
		t.Fatalf("result %+v", resp)
	}
	u.waitStatus(acc.ID, "succeeded")

	// A retry of the finished execution gets its answer, not a 202.
	gate2 := make(chan struct{})
	steps(u.fake, gate2, [2]string{"stdout", "n\n"})
	code, _, _ = u.do("POST", "/v1/executions", ExecutionRequest{ID: "named-async", Code: "x"}, "Prefer", "respond-async")
	if code != http.StatusAccepted {
		t.Fatalf("named respond-async: %d", code)
	}
	code, h, _ = u.do("POST", "/v1/executions", ExecutionRequest{ID: "named-async", Code: "x"}, "Prefer", "respond-async")
	if code != http.StatusAccepted || h.Get("Location") != "/v1/executions/named-async" {
		t.Fatalf("a retry while it runs: %d %v", code, h)
	}
	close(gate2)
	u.waitStatus("named-async", "succeeded")
	code, _, body = u.do("POST", "/v1/executions", ExecutionRequest{ID: "named-async", Code: "x"}, "Prefer", "respond-async")
	if code != 200 || !strings.Contains(string(body), `"stdout":"n\n"`) {
		t.Fatalf("a retry once it ended: %d %s", code, body)
	}
	if n := u.fake.started.Load(); n != 2 {
		t.Fatalf("%d runs, want 2 (retries never run again)", n)
	}
	// Refusals come before anything is accepted.
	code, _, body = u.do("POST", "/v1/executions", ExecutionRequest{Code: " "}, "Prefer", "respond-async")
	wantError(t, code, body, 400, "code is required")
}

// SECURITY.md case 53: attached event streams are bounded (max_streams);
// the execution's own stream is not one of them.
func TestUnitAttachedStreamsAreBounded(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.MaxStreams = 1 })
	gate := make(chan struct{})
	steps(u.fake, gate, [2]string{"stdout", "x\n"})
	own := u.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "att-1", Code: "x"})
	first := u.openEvents("GET", "/v1/executions/att-1/events", nil)
	code, h, body := u.do("GET", "/v1/executions/att-1/events", nil)
	wantError(t, code, body, 429, "max_streams")
	if h.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	first.close()
	waitFor(t, func() bool { return len(u.srv.attached) == 0 })
	second := u.openEvents("GET", "/v1/executions/att-1/events", nil)
	close(gate)
	second.want("stdout", "x\n")
	second.result()
	own.want("stdout", "x\n")
	own.result()
}

// SECURITY.md case 52: a client that stops reading its event stream never
// slows the execution (its output, many times what the connection
// buffers, goes into the hub's ring), and its handler lets go once a
// write waits write_timeout: the server shuts down while the client still
// reads nothing.
func TestUnitSlowEventReader(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.WriteTimeout = config.Duration(500 * time.Millisecond) })
	chunk := strings.Repeat("y", 64<<10)
	u.fake.result = func(ctx context.Context, spec nsjail.Spec) *nsjail.Result {
		for range 1000 { // 64 MB
			spec.Output(nsjail.StreamStdout, []byte(chunk))
		}
		now := time.Now()
		return &nsjail.Result{ID: spec.ID, Status: nsjail.StatusSucceeded, LimitsHit: []string{},
			StdoutBytes: 64 << 20, StartedAt: now, FinishedAt: now}
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(u.http.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"id":"slow-1","code":"x"}`
	fmt.Fprintf(conn, "POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	u.waitStatus("slow-1", "succeeded") // never read a byte of the stream
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := u.http.Config.Shutdown(ctx); err != nil {
		t.Fatalf("a client that reads nothing pins its handler: %v", err)
	}
}

// A stream lasts as long as its execution, well past write_timeout: the
// deadline is per write.
func TestUnitEventStreamOutlivesWriteTimeout(t *testing.T) {
	u := newUnitEnv(t, true, func(c *config.Config) { c.WriteTimeout = config.Duration(200 * time.Millisecond) })
	gate := make(chan struct{})
	steps(u.fake, gate, [2]string{"stdout", "1\n"}, [2]string{"stdout", "2\n"})
	s := u.openEvents("POST", "/v1/executions", ExecutionRequest{Code: "x"})
	gate <- struct{}{}
	s.want("stdout", "1\n")
	time.Sleep(600 * time.Millisecond) // three write_timeouts with the stream open
	gate <- struct{}{}
	s.want("stdout", "2\n")
	if _, resp := s.result(); resp.Status != "succeeded" {
		t.Fatalf("result %+v", resp)
	}
}

// An execution refused after its client was answered (the work root is
// full once it leaves the queue): the stream ends with an error event,
// and GET answers the refusal while the events are kept.
func TestUnitRefusedAfterAccept(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	u.wsErr = fmt.Errorf("%w: test", workspace.ErrFull)
	s := u.openEvents("POST", "/v1/executions", ExecutionRequest{ID: "full-1", Code: "x"})
	ev := s.want("error", "")
	s.end()
	var eb errorBody
	if json.Unmarshal([]byte(ev.data), &eb) != nil || !strings.Contains(eb.Error, "test") || ev.id != "1" {
		t.Fatalf("error event %+v", ev)
	}
	code, h, body := u.do("POST", "/v1/executions", ExecutionRequest{ID: "full-2", Code: "x"}, "Prefer", "respond-async")
	if code != http.StatusAccepted {
		t.Fatalf("respond-async: %d %s", code, body)
	}
	waitFor(t, func() bool { code, _, _ := u.do("GET", h.Get("Location"), nil); return code != 200 })
	code, _, body = u.do("GET", h.Get("Location"), nil)
	wantError(t, code, body, http.StatusInsufficientStorage, "test")
	u.openEvents("GET", h.Get("Location")+"/events", nil).want("error", "")
	if u.fake.started.Load() != 0 {
		t.Fatal("a refused execution ran")
	}
}
