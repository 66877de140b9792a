package server

import (
	"context"
	"errors"
	"sync"
)

// ErrOverCapacity: every slot is taken and the queue is full (HTTP 429).
var ErrOverCapacity = errors.New("over capacity: all execution slots are busy and the queue is full")

// Admission bounds the executions running at once (slots) and those waiting
// for a slot (queue). A request beyond both is refused at once rather than
// held, so a burst cannot pile up memory or sockets in the worker.
type Admission struct {
	slots chan struct{}

	mu        sync.Mutex
	queued    int
	maxQueued int

	// onChange, when set, is called with (running, queued) after each change.
	onChange func(running, queued int)
}

// NewAdmission allows maxRunning executions at once and maxQueued waiting.
func NewAdmission(maxRunning, maxQueued int, onChange func(running, queued int)) *Admission {
	return &Admission{slots: make(chan struct{}, maxRunning), maxQueued: maxQueued, onChange: onChange}
}

func (a *Admission) changed() {
	if a.onChange != nil {
		a.mu.Lock()
		q := a.queued
		a.mu.Unlock()
		a.onChange(len(a.slots), q)
	}
}

// Reserve takes a queue place, or a slot directly when one is free. It never
// blocks: it fails with ErrOverCapacity when the queue is full. The returned
// Ticket must be Waited on or Released.
func (a *Admission) Reserve() (*Ticket, error) {
	select {
	case a.slots <- struct{}{}:
		a.changed()
		return &Ticket{a: a, running: true}, nil
	default:
	}
	a.mu.Lock()
	if a.queued >= a.maxQueued {
		a.mu.Unlock()
		return nil, ErrOverCapacity
	}
	a.queued++
	a.mu.Unlock()
	a.changed()
	return &Ticket{a: a}, nil
}

// Ticket is an admitted execution: queued until Wait returns, then running
// until Release.
type Ticket struct {
	a       *Admission
	running bool
	done    bool
}

// Wait blocks until the ticket holds a slot or ctx ends.
func (t *Ticket) Wait(ctx context.Context) error {
	if t.running {
		return nil
	}
	select {
	case t.a.slots <- struct{}{}:
		t.running = true
		t.a.mu.Lock()
		t.a.queued--
		t.a.mu.Unlock()
		t.a.changed()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release gives back the slot or the queue place. It is idempotent.
func (t *Ticket) Release() {
	if t.done {
		return
	}
	t.done = true
	if t.running {
		<-t.a.slots
	} else {
		t.a.mu.Lock()
		t.a.queued--
		t.a.mu.Unlock()
	}
	t.a.changed()
}
