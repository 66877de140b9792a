package server

// Sessions: a data-analysis conversation keeps its files (a volume of its
// own, server/volume) and its Python state (a long-lived kernel,
// server/warmpool) across executions. The manager (server/session) keeps
// them; this file is their HTTP API: create, list, get, delete, interrupt,
// and an execution in a session, which goes through the same admission,
// result store and answer as a single-shot one (execute.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"path"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// SessionRequest is the body of POST /v1/sessions.
type SessionRequest struct {
	ID   string `json:"id,omitempty"`
	Type string `json:"type,omitempty"`
	// Runtime names one of the config's runtimes (default: the policy's):
	// the session's kernel and executions run on it.
	Runtime string `json:"runtime,omitempty"`
	// Kernel: a long-lived Python whose state persists between executions
	// (default true); false: every execution is a fresh sandbox on the
	// session's files.
	Kernel        *bool `json:"kernel,omitempty"`
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
}

// SessionView is a session as the API shows it: the manager's Info and the
// policy its executions run under.
type SessionView struct {
	session.Info
	Policy Policy `json:"policy"`
}

// sessionList is the body of GET /v1/sessions.
type sessionList struct {
	Sessions []SessionView `json:"sessions"`
}

// SessionExecutionRequest is the body of POST /v1/sessions/{id}/executions:
// an execution request without a type (the session's) or input (files
// persist: PUT them, or send them here, into input/).
type SessionExecutionRequest struct {
	ID        string            `json:"id,omitempty"`
	Code      string            `json:"code"`
	Files     []File            `json:"files,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// DisplayLastExpression (default true in a session) answers the value
	// of the code's final expression in `display`, as a notebook does.
	DisplayLastExpression *bool `json:"display_last_expression,omitempty"`
	// CaptureFigures is ExecutionRequest's.
	CaptureFigures *bool `json:"capture_figures,omitempty"`
}

// sessions returns the session manager, or the 503 saying why there is
// none (not prepared yet, or its directory could not be opened).
func (s *Server) sessions() (*session.Manager, *apiError) {
	s.mu.Lock()
	m, err := s.manager, s.sessErr
	s.mu.Unlock()
	if m != nil {
		return m, nil
	}
	if err == nil {
		if e := s.readyOr503(); e != nil {
			return nil, e
		}
		err = errors.New("not open")
	}
	return nil, &apiError{status: http.StatusServiceUnavailable, reason: "sessions", msg: "sessions are unavailable: " + err.Error(), retryAfter: "5"}
}

// sessionID is the URL's session id. One that breaks the id rule names no
// session (SECURITY.md case 46: it is never a path, whatever it holds).
func sessionID(ps httprouter.Params) (string, *apiError) {
	id := ps.ByName("id")
	if !inside.ValidID(id) {
		return "", &apiError{status: http.StatusNotFound, reason: "not_found", msg: fmt.Sprintf("no session %q", clip(id))}
	}
	return id, nil
}

// sessionError maps the manager's errors to the API's.
func sessionError(id string, err error) *apiError {
	q := clip(id)
	switch {
	case errors.Is(err, session.ErrNotFound):
		return &apiError{status: http.StatusNotFound, reason: "not_found", msg: fmt.Sprintf("no session %q (unknown, deleted or expired)", q)}
	case errors.Is(err, session.ErrInvalid):
		return badRequest("%s", clip(err.Error()))
	case errors.Is(err, session.ErrExists):
		return &apiError{status: http.StatusConflict, reason: "conflict", msg: fmt.Sprintf("session %q exists already", q)}
	case errors.Is(err, session.ErrBusy):
		return &apiError{status: http.StatusConflict, reason: "session_busy", code: "session_busy",
			msg: fmt.Sprintf("session %q is running an execution: one at a time (interrupt it, or wait)", q)}
	case errors.Is(err, session.ErrNotRunning):
		return &apiError{status: http.StatusConflict, reason: "not_running", code: "not_running",
			msg: fmt.Sprintf("session %q is not running an execution", q)}
	case errors.Is(err, session.ErrTooMany):
		return &apiError{status: http.StatusTooManyRequests, reason: "max_sessions", retryAfter: "60",
			msg: fmt.Sprintf("over capacity: %v (delete a session, or wait for one to expire)", err)}
	case errors.Is(err, session.ErrClosed):
		return &apiError{status: http.StatusServiceUnavailable, reason: "draining", msg: "shutting down: " + err.Error()}
	}
	return &apiError{status: http.StatusInternalServerError, reason: "sessions", msg: fmt.Sprintf("session %q: %v", q, err)}
}

// view is what the API shows of a session.
func (s *Server) view(info session.Info) SessionView {
	return SessionView{Info: info, Policy: s.policies[info.Type]}
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req SessionRequest
	decoded, e := s.decodeBody(w, r, &req)
	if e != nil {
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	decoded()
	spec, e := s.validateSession(&req)
	if e == nil {
		var m *session.Manager
		if m, e = s.sessions(); e == nil {
			info, err := m.Create(spec)
			if err != nil {
				e = sessionError(spec.ID, err)
			} else {
				s.log.Info("session created", "session_id", info.ID, "policy", info.Type, "runtime", info.Runtime, "kernel", spec.Kernel)
				writeJSON(w, http.StatusCreated, s.view(info))
				return
			}
		}
	}
	s.logReject(e, "session_id", clip(req.ID), "policy", clip(req.Type))
	writeAPIError(w, e)
}

// validateSession checks a session request; the manager checks its idle
// timeout (Manager.Create: ErrInvalid, 400).
func (s *Server) validateSession(req *SessionRequest) (session.Spec, *apiError) {
	spec := session.Spec{ID: req.ID, Policy: req.Type, Kernel: req.Kernel == nil || *req.Kernel}
	if spec.ID != "" && !inside.ValidID(spec.ID) {
		return spec, badRequest("id %q is invalid: want %s", clip(spec.ID), inside.IDRule)
	}
	if spec.Policy == "" {
		spec.Policy = TypeDynamic
	}
	pol, ok := s.policies[spec.Policy]
	if !ok {
		return spec, badRequest("unknown type %q: want one of %v", clip(spec.Policy), s.policies.Names())
	}
	var e *apiError
	if spec.Runtime, e = s.runtimeFor(pol, req.Runtime); e != nil {
		return spec, e
	}
	// The manager holds the rule (0..session_max_idle_timeout); a number
	// of milliseconds no Duration holds is above any maximum.
	spec.IdleTimeout = time.Duration(math.MaxInt64)
	if req.IdleTimeoutMS <= math.MaxInt64/int64(time.Millisecond) {
		spec.IdleTimeout = time.Duration(req.IdleTimeoutMS) * time.Millisecond
	}
	return spec, nil
}

func (s *Server) handleListSessions(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	m, e := s.sessions()
	if e != nil {
		writeAPIError(w, e)
		return
	}
	out := sessionList{Sessions: []SessionView{}}
	for _, info := range m.List() {
		out.Sessions = append(out.Sessions, s.view(info))
	}
	writeJSON(w, http.StatusOK, out)
}

// withSession runs fn with the URL's session id and the manager, or
// answers why not.
func (s *Server) withSession(w http.ResponseWriter, ps httprouter.Params, fn func(id string, m *session.Manager) *apiError) {
	id, e := sessionID(ps)
	if e == nil {
		var m *session.Manager
		if m, e = s.sessions(); e == nil {
			e = fn(id, m)
		}
	}
	if e != nil {
		if e.status >= 500 || e.status == http.StatusTooManyRequests {
			s.logReject(e, "session_id", clip(ps.ByName("id")))
		}
		writeAPIError(w, e)
	}
}

func (s *Server) handleGetSession(w http.ResponseWriter, _ *http.Request, ps httprouter.Params) {
	s.withSession(w, ps, func(id string, m *session.Manager) *apiError {
		info, err := m.Get(id)
		if err != nil {
			return sessionError(id, err)
		}
		writeJSON(w, http.StatusOK, s.view(info))
		return nil
	})
}

func (s *Server) handleDeleteSession(w http.ResponseWriter, _ *http.Request, ps httprouter.Params) {
	s.withSession(w, ps, func(id string, m *session.Manager) *apiError {
		if err := m.Delete(id); err != nil {
			return sessionError(id, err)
		}
		s.log.Info("session deleted", "session_id", id)
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) handleInterrupt(w http.ResponseWriter, _ *http.Request, ps httprouter.Params) {
	s.withSession(w, ps, func(id string, m *session.Manager) *apiError {
		if err := m.Interrupt(id); err != nil {
			return sessionError(id, err)
		}
		s.log.Info("session interrupted", "session_id", id)
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) handleSessionExecute(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	var req SessionExecutionRequest
	decoded, e := s.decodeBody(w, r, &req)
	if e != nil {
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	var p *plan
	sid, e := sessionID(ps)
	if e == nil {
		p, e = s.validateSessionExecution(sid, &req)
	}
	decoded()
	if e != nil {
		s.logReject(e, "session_id", clip(ps.ByName("id")), "execution_id", clip(req.ID))
		writeAPIError(w, e)
		return
	}
	run, mode := runContext(r, req.ID != "")
	req = SessionExecutionRequest{}
	if mode != answerSync {
		s.answerDetached(w, r, p, run, mode)
		return
	}
	rd, e := s.execute(run, r.Context(), p)
	if e != nil {
		s.logReject(e, "session_id", sid, "execution_id", p.id, "policy", p.policy.Name)
		writeAPIError(w, e)
		return
	}
	defer rd.Close()
	s.writeStored(w, rd, p.id)
}

// validateSessionExecution checks a session's execution as a single-shot
// one under the session's policy. The session must exist (its policy);
// whether it is free is known only when it runs.
func (s *Server) validateSessionExecution(sid string, req *SessionExecutionRequest) (*plan, *apiError) {
	m, e := s.sessions()
	if e != nil {
		return nil, e
	}
	info, err := m.Get(sid)
	if err != nil {
		return nil, sessionError(sid, err)
	}
	// The session is part of what a retry must repeat: one id in two
	// sessions is two requests.
	p, e := s.newPlan(req.ID, requestHash(struct {
		Session string `json:"session"`
		*SessionExecutionRequest
	}{sid, req}))
	if e != nil {
		return nil, e
	}
	// Before anything is claimed: no id, slot, reservation or kernel
	// generation is spent on a runtime the config no longer has.
	if e := s.runtimeGone(info.Runtime); e != nil {
		return nil, e
	}
	p.session, p.runtime = sid, info.Runtime
	p.hub.Scope = sid // not yet in the registry (claim adds it)
	pol, err := s.policies.Apply(info.Type, req.TimeoutMS)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	if e := s.checkRun(p, pol, req.Code, nil, req.Files, req.Env); e != nil {
		return nil, e
	}
	p.display = req.DisplayLastExpression == nil || *req.DisplayLastExpression
	p.figures = req.CaptureFigures == nil || *req.CaptureFigures
	return p, nil
}

// executeInSession runs a validated session execution: its id claimed and
// admitted as any execution's, the session reserved (409 session_busy
// while another runs), the request's files written into its volume (413
// over the quota, nothing run), output/ snapshot, the code run in the
// session's kernel, and only what it created or changed under output/
// answered.
func (s *Server) executeInSession(ctx context.Context, p *plan) (*ExecutionResponse, *results.Reader, *apiError) {
	if e := s.readyOr503(); e != nil {
		return nil, nil, e
	}
	m, e := s.sessions()
	if e != nil {
		return nil, nil, e
	}
	// The id is claimed before the session is reserved: a retry of this
	// request arriving meanwhile finds it live and gets its answer (or
	// waits for it), never the 409 session_busy its original causes.
	var run *session.Run
	ctx, x, e := s.admit(ctx, p, func() *apiError {
		r, err := s.reserve(m, p.session)
		if err != nil {
			return sessionError(p.session, err)
		}
		run = r
		return nil
	})
	if e != nil {
		if run != nil {
			run.End() // reserved, then refused a slot (429)
		}
		return nil, nil, e
	}
	defer x.done()
	x.accept()
	// Ended before the answer is written (deferred calls run before the
	// handler writes): the client's next execution never meets this one.
	defer run.End()
	if !x.wait(ctx) {
		return x.finish()
	}
	v := run.Volume()
	if e := s.putFiles(v, p.files); e != nil {
		x.log.Warn("request files refused", "err", e.msg)
		return nil, nil, x.refuse(e)
	}
	p.files = nil
	for _, d := range []string{inside.InputDir, inside.ArtifactsDir} {
		// The layout the code expects; a full volume is the code's to
		// find out about.
		if err := v.MakeDirs(d); err != nil {
			x.log.Warn("workspace layout", "dir", d, "err", err)
		}
	}
	since := workspace.TakeSnapshot(v.Path())
	x.log.Info("kernel execution starting")
	kr, info, err := run.Exec(ctx, warmpool.KernelExec{Code: p.code, Env: p.extra,
		Timeout: time.Duration(p.policy.TimeoutMS) * time.Millisecond, Logger: x.log, Output: p.hub.Output,
		Display: p.display, Figures: p.figures, OnEvent: p.runnerEvent})
	p.code = ""
	if err != nil {
		// Nothing of the code ran (Run.Exec): refused, the id free for
		// a retry.
		return nil, nil, x.refuse(s.execRefusal(x.log, p.session, err))
	}
	x.started = true
	x.resp.Session = &info
	s.fill(x.resp, kr.Result, kr.Events, v.Path(), since, x.saveArtifact, x.log)
	return x.finish()
}

// execRefusal is the answer to a session execution of which nothing ran:
// the session deleted (404) or the manager closed (503) meanwhile, the
// worker draining (503), or its kernel did not start or ended before it
// took the code (503: the worker's failure, perhaps passing; the client
// may send the request again).
func (s *Server) execRefusal(log *slog.Logger, sid string, err error) *apiError {
	// The server's own refusal passed through the manager (runtimeOr503:
	// a runtime gone, or a worker not ready) is answered as it is.
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, session.ErrNotFound), errors.Is(err, session.ErrClosed):
		return sessionError(sid, err)
	case s.isDraining():
		return &apiError{status: http.StatusServiceUnavailable, reason: "draining", msg: "shutting down: " + err.Error()}
	}
	log.Error("kernel execution failed: nothing ran", "err", err)
	return &apiError{status: http.StatusServiceUnavailable, reason: "kernel", retryAfter: "1",
		msg: fmt.Sprintf("nothing ran: %v (send the request again)", err)}
}

// putFiles writes a session execution's files into its volume under
// input/. A quota they cannot fit is refused (413) before any is written,
// from the volume's counters; should the code's background processes fill
// the volume meanwhile, the files this request created are removed again
// (one it replaced stays replaced).
func (s *Server) putFiles(v *volume.Volume, files []workspace.File) *apiError {
	if len(files) == 0 {
		return nil
	}
	u, err := v.Usage()
	if err != nil {
		return &apiError{status: http.StatusInternalServerError, reason: "sessions", msg: "session workspace: " + err.Error()}
	}
	var size int64
	for _, f := range files {
		size += (int64(len(f.Data)) + 4095) &^ 4095 // whole blocks
	}
	if size > u.MaxBytes-u.Bytes || int64(len(files)) > u.MaxFiles-u.Files {
		s.metrics.quotaRefusals.Inc()
		return &apiError{status: http.StatusRequestEntityTooLarge, reason: "quota", msg: fmt.Sprintf(
			"the files (%d, %d bytes) do not fit the session's workspace: %d of %d bytes and %d of %d files used (delete files first)",
			len(files), size, u.Bytes, u.MaxBytes, u.Files, u.MaxFiles)}
	}
	var created []string
	for _, f := range files {
		p := path.Join(inside.InputDir, f.Path)
		existed := false
		if rf, _, err := v.OpenFile(p); err == nil {
			rf.Close()
			existed = true
		}
		if _, _, err := v.Put(p, bytes.NewReader(f.Data)); err != nil {
			for _, c := range created {
				v.Delete(c)
			}
			return s.fileError(err)
		}
		if !existed {
			created = append(created, p)
		}
	}
	return nil
}
