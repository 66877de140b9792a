package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// A cgroup's CPU weight decides its share of the CPU against its siblings
// when they all want more than there is (v1 cpu.shares, v2 cpu.weight;
// the CFS quota, a sandbox's limit, is another thing). The warm pool
// makes its sandboxes ready at the background weight and raises it to the
// foreground weight at the hand-off (issue 17, M4): a refill yields the
// CPU to executions that want it. A process's niceness cannot do this: it
// weighs only against the tasks of its own cgroup, and a warm sandbox is
// alone in its cgroup (measured: a nice-19 loop in one cgroup and a nice-0
// loop in a sibling share a CPU 50/50).
const (
	// ForegroundShares and ForegroundWeight are the kernel's defaults,
	// every cold sandbox's: v1 cpu.shares and v2 cpu.weight.
	ForegroundShares = 1024
	ForegroundWeight = 100
	// BackgroundShares and BackgroundWeight are a sixteenth of them: low
	// enough that a sandbox being made ready takes little from executions
	// that want the CPU, high enough that it still gets ready within the
	// pool's bounds (a fork's exchanges 30 s each, a zygote's preload
	// 2 min) when every CPU is busy: beside k busy foreground cgroups it
	// gets 1/(16k+1) of their CPUs, ~1/16 of a CPU with max_concurrent's
	// default of one execution per CPU. Not cpu.idle's SCHED_IDLE class
	// (3/1024), which under saturation starves a refill into those bounds.
	BackgroundShares = ForegroundShares / 16
	BackgroundWeight = 6
)

// CPUWeight is a cgroup's CPU weight file held open: a template's, whose
// weight changes as its forks serve executions (one pwrite(2) each, not a
// walk of the cgroup's path).
type CPUWeight struct {
	f  *os.File
	v2 bool
}

// OpenCPUWeight opens the CPU weight file of the cgroup at paths (as
// ReadStats takes them: v1's "cpu" hierarchy, or v2's one directory).
func OpenCPUWeight(paths Paths) (*CPUWeight, error) {
	dir, v2 := paths.V2()
	name := "cpu.weight"
	if !v2 {
		dir, name = paths["cpu"], "cpu.shares"
	}
	if dir == "" {
		return nil, errors.New("cgroup CPU weight: no cpu hierarchy in the cgroup's paths")
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup CPU weight: %w", err)
	}
	return &CPUWeight{f: f, v2: v2}, nil
}

// Set writes the background weight (background) or the foreground one.
func (w *CPUWeight) Set(background bool) error {
	v := ForegroundShares
	switch {
	case w.v2 && background:
		v = BackgroundWeight
	case w.v2:
		v = ForegroundWeight
	case background:
		v = BackgroundShares
	}
	if _, err := w.f.WriteAt([]byte(strconv.Itoa(v)), 0); err != nil {
		return fmt.Errorf("cgroup CPU weight: %w", err)
	}
	return nil
}

// SetCPUWeight writes the CPU weight of the cgroup at paths once
// (OpenCPUWeight, Set, Close).
func SetCPUWeight(paths Paths, background bool) error {
	w, err := OpenCPUWeight(paths)
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Set(background)
}

// Close closes the file.
func (w *CPUWeight) Close() error { return w.f.Close() }
