package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/server/results"
)

// maxBody bounds a request body before it is parsed: twice the code and input
// limits (JSON escaping, base64) plus room for the rest. The exact limits are
// checked on the decoded fields.
func (s *Server) maxBody() int64 {
	return 2*s.cfg.MaxCodeBytes + 2*s.cfg.MaxInputBytes + 64<<10
}

// decodeBody takes a decoding turn (see decodeSlots) and decodes a JSON
// body strictly into v: an unknown field, trailing data or a body over the
// limit is refused. On success the caller holds the turn until it has
// validated v (base64 decoding is part of it) and then calls release.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) (release func(), e *apiError) {
	if r.ContentLength > s.maxBody() {
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, reason: "too_large",
			msg: fmt.Sprintf("request body is %d bytes, more than %d", r.ContentLength, s.maxBody())}
	}
	release, e = s.decoding.acquire(r.Context())
	if e != nil {
		return nil, e
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.maxBody()))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		liftReadDeadline(w)
		return release, nil
	}
	release()
	var tooBig *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooBig):
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, reason: "too_large",
			msg: fmt.Sprintf("request body is more than %d bytes", tooBig.Limit)}
	case errors.As(err, &netErr) && netErr.Timeout():
		// SECURITY.md case 32: a body trickled in slower than read_timeout.
		return nil, &apiError{status: http.StatusRequestTimeout, reason: "timeout",
			msg: fmt.Sprintf("request body not received within read_timeout (%s)", time.Duration(s.cfg.ReadTimeout))}
	case errors.Is(err, io.EOF):
		return nil, badRequest("request body is empty: want a JSON object")
	default:
		// An unknown field's name is the client's: clipped.
		return nil, badRequest("invalid JSON body: %s", clip(err.Error()))
	}
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req ExecutionRequest
	decoded, e := s.decodeBody(w, r, &req)
	if e != nil {
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	p, e := s.validate(&req)
	decoded()
	if e != nil {
		s.logReject(e, "execution_id", clip(req.ID), "policy", clip(req.Type))
		writeAPIError(w, e)
		return
	}
	// Waiting for another request's run (a retry) ends with this
	// connection; the run itself may outlive it (runContext).
	run, mode := runContext(r, req.ID != "")
	req = ExecutionRequest{} // the plan holds what runs: no second copy
	if mode != answerSync {
		s.answerDetached(w, r, p, run, mode)
		return
	}
	rd, e := s.execute(run, r.Context(), p)
	if e != nil {
		s.logReject(e, "execution_id", p.id, "policy", p.policy.Name)
		writeAPIError(w, e)
		return
	}
	defer rd.Close()
	s.writeStored(w, rd, p.id)
}

// runningView is what GET answers while an execution is queued or running.
type runningView struct {
	ID        string     `json:"id"`
	Type      string     `json:"type"`
	Status    string     `json:"status"`
	StartedAt *time.Time `json:"started_at"`
	Policy    Policy     `json:"policy"`
}

func (v view) running() runningView {
	rv := runningView{ID: v.id, Type: v.typ, Status: v.status, Policy: v.policy}
	if !v.startedAt.IsZero() {
		t := v.startedAt
		rv.StartedAt = &t
	}
	return rv
}

func (s *Server) handleGet(w http.ResponseWriter, _ *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	for range 2 { // once more if it finished between the two lookups
		if v, ok := s.live.get(id); ok {
			writeJSON(w, http.StatusOK, v.running())
			return
		}
		rd, err := s.results.Open(id)
		switch {
		case errors.Is(err, results.ErrPending):
			continue
		case errors.Is(err, results.ErrNotFound):
			if s.writeRefusal(w, id) {
				return
			}
			writeError(w, http.StatusNotFound, fmt.Sprintf("no execution %q (unknown, or its result has expired)", clip(id)))
			return
		case err != nil:
			s.writeStoreError(w, id, err)
			return
		}
		defer rd.Close()
		s.writeStored(w, rd, id)
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no execution %q (unknown, or its result has expired)", clip(id)))
}

// cancelWait bounds how long DELETE waits for the cancelled run's cleanup.
const cancelWait = 30 * time.Second

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	v, ok := s.live.get(id)
	if !ok {
		if e, stored := s.results.Get(id); stored && e.Final() {
			writeError(w, http.StatusConflict, fmt.Sprintf("execution %q already finished", clip(id)))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no execution %q", clip(id)))
		return
	}
	s.log.Info("cancel requested", "execution_id", id, "policy", v.typ)
	v.cancel()
	select {
	case <-v.done:
	case <-time.After(cancelWait):
		writeJSON(w, http.StatusAccepted, v.running())
		return
	case <-r.Context().Done():
		// The client left (or the server is closing): the cancel stands,
		// and the answer is 202 as for a run still ending, never an empty
		// 200, should anything still read it.
		writeJSON(w, http.StatusAccepted, v.running())
		return
	}
	rd, err := s.results.Open(id)
	switch {
	case errors.Is(err, results.ErrNotFound), errors.Is(err, results.ErrPending):
		// It ended without a result (refused before it ran, or its result
		// was already evicted; the id may be another request's by now).
		writeJSON(w, http.StatusOK, runningView{ID: id, Type: v.typ, Status: "cancelled", Policy: v.policy})
		return
	case err != nil:
		s.writeStoreError(w, id, err)
		return
	}
	defer rd.Close()
	s.writeStored(w, rd, id)
}

// policiesResponse is the body of GET /v1/policies.
type policiesResponse struct {
	Default  string                `json:"default"`
	Policies map[string]policyView `json:"policies"`
}

func (s *Server) handlePolicies(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	out := policiesResponse{Default: TypeDynamic, Policies: make(map[string]policyView, len(s.policies))}
	for name, p := range s.policies {
		out.Policies[name] = policyView{Policy: p, Runtime: p.Runtime}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	if reason := s.notReady(); reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// notReady is why /readyz answers 503 ("" when ready). Ready once the
// sessions a previous worker left are back too (or could not be: the
// session API then says why, and single-shot executions work): a client
// that waited for /readyz never meets a session 503 "not open" (Prepare
// opens them after the rootfs).
func (s *Server) notReady() string {
	s.mu.Lock()
	draining, sessionsOpening := s.draining, s.manager == nil && s.sessErr == nil
	s.mu.Unlock()
	if err := s.ready(); err != nil {
		return err.Error()
	}
	if sessionsOpening {
		return "opening the sessions"
	}
	if draining {
		return "shutting down"
	}
	return ""
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	s.metrics.handler().ServeHTTP(w, r)
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openapiJSON)
}

// reject answers a refused request and counts it.
func (s *Server) reject(w http.ResponseWriter, reason string, status int, msg string) {
	e := &apiError{status: status, reason: reason, msg: msg}
	s.logReject(e)
	writeAPIError(w, e)
}

// errorBody is every error response. Code, when set, is a stable name
// for a refusal a client handles by itself (session_busy).
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	}
	writeJSON(w, e.status, errorBody{Error: e.msg, Code: e.code})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}
