package nsjail

import (
	"maps"

	"github.com/sandboxd/sandboxd/cgroup"
)

// NormalizeMap is normalizeMap, for the external tests (template_test.go
// compares id maps the way StartShell does).
var NormalizeMap = normalizeMap

// ForgetFreezer makes sb unfreezable on cgroup v1 (its freezer hierarchy
// forgotten), as on a host without one: Wait's way on a done word is then
// the kill and the wait for the end. It reports false on v2, whose one
// hierarchy always has a freezer.
func ForgetFreezer(sb *Sandbox) bool {
	if _, v2 := sb.cgroupPaths.V2(); v2 {
		return false
	}
	paths := maps.Clone(sb.cgroupPaths)
	delete(paths, "freezer")
	sb.cgroupPaths = paths
	return true
}

// PendingCgroupPaths are p's cgroup directories.
func PendingCgroupPaths(p *Pending) cgroup.Paths { return p.s.cgroupPaths }
