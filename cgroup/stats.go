package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Stats are the counters of one sandbox's cgroup that its Result needs.
// A counter the kernel does not offer stays zero.
type Stats struct {
	// OOMKills counts processes the OOM killer killed in the cgroup
	// (v1 memory.oom_control oom_kill, v2 memory.events oom_kill; both
	// since Linux 4.13).
	OOMKills uint64
	// PidsLimitHits counts forks refused at pids.max (pids.events max).
	PidsLimitHits uint64
	// MemoryPeakBytes is the high-water mark of memory use
	// (v1 memory.max_usage_in_bytes; v2 memory.peak, Linux 5.19+).
	MemoryPeakBytes int64
	// MemoryCurrentBytes is the memory in use now (v1
	// memory.usage_in_bytes, v2 memory.current): what an idle warm sandbox
	// costs.
	MemoryCurrentBytes int64
	// CPUUsageNS is the CPU time of all processes (v1 cpuacct.usage;
	// v2 cpu.stat usage_usec).
	CPUUsageNS uint64
	// PidsCurrent and PidsPeak: tasks now and at most (pids.peak is recent:
	// present on the 6.18 dev kernel, absent on older ones).
	PidsCurrent, PidsPeak int64
	// CPUThrottledPeriods and CPUThrottledNS: CFS quota throttling
	// (cpu.stat nr_throttled and v1 throttled_time / v2 throttled_usec).
	CPUThrottledPeriods uint64
	CPUThrottledNS      uint64
}

// ReadStats reads a sandbox's counters from paths exactly as libcontainer's
// cgroups.Manager.GetPaths() returns them: v1 maps controller names to
// absolute directories (hybrid hosts add "" for the cgroup2 mount, ignored
// here, as are hierarchies other than memory, pids, cpu and cpuacct); v2 has
// the single key "" (Paths.V2). A directory read from that does not exist is
// an error; a missing file (older kernel) leaves its counter zero.
func ReadStats(paths Paths) (Stats, error) {
	var s Stats
	if len(paths) == 0 {
		return s, errors.New("cgroup stats: no cgroup paths given")
	}
	_, v2 := paths.V2()
	for c, d := range paths {
		// Only the dirs read below must exist: libcontainer also reports
		// hierarchies it skipped (devices with SkipDevices) and, on hybrid
		// hosts, a cgroup2 dir with no counters we use.
		if (v2 || slices.Contains(requiredV1, c)) && d != "" {
			if _, err := os.Stat(d); err != nil {
				return s, fmt.Errorf("cgroup stats: %w", err)
			}
		}
	}
	r := statReader{}
	if dir, ok := paths.V2(); ok {
		ev := r.keyed(dir, "memory.events")
		s.OOMKills = ev["oom_kill"]
		s.MemoryPeakBytes = r.int(dir, "memory.peak")
		s.MemoryCurrentBytes = r.int(dir, "memory.current")
		s.PidsLimitHits = r.keyed(dir, "pids.events")["max"]
		s.PidsCurrent = r.int(dir, "pids.current")
		s.PidsPeak = r.int(dir, "pids.peak")
		cpu := r.keyed(dir, "cpu.stat")
		s.CPUUsageNS = cpu["usage_usec"] * 1000
		s.CPUThrottledPeriods = cpu["nr_throttled"]
		s.CPUThrottledNS = cpu["throttled_usec"] * 1000
		return s, r.err
	}
	if dir, ok := paths["memory"]; ok {
		s.OOMKills = r.keyed(dir, "memory.oom_control")["oom_kill"]
		s.MemoryPeakBytes = r.int(dir, "memory.max_usage_in_bytes")
		s.MemoryCurrentBytes = r.int(dir, "memory.usage_in_bytes")
	}
	if dir, ok := paths["pids"]; ok {
		s.PidsLimitHits = r.keyed(dir, "pids.events")["max"]
		s.PidsCurrent = r.int(dir, "pids.current")
		s.PidsPeak = r.int(dir, "pids.peak")
	}
	if dir, ok := paths["cpuacct"]; ok {
		s.CPUUsageNS = uint64(r.int(dir, "cpuacct.usage"))
	}
	if dir, ok := paths["cpu"]; ok {
		cpu := r.keyed(dir, "cpu.stat")
		s.CPUThrottledPeriods = cpu["nr_throttled"]
		s.CPUThrottledNS = cpu["throttled_time"]
	}
	return s, r.err
}

// statReader reads cgroup files, keeping the first real error; a missing
// file reads as zero.
type statReader struct{ err error }

func (r *statReader) read(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && r.err == nil {
			r.err = fmt.Errorf("cgroup stats: %w", err)
		}
		return ""
	}
	return string(b)
}

// int reads a single-number file ("max" counts as zero: it is a limit, not a
// counter).
func (r *statReader) int(dir, name string) int64 {
	v := strings.TrimSpace(r.read(dir, name))
	if v == "" || v == "max" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("cgroup stats: %s: %q is not a number", filepath.Join(dir, name), v)
	}
	return n
}

// keyed reads a flat-keyed file ("key value" per line).
func (r *statReader) keyed(dir, name string) map[string]uint64 {
	m := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(r.read(dir, name)))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			if r.err == nil {
				r.err = fmt.Errorf("cgroup stats: %s: %q is not a number", filepath.Join(dir, name), sc.Text())
			}
			continue
		}
		m[k] = n
	}
	return m
}

// ReadCPUUsage reads only the CPU time of a sandbox's cgroup (v1
// cpuacct.usage, v2 cpu.stat usage_usec): the one counter the warm pool
// needs at hand-off, where ReadStats would cost ten file reads.
func ReadCPUUsage(paths Paths) (uint64, error) {
	r := statReader{}
	if dir, ok := paths.V2(); ok {
		return r.keyed(dir, "cpu.stat")["usage_usec"] * 1000, r.err
	}
	if dir, ok := paths["cpuacct"]; ok {
		return uint64(r.int(dir, "cpuacct.usage")), r.err
	}
	return 0, errors.New("cgroup stats: no cpuacct or cgroup2 path")
}
