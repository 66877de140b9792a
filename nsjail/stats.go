package nsjail

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// sandboxStats is what a finished sandbox's cgroups say about it.
// TODO(lead): replace with cgroup.ReadStats once the cgroup package lands.
type sandboxStats struct {
	OOMKills        uint64
	PidsLimitHits   uint64
	MemoryPeakBytes int64
	CPUUsageNS      uint64
	PidsPeak        int64
}

func (s *Sandbox) readStats() sandboxStats {
	var st sandboxStats
	state, err := s.c.State()
	if err != nil {
		s.log.Warn("unable to read sandbox state for stats", "error", err)
		return st
	}
	p := state.CgroupPaths
	// Hybrid hosts list the (controller-less) unified hierarchy under "" as
	// well as the v1 controllers, so v1 wins whenever "memory" is present.
	if dir, ok := p[""]; ok && p["memory"] == "" { // v2
		st.OOMKills = keyed(filepath.Join(dir, "memory.events"), "oom_kill")
		st.PidsLimitHits = keyed(filepath.Join(dir, "pids.events"), "max")
		st.MemoryPeakBytes = int64(single(filepath.Join(dir, "memory.peak")))
		st.CPUUsageNS = keyed(filepath.Join(dir, "cpu.stat"), "usage_usec") * 1000
		st.PidsPeak = int64(single(filepath.Join(dir, "pids.peak")))
		return st
	}
	st.OOMKills = keyed(filepath.Join(p["memory"], "memory.oom_control"), "oom_kill")
	st.PidsLimitHits = keyed(filepath.Join(p["pids"], "pids.events"), "max")
	st.MemoryPeakBytes = int64(single(filepath.Join(p["memory"], "memory.max_usage_in_bytes")))
	st.CPUUsageNS = single(filepath.Join(p["cpuacct"], "cpuacct.usage"))
	st.PidsPeak = int64(single(filepath.Join(p["pids"], "pids.peak")))
	return st
}

func keyed(file, key string) uint64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func single(file string) uint64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}
