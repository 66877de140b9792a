package nsjail

import "github.com/sandboxd/sandboxd/cgroup"

// readStats reads the sandbox's cgroup counters; a failure is logged and
// leaves the counters zero (the result is still worth returning).
func (s *Sandbox) readStats() cgroup.Stats {
	if s.paths() == nil {
		return cgroup.Stats{}
	}
	st, err := cgroup.ReadStats(s.cgroupPaths)
	if err != nil {
		s.log.Warn("unable to read sandbox cgroup stats", "error", err)
	}
	return st
}

// paths returns the sandbox's cgroup directories, read once from
// libcontainer's state (they never change).
func (s *Sandbox) paths() cgroup.Paths {
	if s.cgroupPaths == nil {
		state, err := s.c.State()
		if err != nil {
			s.log.Warn("unable to read sandbox state for stats", "error", err)
			return nil
		}
		s.cgroupPaths = state.CgroupPaths
	}
	return s.cgroupPaths
}
