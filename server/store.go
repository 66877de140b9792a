package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/stream"
)

// Execution states before a final nsjail status is known, and the final
// status of an execution its worker did not live to finish.
const (
	StatusQueued  = "queued"
	StatusRunning = "running"
	// StatusInterrupted: the worker stopped (crash, kill, restart) while the
	// execution was queued or running; the restarted worker answers it so.
	StatusInterrupted = "interrupted"
)

// interruptedError is the error of an interrupted execution.
const interruptedError = "the worker stopped (crash or restart) while this execution was queued or running: " +
	"it may have run in part, and its output is lost"

// An execution lives in two places: the live table below while it is queued
// or running (to be looked up, waited for and cancelled), and the result
// store (package results) from admission on: pending there until its answer
// is stored, which is what lets a restarted worker answer it interrupted.
// An execution leaves the live table only after its answer is stored, so a
// lookup that misses the live table finds the answer or nothing; except one
// that ran and whose answer could not be stored even as a small
// sandbox_error: it stays pending in the store, its id taken, until the
// next worker answers it interrupted.

// errIDTaken: claim lost a race for the id; the caller looks again.
var errIDTaken = errors.New("id taken")

// record is one live execution.
type record struct {
	id        string
	hash      string // requestHash of its request
	typ       string
	policy    Policy
	status    string // queued, then running
	startedAt time.Time
	cancel    context.CancelFunc
	done      chan struct{} // closed once it left the table
	hub       *stream.Hub   // its live events, in s.streams
}

// liveTable holds the live executions; there are at most max_concurrent +
// max_queued of them.
type liveTable struct {
	mu   sync.Mutex
	recs map[string]*record
}

func newLiveTable() *liveTable { return &liveTable{recs: map[string]*record{}} }

// view is a consistent copy of a live record.
type view struct {
	id, hash, typ, status string
	policy                Policy
	startedAt             time.Time
	done                  <-chan struct{}
	cancel                context.CancelFunc
}

func (t *liveTable) get(id string) (view, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.recs[id]
	if !ok {
		return view{}, false
	}
	return view{id: r.id, hash: r.hash, typ: r.typ, status: r.status, policy: r.policy, startedAt: r.startedAt,
		done: r.done, cancel: r.cancel}, true
}

func (t *liveTable) setRunning(r *record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.status = StatusRunning
	r.startedAt = time.Now()
}

// remove takes r out of the table and wakes its waiters.
func (t *liveTable) remove(r *record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.recs[r.id] == r {
		delete(t.recs, r.id)
	}
	r.cancel()
	close(r.done)
}

// cancelAll cancels every live execution (the drain's grace period is over).
func (t *liveTable) cancelAll() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.recs {
		r.cancel()
	}
	return len(t.recs)
}

// pendingInfo is what the result store keeps of an execution, pending and
// final: its type, runtime and policy for the interrupted answer, and the
// session it ran in (the session-scoped routes check it: inSession).
type pendingInfo struct {
	Type    string `json:"type"`
	Runtime string `json:"runtime,omitempty"`
	Policy  Policy `json:"policy"`
	Session string `json:"session,omitempty"`
}

// claim registers p as live and records it, pending, in the result store.
// errIDTaken when the id is live or stored.
func (s *Server) claim(p *plan, cancel context.CancelFunc) (*record, error) {
	r := &record{id: p.id, hash: p.hash, typ: p.policy.Name, policy: p.policy, status: StatusQueued,
		cancel: cancel, done: make(chan struct{}), hub: p.hub}
	s.live.mu.Lock()
	if _, ok := s.live.recs[p.id]; ok {
		s.live.mu.Unlock()
		return nil, errIDTaken
	}
	s.live.recs[p.id] = r
	s.live.mu.Unlock()
	info, _ := json.Marshal(pendingInfo{Type: p.policy.Name, Runtime: p.runtime, Policy: p.policy, Session: p.session})
	if _, err := s.results.Create(p.id, p.run, p.hash, info); err != nil {
		s.live.remove(r)
		if errors.Is(err, results.ErrExists) {
			return nil, errIDTaken
		}
		return nil, err
	}
	s.streams.Add(p.id, p.hub)
	return r, nil
}

// forget drops an execution that never ran (refused after claim).
func (s *Server) forget(r *record) {
	s.results.Discard(r.id)
	s.streams.Remove(r.id, r.hub)
	s.live.remove(r)
}

// existing answers a POST whose id is taken (found is true): the same
// request (same hash) gets that execution's stored answer, waiting for it
// while it runs (until ctx, the request's own context, ends); a different
// request gets 409. found is false when the id is free (again: an execution
// that never ran frees it).
//
// A retry that waits lets go of its plan's code, input and files first, and
// at most retryWaiters() wait at once (429 beyond): otherwise retries of one
// running execution, each holding up to max_code_bytes + max_input_bytes,
// would hold memory outside admission and max_decoding without a bound
// (SECURITY.md case 32).
func (s *Server) existing(ctx context.Context, p *plan) (rd *results.Reader, e *apiError, found bool) {
	conflict := &apiError{status: http.StatusConflict, reason: "conflict", msg: fmt.Sprintf(
		"id %q is taken by a different request (only a retry of the same request body gets its result)", p.id)}
	pendingNotLive := 0
	waited := false
	for {
		if v, live := s.live.get(p.id); live {
			if v.hash != p.hash {
				return nil, conflict, true
			}
			select {
			case s.waiters <- struct{}{}:
			default:
				return nil, &apiError{status: http.StatusTooManyRequests, reason: "over_capacity", retryAfter: "1",
					msg: fmt.Sprintf("over capacity: %d retries are waiting for their executions already", cap(s.waiters))}, true
			}
			p.code, p.input, p.files = "", nil, nil
			waited = true
			select {
			case <-v.done:
				<-s.waiters
				continue
			case <-ctx.Done():
				<-s.waiters
				return nil, &apiError{status: http.StatusServiceUnavailable, reason: "client_gone",
					msg: fmt.Sprintf("request ended while waiting for execution %q", p.id)}, true
			}
		}
		// The hash is checked on the entry that is opened, in one call: the
		// id may have expired and been taken since the lookup above.
		rd, _, err := s.results.OpenIf(p.id, p.hash)
		switch {
		case errors.Is(err, results.ErrNotFound) && waited:
			// The run waited for was refused before it started (or its
			// result expired at once); this request let go of its code
			// meanwhile: the client sends it again.
			return nil, &apiError{status: http.StatusServiceUnavailable, reason: "retry", retryAfter: "1",
				msg: fmt.Sprintf("execution %q ended without a stored result (refused before it ran, or expired); send the request again", p.id)}, true
		case errors.Is(err, results.ErrNotFound):
			return nil, nil, false // expired meanwhile
		case errors.Is(err, results.ErrOtherRequest):
			return nil, conflict, true
		case errors.Is(err, results.ErrPending):
			// Claimed since the lookup: a pending execution is in the live
			// table (claim adds it there first and finish removes it last),
			// so the next lookup finds it. Twice in a row, it is one that
			// ran but whose answer could not be stored (executeNew).
			if pendingNotLive++; pendingNotLive < 2 {
				continue
			}
			return nil, &apiError{status: http.StatusInternalServerError, reason: "store", msg: fmt.Sprintf(
				"execution %q ran but its result could not be stored; it is answered interrupted after the worker restarts", p.id)}, true
		case err != nil:
			return nil, storeError(err), true
		}
		return rd, nil, true
	}
}

// writeStoreError answers a request about execution id whose stored
// answer could not be read: storeError's status, logged as a refusal.
func (s *Server) writeStoreError(w http.ResponseWriter, id string, err error) {
	e := storeError(err)
	s.logReject(e, "execution_id", clip(id))
	writeAPIError(w, e)
}

// storeError is the API's answer to a result store failure.
func storeError(err error) *apiError {
	if errors.Is(err, results.ErrClosed) {
		return &apiError{status: http.StatusServiceUnavailable, reason: "draining", msg: "shutting down: " + err.Error()}
	}
	if errors.Is(err, results.ErrBusy) {
		return &apiError{status: http.StatusServiceUnavailable, reason: "streams", retryAfter: "1",
			msg: "over capacity: max_streams answers are being sent already (" + err.Error() + ")"}
	}
	return &apiError{status: http.StatusInternalServerError, reason: "store", msg: "result store: " + err.Error()}
}

// requestHash identifies a request for the retry rule: the SHA-256 of its
// canonical JSON (the decoded request encoded again: fields in a fixed
// order, env sorted, input compacted), so a retry that re-serialises the
// same request matches.
func requestHash(req any) string {
	data, err := json.Marshal(req)
	if err != nil { // Input was checked valid by the decoder
		data = []byte(err.Error())
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// storedDocument is resp as the result store keeps it: its JSON text with a
// hole where each artifact's content_base64 goes (the store fills them,
// streaming, from the artifact files). The artifacts come last in the
// object so that the text before them is resp's ordinary encoding.
func storedDocument(resp *ExecutionResponse) (text []byte, holes []int64) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// The outer Artifacts (omitted: nil) hides resp's own.
	enc.Encode(struct {
		*ExecutionResponse
		Artifacts []Artifact `json:"artifacts,omitempty"`
	}{ExecutionResponse: resp})
	text = bytes.TrimSuffix(bytes.TrimRight(buf.Bytes(), "\n"), []byte("}"))
	text = append(text[:len(text):len(text)], `,"artifacts":[`...) // a copy: buf is reused
	for i, a := range resp.Artifacts {
		if i > 0 {
			text = append(text, ',')
		}
		buf.Reset()
		enc.Encode(struct {
			Name      string `json:"name"`
			Size      int64  `json:"size"`
			MediaType string `json:"media_type"`
			SHA256    string `json:"sha256"`
			Width     int    `json:"width,omitempty"`
			Height    int    `json:"height,omitempty"`
		}{a.Name, a.Size, a.MediaType, a.SHA256, a.Width, a.Height})
		text = append(text, bytes.TrimSuffix(bytes.TrimRight(buf.Bytes(), "\n"), []byte("}"))...)
		text = append(text, `,"content_base64":"`...)
		holes = append(holes, int64(len(text)))
		text = append(text, `"}`...)
	}
	return append(text, "]}\n"...), holes
}

// interruptedDocument is the stored answer of an execution found pending
// when the store opened (its worker died), and its type.
func interruptedDocument(e results.Entry, now time.Time) (text []byte, typ string) {
	var info pendingInfo
	json.Unmarshal(e.Info, &info)
	resp := &ExecutionResponse{ID: e.ID, Type: info.Type, Runtime: info.Runtime, Policy: info.Policy, Status: StatusInterrupted, ExitCode: -1,
		Artifacts: []Artifact{}, ArtifactsOmitted: []Omitted{}, LimitsHit: []string{},
		StartedAt: e.CreatedAt, FinishedAt: now, DurationMS: now.Sub(e.CreatedAt).Milliseconds(), Error: errorMessage(interruptedError),
		Display: []runner.Display{}}
	text, _ = storedDocument(resp)
	return text, info.Type
}

// writeStored streams a stored answer from disk (SECURITY.md case 31: never
// whole in memory).
func (s *Server) writeStored(w http.ResponseWriter, rd *results.Reader, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.FormatInt(rd.Len(), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := rd.WriteTo(w); err != nil {
		s.log.Debug("answer not fully sent", "execution_id", id, "err", err)
	}
}
