package cgroup

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/moby/sys/mountinfo"
)

// Paths maps each cgroup controller to a directory, keyed the way
// /proc/<pid>/cgroup and libcontainer's Manager.GetPaths() key them: v1
// controllers by name ("cpu" and "cpuacct" both, when co-mounted; named
// hierarchies as "name=systemd"), the cgroup2 hierarchy by "" (v2Key).
type Paths map[string]string

// v2Key is the key of the cgroup2 hierarchy in Paths.
const v2Key = ""

// V2 returns the cgroup v2 directory when p are the paths of a cgroup on a
// unified host, where libcontainer reports the cgroup2 directory alone. A
// hybrid host's cgroup2 directory beside v1 controllers is not v2: the
// controllers sandboxd needs live in the v1 hierarchies (see Mode.V2).
func (p Paths) V2() (dir string, ok bool) {
	dir = p[v2Key]
	return dir, len(p) == 1 && dir != ""
}

// ParseProcCgroup parses a /proc/<pid>/cgroup text into the process's cgroup
// path per controller, relative to each hierarchy's root (see Paths).
func ParseProcCgroup(r io.Reader) (Paths, error) {
	raw, unified, err := cgroups.ParseCgroupFromReaderUnified(r)
	if err != nil {
		return nil, fmt.Errorf("parse /proc/self/cgroup: %w", err)
	}
	paths := Paths(raw)
	if unified != "" {
		paths[v2Key] = unified
	}
	for c, p := range paths {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("parse /proc/self/cgroup: %q has a relative path %q", c, p)
		}
	}
	return paths, nil
}

// Hierarchy is the worker's place in the cgroup tree. The package-level
// functions use Host(); tests build one over a recorded tree in a temp dir.
type Hierarchy struct {
	Mode Mode
	// Own maps each controller to the absolute directory of the worker's own
	// cgroup in it, e.g. v1 "memory" → /sys/fs/cgroup/memory/<own>; v2 ""
	// → /sys/fs/cgroup/<own>. In Hybrid mode "" is its dir in the cgroup2 mount.
	Own Paths
}

// Host describes the calling process's own cgroups on this host.
func Host() (*Hierarchy, error) {
	mode := DetectMode()
	if mode == Unavailable {
		return nil, fmt.Errorf("no cgroup filesystem mounted at %s", unifiedMountpoint)
	}
	mi, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer mi.Close()
	pc, err := os.Open("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	return NewHierarchy(mode, mi, pc)
}

// NewHierarchy locates the own cgroup paths of procCgroup (a
// /proc/<pid>/cgroup text) in the mounts of mountinfo, the way libcontainer
// does for a relative Cgroups.Path: directory = mountpoint + (path relative to
// the mount's root). The root matters in containers without a cgroup
// namespace, where /proc/self/cgroup shows host paths but the mount's root is
// already the container's cgroup. Controllers whose hierarchy is not mounted
// are left out.
func NewHierarchy(mode Mode, mountInfo, procCgroup io.Reader) (*Hierarchy, error) {
	mounts, err := mountinfo.GetMountsFromReader(mountInfo, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("parse mountinfo: %w", err)
	}
	paths, err := ParseProcCgroup(procCgroup)
	if err != nil {
		return nil, err
	}
	h := &Hierarchy{Mode: mode, Own: Paths{}}
	for ctrl, p := range paths {
		if mode.V2() && ctrl != v2Key {
			continue // on a unified host only the "0::" line counts
		}
		for _, m := range mounts {
			if !mountCarries(m, ctrl) {
				continue
			}
			rel, err := filepath.Rel(m.Root, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				continue // this mount does not show our cgroup (bind of a subtree)
			}
			h.Own[ctrl] = filepath.Join(m.Mountpoint, rel)
			break
		}
	}
	if mode.V2() && h.Own[v2Key] == "" {
		return nil, fmt.Errorf("cgroup v2: own cgroup %q is not visible under any cgroup2 mount", paths[v2Key])
	}
	return h, nil
}

// mountCarries reports whether mount m is the hierarchy of controller ctrl
// (v2Key = cgroup2; v1 controllers and "name=X" are super options).
func mountCarries(m *mountinfo.Info, ctrl string) bool {
	if ctrl == v2Key {
		return m.FSType == "cgroup2"
	}
	return m.FSType == "cgroup" && slices.Contains(strings.Split(m.VFSOptions, ","), ctrl)
}

// supervisorLeaf is the v2 leaf the worker moves itself into (PrepareParent).
const supervisorLeaf = "supervisor"

// base is the v2 directory under which sandboxes nest. libcontainer (fs2)
// resolves a relative Cgroups.Path against the *parent* of the caller's
// cgroup, assuming the caller sits in a leaf; after PrepareParent the worker
// is in <own>/supervisor, so that parent is <own>. Before it, the parent
// would be above the worker's cgroup, which we never touch.
func (h *Hierarchy) base() (string, error) {
	own := h.Own[v2Key]
	if filepath.Base(own) != supervisorLeaf {
		return "", fmt.Errorf("cgroup v2: worker is in %s, not in its %q leaf: call PrepareParent first (libcontainer would nest sandboxes beside it, above the worker's cgroup)", own, supervisorLeaf)
	}
	return filepath.Dir(own), nil
}

// ParentDirs returns, per controller, the directory that holds the sandboxes'
// cgroups: <own>/<parent> (v1: one per hierarchy; v2: "" → <base>/<parent>).
// These are the parents of what libcontainer creates for the relative
// Cgroups.Path "<parent>/<id>".
func (h *Hierarchy) ParentDirs(parent string) (Paths, error) {
	if err := checkParent(parent); err != nil {
		return nil, err
	}
	dirs := Paths{}
	if h.Mode.V2() {
		b, err := h.base()
		if err != nil {
			return nil, err
		}
		dirs[v2Key] = filepath.Join(b, parent)
		return dirs, nil
	}
	for ctrl, own := range h.Own {
		dirs[ctrl] = filepath.Join(own, parent)
	}
	return dirs, nil
}

// checkParent rejects parents that would escape the worker's cgroup.
func checkParent(parent string) error {
	if parent == "" || filepath.IsAbs(parent) || filepath.Clean(parent) != parent ||
		parent == ".." || strings.HasPrefix(parent, "../") || parent == "." {
		return fmt.Errorf("cgroup parent %q must be a clean relative path inside the worker's own cgroup", parent)
	}
	if parent == supervisorLeaf || strings.HasPrefix(parent, supervisorLeaf+"/") {
		return fmt.Errorf("cgroup parent %q collides with the worker's own v2 leaf %q", parent, supervisorLeaf)
	}
	return nil
}

// uniqueDirs returns the distinct directories of paths, sorted (co-mounted
// v1 controllers share one).
func uniqueDirs(paths Paths) []string {
	var dirs []string
	for _, d := range paths {
		if d != "" && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	return dirs
}
