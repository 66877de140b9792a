package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// storeSessionResult stores a finished answer for execution eid of session
// sid, as a session's execution records it (pendingInfo.Session), without a
// kernel (the fake sandbox runs none).
func storeSessionResult(t *testing.T, s *Server, sid, eid string) {
	t.Helper()
	info, _ := json.Marshal(pendingInfo{Type: TypeDynamic, Session: sid})
	e, err := s.results.Create(eid, newRunName(), "hash", info)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := interruptedDocument(e, time.Now())
	rd, err := s.results.Finish(eid, text, nil)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
}

// The session-scoped routes answer as /v1/executions/{id}… for the
// session's own execution, and 404 for another session's or a single-shot
// one, on every route (GET, events, artifacts, DELETE).
func TestUnitSessionExecutionRoutes(t *testing.T) {
	u := newUnitEnv(t, true, nil)
	storeSessionResult(t, u.srv, "se-one", "in-one")
	if code, _, body := u.do("POST", "/v1/executions", ExecutionRequest{ID: "solo", Code: "x"}); code != http.StatusOK {
		t.Fatalf("single-shot: %d %s", code, body)
	}

	code, _, body := u.do("GET", "/v1/sessions/se-one/executions/in-one", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"id":"in-one"`) || !strings.Contains(string(body), `"status":"interrupted"`) {
		t.Fatalf("GET in its session: %d %s", code, body)
	}
	_, r := u.openEvents("GET", "/v1/sessions/se-one/executions/in-one/events", nil).result()
	if r.ID != "in-one" || r.Status != StatusInterrupted {
		t.Fatalf("events in its session: %+v", r)
	}
	// The handlers behind are /v1/executions/{id}…'s: their own answers.
	if code, _, body = u.do("DELETE", "/v1/sessions/se-one/executions/in-one", nil); code != http.StatusConflict {
		t.Fatalf("DELETE of a finished one in its session: %d %s", code, body)
	}
	code, _, body = u.do("GET", "/v1/sessions/se-one/executions/in-one/artifacts/a.png", nil)
	if code != http.StatusNotFound || !strings.Contains(string(body), "returned no artifact") {
		t.Fatalf("artifact in its session: %d %s", code, body)
	}

	refused := map[string]string{
		"another session's": "/v1/sessions/se-two/executions/in-one",
		"a single-shot one": "/v1/sessions/se-one/executions/solo",
		"an unknown one":    "/v1/sessions/se-one/executions/nothing",
	}
	for what, path := range refused {
		for _, rq := range [][2]string{{"GET", path}, {"GET", path + "/events"}, {"GET", path + "/artifacts/a.png"}, {"DELETE", path}} {
			code, _, body := u.do(rq[0], rq[1], nil)
			if eb := decodeErr(t, body); code != http.StatusNotFound || !strings.Contains(eb.Error, "in session") {
				t.Errorf("%s, %s %s: %d %s", what, rq[0], rq[1], code, body)
			}
		}
	}
	if code, _, _ = u.do("GET", "/v1/executions/solo", nil); code != http.StatusOK {
		t.Fatalf("the single-shot one on its own route: %d", code)
	}

	// Every record must name the session: a hub of another session's
	// under the same id (the id reused) refuses it.
	hub := u.srv.streams.NewHub()
	hub.Scope = "se-two"
	u.srv.streams.Add("in-one", hub)
	if code, _, body = u.do("GET", "/v1/sessions/se-one/executions/in-one", nil); code != http.StatusNotFound {
		t.Fatalf("records disagreeing: %d %s", code, body)
	}
	u.srv.streams.Remove("in-one", hub)
}
