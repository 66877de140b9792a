package server

// Session forwarding between real workers: each a whole server on its own
// loopback port with its own worker_id, sessions_dir and result store, all
// with one static peer list (peers_source = "static"), as on VMs.

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/sessionid"
)

const peerToken = "peer-test-token"

// newPeers starts one worker per id on rootfs, each knowing all of them
// and, when down is not empty, a worker down listed at an address that
// refuses connections. mod, when not nil, adjusts each worker's config.
func newPeers(t *testing.T, rootfs string, ids []string, down string, mod func(id string, c *config.Config)) map[string]*testEnv {
	t.Helper()
	nsjailtest.RequireRoot(t)
	lns := map[string]net.Listener{}
	list := map[string]string{}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	for _, id := range ids {
		lns[id] = listen()
		list[id] = "http://" + lns[id].Addr().String()
	}
	if down != "" {
		ln := listen()
		list[down] = "http://" + ln.Addr().String()
		ln.Close() // nothing listens there: connections are refused
	}
	envs := map[string]*testEnv{}
	for _, id := range ids {
		e := newEnvOn(t, rootfs, func(c *config.Config) {
			c.WorkerID, c.PeersSource, c.Peers, c.WorkerToken = id, config.PeersStatic, list, peerToken
			if mod != nil {
				mod(id, c)
			}
		}, nil, lns[id])
		e.token = e.cfg.WorkerToken
		t.Cleanup(e.deleteSessions)
		envs[id] = e
	}
	return envs
}

// decodeErr reads an error answer.
func decodeErr(t *testing.T, body []byte) errorBody {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("not an error body: %v: %s", err, body)
	}
	return eb
}

// TestSessionForwarding is issue 16's flow: a session made on worker A is
// used through worker B (its kernel's state, its files, an event stream,
// its deletion) as if B held it; ids of an owner that is gone, down or
// already forwarded from are refused at once with the reason.
func TestSessionForwarding(t *testing.T) {
	w := newPeers(t, nsjailtest.RuntimeRootfs(t), []string{"worker-a", "worker-b"}, "worker-c", nil)
	a, b := w["worker-a"], w["worker-b"]

	sess := a.createSession(SessionRequest{})
	id := sess.ID
	if tok, ok := sessionid.Owner(id); !ok || tok != sessionid.Token("worker-a") {
		t.Fatalf("session id %q does not name worker-a (%s)", id, sessionid.Token("worker-a"))
	}
	// The kernel's state, through B, then through A: one kernel.
	b.sessionExec(id, SessionExecutionRequest{Code: "x = 41"})
	if r := b.sessionExec(id, SessionExecutionRequest{Code: "print(x + 1)"}); r.Stdout != "42\n" {
		t.Fatalf("print(x + 1) through B: %q %q", r.Stdout, r.Stderr)
	}
	if r := a.sessionExec(id, SessionExecutionRequest{Code: "x += 1\nprint(x)"}); r.Stdout != "42\n" {
		t.Fatalf("print(x) on A: %q", r.Stdout)
	}
	// Files: PUT through B, read on A and through B, listed through B.
	data := []byte("region,units\nnorth,3\nsouth,4\n")
	if code, body := b.put(id, "data.csv", data); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("PUT through B: %d %s", code, body)
	}
	for name, e := range map[string]*testEnv{"A": a, "B": b} {
		code, _, body := e.do("GET", "/v1/sessions/"+id+"/files/data.csv", nil)
		if code != http.StatusOK || string(body) != string(data) {
			t.Fatalf("GET data.csv via %s: %d %q", name, code, body)
		}
	}
	if r := b.sessionExec(id, SessionExecutionRequest{Code: "print(open('data.csv').read().count('\\n'))"}); r.Stdout != "3\n" {
		t.Fatalf("the kernel reads the file PUT through B: %q %q", r.Stdout, r.Stderr)
	}
	code, _, body := b.do("GET", "/v1/sessions/"+id+"/files", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"data.csv"`) {
		t.Fatalf("listing through B: %d %s", code, body)
	}
	code, _, body = b.do("GET", "/v1/sessions/"+id, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"id":"`+id+`"`) {
		t.Fatalf("GET session through B: %d %s", code, body)
	}
	// GET /v1/sessions is each worker's own list.
	code, _, body = b.do("GET", "/v1/sessions", nil)
	if code != http.StatusOK || strings.Contains(string(body), id) {
		t.Fatalf("B's list: %d %s", code, body)
	}

	// An event stream through B, live: the code waits for a file the test
	// PUTs, also through B, only after it read the first event: were the
	// stream held back anywhere, the code would wait until its timeout.
	s := b.openEvents("POST", "/v1/sessions/"+id+"/executions", SessionExecutionRequest{
		Code: "import os, time\nprint('first', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\nprint(x)\n"})
	s.wantText("stdout", "first\n")
	if code, body := b.put(id, "go", nil); code >= 300 {
		t.Fatalf("PUT go through B: %d %s", code, body)
	}
	texts, r := s.rest()
	s.end()
	if texts["stdout"] != "42\n" || r.Status != "succeeded" || r.Session == nil || r.Session.State != "preserved" {
		t.Fatalf("stream through B: events %q, result %+v", texts, r)
	}

	// The owner not in the list: 410 owner_gone at once.
	gone := sessionid.New(sessionid.Token("worker-x"))
	code, _, body = b.do("GET", "/v1/sessions/"+gone, nil)
	if eb := decodeErr(t, body); code != http.StatusGone || eb.Code != "owner_gone" || !strings.Contains(eb.Error, sessionid.Token("worker-x")) {
		t.Fatalf("an unknown owner's session: %d %s", code, body)
	}
	// Listed but down: 503 + Retry-After, after one more try.
	down := sessionid.New(sessionid.Token("worker-c"))
	code, h, body := b.do("POST", "/v1/sessions/"+down+"/executions", SessionExecutionRequest{Code: "1"})
	if eb := decodeErr(t, body); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" ||
		eb.Code != "owner_unavailable" || !strings.Contains(eb.Error, "worker-c") {
		t.Fatalf("a down owner's session: %d %v %s", code, h, body)
	}
	// A forwarded request for another owner is answered, not forwarded
	// again (503: the forwarder's list will catch up); one for this
	// worker's own session is served.
	code, h, body = b.do("GET", "/v1/sessions/"+id, nil, ForwardedHeader, "worker-a")
	if eb := decodeErr(t, body); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || eb.Code != "forward_loop" {
		t.Fatalf("a marked request for another owner: %d %s", code, body)
	}
	if code, _, body = a.do("GET", "/v1/sessions/"+id, nil, ForwardedHeader, "worker-b"); code != http.StatusOK {
		t.Fatalf("a marked request for the owner's own session: %d %s", code, body)
	}
	// A client may not take an id that names another worker.
	code, _, body = a.do("POST", "/v1/sessions", SessionRequest{ID: "se-" + sessionid.Token("worker-b") + "-mine"})
	if code != http.StatusBadRequest || !strings.Contains(string(body), "names the owner") {
		t.Fatalf("a chosen id naming worker-b: %d %s", code, body)
	}

	// Deleted through B: gone on A.
	if code, _, body = b.do("DELETE", "/v1/sessions/"+id, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE through B: %d %s", code, body)
	}
	if code, _, _ = a.do("GET", "/v1/sessions/"+id, nil); code != http.StatusNotFound {
		t.Fatalf("GET on A after the DELETE through B: %d", code)
	}
	wantMetric(t, b, `sandboxd_session_forwards_total{outcome="proxied"}`)
	wantMetric(t, b, `sandboxd_session_forwards_total{outcome="owner_gone"} 1`)
	wantMetric(t, b, `sandboxd_session_forwards_total{outcome="owner_unavailable"} 1`)
	wantMetric(t, b, `sandboxd_session_forwards_total{outcome="forward_loop"} 1`)
}

func wantMetric(t *testing.T, e *testEnv, prefix string) {
	t.Helper()
	_, _, body := e.do("GET", "/metrics", nil)
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return
		}
	}
	t.Errorf("no metric line %q on %s", prefix, e.cfg.WorkerID)
}

// TestForwardingKeepsAuthentication: the owner checks the token of a
// forwarded request as of any other, and the marker grants nothing.
// Workers with different tokens: the client's token for B is not A's.
func TestForwardingKeepsAuthentication(t *testing.T) {
	w := newPeers(t, shellRootfs(t), []string{"worker-a", "worker-b"}, "", func(id string, c *config.Config) {
		c.WorkerToken = "token-of-" + id
	})
	a, b := w["worker-a"], w["worker-b"]
	id := a.createSession(SessionRequest{Kernel: new(bool)}).ID
	code, _, body := b.do("GET", "/v1/sessions/"+id, nil)
	if code != http.StatusUnauthorized {
		t.Fatalf("B's token, forwarded to A: %d %s", code, body)
	}
	code, _, body = a.do("GET", "/v1/sessions/"+id, nil, "Authorization", "", ForwardedHeader, "worker-b")
	if code != http.StatusUnauthorized {
		t.Fatalf("the marker without a token on A: %d %s", code, body)
	}
}

// TestForwardingServesItsOwnSessions: a session this worker has is served
// here, whatever owner its id names: one made before a worker_id rename
// (restored from sessions_dir) is not forwarded away, marked or not.
func TestForwardingServesItsOwnSessions(t *testing.T) {
	rootfs := shellRootfs(t)
	dir := filepath.Join(t.TempDir(), "sessions")
	old := newEnv(t, rootfs, func(c *config.Config) { c.WorkerID, c.SessionsDir = "worker-old", dir })
	id := old.createSession(SessionRequest{Kernel: new(bool)}).ID
	if tok, _ := sessionid.Owner(id); tok != sessionid.Token("worker-old") {
		t.Fatalf("session id %q does not name worker-old", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	old.srv.Drain(ctx)
	old.http.Close()
	if err := old.srv.Close(); err != nil {
		t.Fatal(err)
	}

	a := newPeers(t, rootfs, []string{"worker-a"}, "", func(_ string, c *config.Config) { c.SessionsDir = dir })["worker-a"]
	for _, hdr := range [][]string{nil, {ForwardedHeader, "worker-b"}} {
		if code, _, body := a.do("GET", "/v1/sessions/"+id, nil, hdr...); code != http.StatusOK || !strings.Contains(string(body), `"id":"`+id+`"`) {
			t.Fatalf("GET %s (renamed from worker-old) on worker-a, %v: %d %s", id, hdr, code, body)
		}
	}
}

// TestSessionExecutionForwarding: a session execution's detached answer
// and the resume of its events, through a worker that is not its owner,
// by the session-scoped routes (which /v1/executions/{id} cannot give
// there); and a session's URL never reaches another session's execution.
func TestSessionExecutionForwarding(t *testing.T) {
	w := newPeers(t, nsjailtest.RuntimeRootfs(t), []string{"worker-a", "worker-b"}, "", nil)
	a, b := w["worker-a"], w["worker-b"]
	id := a.createSession(SessionRequest{}).ID
	other := b.createSession(SessionRequest{}).ID

	// Submitted through B, answered 202 with a Location under the session.
	code, h, body := b.do("POST", "/v1/sessions/"+id+"/executions", SessionExecutionRequest{
		Code: "import os, sys, time\nsys.stdout.write('first\\n'); sys.stdout.flush()\n" +
			"while not os.path.exists('go'):\n    time.sleep(0.02)\nprint('second')\n"}, "Prefer", "respond-async")
	var acc accepted
	if code != http.StatusAccepted || json.Unmarshal(body, &acc) != nil {
		t.Fatalf("respond-async through B: %d %s", code, body)
	}
	loc := h.Get("Location")
	if loc != "/v1/sessions/"+id+"/executions/"+acc.ID {
		t.Fatalf("Location %q", loc)
	}
	// Polled through B (the old route there knows nothing of it).
	code, _, body = b.do("GET", loc, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"id":"`+acc.ID+`"`) {
		t.Fatalf("GET %s through B: %d %s", loc, code, body)
	}
	if code, _, _ = b.do("GET", "/v1/executions/"+acc.ID, nil); code != http.StatusNotFound {
		t.Fatalf("GET /v1/executions/{id} through B, not the owner: %d", code)
	}
	// Its events through B, then resumed through B after the first.
	s := b.openEvents("GET", loc+"/events", nil)
	first := s.want("stdout", "first\n")
	s.close()
	s = b.openEvents("GET", loc+"/events", nil, "Last-Event-ID", first.id)
	if code, body := b.put(id, "go", nil); code >= 300 {
		t.Fatalf("PUT go through B: %d %s", code, body)
	}
	texts, r := s.rest()
	s.end()
	if texts["stdout"] != "second\n" || r.ID != acc.ID || r.Status != "succeeded" || r.Stdout != "first\nsecond\n" {
		t.Fatalf("resumed through B: events %q, result %+v", texts, r)
	}
	code, _, body = b.do("GET", loc, nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"status":"succeeded"`) {
		t.Fatalf("GET %s through B once done: %d %s", loc, code, body)
	}

	// Cancelled through B.
	code, h, body = b.do("POST", "/v1/sessions/"+id+"/executions", SessionExecutionRequest{
		Code: "import time\nwhile True:\n    time.sleep(0.05)\n"}, "Prefer", "respond-async")
	if code != http.StatusAccepted {
		t.Fatalf("a second respond-async through B: %d %s", code, body)
	}
	code, _, body = b.do("DELETE", h.Get("Location"), nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"status":"cancelled"`) {
		t.Fatalf("DELETE %s through B: %d %s", h.Get("Location"), code, body)
	}

	// Another session's execution is not found under this session's URL,
	// on its worker or on the owner of the session named.
	mine := b.sessionExec(other, SessionExecutionRequest{Code: "print(1)"})
	for _, path := range []string{
		"/v1/sessions/" + other + "/executions/" + acc.ID, // A's execution under B's session
		"/v1/sessions/" + id + "/executions/" + mine.ID,   // B's execution under A's session, forwarded to A
	} {
		for _, suffix := range []string{"", "/events"} {
			code, _, body := b.do("GET", path+suffix, nil)
			if code != http.StatusNotFound || !strings.Contains(string(body), "in session") {
				t.Errorf("GET %s: %d %s", path+suffix, code, body)
			}
		}
	}
}
