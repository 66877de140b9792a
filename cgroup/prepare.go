package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Required are the controllers every sandbox is limited by. v1 also needs
// cpuacct, which reports CPU time (v2's cpu.stat does both).
var (
	requiredV2 = []string{"cpu", "memory", "pids"}
	requiredV1 = []string{"cpu", "cpuacct", "memory", "pids"}
)

// PrepareParent makes the sandboxes' parent cgroup usable. Call it once at
// start-up, before any sandbox exists; it is idempotent.
//
// v1 (and hybrid): checks that the memory, pids, cpu and cpuacct hierarchies
// are mounted and that <own>/<parent> can be created in each.
//
// v2: the delegation step. cgroup v2's "no internal processes" rule forbids a
// cgroup that holds processes from handing controllers to its children, and
// the worker sits in <own> (a systemd unit with Delegate=yes, or a container's
// root). So the worker moves itself, and only itself, into the leaf
// <own>/supervisor, then writes "+cpu +memory +pids" to
// <own>/cgroup.subtree_control and <own>/<parent>/cgroup.subtree_control.
// Nothing above <own> is read or written: in a privileged container the
// host's whole tree is visible and writable. On success h.Own[v2Key] is the
// supervisor leaf, as /proc/self/cgroup now says.
func (h *Hierarchy) PrepareParent(parent string) error {
	if err := checkParent(parent); err != nil {
		return err
	}
	if h.Mode.V2() {
		return h.delegateV2(parent)
	}
	for _, c := range requiredV1 {
		own, ok := h.Own[c]
		if !ok {
			return fmt.Errorf("cgroup v1: the %s hierarchy is not mounted (or does not show this process's cgroup); sandboxes need %s", c, strings.Join(requiredV1, ", "))
		}
		if err := os.MkdirAll(filepath.Join(own, parent), 0o755); err != nil {
			return fmt.Errorf("cgroup v1: cannot create the sandboxes' parent under the worker's %s cgroup: %w", c, err)
		}
	}
	return nil
}

// SwapAccounting reports whether a sandbox's memory+swap can be limited:
// always on v2 (memory.swap.max); on v1 and hybrid only when the kernel
// accounts swap (swapaccount=1), which puts memory.memsw.* in every memory
// cgroup, the worker's own included.
func (h *Hierarchy) SwapAccounting() bool {
	if h.Mode.V2() {
		return true
	}
	own, ok := h.Own["memory"]
	return ok && fileExists(filepath.Join(own, "memory.memsw.limit_in_bytes"))
}

func (h *Hierarchy) delegateV2(parent string) error {
	own := h.Own[v2Key]
	leaf := own
	if filepath.Base(own) == supervisorLeaf {
		own = filepath.Dir(own) // already moved (PrepareParent ran before)
	} else {
		leaf = filepath.Join(own, supervisorLeaf)
	}
	avail, err := readFields(filepath.Join(own, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	var missing []string
	for _, c := range requiredV2 {
		if !slices.Contains(avail, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cgroup v2: controllers %s are not delegated to the worker's cgroup %s (it has %q); run it as a systemd unit with Delegate=yes, or in a container with its own writable cgroup2 mount",
			strings.Join(missing, ", "), own, strings.Join(avail, " "))
	}
	self := os.Getpid()
	// Anything in <own> but us was not started by us (a shell, a sidecar):
	// moving it is not ours to do, and it would make enabling controllers
	// fail with EBUSY. Checked before we move, so a refusal changes nothing.
	pids, err := readFields(filepath.Join(own, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	pids = slices.DeleteFunc(pids, func(p string) bool { return p == strconv.Itoa(self) })
	if len(pids) > 0 {
		return fmt.Errorf("cgroup v2: %s still holds processes %s that the worker did not start; controllers cannot be enabled below a cgroup with processes (\"no internal processes\" rule): start the worker alone in its cgroup",
			own, strings.Join(pids, " "))
	}
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cgroup v2: create the worker's leaf: %w", err)
	}
	if h.Own[v2Key] != leaf {
		// Moves every thread of this process (cgroup.procs moves the whole
		// thread group); no other process is touched.
		if err := writeFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(self)); err != nil {
			return fmt.Errorf("cgroup v2: move the worker into %s: %w", leaf, err)
		}
		h.Own[v2Key] = leaf
	}
	enable := "+" + strings.Join(requiredV2, " +")
	if err := writeFile(filepath.Join(own, "cgroup.subtree_control"), enable); err != nil {
		return fmt.Errorf("cgroup v2: enable %s in %s: %w", enable, own, err)
	}
	if err := os.MkdirAll(filepath.Join(own, parent), 0o755); err != nil {
		return fmt.Errorf("cgroup v2: create the sandboxes' parent: %w", err)
	}
	// Every level of a nested parent ("a/b") hands the controllers on.
	d := own
	for _, part := range strings.Split(parent, "/") {
		d = filepath.Join(d, part)
		if err := writeFile(filepath.Join(d, "cgroup.subtree_control"), enable); err != nil {
			return fmt.Errorf("cgroup v2: enable %s in %s: %w", enable, d, err)
		}
	}
	return nil
}

// readFields reads a whitespace-separated cgroup file (controllers, pids).
func readFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// writeFile writes one value to a cgroup control file. O_CREATE is harmless
// on cgroupfs (the file exists or the write fails) and lets tests run on
// recorded trees.
func writeFile(path, value string) error {
	return os.WriteFile(path, []byte(value), 0o644)
}
