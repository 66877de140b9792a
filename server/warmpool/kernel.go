package warmpool

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
)

// A kernel is a session's long-lived Python: the process a warm sandbox's
// zygote forked, told by its hand-off to loop over executions instead of
// running one file, so that variables, imports and loaded data persist
// between them, as in a notebook. Its sandbox is the same single-use
// sandbox as an execution's (namespaces, cgroup limits, seccomp, uid 10001)
// with the session's volume at /workspace, and is destroyed when the kernel
// ends. Everything the kernel says is untrusted: the code runs in that very
// process (SECURITY.md, the kernel cases).

// Why a kernel ended (KernelResult.Ended, Kernel.EndReason).
const (
	EndTimeout   = "timeout"   // an execution outlived its timeout and the interrupt
	EndOOM       = "oom"       // the OOM killer ended it
	EndPids      = "pids"      // an execution hit the pids limit
	EndExited    = "exited"    // it exited by itself (os._exit, a crash)
	EndProtocol  = "protocol"  // it broke the kernel protocol
	EndClosed    = "closed"    // Close ended it (idle timeout, budget, session deleted, drain)
	EndCancelled = "cancelled" // the execution's context was cancelled (client gone, drain)
)

// Kernel errors: nothing of the execution ran.
var (
	ErrKernelEnded = errors.New("kernel has ended")
	ErrKernelBusy  = errors.New("kernel is running an execution")
)

// KernelOptions shape a kernel's sandbox.
type KernelOptions struct {
	// ReadOnly binds the workspace read-only (a profile of a file reads,
	// never writes).
	ReadOnly bool
}

// KernelExec is one execution in a kernel.
type KernelExec struct {
	// Code is the Python source, run as a notebook cell in the kernel's
	// persistent namespace.
	Code string
	// Env is set in os.environ for the execution and restored after it.
	Env map[string]string
	// Timeout: the code is interrupted (KeyboardInterrupt) at it, and the
	// kernel killed if it does not stop within a grace period.
	Timeout time.Duration
	// Logger, when set, receives the execution's log lines.
	Logger *slog.Logger
}

// KernelResult is what one execution in a kernel did.
type KernelResult struct {
	// Result is the execution's, as a cold run would report it: status,
	// exit code (1 for an uncaught exception, N for sys.exit(N)), its own
	// stdout and stderr within the limits, limits hit, usage.
	Result *nsjail.Result
	// Ended is "" when the kernel lives on with its state, else why it
	// ended during the execution (End*).
	Ended string
}

// Kernel is a running session kernel.
type Kernel struct{}

// StartKernel starts a kernel for spec (spec.Workspace is the session's
// volume, spec.Args ignored): from a ready warm sandbox of a matching
// template when there is one (no import on the request path), whose
// workspace then gets spec.Workspace bound over it, else cold. It works on
// a pool of Size 0 (always cold).
func (p *Pool) StartKernel(ctx context.Context, spec nsjail.Spec, o KernelOptions) (*Kernel, error) {
	panic("not implemented")
}

// Exec runs one execution. The error is non-nil only when nothing ran
// (ErrKernelEnded, ErrKernelBusy).
func (k *Kernel) Exec(ctx context.Context, e KernelExec) (*KernelResult, error) {
	panic("not implemented")
}

// Interrupt raises KeyboardInterrupt in the running execution (SIGINT to
// the kernel process, by pidfd); the kernel and its state survive.
func (k *Kernel) Interrupt() error { panic("not implemented") }

// Close ends the kernel (EndClosed unless it had ended already), waits for
// its sandbox to be destroyed and unbinds the workspace. Idempotent.
func (k *Kernel) Close() { panic("not implemented") }

// Ended is closed once the kernel has ended; EndReason then says why.
func (k *Kernel) Ended() <-chan struct{} { panic("not implemented") }

// EndReason is why the kernel ended ("" while it runs).
func (k *Kernel) EndReason() string { panic("not implemented") }

// StartedAt is when the kernel was handed its session.
func (k *Kernel) StartedAt() time.Time { panic("not implemented") }

// Warm reports whether the kernel came from a ready warm sandbox.
func (k *Kernel) Warm() bool { panic("not implemented") }

// MemoryBytes is what the kernel's cgroup accounts now.
func (k *Kernel) MemoryBytes() int64 { panic("not implemented") }
