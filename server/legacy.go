package server

import (
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/nsjail"
)

// LegacyRequest is the body of POST /execute, the contract of the Flask
// python worker sandboxd replaces: code and a timeout in seconds.
type LegacyRequest struct {
	Code    string  `json:"code"`
	Timeout float64 `json:"timeout,omitempty"`
}

// LegacyResponse is its answer: stdout, stderr and one of the Legacy* statuses.
type LegacyResponse struct {
	Output string `json:"output"`
	Error  string `json:"error"`
	Status string `json:"status"`
}

// Statuses of the Flask contract.
const (
	LegacySuccess       = "success"
	LegacyError         = "error"
	LegacyCriticalError = "critical_error"
)

// handleLegacyExecute runs code under the dynamic policy. Unlike
// /v1/executions, a timeout above the policy maximum is capped, not refused:
// Flask clients never had a policy to respect.
func (s *Server) handleLegacyExecute(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req LegacyRequest
	decoded, e := s.decodeBody(w, r, &req)
	if e != nil {
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	if req.Timeout < 0 || math.IsNaN(req.Timeout) || math.IsInf(req.Timeout, 0) {
		decoded()
		s.reject(w, "bad_request", http.StatusBadRequest, fmt.Sprintf("timeout must be a positive number of seconds, got: %v", req.Timeout))
		return
	}
	timeoutMS := int64(math.Ceil(req.Timeout * 1000))
	if max := s.policies[TypeDynamic].TimeoutMS; timeoutMS > max {
		timeoutMS = max
	}
	// Flask clients read stdout and stderr only: no figures are saved, no
	// value displayed.
	noFigures := false
	p, e := s.validate(&ExecutionRequest{Type: TypeDynamic, Code: req.Code, TimeoutMS: timeoutMS, CaptureFigures: &noFigures})
	decoded()
	if e != nil {
		s.logReject(e, "policy", TypeDynamic)
		writeAPIError(w, e)
		return
	}
	// A fresh id: no retry rule. Only stdout, stderr and the status are
	// answered, from memory.
	resp, rd, e := s.executeNew(r.Context(), p)
	if e != nil {
		s.logReject(e, "execution_id", p.id, "policy", TypeDynamic)
		writeAPIError(w, e)
		return
	}
	rd.Close()
	writeJSON(w, http.StatusOK, legacyFrom(resp))
}

// legacyFrom maps a result to the Flask contract: critical_error when the
// run did not end by itself (crash by signal, timeout, OOM, our failure),
// error when it wrote to stderr or exited non-zero, success otherwise.
func legacyFrom(r *ExecutionResponse) LegacyResponse {
	out := LegacyResponse{Output: r.Stdout, Error: r.Stderr}
	var why string
	switch nsjail.Status(r.Status) {
	case nsjail.StatusTimeout:
		why = fmt.Sprintf("execution timed out after %d ms", r.Policy.TimeoutMS)
	case nsjail.StatusOOM:
		why = fmt.Sprintf("execution ran out of memory (limit %d MiB)", r.Policy.MemoryMB)
	case nsjail.StatusCancelled:
		why = "execution was cancelled"
	case nsjail.StatusSandboxError:
		why = "sandbox error: " + r.Error.String()
	default:
		if r.Signal != nil {
			why = "execution crashed with " + *r.Signal
		}
	}
	switch {
	case why != "":
		out.Status = LegacyCriticalError
		if out.Error != "" && !strings.HasSuffix(out.Error, "\n") {
			out.Error += "\n"
		}
		out.Error += why
	case strings.TrimSpace(r.Stderr) != "" || r.ExitCode != 0:
		out.Status = LegacyError
	default:
		out.Status = LegacySuccess
	}
	return out
}
