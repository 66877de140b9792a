package server

// The schema preview of a session file (GET .../files/{path}?profile=1):
// columns, types, nulls and a head, for an agent's planning step. The file
// is untrusted and so are the parsers that read it: it is parsed only in a
// single-use sandbox of the session's policy with the workspace bound
// read-only (SECURITY.md case 45), by a fixed program (profile.py) whose
// one JSON document the worker reads bounded and checks only for being a
// JSON object, never trusting more of it than its two error fields.

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/session"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

//go:embed profile.py
var profileSource string

// profileKinds are the extensions profiled, and the reader for each.
var profileKinds = map[string]string{".csv": "csv", ".xlsx": "xlsx", ".json": "json", ".parquet": "parquet"}

// profileLimits bound the profile document (profile.py enforces them; the
// worker's read is bounded by max_stdout_bytes anyway).
var profileLimits = map[string]int{
	"max_columns":  200,
	"head_rows":    5,
	"max_cell":     200, // characters of a cell, a sample or a name
	"samples":      5,
	"max_distinct": 1000, // beyond, a column has no "distinct"
	"chunk_rows":   50_000,
	"max_bytes":    256 << 10,
}

// profileError is profile.py's answer when the file cannot be profiled.
type profileError struct {
	Error *string `json:"error"`
	Kind  string  `json:"kind"`
}

func (s *Server) handleProfile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	s.withSession(w, ps, func(id string, m *session.Manager) *apiError {
		if v := r.URL.Query().Get("profile"); v != "1" {
			return badRequest("profile must be 1, got: %q", clip(v))
		}
		p, e := filePath(ps)
		if e != nil {
			return e
		}
		kind, ok := profileKinds[strings.ToLower(path.Ext(p))]
		if !ok {
			return &apiError{status: http.StatusUnsupportedMediaType, reason: "unsupported", msg: fmt.Sprintf(
				"profile reads .csv, .xlsx, .json and .parquet files, not %q", clip(path.Base(p)))}
		}
		if !utf8.ValidString(p) {
			return badRequest("profile needs a UTF-8 path, got: %q", clip(p))
		}
		// Lent for the whole profile: the sandbox binds the volume by its
		// path, which names this session's volume, and no re-created
		// one's, only while a Delete waits for the lend (SECURITY.md case
		// 49). The Delete cancels the lend's context: the profile ends.
		l, err := m.Lend(id)
		if err != nil {
			return sessionError(id, err)
		}
		defer l.Release()
		// Before anything is claimed (a slot, a sandbox).
		if e := s.runtimeGone(l.Runtime); e != nil {
			return e
		}
		// The worker checks what it is (a regular file the sandbox user
		// owns) as for a GET; the sandbox reads it.
		f, _, err := l.Volume.OpenFile(p)
		if err != nil {
			return s.fileError(err)
		}
		f.Close()
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(l.Ctx, cancel)()
		doc, e := s.profile(ctx, s.policies[l.Policy], l.Runtime, l.Volume.Path(), p, kind)
		if e != nil {
			if l.Ctx.Err() != nil {
				return sessionError(id, session.ErrNotFound)
			}
			return e
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		w.Write(doc)
		return nil
	})
}

// profile runs profile.py on the file p of the workspace ws in a
// single-use read-only kernel of pol, admitted as an execution, and
// returns its document.
func (s *Server) profile(ctx context.Context, pol Policy, runtime, ws, p, kind string) ([]byte, *apiError) {
	if e := s.readyOr503(); e != nil {
		return nil, e
	}
	if !s.enter() {
		return nil, &apiError{status: http.StatusServiceUnavailable, reason: "draining", msg: "shutting down: not accepting executions"}
	}
	defer s.inFlight.Done()
	ticket, err := s.admission.Reserve()
	if err != nil {
		return nil, &apiError{status: http.StatusTooManyRequests, reason: "over_capacity", msg: err.Error(), retryAfter: "1"}
	}
	defer ticket.Release()
	if err := ticket.Wait(ctx); err != nil {
		return nil, &apiError{status: http.StatusServiceUnavailable, reason: "client_gone", msg: "request ended while waiting for a slot"}
	}
	// A JSON string is a Python string literal; the path is UTF-8 without
	// NUL (CheckPath), so it round-trips.
	target, _ := json.Marshal(path.Join(inside.Workspace, p))
	lim, _ := json.Marshal(profileLimits)
	code := fmt.Sprintf("%s\n_sandboxd_profile(%s, %q, %s)\n", profileSource, target, kind, lim)
	k, err := s.starter.StartKernel(ctx, pol.Name, runtime, ws, warmpool.KernelOptions{ReadOnly: true})
	var ae *apiError
	if errors.As(err, &ae) {
		return nil, ae // runtimeOr503's: not ready, or the runtime gone
	}
	if err != nil {
		s.log.Error("profile: no sandbox", "err", err)
		return nil, &apiError{status: http.StatusInternalServerError, reason: "sandbox", msg: "profile: the sandbox did not start: " + err.Error()}
	}
	defer k.Close()
	timeout := time.Duration(pol.TimeoutMS) * time.Millisecond
	kr, err := k.Exec(ctx, warmpool.KernelExec{Code: code, Timeout: timeout})
	if err != nil {
		return nil, &apiError{status: http.StatusInternalServerError, reason: "sandbox", msg: "profile: " + err.Error()}
	}
	return profileAnswer(kr.Result, pol, p)
}

// profileAnswer turns profile.py's run into the answer: its document, or
// the error it or its sandbox met. Its output is untrusted (the parsers ran
// on an untrusted file): bounded, and passed on only as a JSON object.
func profileAnswer(res *nsjail.Result, pol Policy, p string) ([]byte, *apiError) {
	unprocessable := func(format string, a ...any) *apiError {
		return &apiError{status: http.StatusUnprocessableEntity, reason: "profile", msg: clipLong(fmt.Sprintf(format, a...))}
	}
	switch res.Status {
	case nsjail.StatusSucceeded:
	case nsjail.StatusTimeout:
		return nil, unprocessable("%s could not be profiled within the policy's timeout (%d ms)", clip(p), pol.TimeoutMS)
	case nsjail.StatusOOM:
		return nil, unprocessable("%s could not be profiled within the policy's memory (%d MiB)", clip(p), pol.MemoryMB)
	case nsjail.StatusFailed:
		return nil, unprocessable("%s could not be profiled: %s", clip(p), lastLine(res.Stderr))
	default:
		return nil, &apiError{status: http.StatusInternalServerError, reason: "sandbox",
			msg: clipLong(fmt.Sprintf("profile: the sandbox ended %s: %s", res.Status, res.Error))}
	}
	doc := bytes.TrimSpace(res.Stdout)
	if res.StdoutTruncated || len(doc) > 2*profileLimits["max_bytes"] {
		return nil, &apiError{status: http.StatusInternalServerError, reason: "profile", msg: "profile: the profiler's output is over its budget"}
	}
	if len(doc) == 0 || doc[0] != '{' || !json.Valid(doc) {
		return nil, &apiError{status: http.StatusInternalServerError, reason: "profile", msg: "profile: the profiler's output is not a JSON object"}
	}
	var pe profileError
	if json.Unmarshal(doc, &pe) == nil && pe.Error != nil {
		if pe.Kind == "unsupported" {
			return nil, &apiError{status: http.StatusUnsupportedMediaType, reason: "unsupported",
				msg: clipLong(fmt.Sprintf("%s cannot be profiled: %s", clip(p), *pe.Error))}
		}
		return nil, unprocessable("%s could not be parsed: %s", clip(p), *pe.Error)
	}
	return doc, nil
}

// lastLine is the last non-empty line of a traceback: the exception.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// clipLong bounds a message that carries a parser's words (up to 1 KiB).
func clipLong(s string) string {
	if len(s) <= 1024 {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ToValidUTF8(s[:1024], "") + fmt.Sprintf("…(%d bytes)", len(s))
}
