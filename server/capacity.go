package server

import (
	"net/http"

	"github.com/julienschmidt/httprouter"
)

// Capacity is the body of GET /v1/capacity: what this worker can take now,
// for operators and for clients choosing (or backing off from) a worker.
// It reveals nothing /metrics does not (both behind the same guard), plus
// worker_id, which the operator chose to publish.
type Capacity struct {
	// WorkerID is worker_id (omitted when not configured).
	WorkerID string `json:"worker_id,omitempty"`
	// Ready is what /readyz says: executions are admitted now.
	Ready bool `json:"ready"`
	// Draining: SIGTERM arrived; nothing new is admitted.
	Draining   bool               `json:"draining"`
	Executions CapacityExecutions `json:"executions"`
	WarmPool   CapacityWarmPool   `json:"warm_pool"`
	Sessions   CapacitySessions   `json:"sessions"`
}

// CapacityExecutions is the admission state: slots (max_concurrent) and
// the queue (max_queued). A POST is admitted at once while free_slots > 0,
// queued while queued < max_queued, refused with 429 beyond.
type CapacityExecutions struct {
	Slots     int `json:"slots"`
	Running   int `json:"running"`
	FreeSlots int `json:"free_slots"`
	Queued    int `json:"queued"`
	MaxQueued int `json:"max_queued"`
}

// CapacityWarmPool is the warm pool: the sandboxes each template keeps
// ready (Size) and has ready now, by template name (policy/runtime; both
// empty with the pool off or not yet built), and those starting.
type CapacityWarmPool struct {
	Size     map[string]int `json:"size"`
	Ready    map[string]int `json:"ready"`
	Starting int            `json:"starting"`
}

// CapacitySessions is the session manager's state: sessions kept (active),
// those running an execution (busy), those whose kernel is alive and
// waiting (idle), max_sessions, and the memory the idle kernels hold
// against session_idle_memory_bytes (beyond it the longest idle is
// stopped). Available is false while the session API answers 503.
type CapacitySessions struct {
	Available            bool  `json:"available"`
	Active               int   `json:"active"`
	Busy                 int   `json:"busy"`
	Idle                 int   `json:"idle"`
	Max                  int   `json:"max"`
	IdleMemoryBytes      int64 `json:"idle_memory_bytes"`
	IdleMemoryLimitBytes int64 `json:"idle_memory_limit_bytes"`
}

// capacity reads the state Capacity reports.
func (s *Server) capacity() Capacity {
	ready := s.notReady() == ""
	s.mu.Lock()
	draining, pool, m := s.draining, s.pool, s.manager
	s.mu.Unlock()
	running, queued := s.admission.load()
	c := Capacity{
		WorkerID: s.cfg.WorkerID,
		Ready:    ready,
		Draining: draining,
		Executions: CapacityExecutions{
			Slots: s.cfg.MaxConcurrent, Running: running, FreeSlots: max(s.cfg.MaxConcurrent-running, 0),
			Queued: queued, MaxQueued: s.cfg.MaxQueued,
		},
		WarmPool: CapacityWarmPool{Size: map[string]int{}, Ready: map[string]int{}},
		Sessions: CapacitySessions{Max: s.cfg.MaxSessions, IdleMemoryLimitBytes: s.cfg.SessionIdleMemoryBytes},
	}
	if pool != nil {
		// Not gated on pool_size: runtime_pool_size alone sizes templates.
		pc := pool.Capacity()
		c.WarmPool.Size, c.WarmPool.Ready, c.WarmPool.Starting = pc.Size, pc.Ready, pc.Starting
	}
	if m != nil {
		st := m.Stats()
		c.Sessions.Available = true
		c.Sessions.Active, c.Sessions.Busy, c.Sessions.Idle = st.Sessions, st.Busy, st.IdleKernels
		c.Sessions.IdleMemoryBytes = st.IdleKernelBytes
	}
	return c
}

func (s *Server) handleCapacity(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	writeJSON(w, http.StatusOK, s.capacity())
}

// load is the executions holding a slot and those queued.
func (a *Admission) load() (running, queued int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.slots), a.queued
}
