package server

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Execution states before a final nsjail status is known.
const (
	StatusQueued  = "queued"
	StatusRunning = "running"
)

// ErrDuplicateID is returned when an id is already in the store.
var ErrDuplicateID = errors.New("an execution with this id exists")

// record is one execution as the store keeps it.
type record struct {
	id        string
	typ       string
	policy    Policy
	status    string // queued, running, then the final status
	createdAt time.Time
	startedAt time.Time
	cancel    context.CancelFunc
	done      chan struct{} // closed once resp is set and cleanup is done
	resp      *ExecutionResponse
	finished  time.Time
}

// Store keeps live executions (so they can be looked up and cancelled) and
// finished results, bounded by count and age. Live executions are never
// evicted; there are at most max_concurrent + max_queued of them.
type Store struct {
	mu      sync.Mutex
	recs    map[string]*record
	order   []string // finished ids, oldest first
	maxDone int
	ttl     time.Duration
	now     func() time.Time
}

// NewStore returns a store keeping at most maxDone finished results for ttl.
func NewStore(maxDone int, ttl time.Duration) *Store {
	return &Store{recs: map[string]*record{}, maxDone: maxDone, ttl: ttl, now: time.Now}
}

// add registers a new execution in state queued.
func (s *Store) add(id, typ string, pol Policy, cancel context.CancelFunc) (*record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked()
	if _, ok := s.recs[id]; ok {
		return nil, ErrDuplicateID
	}
	r := &record{id: id, typ: typ, policy: pol, status: StatusQueued, createdAt: s.now(), cancel: cancel, done: make(chan struct{})}
	s.recs[id] = r
	return r, nil
}

// forget drops a record that never ran (rejected after add).
func (s *Store) forget(r *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recs[r.id] == r {
		delete(s.recs, r.id)
	}
	r.cancel()
	close(r.done)
}

func (s *Store) setRunning(r *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.status = StatusRunning
	r.startedAt = s.now()
}

// finish stores the final response and wakes waiters.
func (s *Store) finish(r *record, resp *ExecutionResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.status = resp.Status
	r.resp = resp
	r.finished = s.now()
	r.cancel()
	s.order = append(s.order, r.id)
	s.evictLocked()
	close(r.done)
}

func (s *Store) evictLocked() {
	now := s.now()
	for len(s.order) > 0 {
		r := s.recs[s.order[0]]
		if r != nil && r.resp != nil && len(s.order) <= s.maxDone && now.Sub(r.finished) < s.ttl {
			break
		}
		if r != nil && r.resp != nil {
			delete(s.recs, s.order[0])
		}
		s.order = s.order[1:]
	}
}

// view is a consistent copy of a record.
type view struct {
	id, typ, status string
	policy          Policy
	createdAt       time.Time
	startedAt       time.Time
	resp            *ExecutionResponse
	done            <-chan struct{}
	cancel          context.CancelFunc
}

func (s *Store) get(id string) (view, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked()
	r, ok := s.recs[id]
	if !ok {
		return view{}, false
	}
	return view{id: r.id, typ: r.typ, status: r.status, policy: r.policy, createdAt: r.createdAt, startedAt: r.startedAt, resp: r.resp, done: r.done, cancel: r.cancel}, true
}

// cancelAll cancels every live execution (used when the drain's grace period
// is over).
func (s *Store) cancelAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if r.resp == nil {
			r.cancel()
			n++
		}
	}
	return n
}
