package nsjail

import (
	"errors"

	"github.com/sandboxd/sandboxd/cgroup"
)

// readStats reads the sandbox's cgroup counters; a failure is logged and
// leaves the counters zero (the result is still worth returning).
func (s *Sandbox) readStats() cgroup.Stats {
	if s.cgroupPaths == nil {
		return cgroup.Stats{}
	}
	st, err := cgroup.ReadStats(s.cgroupPaths)
	if err != nil {
		s.log.Warn("unable to read sandbox cgroup stats", "error", err)
	}
	return st
}

// Stats reads the sandbox's cgroup counters now: a session's kernel takes
// the difference over each of its executions. It fails once the sandbox
// was removed.
func (s *Sandbox) Stats() (cgroup.Stats, error) {
	if s.cgroupPaths == nil {
		return cgroup.Stats{}, errors.New("the sandbox's cgroup paths are unknown")
	}
	return cgroup.ReadStats(s.cgroupPaths)
}
