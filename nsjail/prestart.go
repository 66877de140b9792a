package nsjail

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

// A sandbox can also be started in two phases (the warm pool's): Prestart
// starts the command, which prepares itself and then waits for its
// execution on a channel of the caller's (files); Handoff marks the moment
// the execution is given to it and returns the Sandbox to Wait for, which
// then reports what a cold run of that execution would.

// FirstFileFD is the fd that Prestart's first file becomes in the sandbox.
const FirstFileFD = 3

// Prestart validates spec and starts its command in a fresh sandbox that
// waits for its execution. files are passed to the command as fds
// FirstFileFD, FirstFileFD+1, ...:
// the channel its execution comes over (every other host fd is closed, as
// for Start). No deadline runs until Handoff; spec.Limits.Timeout is the
// execution's unless HandoffOptions.Timeout is set. Errors are Start's.
// Exactly one of Handoff and Retire must be called on the result.
func (r *Runner) Prestart(spec Spec, files ...*os.File) (*Pending, error) {
	if len(spec.ExtraFiles) > 0 {
		return nil, errors.New("a pre-started sandbox takes its files as Prestart's arguments, not Spec.ExtraFiles")
	}
	s, err := r.start(spec, files)
	if err != nil {
		return nil, err
	}
	return &Pending{s: s}, nil
}

// Pending is a pre-started sandbox waiting for its execution.
type Pending struct {
	s *Sandbox
	// state moves once, from pendingWaiting to pendingHandedOff or
	// pendingRetired: a second Handoff would reset the output and start
	// time of a running execution, and a Retire after a Handoff would wait
	// for the sandbox twice.
	state atomic.Int32
}

const (
	pendingWaiting int32 = iota
	pendingHandedOff
	pendingRetired
)

// leave moves p out of pendingWaiting, panicking when it already left: a
// second Handoff or Retire is the caller's programming error.
func (p *Pending) leave(to int32, call string) {
	if !p.state.CompareAndSwap(pendingWaiting, to) {
		was := "handed off"
		if p.state.Load() == pendingRetired {
			was = "retired"
		}
		panic(fmt.Sprintf("nsjail: %s on pre-started sandbox %s, already %s", call, p.s.id, was))
	}
}

// ID is the sandbox's id.
func (p *Pending) ID() string { return p.s.id }

// Pid is the host pid of the sandbox's first process. It stays that
// process's until Handoff's Sandbox or Retire has waited for it (only the
// Runner reaps it), so a pidfd opened for it before then is the process's.
// A template fork (Shell.Pending) has none to give: its G is the template's (T's) to reap,
// so its pid may be reused; GPidfd gives G's pidfd.
func (p *Pending) Pid() (int, error) { return p.s.proc.Pid() }

// Alive reports whether the sandbox's first process is running and has not
// been sent SIGKILL. Once it has (the host's kill, the OOM killer), it never
// runs again and takes the whole sandbox with it, but tearing down a large
// process takes milliseconds during which wait(2) still sees it alive: the
// kill shows at once in its pending signals.
func (p *Pending) Alive() bool {
	if g, ok := p.s.proc.(gProcess); ok {
		// A template fork's G: the status read is G's only if G's pidfd
		// says G had not exited before it nor after it (SECURITY.md case
		// 41's pattern; T may reap G and free its pid).
		if g.exited() {
			return false
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.pid))
		return err == nil && !g.exited() && statusAlive(string(status)) && g.parentAlive()
	}
	pid, err := p.s.proc.Pid()
	if err != nil {
		return false
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	return err == nil && statusAlive(string(status))
}

// statusAlive reads a /proc/PID/status: not a zombie, no SIGKILL pending
// for the thread or the process.
func statusAlive(status string) bool {
	for _, line := range strings.Split(status, "\n") {
		key, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch key {
		case "State":
			if strings.HasPrefix(value, "Z") || strings.HasPrefix(value, "X") {
				return false
			}
		case "SigPnd", "ShdPnd":
			mask, err := strconv.ParseUint(value, 16, 64)
			if err != nil || mask&(1<<(unix.SIGKILL-1)) != 0 {
				return false
			}
		}
	}
	return true
}

// MemoryBytes is the sandbox's current memory use as its cgroup accounts it
// (what an idle pre-started sandbox costs), 0 once it was handed off or
// retired: its cgroup is then the execution's, or removed.
func (p *Pending) MemoryBytes() int64 {
	if p.state.Load() != pendingWaiting {
		return 0
	}
	// Not readStats: a Handoff racing this call sets the logger it uses,
	// and a cgroup removed meanwhile is no failure worth a warning.
	st, _ := cgroup.ReadStats(p.s.cgroupPaths)
	return st.MemoryCurrentBytes
}

// OpenCounters opens the sandbox's cgroup counter files (cgroup.Counters)
// now, so that the first Stats after the hand-off only reads them: the
// warm pool does it while it prepares, off the request path (ten opens by
// path were ~0.25 ms of a session kernel's start).
func (p *Pending) OpenCounters() error {
	_, err := p.s.Stats()
	return err
}

// HandoffOptions are the execution's, given to a pre-started sandbox.
type HandoffOptions struct {
	// Timeout is the execution's deadline, counted from the hand-off
	// (Spec.Limits.Timeout when 0).
	Timeout time.Duration
	// Logger, when set, receives the sandbox's further log lines (the
	// execution's, carrying its ids).
	Logger *slog.Logger
	// ExitReport, when set, delivers the command's wait status from inside
	// the sandbox: the warm pool's zygote, the sandbox's init, forks the
	// process that runs the code, reaps it and relays the status the kernel
	// gave, then exits with it (a signal N as 128+N). Wait answers then
	// instead of waiting for the kernel to tear the zygote down (~8-20 ms
	// for a Python that imported the data stack), kills what is left of the
	// sandbox, and later cross-checks the report against the init's own
	// exit status, logging a mismatch. A channel that closes without a
	// value means no report: Wait waits for the exit. The report must come
	// over a channel that the code cannot reach (SECURITY.md case 25): its
	// sender must be a process that runs none of the code.
	ExitReport <-chan syscall.WaitStatus
	// Done is Spec.Done, for the execution handed off.
	Done <-chan int
	// NoDeadline runs the sandbox without a deadline: it lives until its
	// command ends or Wait's context is cancelled. A session's kernel
	// outlives any one execution, whose timeout its owner enforces.
	NoDeadline bool
	// Output, when set, is given the execution's output from the hand-off
	// on (see Spec.Output); what was written before is not.
	Output OutputFunc
}

// Handoff marks the moment the sandbox is given its execution, which the
// caller then sends over its channel: the deadline counts from now, so do
// the reported start time, wall time and CPU time, and the output written
// before now is dropped, so the execution reports what a cold one would.
// It returns the Sandbox to Wait for and the dropped output (normally
// empty). It panics when p was already handed off or retired.
func (p *Pending) Handoff(o HandoffOptions) (sb *Sandbox, droppedStdout, droppedStderr []byte) {
	p.leave(pendingHandedOff, "Handoff")
	s := p.s
	if o.Logger != nil {
		s.log = o.Logger.With("sandbox", s.id)
	}
	s.toForeground()
	droppedStdout = s.stdout.reset(o.Output.ForStream(StreamStdout))
	droppedStderr = s.stderr.reset(o.Output.ForStream(StreamStderr))
	// Kept when another counter fails to parse (Read parses them all).
	st, err := s.readCounters()
	s.cpuBaselineNS = st.CPUUsageNS
	if err != nil {
		s.log.Warn("unable to read the sandbox's counters at its hand-off", "error", err)
	}
	s.startedAt = time.Now()
	if o.Timeout > 0 {
		s.lim.Timeout = o.Timeout
	}
	s.noDeadline = o.NoDeadline
	s.exitReport = o.ExitReport
	s.done = o.Done
	return s, droppedStdout, droppedStderr
}

// Retire ends a pre-started sandbox that gets no execution: it gives the
// command grace to exit on its own (the caller has told it to, as by
// closing its channel), then kills it, and returns its result with
// everything it wrote (why it failed, when it did); its wall time counts
// from the call. report, when not nil, is the exit report as at a
// hand-off (HandoffOptions.ExitReport): a template fork's G's status is
// its template's (T's) to tell, and without it the result is a sandbox_error. The
// sandbox is removed as after Wait. It panics when p was already handed
// off or retired.
func (p *Pending) Retire(grace time.Duration, report <-chan syscall.WaitStatus) *Result {
	p.leave(pendingRetired, "Retire")
	p.s.lim.Timeout = grace
	p.s.startedAt = time.Now()
	p.s.exitReport = report
	return p.s.Wait(context.Background())
}
