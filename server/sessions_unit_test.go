package server

// Fast tests of the session API that need no root: request validation,
// ids in URLs, the profile's answer, the sessions being unavailable. What
// needs a volume (loop devices) or a kernel is in sessions_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
)

// config cannot import server/volume; its copies of the quota's bounds
// must be volume's.
func TestSessionQuotaBoundsAreTheVolumes(t *testing.T) {
	if config.SessionMinBytes != volume.MinBytes || config.SessionMaxBytes != volume.MaxBytesLimit ||
		config.SessionMinFiles != volume.MinFiles || config.SessionMaxFiles != volume.MaxFilesLimit {
		t.Fatalf("config's bounds %d..%d bytes, %d..%d files differ from volume's", config.SessionMinBytes, int64(config.SessionMaxBytes),
			config.SessionMinFiles, config.SessionMaxFiles)
	}
	if d := config.Default(); d.SessionMaxBytes != volume.DefaultMaxBytes || d.SessionMaxFiles != volume.DefaultMaxFiles {
		t.Fatalf("config's default quota %d bytes %d files, volume's %d %d", d.SessionMaxBytes, d.SessionMaxFiles,
			volume.DefaultMaxBytes, volume.DefaultMaxFiles)
	}
}

// Bad session requests are refused with a clear 400 and create nothing.
func TestUnitSessionRequests(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	for _, c := range []struct {
		name string
		body any
		msg  string
	}{
		{"bad id", SessionRequest{ID: "../x"}, "id \"../x\" is invalid"},
		{"unknown type", SessionRequest{Type: "gpu"}, `unknown type "gpu": want one of [dynamic skill]`},
		{"idle above max", SessionRequest{IdleTimeoutMS: 3 * 3600 * 1000}, "idle_timeout_ms must be in 0..7200000 (session_max_idle_timeout; 0: the default), got: 10800000"},
		// No Duration holds it: above the maximum, never wrapped around.
		{"idle huge", SessionRequest{IdleTimeoutMS: math.MaxInt64}, "idle_timeout_ms must be in 0..7200000"},
		{"idle negative", SessionRequest{IdleTimeoutMS: -1}, "idle_timeout_ms must be in 0..7200000 (session_max_idle_timeout; 0: the default), got: -1"},
		{"unknown field", `{"image": "x"}`, "unknown field"},
		{"not json", `{`, "invalid JSON"},
	} {
		code, _, body := u.do("POST", "/v1/sessions", c.body)
		wantError(t, code, body, http.StatusBadRequest, c.msg)
	}
	code, _, body := u.do("GET", "/v1/sessions", nil)
	if code != http.StatusOK || string(body) != "{\"sessions\":[]}\n" {
		t.Fatalf("GET /v1/sessions = %d %s", code, body)
	}
}

// SECURITY.md case 46: an id that breaks the id rule names no session on
// any route, before the manager (or the disk) sees it; a valid unknown id
// is 404 too.
func TestUnitSessionIDs(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	for _, id := range []string{"..", "%2e%2e", "a%2fb", "..%2f..%2fetc", strings.Repeat("s", 65), ".hidden", "unknown"} {
		for _, r := range []struct{ method, path string }{
			{"GET", ""}, {"DELETE", ""}, {"POST", "/executions"}, {"POST", "/interrupt"},
			{"GET", "/files"}, {"GET", "/files/a.csv"}, {"PUT", "/files/a.csv"}, {"DELETE", "/files/a.csv"},
			{"GET", "/files/a.csv?profile=1"},
		} {
			var body any
			if r.path == "/executions" {
				body = SessionExecutionRequest{Code: "print(1)"}
			}
			code, _, resp := u.do(r.method, "/v1/sessions/"+id+r.path, body)
			// An encoded slash is a slash to the router: no such
			// endpoint, a 404 as well.
			if code != http.StatusNotFound {
				t.Errorf("%s %s%s = %d %s", r.method, id, r.path, code, resp)
			}
		}
	}
	u.wantNothingStarted(t)
}

// Without a usable sessions_dir the session API answers 503 with the
// reason, and single-shot executions are served as before.
func TestUnitSessionsUnavailable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	os.WriteFile(file, nil, 0o600)
	u := newUnitEnv(t, true, func(c *config.Config) { c.SessionsDir = file })
	code, h, body := u.do("POST", "/v1/sessions", SessionRequest{})
	wantError(t, code, body, http.StatusServiceUnavailable, "sessions are unavailable: sessions_dir "+file)
	if h.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	wantExecStatus(t, u.execute(ExecutionRequest{Code: "x"}), "succeeded")
}

// The profile's answer: the sandbox's verdicts and profile.py's document
// or error mapped to statuses; its output trusted no further than a
// bounded JSON object (SECURITY.md case 45).
func TestProfileAnswer(t *testing.T) {
	pol := Policy{TimeoutMS: 1000, MemoryMB: 64}
	for _, c := range []struct {
		name   string
		res    nsjail.Result
		status int
		msg    string
	}{
		{"ok", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{"rows": 1}` + "\n")}, 200, ""},
		{"unsupported", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{"error": "no pyarrow", "kind": "unsupported"}`)}, 415, "cannot be profiled: no pyarrow"},
		{"parse", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{"error": "ParserError: x", "kind": "parse"}`)}, 422, "could not be parsed: ParserError: x"},
		{"timeout", nsjail.Result{Status: nsjail.StatusTimeout}, 422, "within the policy's timeout (1000 ms)"},
		{"oom", nsjail.Result{Status: nsjail.StatusOOM}, 422, "within the policy's memory (64 MiB)"},
		{"crash", nsjail.Result{Status: nsjail.StatusFailed, Stderr: []byte("Traceback\n  ...\nMemoryError: boom\n")}, 422, "MemoryError: boom"},
		{"not json", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{"rows": `)}, 500, "not a JSON object"},
		{"not an object", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`[1]`)}, 500, "not a JSON object"},
		{"two documents", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{} {}`)}, 500, "not a JSON object"},
		{"truncated", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{}`), StdoutTruncated: true}, 500, "over its budget"},
		{"huge", nsjail.Result{Status: nsjail.StatusSucceeded, Stdout: []byte(`{"x":"` + strings.Repeat("a", 600<<10) + `"}`)}, 500, "over its budget"},
		{"sandbox error", nsjail.Result{Status: nsjail.StatusSandboxError, Error: "no cgroup"}, 500, "no cgroup"},
	} {
		doc, e := profileAnswer(&c.res, pol, "t.csv")
		switch {
		case c.status == 200 && (e != nil || !json.Valid(doc)):
			t.Errorf("%s: %v %s", c.name, e, doc)
		case c.status != 200 && (e == nil || e.status != c.status || !strings.Contains(e.msg, c.msg)):
			t.Errorf("%s: got %+v, want %d %q", c.name, e, c.status, c.msg)
		}
	}
}

// TestUnitCutOffAfterStopIsNoOp: a session's delete cuts a file transfer
// by moving the connection's deadline to now (SECURITY.md case 49), from
// context.AfterFunc's own goroutine. A delete landing as the transfer ends
// can start that goroutine just before the handler's stop, which does not
// wait for it: the cut then runs after the handler returned, and its
// deadline would be the next request's on a keep-alive connection (cut
// while idle, or mid-body). Here the pieces run in that order: the cut
// comes after stop returned, and must not touch the deadline.
func TestUnitCutOffAfterStopIsNoOp(t *testing.T) {
	type move struct {
		at       time.Time
		afterEnd bool
	}
	var (
		mu    sync.Mutex
		moves []move
		ended bool
		cut   = make(chan struct{}, 1)
	)
	set := func(d time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		moves = append(moves, move{d, ended})
		if !d.After(time.Now()) {
			cut <- struct{}{}
		}
		return nil
	}

	// A delete during the transfer cuts it: deadline now, reads refused.
	ctx, cancel := context.WithCancel(context.Background())
	pc := newPacer(set, time.Minute)
	stop := cutOnDelete(&session.Lend{Ctx: ctx}, &pc)
	if err := pc.pace(1); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-cut
	stop()
	if err := pc.pace(2); !errors.Is(err, errCut) {
		t.Fatalf("pace after the cut = %v, want errCut", err)
	}

	// A delete as the transfer ends: its cut runs after stop.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	mu.Lock()
	moves = nil
	mu.Unlock()
	pc = newPacer(set, time.Minute)
	stop = cutOnDelete(&session.Lend{Ctx: ctx}, &pc)
	if err := pc.pace(1); err != nil {
		t.Fatal(err)
	}
	stop()
	mu.Lock()
	ended = true // the handler has returned
	mu.Unlock()
	pc.cutOff() // as AfterFunc's goroutine, started before stop, would
	mu.Lock()
	defer mu.Unlock()
	for _, m := range moves {
		if m.afterEnd {
			t.Fatalf("a cut after stop moved the connection's deadline to %s after the handler returned: the next request's", m.at)
		}
	}
	if len(moves) != 1 {
		t.Fatalf("deadline moves = %v, want the pace's only", moves)
	}
}
