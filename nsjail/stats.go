package nsjail

import "github.com/sandboxd/sandboxd/cgroup"

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
