// Package session keeps data-analysis conversations: each session has a
// persistent workspace (package volume: files survive kernels, executions
// and worker restarts) and, when asked, a long-lived Python kernel (package
// warmpool's Kernel) whose variables, imports and loaded data persist
// between executions. It owns the sessions' lifecycle: creation, lookup,
// one execution at a time, kernel (re)starts and why, idle kernels stopped,
// sessions expired, the host's budgets, and what a restarted worker finds
// on disk. The HTTP API is package server's.
//
// On disk (sessions_dir, 0755, the worker's own): one directory per
// session, named by its id, holding session.json (the record: policy,
// kernel flag, idle timeout, created and last used, kernel generation;
// written atomically, last at Create, first removed at Delete) and the
// volume directory. Open removes what a killed worker left half-made and
// leaves everything else it does not recognise alone (SECURITY.md case 42).
//
// A session's Python state lives only in its kernel: every execution's
// answer says whether it ran in the kernel that ran the previous one
// (StatePreserved) or in a new one, and why (ExecInfo). Its files live in
// the volume and survive kernels, executions and worker restarts.
//
// The clock (Config.Now) is injectable and Tidy runs the janitor at once,
// so that expiry is tested without waiting. See README.md.
package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Errors the API maps to statuses.
var (
	ErrNotFound   = errors.New("no such session")                 // 404
	ErrExists     = errors.New("session id already exists")       // 409
	ErrBusy       = errors.New("session is running an execution") // 409 session_busy
	ErrTooMany    = errors.New("max_sessions reached")            // 429 with Retry-After
	ErrClosed     = errors.New("session manager is closed")       // 503
	ErrNotRunning = errors.New("no execution is running")         // 409 on interrupt
	ErrInvalid    = errors.New("invalid session")                 // 400: a bad Spec
)

// Kernel states (Info.Kernel.State).
const (
	KernelNone     = "none"     // no kernel: not started yet, stopped (files kept), or kernel: false
	KernelStarting = "starting" // being started, for an execution or ahead of the first (startAhead)
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

// Config configures the manager; server/config sets its values and checks
// their ranges (Open refuses what the manager cannot work with).
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
	// SpareVolumes is session_spare_volumes: empty volumes kept ready so
	// that Create need not make one (spares.go); 0: none.
	SpareVolumes int
	// SpareKernels is session_spare_kernels: how many of the spare volumes
	// also hold a kernel of SparePolicy on SpareRuntime, started from a
	// warm sandbox ahead of any request, which a Create of that kind
	// adopts (spares.go); 0: none. At most SpareVolumes.
	SpareKernels              int
	SparePolicy, SpareRuntime string
	// SpareMaxAge retires a spare kernel started this long ago (at the
	// next wake of the refill: the janitor's round at the latest), as the
	// warm pool retires its sandboxes (pool_max_idle); 0: never.
	SpareMaxAge time.Duration
	// Owner is this worker's owner token (sessionid.Token of worker_id;
	// "": none): generated ids carry it, and a client's id that names
	// another owner is refused (server/sessionid).
	Owner string

	// JanitorInterval is how often the janitor looks (DefaultJanitorInterval
	// when 0); Tidy runs it at once.
	JanitorInterval time.Duration
	// Now is the clock (time.Now when nil): tests of expiry move it.
	Now func() time.Time
}

// DefaultJanitorInterval is Config.JanitorInterval when 0.
const DefaultJanitorInterval = 5 * time.Second

// flushInterval coalesces the rewrites of session.json for last_used_at:
// at most one per session per interval (Close writes what is left). A
// crash loses at most that much of a session's lifetime; a kernel start
// is written at once (Run.Exec), so that a restarted worker never says
// "new" of a session whose Python state it lost.
const flushInterval = 5 * time.Second

// check refuses a Config the manager cannot work with. Its values are
// server/config's (config.Default, config.Validate: one place for them);
// only the clock and the janitor's pace have defaults here.
func (c Config) check() error {
	var errs []error
	if c.UID <= 0 || c.GID <= 0 {
		errs = append(errs, fmt.Errorf("uid and gid must be the sandbox user's host ids (> 0), got: %d:%d", c.UID, c.GID))
	}
	if c.MaxSessions <= 0 {
		errs = append(errs, fmt.Errorf("max sessions must be > 0, got: %d", c.MaxSessions))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"retention", c.Retention}, {"idle timeout", c.IdleTimeout}, {"max idle timeout", c.MaxIdleTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be > 0, got: %s", d.name, d.v))
		}
	}
	if c.IdleTimeout > c.MaxIdleTimeout {
		errs = append(errs, fmt.Errorf("idle timeout must be <= the max idle timeout (%s), got: %s", c.MaxIdleTimeout, c.IdleTimeout))
	}
	if c.SpareVolumes < 0 {
		errs = append(errs, fmt.Errorf("spare volumes must be >= 0, got: %d", c.SpareVolumes))
	}
	if c.SpareKernels < 0 || c.SpareKernels > max(c.SpareVolumes, 0) {
		errs = append(errs, fmt.Errorf("spare kernels must be in 0..%d (the spare volumes), got: %d", max(c.SpareVolumes, 0), c.SpareKernels))
	}
	if c.SpareMaxAge < 0 {
		errs = append(errs, fmt.Errorf("spare max age must be >= 0, got: %s", c.SpareMaxAge))
	}
	if c.SpareKernels > 0 {
		if err := checkPolicyName(c.SparePolicy); err != nil {
			errs = append(errs, fmt.Errorf("spare kernels: %w", err))
		}
		if err := checkRuntimeName(c.SpareRuntime); err != nil {
			errs = append(errs, fmt.Errorf("spare kernels: %w", err))
		}
	}
	if c.IdleMemoryBudget <= 0 {
		errs = append(errs, fmt.Errorf("idle memory budget must be > 0, got: %d", c.IdleMemoryBudget))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.JanitorInterval <= 0 {
		c.JanitorInterval = DefaultJanitorInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Starter starts a kernel for a session: the server's, which turns the
// policy and runtime into a sandbox spec and asks the warm pool.
type Starter interface {
	StartKernel(ctx context.Context, policy, runtime, workspace string, o warmpool.KernelOptions) (Kernel, error)
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
	Runtime     string        // the runtime's name, already validated
	Kernel      bool          // a long-lived kernel (default true at the API)
	IdleTimeout time.Duration // 0: Config.IdleTimeout; above MaxIdleTimeout: ErrInvalid
}

// Info is a session as the API shows it.
type Info struct {
	ID            string        `json:"id"`
	Type          string        `json:"type"`
	Runtime       string        `json:"runtime"`
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
