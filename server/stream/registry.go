package stream

import (
	"encoding/json"
	"sync"
	"time"
)

// Registry finds an execution's hub by its id: every live execution's, and
// the last finished ones' for a while (Linger, at most MaxFinished of them),
// so that a client resumes after a dropped connection from the events
// rather than from the answer alone.
type Registry struct {
	lim         Limits
	maxFinished int
	linger      time.Duration
	now         func() time.Time

	mu       sync.Mutex
	hubs     map[string]*Hub
	finished []finishedHub // oldest first
}

type finishedHub struct {
	id  string
	hub *Hub
	at  time.Time
}

// NewRegistry returns an empty registry whose hubs have the limits lim.
func NewRegistry(lim Limits, maxFinished int, linger time.Duration) *Registry {
	return &Registry{lim: lim, maxFinished: maxFinished, linger: linger, now: time.Now, hubs: map[string]*Hub{}}
}

// NewHub returns a hub with the registry's limits, not registered yet.
func (r *Registry) NewHub() *Hub { return NewHub(r.lim) }

// Add registers h as id's, replacing a finished execution's that lingers
// under the same id (the id was reused after its result expired).
func (r *Registry) Add(id string, h *Hub) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prune()
	r.dropFinished(id)
	r.hubs[id] = h
}

// Get returns id's hub, nil when there is none (never was, refused, or
// finished too long ago).
func (r *Registry) Get(id string) *Hub {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prune()
	return r.hubs[id]
}

// Finish finishes h (Hub.Finish) and keeps it for Linger, dropping the
// oldest finished hubs beyond MaxFinished.
func (r *Registry) Finish(id string, h *Hub) {
	h.Finish()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hubs[id] != h {
		return
	}
	r.dropFinished(id)
	r.finished = append(r.finished, finishedHub{id: id, hub: h, at: r.now()})
	r.prune()
}

// Refuse ends h's stream with the refusal of its execution (Hub.Refuse)
// and keeps it as a finished hub, registered again if it was removed
// meanwhile (unless id has another hub by then), so a client answered
// before the refusal (202, or its stream started) learns why.
func (r *Registry) Refuse(id string, h *Hub, status int, data json.RawMessage) {
	h.Refuse(status, data)
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.hubs[id]; cur != nil && cur != h {
		return
	}
	r.dropFinished(id)
	r.hubs[id] = h
	r.finished = append(r.finished, finishedHub{id: id, hub: h, at: r.now()})
	r.prune()
}

// Remove forgets h, id's hub, at once: its execution never ran, or its
// events are not to be kept.
func (r *Registry) Remove(id string, h *Hub) {
	h.Finish()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hubs[id] == h {
		delete(r.hubs, id)
		r.dropFinished(id)
	}
}

// Len counts the registered hubs, live and finished.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prune()
	return len(r.hubs)
}

// prune drops the finished hubs beyond the count or older than Linger.
func (r *Registry) prune() {
	now := r.now()
	n := 0
	for n < len(r.finished) && (len(r.finished)-n > r.maxFinished || now.Sub(r.finished[n].at) >= r.linger) {
		f := r.finished[n]
		if r.hubs[f.id] == f.hub {
			delete(r.hubs, f.id)
		}
		n++
	}
	if n > 0 {
		clear(r.finished[:n])
		r.finished = r.finished[n:]
	}
}

// dropFinished takes id out of the finished list (its hub is replaced or
// removed).
func (r *Registry) dropFinished(id string) {
	for i, f := range r.finished {
		if f.id == id {
			r.finished = append(r.finished[:i], r.finished[i+1:]...)
			if r.hubs[id] == f.hub {
				delete(r.hubs, id)
			}
			return
		}
	}
}
