// Package cgroup is sandboxd's view of the worker's own cgroup: which cgroup
// version the host runs, where the worker sits in each hierarchy, how the
// sandboxes' parent is prepared below it, and how a sandbox's counters are
// read, its processes killed and orphans swept after a crash.
//
// One manager owns each cgroup: libcontainer creates, limits and destroys
// every sandbox's own cgroup; this package only prepares their common parent,
// reads counters, kills and sweeps. It never writes above the worker's own
// cgroup, never mounts or unmounts, and moves no process but the worker
// itself (the cgroup v2 delegation step of PrepareParent).
package cgroup

import "github.com/containerd/cgroups/v3"

// Mode is the cgroup layout of the host, as containerd/cgroups names it.
type Mode int

const (
	// Unavailable: no cgroup filesystem is mounted where expected.
	Unavailable Mode = iota
	// Legacy: cgroup v1 hierarchies only.
	Legacy
	// Hybrid: v1 hierarchies plus a cgroup2 mount (usually
	// /sys/fs/cgroup/unified) that holds few or no controllers. sandboxd,
	// like libcontainer, treats it as v1: the controllers it needs (cpu,
	// memory, pids) are bound to v1 hierarchies.
	Hybrid
	// Unified: cgroup v2 only, mounted at /sys/fs/cgroup.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Legacy:
		return "v1"
	case Hybrid:
		return "hybrid (v1 controllers)"
	case Unified:
		return "v2"
	}
	return "unavailable"
}

// V2 reports whether sandbox limits use cgroup v2 files. Only Unified does:
// in Hybrid mode the controllers sandboxd needs live in v1 hierarchies.
func (m Mode) V2() bool { return m == Unified }

// DetectMode returns the host's cgroup mode (cached for the process's life,
// by containerd/cgroups, from statfs of /sys/fs/cgroup and
// /sys/fs/cgroup/unified).
func DetectMode() Mode {
	switch cgroups.Mode() {
	case cgroups.Legacy:
		return Legacy
	case cgroups.Hybrid:
		return Hybrid
	case cgroups.Unified:
		return Unified
	}
	return Unavailable
}

// unifiedMountpoint is where a pure-v2 host mounts cgroup2 (containerd and
// libcontainer assume the same).
const unifiedMountpoint = "/sys/fs/cgroup"
