package nsjail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

// Wait waits for the command to finish, enforcing the deadline (counted from
// now) and ctx, then collects the result and removes the sandbox (in the
// background: WaitForCleanup). It has three steps: await (the end, and the
// kills it takes), collect (output, counters, removal) and classify (the
// status, a pure function of what the first two saw). The sandbox is waited
// for once: a later Wait (or one concurrent with the first) returns the
// first's Result.
func (s *Sandbox) Wait(ctx context.Context) *Result {
	s.waitOnce.Do(func() { s.result = s.wait(ctx) })
	return s.result
}

func (s *Sandbox) wait(ctx context.Context) *Result {
	res := &Result{ID: s.id, StartedAt: s.startedAt}
	end := s.await(ctx)
	res.FinishedAt = time.Now()
	stats := s.collect(end)

	res.Stdout, res.Stderr = s.stdout.kept(), s.stderr.kept()
	res.StdoutBytes, res.StderrBytes = s.stdout.total, s.stderr.total
	res.StdoutTruncated, res.StderrTruncated = s.stdout.truncated(), s.stderr.truncated()
	res.Usage = Usage{
		WallMS:          res.FinishedAt.Sub(res.StartedAt).Milliseconds(),
		CPUMS:           int64((stats.CPUUsageNS - min(stats.CPUUsageNS, s.cpuBaselineNS)) / 1e6),
		PeakMemoryBytes: stats.MemoryPeakBytes,
		PidsPeak:        stats.PidsPeak,
	}
	e := end.ending()
	res.ExitCode, res.Signal = e.exitCode, e.signal
	res.Ended = end.ended
	res.Status, res.LimitsHit = classify(e, counted{
		oomKills: stats.OOMKills, pidsLimitHits: stats.PidsLimitHits,
		stdoutTruncated: res.StdoutTruncated, stderrTruncated: res.StderrTruncated,
	})
	if res.Status == StatusSandboxError {
		res.Error = fmt.Sprintf("unable to wait for the sandbox: %v", end.waitErr)
	}
	s.log.Info("sandbox finished", "status", res.Status, "exit_code", res.ExitCode,
		"wall_ms", res.Usage.WallMS, "limits_hit", res.LimitsHit)
	return res
}

// reaped is what waiting for the sandbox's init returned.
type reaped struct {
	state *os.ProcessState
	err   error
}

// awaited is how the wait for a sandbox ended.
type awaited struct {
	// killedFor is StatusTimeout or StatusCancelled when Wait killed the
	// sandbox for that reason, else empty.
	killedFor Status
	// reported is the exit status the sandbox reported
	// (HandoffOptions.ExitReport), valid when haveReport. Its init is then still being reaped: exited
	// delivers that.
	reported   syscall.WaitStatus
	haveReport bool
	exited     <-chan reaped
	// state and waitErr are the reaped init's, when not haveReport.
	state   *os.ProcessState
	waitErr error
	// done is the exit code the command's process said it was done with
	// (Spec.Done, HandoffOptions.Done), valid when haveDone. ended is set
	// when Wait froze the sandbox on that word, leaving the kill to
	// collect's cleanup (endFrozen), which closes it once the sandbox's
	// processes are gone (Result.Ended).
	done     int
	haveDone bool
	ended    chan struct{}
}

// await waits for the command's end: its exit, its exit report, its done
// word, the deadline or ctx. On a deadline, a cancellation or a report it
// kills what is left of the sandbox; on a done word it freezes the
// sandbox (its kill is collect's, endFrozen), or kills it when it cannot.
func (s *Sandbox) await(ctx context.Context) awaited {
	exited := make(chan reaped, 1)
	go func() {
		state, err := s.proc.Wait()
		exited <- reaped{state, err}
	}()
	var expired <-chan time.Time // none with HandoffOptions.NoDeadline
	// freezeBound bounds the freeze on a done word: a freeze that waits
	// for a task in an uninterruptible sleep must not let the rest of the
	// sandbox run on past its deadline.
	freezeBound := func() time.Duration { return freezeTimeout }
	if !s.noDeadline {
		at := time.Now().Add(s.lim.Timeout)
		deadline := time.NewTimer(time.Until(at))
		defer deadline.Stop()
		expired = deadline.C
		freezeBound = func() time.Duration { return max(min(freezeTimeout, time.Until(at)), time.Millisecond) }
	}

	a := awaited{exited: exited}
	report := s.exitReport
	done := s.done
	exitCase := (<-chan reaped)(exited)
	// gEnded: a template fork's G has ended and its report is awaited
	// (shellReportGrace).
	var gEnded <-chan time.Time
	ctxDone := ctx.Done()
wait:
	for {
		select {
		case r := <-exitCase:
			if s.shell != nil && report != nil && r.err == nil {
				// A template fork's G ended: its pidfd may tell before T's
				// report of how does, which T writes as soon as the
				// kernel tells it. Wait a moment for the report, and keep
				// the exit for those who read it later.
				exitCase = nil
				exited <- r
				gEnded = time.After(shellReportGrace)
				// It ended in time: no deadline or cancellation while
				// its report is awaited (a cold run has no such window).
				expired, ctxDone = nil, nil
				continue
			}
			a.state, a.waitErr = r.state, r.err
			if s.shell != nil && r.err == nil {
				a.waitErr = errNoReport // G's status is T's to tell
			}
			break wait
		case <-gEnded:
			// No report (T died, or will not say): G's status is unknown.
			<-exited
			a.state, a.waitErr = nil, errNoReport
			break wait
		case <-expired:
			a.killedFor = StatusTimeout
			break wait
		case <-ctxDone:
			a.killedFor = StatusCancelled
			break wait
		case code, ok := <-done:
			if !ok {
				done = nil // no word from the process: its end is awaited
				continue
			}
			a.done, a.haveDone = code, true
			break wait
		case a.reported, a.haveReport = <-report:
			if a.haveReport {
				break wait
			}
			report = nil // closed without a report: wait for the exit
			if exitCase == nil {
				// ... which G's pidfd told already.
				<-exited
				a.state, a.waitErr = nil, errNoReport
				break wait
			}
		}
	}
	if a.haveDone && s.freezable() {
		// The code is done and its process waits to be ended: stopped
		// where everything of the sandbox is, it can be read at once, and
		// killed afterwards (collect). Without the freeze, the kill and
		// the wait for the end come first, as at a timeout (below).
		err := s.freeze(freezeBound())
		if err == nil {
			a.ended = make(chan struct{})
			return a
		}
		s.log.Warn("unable to freeze the sandbox its code was done in; killing it and waiting for its end", "error", err)
	}
	// killed: Wait ends the sandbox itself, rather than awaiting its end.
	killed := a.killedFor != "" || a.haveDone
	// Never frozen from now on; one frozen before is thawed after the
	// kill, which a frozen task only takes once thawed (freeze.go).
	s.endFreezing()
	if killed || a.haveReport {
		// After an exit report the init is exiting anyway; this ends what
		// it leaves behind.
		s.killFirst()
	}
	s.thawForEnd()
	if s.shell != nil && a.haveReport && exitCase != nil {
		// T's report is the template's word, and a compromised template
		// could report early; the kernel's is G's pidfd, readable once G
		// has exited, which as PID_F's init it does only after every other
		// process of PID_F is gone (below). It tells as T's waitid does, so
		// waiting for it costs nothing; without it the result would be
		// built while the code still ran.
		select {
		case r := <-exited:
			exited <- r
		case <-time.After(shellReportGrace):
			s.log.Error("the fork's parent reported an exit its process had not made: killing the shell's cgroup")
			if err := cgroup.KillAll(s.cgroupPaths); err != nil {
				s.log.Error("unable to kill the sandbox's cgroup", "error", err)
			}
		}
	}
	if !a.haveReport && (killed || s.shell != nil) {
		// And the cgroup, should anything of the sandbox live outside its
		// pid namespace's reach: cgroup.kill on v2 (Linux 5.14+), else a
		// SIGKILL per pid until cgroup.procs is empty. A template fork's
		// only kill is this one: its pid 1, G, is not the worker's to
		// signal by pid, and everything of the execution (G and what it
		// started) is in the shell's cgroup, T outside it.
		//
		// Not after T's report of G's exit, once G's pidfd confirmed it
		// (above): G is pid 1 of PID_F, whose exit the
		// kernel completes only after it killed every other process of
		// PID_F and they were reaped (pid_namespaces(7); the kernel's
		// zap_pid_ns_processes waits for the namespace's pid count to
		// drop to G's own). Every process the execution could start is in
		// PID_F or below it, so none is left; the shell's removal kills
		// the cgroup anyway (Shell.Destroy, in collect's cleanup), off the
		// result's path, where a v1 kill's walk of every hierarchy cost
		// ~0.45 ms (TEMPLATE.md M5).
		if err := cgroup.KillAll(s.cgroupPaths); err != nil {
			s.log.Error("unable to kill the sandbox's cgroup", "error", err)
		}
		if killed {
			r := <-exited
			a.state, a.waitErr = r.state, r.err
			if s.shell != nil && report != nil && !a.haveDone {
				// G's status (the kill's, as a cold init's would be)
				// comes in T's report, written as G ends. (After a done
				// word the status is the word's: no wait for it.)
				exited <- r
				select {
				case a.reported, a.haveReport = <-report:
				case <-time.After(shellReportGrace):
				}
			}
		}
	}
	return a
}

// errNoReport: a template fork's G ended, and T reported no status.
var errNoReport = errors.New("the fork's process ended without an exit report from its parent")

// shellReportGrace bounds the wait for T's report of a G that ended.
const shellReportGrace = time.Second

// killFirst sends SIGKILL to the sandbox's init: the kernel then kills
// every other process of its pid namespace (pid_namespaces(7)),
// double-forked, setsid and signal-ignoring ones included. A template
// fork has no init of the worker's: await kills its cgroup instead.
func (s *Sandbox) killFirst() {
	if s.shell != nil {
		return
	}
	if err := s.c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		s.log.Error("unable to kill sandbox", "error", err)
	}
}

// collect reads the rest of the output and the cgroup's counters, then
// starts the sandbox's removal in the background.
func (s *Sandbox) collect(a awaited) cgroup.Stats {
	// Once init is reaped every process of the pid namespace is gone and the
	// pipes are at EOF (after an exit report, init closed its ends itself);
	// the grace only guards against the impossible. Frozen, the processes
	// still hold their ends, and what they wrote is in the pipes or read.
	for _, c := range []*capture{s.stdout, s.stderr} {
		if a.ended != nil { // frozen
			c.stop()
			continue
		}
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
			s.log.Error("output stream still open after the sandbox exited; closing it")
			c.abort()
			<-c.done
		}
		c.r.Close()
	}
	stats := s.readStats()

	// Reaping a reported exit and removing the sandbox (cgroup rmdirs, the
	// mount namespace's umounts and RCU waits) are not part of the result.
	s.r.cleanups.Add(1)
	go func() {
		defer s.r.cleanups.Done()
		// What is left (the kill of a frozen sandbox, the kernel's
		// teardown of its processes) is no execution's.
		s.endForeground()
		if a.ended != nil {
			if !s.endFrozen() {
				close(a.ended)
				return // left frozen, to the start-up sweep (endFrozen)
			}
			<-a.exited
			close(a.ended)
		}
		if a.haveReport {
			r := <-a.exited
			s.crossCheckReport(a.reported, r.state)
		}
		s.closePeak()
		if s.shell != nil {
			_ = s.shell.Destroy() // logs its own failure
		} else {
			s.r.destroy(s.c, s.log, s.cgroupAlso)
		}
		s.dropAnchor()
		if s.mntns != nil {
			s.mntns.Close()
		}
	}()
	return stats
}

// endFrozen ends a sandbox that Wait froze when its code was done, once
// its result is built: every process is sent SIGKILL while still frozen,
// and only then thawed, so that none runs again while the caller reads the
// workspace (SECURITY.md case 72). Frozen, none can fork, so one round of
// kills reaches them all (cgroup.KillOnce); the caller then waits for the
// init's (a template fork's G's) exit, which as its pid namespace's init
// it makes only once every other process of the namespace is gone
// (pid_namespaces(7)), and every process of the sandbox is in it. A kill
// that keeps failing (no pidfd to be had, say) leaves the sandbox frozen,
// running nothing, for the start-up sweep: thawed, it would run on with no
// deadline. It says whether the sandbox was killed.
func (s *Sandbox) endFrozen() bool {
	s.endFreezing()
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		err := cgroup.KillOnce(s.cgroupPaths)
		if err == nil {
			break
		}
		if wait > time.Second {
			s.log.Error("unable to kill the sandbox frozen on its done word; leaving it frozen for the next start-up's sweep", "error", err)
			return false
		}
		time.Sleep(wait)
	}
	s.thawForEnd()
	return true
}

// freezable says the sandbox has a freezer: v2's, or v1's hierarchy.
func (s *Sandbox) freezable() bool {
	_, v2 := s.cgroupPaths.V2()
	return v2 || s.cgroupPaths["freezer"] != ""
}

// ending is how the command ended, as Wait saw it.
type ending struct {
	// killedFor is StatusTimeout or StatusCancelled when Wait killed the
	// sandbox for that reason, else empty.
	killedFor Status
	// known: the exit status is known (reaped, or reported by the sandbox).
	known bool
	// exitCode is the exit code, 128+N for a signal N, -1 when neither.
	exitCode int
	// signal names the signal that ended the command, if one did.
	signal string
}

func (a awaited) ending() ending {
	e := ending{killedFor: a.killedFor, exitCode: -1}
	switch {
	case a.haveDone:
		e.known, e.exitCode = true, a.done
	case a.haveReport:
		e.known = true
		e.exitCode, e.signal = decodeWaitStatus(a.reported)
	case a.state != nil:
		e.known = true
		if ws, ok := initWaitStatus(a.state); ok {
			e.exitCode, e.signal = decodeWaitStatus(ws)
		}
	}
	return e
}

// decodeWaitStatus is the exit code (128+N for a signal N, -1 when
// neither) and signal name of a wait status.
func decodeWaitStatus(ws syscall.WaitStatus) (code int, signal string) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), ""
	case ws.Signaled():
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
	}
	return -1, ""
}

// DecodeWaitStatus is the exit code (128+N for a signal N, -1 when
// neither) and signal name of a wait status, as a Result reports them.
func DecodeWaitStatus(ws syscall.WaitStatus) (code int, signal string) { return decodeWaitStatus(ws) }

func initWaitStatus(state *os.ProcessState) (syscall.WaitStatus, bool) {
	if state == nil {
		return 0, false
	}
	ws, ok := state.Sys().(syscall.WaitStatus)
	return ws, ok
}

// crossCheckReport compares an exit report with the sandbox init's own wait
// status, which the kernel gave: the reporter exits with the status it
// reported (a signal N as exit 128+N). A difference is logged. An init that
// the kill after the report reached first says nothing either way.
func (s *Sandbox) crossCheckReport(reported syscall.WaitStatus, state *os.ProcessState) {
	if ws, ok := initWaitStatus(state); ok && reportMismatch(reported, ws) {
		code, _ := decodeWaitStatus(reported)
		s.log.Warn("exit report does not match the sandbox's exit status; the result used the report",
			"reported_exit_code", code, "init_exit_code", ws.ExitStatus())
	}
}

// reportMismatch tells whether an init that exited with status init
// contradicts the report it sent.
func reportMismatch(reported, init syscall.WaitStatus) bool {
	code, _ := decodeWaitStatus(reported)
	return init.Exited() && init.ExitStatus() != code
}

// counted is what the kernel and the output captures counted during a run.
type counted struct {
	oomKills, pidsLimitHits          uint64
	stdoutTruncated, stderrTruncated bool
}

// Outcome is how one execution ended and what was counted during it, for
// Classify: a session kernel's executions, which end with a reply rather
// than an exit, are classified by the same rules as a sandbox's run.
type Outcome struct {
	// KilledFor is StatusTimeout or StatusCancelled when the caller
	// stopped the execution for that reason, else empty.
	KilledFor Status
	// Known says the exit code is known; ExitCode and Signal are it (see
	// Result).
	Known    bool
	ExitCode int
	Signal   string
	// OOMKills and PidsLimitHits are the cgroup counters' increase during
	// the execution; StdoutTruncated and StderrTruncated the captures'.
	OOMKills, PidsLimitHits          uint64
	StdoutTruncated, StderrTruncated bool
}

// Classify is the status of an execution and the limits it hit, as Wait
// reports them for a run (see classify).
func Classify(o Outcome) (Status, []string) {
	return classify(ending{killedFor: o.KilledFor, known: o.Known, exitCode: o.ExitCode, signal: o.Signal},
		counted{oomKills: o.OOMKills, pidsLimitHits: o.PidsLimitHits,
			stdoutTruncated: o.StdoutTruncated, stderrTruncated: o.StderrTruncated})
}

// classify is the status of a run and the limits it hit, in the order
// stdout, stderr, pids, memory, timeout. A kill Wait made for a deadline or
// a cancellation wins; then an OOM kill, from the cgroup's own counter (the
// killed process need not be init: a shell whose child was killed may still
// exit 0); then an unknown exit is our failure; then the exit itself.
func classify(e ending, c counted) (Status, []string) {
	hit := []string{}
	if c.stdoutTruncated {
		hit = append(hit, LimitStdout)
	}
	if c.stderrTruncated {
		hit = append(hit, LimitStderr)
	}
	if c.pidsLimitHits > 0 {
		hit = append(hit, LimitPids)
	}
	if c.oomKills > 0 {
		hit = append(hit, LimitMemory)
	}
	switch {
	case e.killedFor == StatusTimeout:
		return StatusTimeout, append(hit, LimitTimeout)
	case e.killedFor == StatusCancelled:
		return StatusCancelled, hit
	case c.oomKills > 0:
		return StatusOOM, hit
	case !e.known:
		return StatusSandboxError, hit
	case e.exitCode == 0 && e.signal == "":
		return StatusSucceeded, hit
	default:
		return StatusFailed, hit
	}
}

// WaitForCleanup blocks until every sandbox this Runner finished has been
// removed (cgroups, state directory, mounts). Removal runs in the
// background, after the result is returned; call this before exiting or
// checking for leftovers.
func (r *Runner) WaitForCleanup() { r.cleanups.Wait() }
