package server

// Session-scoped execution routes: GET /v1/sessions/{sid}/executions/{eid}
// (and /events, /artifacts/{name}, DELETE) answer as the same routes under
// /v1/executions/{eid}, by the same handlers. Being under
// /v1/sessions/{sid}, they are forwarded to the session's owner
// (forward.go), which /v1/executions/{eid} cannot be (an execution id names
// no owner): behind a load balancer, a session execution's detached answer
// and the resume of its event stream reach the worker that has them.

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/julienschmidt/httprouter"
)

// inSession reports whether execution eid ran in session sid. Every record
// of eid this worker has must say so (its events' hub, its entry in the
// result store: the hub of a refused execution outlives its entry), and it
// must have one. A session's URL never reaches another session's (or a
// single-shot) execution, so a client that mixed up two ids gets 404, not
// the wrong answer; and an execution stored before the session was
// recorded is served on /v1/executions/{eid} only.
func (s *Server) inSession(sid, eid string) bool {
	found := false
	if hub := s.streams.Get(eid); hub != nil {
		if hub.Scope != sid {
			return false
		}
		found = true
	}
	if e, ok := s.results.Get(eid); ok {
		var info pendingInfo
		if json.Unmarshal(e.Info, &info) != nil || info.Session != sid {
			return false
		}
		found = true
	}
	return found
}

// sessionExecution serves a session-scoped execution route with h, the
// /v1/executions/{id}… route's handler, once eid is found to be sid's.
func (s *Server) sessionExecution(h httprouter.Handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		sid, e := sessionID(ps)
		eid := ps.ByName("eid")
		if e == nil && !s.inSession(sid, eid) {
			e = &apiError{status: http.StatusNotFound, reason: "not_found", msg: fmt.Sprintf(
				"no execution %q in session %q (unknown, another session's, or its result has expired)", clip(eid), clip(sid))}
		}
		if e != nil {
			writeAPIError(w, e)
			return
		}
		inner := httprouter.Params{{Key: "id", Value: eid}}
		if name := ps.ByName("name"); name != "" {
			inner = append(inner, httprouter.Param{Key: "name", Value: name})
		}
		h(w, r, inner)
	}
}
