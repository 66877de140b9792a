package nsjail

import (
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/cgroup"
)

// A sandbox can be frozen between the executions it serves (a session's
// kernel idles frozen): every process of its cgroup stops where it is,
// using no CPU and touching no file, until Thaw. Background code left
// running by an execution (a thread, a forked process) is what this stops:
// idle, it would run with no admission slot of its own and race the
// worker's reads of the workspace (SECURITY.md case 47).
//
// The freezer is the cgroup's (cgroup.Freeze: v1 freezer.state, v2
// cgroup.freeze), written directly rather than through libcontainer's
// Pause, whose retry policy costs 10 ms at times; libcontainer reads the
// same files for its own view (a frozen container is "paused" to it).
//
// A frozen task cannot die: on cgroup v1 a SIGKILL stays pending until the
// task is thawed (v2's freezer lets a fatal signal through). libcontainer's
// Signal(SIGKILL) thaws a paused container after signalling its init (and
// so Sweep's kill of a frozen orphan, and Destroy thaws one whose init is
// gone), but not when the init has exited already, and a Freeze racing the
// kill could freeze it again after. So the sandbox is never frozen once its
// end began: Wait marks it ending under fz before it kills, and thaws it
// after the kill, whatever froze it before. The one end that begins frozen
// is on the command's done word (Spec.Done): Wait freezes the sandbox to
// read it, and endFrozen kills every task while frozen before it thaws.

// freezeTimeout bounds Freeze: a task in an uninterruptible sleep (a disk
// write) freezes only when it wakes. Wait's freeze on a done word is also
// bounded by the time left to the execution's deadline (1 ms at least).
const freezeTimeout = time.Second

// errEnding: Freeze after the sandbox began to end.
var errEnding = errors.New("the sandbox is ending: not frozen")

// Freeze freezes every process of the sandbox and returns once they all
// are. A sandbox whose end has begun (Wait is killing it, or it was waited
// for) is not frozen: an error. On an error nothing is frozen (a freeze
// that failed half-way is thawed).
func (s *Sandbox) Freeze() error { return s.freeze(freezeTimeout) }

// freeze is Freeze, waiting at most timeout for every task to freeze.
func (s *Sandbox) freeze(timeout time.Duration) error {
	s.fz.Lock()
	defer s.fz.Unlock()
	if s.ending {
		return errEnding
	}
	if s.frozen {
		return nil
	}
	if s.releaseAnchor == nil {
		// Held until the sandbox is removed (collect): see cgroup/anchor.go.
		release, err := cgroup.AcquireFreezerAnchor(s.cgroupPaths)
		if err != nil {
			s.log.Debug("no freezer anchor; freezing and thawing cost more", "error", err)
		} else {
			s.releaseAnchor = release
		}
	}
	if err := cgroup.Freeze(s.cgroupPaths, timeout); err != nil {
		return fmt.Errorf("unable to freeze the sandbox: %w", err)
	}
	s.frozen = true
	s.releaseForegroundLocked()
	return nil
}

// dropAnchor releases the freezer anchor Freeze took, once the sandbox is
// gone.
func (s *Sandbox) dropAnchor() {
	s.fz.Lock()
	release := s.releaseAnchor
	s.releaseAnchor = nil
	s.fz.Unlock()
	if release != nil {
		if err := release(); err != nil {
			s.log.Warn("unable to release the freezer anchor", "error", err)
		}
	}
}

// Thaw lets a sandbox Freeze stopped run again; it does nothing to one
// that is not frozen.
func (s *Sandbox) Thaw() error {
	s.fz.Lock()
	defer s.fz.Unlock()
	return s.thawLocked()
}

func (s *Sandbox) thawLocked() error {
	if !s.frozen {
		return nil
	}
	if err := cgroup.Thaw(s.cgroupPaths); err != nil {
		return fmt.Errorf("unable to thaw the sandbox: %w", err)
	}
	s.frozen = false
	s.holdForegroundLocked()
	return nil
}

// endFreezing marks the sandbox ending: no Freeze from now on. Wait calls
// it before it kills the sandbox, and thawForEnd after the kill.
func (s *Sandbox) endFreezing() {
	s.fz.Lock()
	s.ending = true
	s.fz.Unlock()
}

// thawForEnd thaws a sandbox frozen before its end began, so that the kill
// it was sent (pending while frozen) takes it, and its processes can exit.
func (s *Sandbox) thawForEnd() {
	s.fz.Lock()
	defer s.fz.Unlock()
	if err := s.thawLocked(); err != nil {
		s.log.Error("unable to thaw the sandbox to end it", "error", err)
	}
}

// HoldFreezerAnchor keeps the cgroup v1 freezer anchor (cgroup/anchor.go)
// until release is called: for a caller that freezes this Runner's
// sandboxes for a while (session kernels idle frozen; a sandbox with
// Spec.Done is frozen on its word), so that even the first freeze of each
// flips nothing. A no-op on v2.
func (r *Runner) HoldFreezerAnchor() (release func() error, err error) {
	h, err := cgroup.Host()
	if err != nil {
		return nil, err
	}
	return h.AcquireFreezerAnchor(r.opts.CgroupParent)
}

// toForeground is the hand-off's change of CPU weight: a sandbox made
// ready in the background (Spec.Background) gets the foreground weight, a
// cold sandbox's, and a template fork's sandbox holds its template's
// (Template.HoldForeground: tpl-<id> holds the fork's cgroup) while it
// serves, but for the time it is frozen, when it uses no CPU (a session's
// idle kernel). A failure is logged: the execution runs, slower under
// load.
func (s *Sandbox) toForeground() {
	s.fz.Lock()
	s.fgServing = true
	s.holdForegroundLocked()
	s.fz.Unlock()
	if !s.background {
		return
	}
	s.background = false
	// By path, ~25 µs on v1 (a held file would save that much).
	if err := cgroup.SetCPUWeight(s.cgroupPaths, false); err != nil {
		s.log.Error("unable to give the sandbox the foreground CPU weight at its hand-off: it runs at the background weight", "error", err)
	}
}

// holdForegroundLocked takes the template's foreground weight for a
// template fork that serves and is not frozen; under fz.
func (s *Sandbox) holdForegroundLocked() {
	if s.shell != nil && s.fgServing && !s.frozen && s.fgRelease == nil {
		s.fgRelease = s.shell.tpl.HoldForeground()
	}
}

// releaseForegroundLocked lets the template's foreground weight go; under
// fz.
func (s *Sandbox) releaseForegroundLocked() {
	if s.fgRelease != nil {
		s.fgRelease()
		s.fgRelease = nil
	}
}

// endForeground ends the hold for good: the sandbox's end has begun and
// its result is built (collect), whether or not it is removed.
func (s *Sandbox) endForeground() {
	s.fz.Lock()
	defer s.fz.Unlock()
	s.fgServing = false
	s.releaseForegroundLocked()
}
