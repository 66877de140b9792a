// Package stream holds the live events of executions for the clients that
// follow them (server-sent events): one Hub per execution, fed by the
// execution (its output as it is read, and whatever else publishes into it)
// without ever waiting for a client, and read by any number of clients,
// each at its own pace, from any event id it has seen.
//
// Memory is bounded whatever the clients do (SECURITY.md cases 52 and 53):
// a hub keeps its events in a ring bounded by count and bytes, and a client
// holds no state in the hub at all, only the id of the last event it read,
// so a slow client falls behind (it is told how many events it missed and
// skips ahead) and a vanished one costs nothing. The Registry keeps the
// hubs of live executions and, for a short while and a bounded number, of
// finished ones, so a client whose connection dropped can resume.
//
// The final event of every hub is "result": it carries no data here (the
// answer can be large and is streamed from the result store); the hub says
// only that the execution's answer is stored.
package stream

import (
	"context"
	"encoding/json"
	"sync"
	"unicode/utf8"
)

// Event types. Stdout and Stderr carry Text; Result ends a stream; other
// types (a13's "figure", "display") carry Data.
const (
	TypeStdout = "stdout"
	TypeStderr = "stderr"
	TypeResult = "result"
	// TypeError ends the stream of an execution refused after its
	// client was answered (202, or its stream started): Data is the
	// refusal, as the API answers it.
	TypeError = "error"
)

// Event is one event of an execution. An event is never changed once a
// client may have read it, so a client may keep it while it writes it.
type Event struct {
	// ID increases by one per event of the hub, from 1.
	ID   uint64
	Type string
	// Text is an output event's text (raw bytes, as the code wrote them;
	// a UTF-8 sequence is never split between two events).
	Text []byte
	// Data is any other event's JSON document.
	Data json.RawMessage
}

// JSON is the event's data as a JSON document: {"text": …} for output
// (invalid UTF-8 becomes U+FFFD, as in the answer), Data otherwise, null
// for a result.
func (e Event) JSON() []byte {
	if e.Type == TypeStdout || e.Type == TypeStderr {
		b, _ := json.Marshal(struct {
			Text string `json:"text"`
		}{string(e.Text)})
		return b
	}
	if len(e.Data) == 0 {
		return []byte("null")
	}
	return e.Data
}

// size is what the event counts against a hub's byte bound.
func (e Event) size() int64 { return int64(len(e.Text) + len(e.Data) + len(e.Type) + 32) }

// Limits bound one hub.
type Limits struct {
	// MaxEvents and MaxBytes bound the events held: the oldest go first.
	// The newest event is always held, whatever its size.
	MaxEvents int
	MaxBytes  int64
	// MaxChunk is the most text one output event gathers: output written
	// in small pieces is merged into the newest event while no client has
	// read it yet.
	MaxChunk int
}

// DefaultLimits are the worker's.
var DefaultLimits = Limits{MaxEvents: 4096, MaxBytes: 1 << 20, MaxChunk: 64 << 10}

// Hub is one execution's events. Publish and Output never block on a
// client; Next never blocks the producer.
type Hub struct {
	lim Limits
	// Scope is what the hub's execution belongs to (the server's session
	// id; empty for none). Set before the hub is added to a Registry and
	// never changed after: read without the lock.
	Scope string

	mu sync.Mutex
	// ring holds the events in id order: ring[first:] (ring[:first] are
	// dropped, kept only until the slice is compacted).
	ring  []Event
	first int
	bytes int64
	next  uint64 // the id the next event gets
	// read is the highest id any client was given: events after it may
	// still be merged into.
	read     uint64
	finished bool
	// refused is the HTTP status of the refusal that ended the stream
	// (Refuse), 0 when none.
	refused int
	// carry is the incomplete UTF-8 sequence at the end of the last
	// chunk of each output stream, held for the next chunk.
	carry map[string][]byte
	// spare is the text buffer of an output event dropped unread, reused
	// for the next: output flooding a hub nobody reads costs no
	// allocation per chunk (SECURITY.md case 8).
	spare []byte
	// wake is closed when an event arrives; a new one is made only when a
	// client took the old one.
	wake      chan struct{}
	wakeTaken bool
}

// NewHub returns an empty hub; a zero field of lim takes DefaultLimits'.
func NewHub(lim Limits) *Hub {
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = DefaultLimits.MaxEvents
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultLimits.MaxBytes
	}
	if lim.MaxChunk <= 0 {
		lim.MaxChunk = DefaultLimits.MaxChunk
	}
	return &Hub{lim: lim, next: 1, carry: map[string][]byte{}, wake: make(chan struct{})}
}

// Publish adds an event of type typ with its JSON data and returns its
// id; 0 once the hub is finished (the event is dropped). data is kept:
// the caller must not change it afterwards.
func (h *Hub) Publish(typ string, data json.RawMessage) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished {
		return 0
	}
	return h.push(Event{Type: typ, Data: data})
}

// Output adds a chunk of stream (TypeStdout or TypeStderr) as the
// execution wrote it; chunk is copied. Its signature is an
// nsjail.OutputFunc's.
func (h *Hub) Output(stream string, chunk []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished || len(chunk) == 0 {
		return
	}
	// The text is carry + chunk up to its last complete character; only
	// the last utf8.UTFMax bytes decide where that is.
	carry := h.carry[stream]
	var rest [2 * utf8.UTFMax]byte
	var head, tail []byte
	if len(chunk) >= utf8.UTFMax {
		cut := completeUTF8(chunk)
		head, tail = chunk[:cut], append(rest[:0], chunk[cut:]...)
	} else {
		short := append(append(rest[:0], carry...), chunk...)
		cut := completeUTF8(short)
		carry, head, tail = nil, short[:cut], short[cut:]
	}
	h.output(stream, carry, head)
	h.carry[stream] = append(h.carry[stream][:0], tail...)
}

// output adds a+b to the newest event when it is of stream, unread and
// small enough, else as a new event.
func (h *Hub) output(stream string, a, b []byte) {
	size := len(a) + len(b)
	if size == 0 {
		return
	}
	if n := len(h.ring); n > h.first {
		last := &h.ring[n-1]
		if last.Type == stream && last.ID > h.read && len(last.Text)+size <= h.lim.MaxChunk {
			last.Text = append(append(last.Text, a...), b...)
			h.bytes += int64(size)
			h.evict()
			h.signal()
			return
		}
	}
	text := h.spare
	h.spare = nil
	if cap(text) < size {
		text = make([]byte, 0, size)
	}
	h.push(Event{Type: stream, Text: append(append(text[:0], a...), b...)})
}

// completeUTF8 is the length of b without an incomplete UTF-8 sequence at
// its end (an invalid one counts as complete: it is never completed).
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// Finish ends the stream: what is held of incomplete UTF-8 goes out as it
// is, then the result event. Nothing is added after it. Call it once the
// execution's answer is stored.
func (h *Hub) Finish() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished {
		return
	}
	for _, stream := range []string{TypeStdout, TypeStderr} {
		h.output(stream, h.carry[stream], nil)
	}
	h.carry = nil
	h.push(Event{Type: TypeResult})
	h.finished = true
}

// Refuse ends the stream with an error event holding data, the refusal
// of the execution (HTTP status status), instead of a result. Nothing is
// added after it; it does nothing once the hub is finished.
func (h *Hub) Refuse(status int, data json.RawMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished {
		return
	}
	h.carry = nil
	h.push(Event{Type: TypeError, Data: data})
	h.finished, h.refused = true, status
}

// Refusal is the refusal that ended the stream, if one did: its HTTP
// status and its data.
func (h *Hub) Refusal() (status int, data json.RawMessage, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refused == 0 {
		return 0, nil, false
	}
	return h.refused, h.ring[len(h.ring)-1].Data, true
}

// push appends e with the next id and drops the oldest events over the
// bounds.
func (h *Hub) push(e Event) uint64 {
	e.ID = h.next
	h.next++
	h.ring = append(h.ring, e)
	h.bytes += e.size()
	h.evict()
	h.signal()
	return e.ID
}

func (h *Hub) evict() {
	for len(h.ring)-h.first > 1 && (len(h.ring)-h.first > h.lim.MaxEvents || h.bytes > h.lim.MaxBytes) {
		old := h.ring[h.first]
		h.bytes -= old.size()
		if old.ID > h.read && old.Text != nil && cap(old.Text) > cap(h.spare) {
			h.spare = old.Text[:0] // no client ever had it
		}
		h.ring[h.first] = Event{} // its text may go
		h.first++
	}
	if h.first > 0 && h.first >= len(h.ring)/2 {
		// Compact: the dropped half goes, the slice does not grow forever,
		// and no stale copy past its end holds an event's text.
		n := len(h.ring)
		h.ring = append(h.ring[:0], h.ring[h.first:]...)
		clear(h.ring[len(h.ring):n])
		h.first = 0
	}
}

func (h *Hub) signal() {
	if h.wakeTaken {
		close(h.wake)
		h.wake = make(chan struct{})
		h.wakeTaken = false
	}
}

// Batch is what Next returns.
type Batch struct {
	// Events are the held events after the id asked for, in order.
	Events []Event
	// Missed counts the events after the id asked for that are no
	// longer held (the client was too slow, or resumed too late): Events
	// start after them.
	Missed uint64
	// Done: the stream is over for this client (its last event is the
	// result, in Events or read before).
	Done bool
}

// Next returns the events after id after, at most maxBytes of them (at
// least one), waiting until there is one or ctx ends (then ctx's error).
// It holds nothing for the client between calls.
func (h *Hub) Next(ctx context.Context, after uint64, maxBytes int64) (Batch, error) {
	for {
		h.mu.Lock()
		b, ok := h.batch(after, maxBytes)
		if ok {
			h.mu.Unlock()
			return b, nil
		}
		h.wakeTaken = true
		wake := h.wake
		h.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		}
	}
}

// batch is Next's answer when there is one.
func (h *Hub) batch(after uint64, maxBytes int64) (Batch, bool) {
	if h.finished && after >= h.next-1 {
		return Batch{Done: true}, true
	}
	held := h.ring[h.first:]
	if len(held) == 0 || held[len(held)-1].ID <= after {
		return Batch{}, false
	}
	var b Batch
	start := 0
	if oldest := held[0].ID; oldest > after+1 {
		b.Missed = oldest - after - 1
	} else {
		start = int(after + 1 - oldest)
	}
	var size int64
	for _, e := range held[start:] {
		if len(b.Events) > 0 && size+e.size() > maxBytes {
			break
		}
		size += e.size()
		b.Events = append(b.Events, e)
	}
	last := b.Events[len(b.Events)-1]
	h.read = max(h.read, last.ID)
	b.Done = last.Type == TypeResult || last.Type == TypeError
	return b, true
}

// Finished says the hub has its result event.
func (h *Hub) Finished() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.finished
}
