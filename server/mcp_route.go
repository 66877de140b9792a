package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
)

// handleMCP serves POST /mcp with the handler Deps.MCP built (the guard
// has run). The body is read here first, under the same bounds as an API
// body (max body, a decoding turn, read_timeout: SECURITY.md case 32),
// with the API's refusals (413, 408, 429), and the read deadline is then
// lifted as decodeBody does: an MCP call that runs code must outlive
// read_timeout as a POST /v1/executions does (limits.go, deadlines). The
// turn is given back before the call runs, as the tools' own API calls
// take turns of their own.
//
// SECURITY.md case 55: a tool call holds memory of its own outside the
// API's admission (an answer being parsed, images inlined, a resource
// read), so at most mcpCallLimit calls are served at once (429 beyond),
// and a JSON-RPC batch, which the SDK would run all at once under one
// place, is refused.
func (s *Server) handleMCP(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	if s.mcp == nil {
		writeError(w, http.StatusNotFound, "MCP is not enabled on this worker")
		return
	}
	select {
	case s.mcpCalls <- struct{}{}:
		defer func() { <-s.mcpCalls }()
	default:
		e := &apiError{status: http.StatusTooManyRequests, reason: "over_capacity", retryAfter: "1",
			msg: fmt.Sprintf("over capacity: %d MCP calls are being served already (max_concurrent + max_queued)", cap(s.mcpCalls))}
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	if r.ContentLength > s.maxBody() {
		s.reject(w, "too_large", http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is %d bytes, more than %d", r.ContentLength, s.maxBody()))
		return
	}
	release, e := s.decoding.acquire(r.Context())
	if e != nil {
		s.logReject(e)
		writeAPIError(w, e)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody()))
	release()
	var tooBig *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooBig):
		s.reject(w, "too_large", http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is more than %d bytes", tooBig.Limit))
		return
	case errors.As(err, &netErr) && netErr.Timeout():
		// SECURITY.md case 32: a body trickled in slower than read_timeout.
		s.reject(w, "timeout", http.StatusRequestTimeout, fmt.Sprintf("request body not received within read_timeout (%s)", time.Duration(s.cfg.ReadTimeout)))
		return
	case err != nil:
		s.reject(w, "bad_request", http.StatusBadRequest, "reading the request body: "+clip(err.Error()))
		return
	}
	if isBatch(body) {
		s.reject(w, "bad_request", http.StatusBadRequest, "JSON-RPC batches are not served at /mcp: send one message per POST")
		return
	}
	liftReadDeadline(w)
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.mcp.ServeHTTP(w, r)
}

// mcpCallLimit is how many /mcp calls are served at once: as many as the
// executions the worker holds (max_concurrent running + max_queued
// waiting), so that every call may be waiting on one of them, and no more:
// a call beyond could only be refused by admission anyway, after its
// request was read and held. At least 1.
func mcpCallLimit(maxConcurrent, maxQueued int) int {
	return max(1, maxConcurrent+maxQueued)
}

// isBatch reports whether a JSON-RPC body is a batch: a JSON array (after
// the whitespace JSON allows).
func isBatch(body []byte) bool {
	b := bytes.TrimLeft(body, " \t\r\n")
	return len(b) > 0 && b[0] == '['
}
