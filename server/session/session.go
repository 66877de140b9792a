// Package session keeps data-analysis conversations: each session has a
// persistent workspace (package volume: files survive kernels, executions
// and worker restarts) and, when asked, a long-lived Python kernel (package
// warmpool's Kernel) whose variables, imports and loaded data persist
// between executions. It owns the sessions' lifecycle: creation, lookup,
// one execution at a time, kernel (re)starts and why, idle kernels stopped,
// sessions expired, the host's budgets, and what a restarted worker finds
// on disk. The HTTP API is package server's.
package session

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/server/volume"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Errors the API maps to statuses.
var (
	ErrNotFound   = errors.New("no such session")                 // 404
	ErrExists     = errors.New("session id already exists")       // 409
	ErrBusy       = errors.New("session is running an execution") // 409 session_busy
	ErrTooMany    = errors.New("max_sessions reached")            // 429 (or 507) with Retry-After
	ErrClosed     = errors.New("session manager is closed")       // 503
	ErrNotRunning = errors.New("no execution is running")         // 409 on interrupt
)

// Kernel states (Info.Kernel.State).
const (
	KernelNone     = "none"     // no kernel: not started yet, stopped (files kept), or kernel: false
	KernelStarting = "starting" // being started for an execution
	KernelIdle     = "idle"     // alive, waiting
	KernelBusy     = "busy"     // running an execution
)

// State of the Python state at the start of an execution (ExecInfo.State).
const (
	StatePreserved = "preserved" // ran in the kernel that ran the previous execution
	StateNew       = "new"       // a new kernel; Reason says why
	StateRestarted = "restarted" // a new kernel because the worker restarted
)

// Reasons for StateNew/StateRestarted (ExecInfo.Reason) and for a kernel
// stop (Info.Kernel.EndReason): the warmpool.End* values, plus these.
const (
	ReasonFirst         = "first_execution"
	ReasonIdleTimeout   = "idle_timeout"
	ReasonMemoryBudget  = "memory_budget"
	ReasonWorkerRestart = "worker_restart"
	ReasonNoKernel      = "kernel_disabled" // kernel: false: every execution is a fresh sandbox
)

// Config configures the manager; server/config sets defaults and checks.
type Config struct {
	Root             string        // sessions_dir: one volume directory per session
	MaxSessions      int           // max_sessions
	Retention        time.Duration // session_retention: since last use
	IdleTimeout      time.Duration // default idle_timeout of a kernel
	MaxIdleTimeout   time.Duration // cap on a request's idle_timeout_ms
	IdleMemoryBudget int64         // session_idle_memory_bytes: idle kernels' memory, host-wide
	MaxBytes         int64         // session_max_bytes: each volume's quota
	MaxFiles         int64         // session_max_files
	UID, GID         int           // the sandbox user on the host: owner of the volume root
}

// Starter starts a kernel for a session: the server's, which turns the
// policy into a sandbox spec and asks the warm pool.
type Starter interface {
	StartKernel(ctx context.Context, policy string, workspace string, o warmpool.KernelOptions) (Kernel, error)
}

// Kernel is what the manager needs of a *warmpool.Kernel.
type Kernel interface {
	Exec(ctx context.Context, e warmpool.KernelExec) (*warmpool.KernelResult, error)
	Interrupt() error
	Close()
	Ended() <-chan struct{}
	EndReason() string
	StartedAt() time.Time
	MemoryBytes() int64
}

// Spec is a session to create (POST /v1/sessions).
type Spec struct {
	ID          string        // "" : generated
	Policy      string        // the policy (type) name, already validated
	Kernel      bool          // a long-lived kernel (default true at the API)
	IdleTimeout time.Duration // 0: Config.IdleTimeout; capped by MaxIdleTimeout
}

// Info is a session as the API shows it.
type Info struct {
	ID            string        `json:"id"`
	Type          string        `json:"type"`
	Kernel        KernelInfo    `json:"kernel"`
	Workspace     WorkspaceInfo `json:"workspace"`
	IdleTimeoutMS int64         `json:"idle_timeout_ms"`
	CreatedAt     time.Time     `json:"created_at"`
	LastUsedAt    time.Time     `json:"last_used_at"`
	ExpiresAt     time.Time     `json:"expires_at"`
}

// KernelInfo is the session's kernel.
type KernelInfo struct {
	Enabled    bool       `json:"enabled"`
	State      string     `json:"state"`
	Generation int64      `json:"generation"`
	StartedAt  *time.Time `json:"started_at"`
	// EndReason says why the last kernel stopped, when none runs now.
	EndReason string `json:"end_reason,omitempty"`
}

// WorkspaceInfo is the session's volume usage and quota.
type WorkspaceInfo struct {
	BytesUsed int64 `json:"bytes_used"`
	FilesUsed int64 `json:"files_used"`
	MaxBytes  int64 `json:"max_bytes"`
	MaxFiles  int64 `json:"max_files"`
}

// ExecInfo is the "session" block of an execution's answer.
type ExecInfo struct {
	ID               string `json:"id"`
	KernelGeneration int64  `json:"kernel_generation"`
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	// KernelEnded says the kernel ended during this execution (why); the
	// next execution starts a new one. "" when it lives on.
	KernelEnded string `json:"kernel_ended,omitempty"`
}

// Manager keeps the sessions.
type Manager struct{}

// Open sweeps cfg.Root (half-created and half-removed volumes), loads the
// sessions found there (their kernels are gone: the next execution says
// StateRestarted) and starts the janitor.
func Open(cfg Config, starter Starter, log *slog.Logger) (*Manager, error) { panic("not implemented") }

// Create creates a session and its volume.
func (m *Manager) Create(spec Spec) (Info, error) { panic("not implemented") }

// Get is one session.
func (m *Manager) Get(id string) (Info, error) { panic("not implemented") }

// List is every session, by id.
func (m *Manager) List() []Info { panic("not implemented") }

// Delete kills the session's kernel and removes its volume.
func (m *Manager) Delete(id string) error { panic("not implemented") }

// Interrupt raises KeyboardInterrupt in the session's running execution.
func (m *Manager) Interrupt(id string) error { panic("not implemented") }

// Begin reserves the session for one execution (ErrBusy when one runs)
// and marks it used. The Run must be ended with End.
func (m *Manager) Begin(id string) (*Run, error) { panic("not implemented") }

// Volume lends the session's volume to the file API; release when done.
// The session counts as used.
func (m *Manager) Volume(id string) (v *volume.Volume, release func(), err error) {
	panic("not implemented")
}

// Close stops every kernel (files kept), the janitor, and closes the
// volumes' handles (they stay mounted for the next worker).
func (m *Manager) Close() { panic("not implemented") }

// Stats for /metrics.
type Stats struct {
	Sessions, Busy, IdleKernels int
	IdleKernelBytes             int64
	BytesOnDisk                 int64
	KernelStarts                map[string]uint64 // by reason (state/reason)
}

// Stats is the manager's state.
func (m *Manager) Stats() Stats { panic("not implemented") }

// Run is one execution reserved in a session.
type Run struct{}

// Volume is the session's volume, for the request's files and artifacts.
func (r *Run) Volume() *volume.Volume { panic("not implemented") }

// Exec runs the execution in the session's kernel, starting one first
// when none runs (kernel: false: always a fresh one, closed after), and
// says what happened to the Python state.
func (r *Run) Exec(ctx context.Context, e warmpool.KernelExec) (*warmpool.KernelResult, ExecInfo, error) {
	panic("not implemented")
}

// End releases the session for its next execution.
func (r *Run) End() { panic("not implemented") }
