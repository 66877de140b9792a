package server

// Streaming and asynchronous answers. A POST that accepts
// text/event-stream gets the execution's events as server-sent events
// while it runs (its output as it is read, what else is published into its
// hub), then one `result` event holding the usual answer; a POST that
// prefers respond-async gets 202 and a Location once it is accepted (execution.accept); GET
// /v1/executions/{id}/events attaches to a running or finished execution,
// resuming after Last-Event-ID. The execution itself never waits for a
// client (package stream): these answers only read.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/sandboxd/sandboxd/server/results"
	"github.com/sandboxd/sandboxd/server/stream"
)

const (
	// finishedStreams and streamLinger bound the finished executions whose
	// events are kept for a client that resumes (SECURITY.md case 53).
	finishedStreams = 16
	streamLinger    = time.Minute
	// keepAlive is how often an idle event stream gets a comment: a
	// vanished client is noticed, and proxies keep the connection.
	keepAlive = 15 * time.Second
	// eventBatchBytes bounds what one client holds of a hub's events while
	// it writes them (SECURITY.md case 52).
	eventBatchBytes = 64 << 10
)

// answerMode is how a POST's client wants its answer.
type answerMode int

const (
	answerSync   answerMode = iota // the answer, once the execution is over
	answerEvents                   // server-sent events, then the answer
	answerAsync                    // 202 and a Location, at once
)

// answerModeOf reads Prefer (respond-async, RFC 7240) and Accept
// (text/event-stream); the first wins.
func answerModeOf(r *http.Request) answerMode {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(pref, ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return answerAsync
			}
		}
	}
	for _, v := range r.Header.Values("Accept") {
		for _, media := range strings.Split(v, ",") {
			typ, params, _ := strings.Cut(media, ";")
			if strings.EqualFold(strings.TrimSpace(typ), "text/event-stream") && !zeroQuality(params) {
				return answerEvents
			}
		}
	}
	return answerSync
}

// runContext is the context an execution POSTed with r runs in, and how it
// is answered. An execution the client named can be fetched again (GET,
// or a retry of the POST), so it outlives the connection: a client whose
// request timed out retries and gets the result instead of "cancelled"
// (in a session, never a second run in the kernel). So does an
// asynchronous one (respond-async). An unnamed one cannot be found again
// and is cancelled with its client. DELETE and the drain still cancel
// both.
func runContext(r *http.Request, named bool) (context.Context, answerMode) {
	mode := answerModeOf(r)
	if named || mode == answerAsync {
		return context.WithoutCancel(r.Context()), mode
	}
	return r.Context(), mode
}

// zeroQuality: the media type's parameters say q=0 (not acceptable).
func zeroQuality(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.EqualFold(k, "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && q == 0
		}
	}
	return false
}

// answerDetached answers a validated POST that does not wait for the
// execution's end: with its events (answerEvents) or 202 (answerAsync).
// run is the execution's context; an asynchronous one outlives the
// request whether it is named or not (it is fetched by the id in the
// Location).
func (s *Server) answerDetached(w http.ResponseWriter, r *http.Request, p *plan, run context.Context, mode answerMode) {
	log := func(e *apiError) {
		s.logReject(e, "session_id", p.session, "execution_id", p.id, "policy", p.policy.Name)
	}
	if v, ok := s.live.get(p.id); ok && v.hash == p.hash {
		// A retry of a live execution: point at it or follow it, never
		// wait here for its end.
		p.code, p.input, p.files = "", nil, nil
		if mode == answerAsync {
			writeAccepted(w, p)
			return
		}
		if e := s.serveEvents(w, r, p.id, 0); e != nil {
			log(e)
			writeAPIError(w, e)
		}
		return
	}
	p.detached = true
	rd, e := s.startDetached(run, r.Context(), p)
	switch {
	case e != nil:
		log(e)
		writeAPIError(w, e)
	case rd != nil:
		// Answered without running (a retry of a finished execution).
		defer rd.Close()
		if mode == answerAsync {
			s.writeStored(w, rd, p.id)
			return
		}
		sse := s.startEvents(w)
		s.writeResult(sse, rd, 0)
	case mode == answerAsync:
		writeAccepted(w, p)
	default:
		s.streamHub(w, r, p.id, p.hub, 0)
	}
}

// startDetached runs p in the background and returns once it is accepted (execution.accept)
// (nil, nil) or answered without running: a stored answer (a retry) or a
// refusal. The run then goes on by itself and closes its own answer.
func (s *Server) startDetached(run, wait context.Context, p *plan) (*results.Reader, *apiError) {
	type outcome struct {
		rd *results.Reader
		e  *apiError
	}
	out := make(chan outcome, 1)
	go func() {
		rd, e := s.execute(run, wait, p)
		select {
		case <-p.accepted: // the caller is answered already
			if rd != nil {
				rd.Close()
			}
			if e != nil {
				// Refused after the client was answered: its events say so.
				s.logReject(e, "session_id", p.session, "execution_id", p.id, "policy", p.policy.Name)
			}
		default:
			out <- outcome{rd, e}
		}
	}()
	select {
	case <-p.accepted:
		return nil, nil
	case o := <-out:
		return o.rd, o.e
	}
}

// accepted is the body of a 202.
type accepted struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// writeAccepted answers 202 for p. A session's execution is located under
// its session, a route forwarded to the session's owner (any worker can
// answer it behind a load balancer, as /v1/executions/{id} cannot).
func writeAccepted(w http.ResponseWriter, p *plan) {
	loc := "/v1/executions/" + p.id
	if p.session != "" {
		loc = "/v1/sessions/" + p.session + "/executions/" + p.id
	}
	w.Header().Set("Location", loc)
	w.Header().Set("Preference-Applied", "respond-async")
	writeJSON(w, http.StatusAccepted, accepted{ID: p.id, Status: StatusRunning})
}

// writeRefusal answers GET for an execution refused after its client was
// answered (202): the refusal, as the POST would have answered it, while
// its events are kept. False when there is none.
func (s *Server) writeRefusal(w http.ResponseWriter, id string) bool {
	hub := s.streams.Get(id)
	if hub == nil {
		return false
	}
	status, body, ok := hub.Refusal()
	if !ok {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
	return true
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	var after uint64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			s.reject(w, "bad_request", http.StatusBadRequest, fmt.Sprintf("Last-Event-ID %q is not an event id (a decimal integer)", clip(v)))
			return
		}
		after = n
	}
	if e := s.serveEvents(w, r, id, after); e != nil {
		if e.status != http.StatusNotFound {
			s.logReject(e, "execution_id", clip(id))
		}
		writeAPIError(w, e)
	}
}

// serveEvents streams id's events after after: from its hub while it has
// one (running, or finished a short while ago), else its stored answer as
// the result event. An error is returned only before anything is written.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request, id string, after uint64) *apiError {
	release, e := s.attached.acquire(r.Context())
	if e != nil {
		e.msg = fmt.Sprintf("over capacity: max_streams (%d) event streams are attached already", cap(s.attached))
		return e
	}
	defer release()
	for range 2 { // once more if it finished between the lookups
		if hub := s.streams.Get(id); hub != nil {
			s.streamHub(w, r, id, hub, after)
			return nil
		}
		rd, err := s.results.Open(id)
		switch {
		case errors.Is(err, results.ErrPending):
			// Claimed, its hub about to be registered (claim), or ran
			// with an answer that could not be stored.
			time.Sleep(10 * time.Millisecond)
			continue
		case errors.Is(err, results.ErrNotFound):
			return &apiError{status: http.StatusNotFound, reason: "not_found",
				msg: fmt.Sprintf("no execution %q (unknown, or its result has expired)", clip(id))}
		case err != nil:
			return storeError(err)
		}
		defer rd.Close()
		s.writeResult(s.startEvents(w), rd, 0)
		return nil
	}
	return &apiError{status: http.StatusServiceUnavailable, reason: "store", retryAfter: "1",
		msg: fmt.Sprintf("execution %q has no events and no stored answer yet; try again", clip(id))}
}

// streamHub writes hub's events after after until the result, the
// client's departure, or a write the client does not take in time.
func (s *Server) streamHub(w http.ResponseWriter, r *http.Request, id string, hub *stream.Hub, after uint64) {
	sse := s.startEvents(w)
	ctx := r.Context()
	for {
		wait, cancel := context.WithTimeout(ctx, keepAlive)
		b, err := hub.Next(wait, after, eventBatchBytes)
		cancel()
		if err != nil {
			if ctx.Err() != nil || sse.comment("keep-alive") != nil {
				return
			}
			continue
		}
		if b.Missed > 0 && len(b.Events) > 0 {
			// A slow or late client skips ahead: told how many events
			// it missed (the answer still has all the output it keeps).
			missed, _ := json.Marshal(struct {
				Missed uint64 `json:"missed"`
			}{b.Missed})
			if sse.event(b.Events[0].ID-1, eventGap, missed) != nil {
				return
			}
		}
		for _, e := range b.Events {
			if e.Type == stream.TypeResult {
				s.writeStoredResult(sse, id, e.ID)
				return
			}
			if e.Type == stream.TypeError { // refused: the last event
				sse.event(e.ID, e.Type, e.JSON())
				return
			}
			if sse.event(e.ID, e.Type, e.JSON()) != nil {
				return
			}
			after = e.ID
		}
		if b.Done {
			return
		}
	}
}

// eventGap says events were missed; stream.TypeError ends a stream whose
// execution was refused, or whose result cannot be read.
const eventGap = "gap"

// writeStoredResult writes id's stored answer as the result event eventID.
func (s *Server) writeStoredResult(sse *sseWriter, id string, eventID uint64) {
	rd, err := s.results.Open(id)
	if err != nil {
		msg := fmt.Sprintf("the answer of execution %q cannot be read: %v", clip(id), err)
		if errors.Is(err, results.ErrPending) {
			msg = fmt.Sprintf("execution %q ran but its answer could not be stored", clip(id))
		}
		data, _ := json.Marshal(errorBody{Error: msg})
		sse.event(eventID, stream.TypeError, data)
		return
	}
	defer rd.Close()
	s.writeResult(sse, rd, eventID)
}

// writeResult writes a stored answer as the result event (id 0: none, the
// events are gone), streamed from disk (SECURITY.md case 31). The whole
// event gets one write_timeout, as a synchronous answer does
// (deadlineWriter): a client reading it slowly holds the stored answer's
// reader (a place of results.MaxReaders) no longer (SECURITY.md case 52).
func (s *Server) writeResult(sse *sseWriter, rd *results.Reader, eventID uint64) {
	sse.fixDeadline()
	if sse.head(eventID, stream.TypeResult) != nil {
		return
	}
	if _, err := rd.WriteTo(dataLine{sse}); err != nil {
		s.log.Debug("result event not fully sent", "err", err)
		return
	}
	sse.end()
}

// sseWriter writes server-sent events. Every write has its own deadline,
// write_timeout from when it starts: a stream may last as long as its
// execution, but a client that stops reading holds its handler for at
// most one write_timeout (SECURITY.md case 52). The result event, which
// may be large, has one deadline for all of it (fixDeadline).
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	buf     bytes.Buffer
	fixed   bool // the deadline is set for the rest of the stream
}

// startEvents answers 200 text/event-stream.
func (s *Server) startEvents(w http.ResponseWriter) *sseWriter {
	sse := &sseWriter{w: w, rc: http.NewResponseController(w), timeout: time.Duration(s.cfg.WriteTimeout)}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no") // nginx: pass events on as they come
	sse.arm()
	w.WriteHeader(http.StatusOK)
	sse.flush()
	return sse
}

func (s *sseWriter) arm() {
	if !s.fixed {
		s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	}
}

// fixDeadline sets the deadline once, write_timeout from now, for
// everything written from now on: a client that takes a few bytes now and
// then can no longer keep re-arming it.
func (s *sseWriter) fixDeadline() {
	s.arm()
	s.fixed = true
}

func (s *sseWriter) Write(b []byte) (int, error) {
	s.arm()
	return s.w.Write(b)
}

func (s *sseWriter) flush() error {
	s.arm()
	return s.rc.Flush()
}

// event writes one whole event and sends it.
func (s *sseWriter) event(id uint64, typ string, data []byte) error {
	if err := s.head(id, typ); err != nil {
		return err
	}
	if _, err := (dataLine{s}).Write(data); err != nil {
		return err
	}
	return s.end()
}

// head starts an event: its id (none when 0) and type, and its data line.
// typ is the worker's own name, never the code's; a line break in it
// would end the field: it is dropped.
func (s *sseWriter) head(id uint64, typ string) error {
	s.buf.Reset()
	if id > 0 {
		fmt.Fprintf(&s.buf, "id: %d\n", id)
	}
	fmt.Fprintf(&s.buf, "event: %s\ndata: ", strings.NewReplacer("\r", "", "\n", "").Replace(typ))
	_, err := s.Write(s.buf.Bytes())
	return err
}

// end ends an event and sends it.
func (s *sseWriter) end() error {
	if _, err := s.Write([]byte("\n\n")); err != nil {
		return err
	}
	return s.flush()
}

// comment writes a comment line (ignored by clients) and sends it.
func (s *sseWriter) comment(text string) error {
	if _, err := s.Write([]byte(": " + text + "\n\n")); err != nil {
		return err
	}
	return s.flush()
}

// dataLine writes a JSON document as one SSE data line: a raw line break,
// only ever whitespace between JSON tokens (inside strings they are
// escaped), would end the field, so CR and LF are dropped.
type dataLine struct{ s *sseWriter }

func (d dataLine) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			i = len(b)
		}
		if i > 0 {
			if _, err := d.s.Write(b[:i]); err != nil {
				return 0, err
			}
		}
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return n, nil
}
