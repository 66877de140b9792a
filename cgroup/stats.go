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

	"golang.org/x/sys/unix"
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
// an error; a missing file (older kernel) leaves its counter zero. It opens,
// reads and closes the files; OpenCounters keeps them open for a sandbox
// read many times.
func ReadStats(paths Paths) (Stats, error) {
	c, err := OpenCounters(paths)
	if err != nil {
		return Stats{}, err
	}
	defer c.Close()
	return c.Read()
}

// Counters are a sandbox's counter files (those ReadStats reads), held
// open: a session kernel's every execution reads them twice, and a read
// through an open file is one pread(2) where opening it again walks the
// cgroup path (ten files: 0.15-0.2 ms of a 2 ms live-kernel execution,
// 0.02 ms this way). cgroupfs files show their current value at every read
// from offset 0. Read may be called concurrently; Close ends it.
type Counters struct {
	files []counterFile
}

type counterFile struct {
	f     *os.File
	parse func(s *Stats, r *statReader, path, text string)
}

// counterSources are the files of Stats, per hierarchy ("" for v2's one).
var counterSources = map[string][]struct {
	name  string
	parse func(s *Stats, r *statReader, path, text string)
}{
	"": {
		{"memory.events", func(s *Stats, r *statReader, p, t string) { s.OOMKills = r.keyed(p, t)["oom_kill"] }},
		{"memory.peak", func(s *Stats, r *statReader, p, t string) { s.MemoryPeakBytes = r.int(p, t) }},
		{"memory.current", func(s *Stats, r *statReader, p, t string) { s.MemoryCurrentBytes = r.int(p, t) }},
		{"pids.events", func(s *Stats, r *statReader, p, t string) { s.PidsLimitHits = r.keyed(p, t)["max"] }},
		{"pids.current", func(s *Stats, r *statReader, p, t string) { s.PidsCurrent = r.int(p, t) }},
		{"pids.peak", func(s *Stats, r *statReader, p, t string) { s.PidsPeak = r.int(p, t) }},
		{"cpu.stat", func(s *Stats, r *statReader, p, t string) {
			cpu := r.keyed(p, t)
			s.CPUUsageNS = cpu["usage_usec"] * 1000
			s.CPUThrottledPeriods = cpu["nr_throttled"]
			s.CPUThrottledNS = cpu["throttled_usec"] * 1000
		}},
	},
	"memory": {
		{"memory.oom_control", func(s *Stats, r *statReader, p, t string) { s.OOMKills = r.keyed(p, t)["oom_kill"] }},
		{"memory.max_usage_in_bytes", func(s *Stats, r *statReader, p, t string) { s.MemoryPeakBytes = r.int(p, t) }},
		{"memory.usage_in_bytes", func(s *Stats, r *statReader, p, t string) { s.MemoryCurrentBytes = r.int(p, t) }},
	},
	"pids": {
		{"pids.events", func(s *Stats, r *statReader, p, t string) { s.PidsLimitHits = r.keyed(p, t)["max"] }},
		{"pids.current", func(s *Stats, r *statReader, p, t string) { s.PidsCurrent = r.int(p, t) }},
		{"pids.peak", func(s *Stats, r *statReader, p, t string) { s.PidsPeak = r.int(p, t) }},
	},
	"cpuacct": {
		{"cpuacct.usage", func(s *Stats, r *statReader, p, t string) { s.CPUUsageNS = uint64(r.int(p, t)) }},
	},
	"cpu": {
		{"cpu.stat", func(s *Stats, r *statReader, p, t string) {
			cpu := r.keyed(p, t)
			s.CPUThrottledPeriods = cpu["nr_throttled"]
			s.CPUThrottledNS = cpu["throttled_time"]
		}},
	},
}

// OpenCounters opens the counter files of the cgroup at paths (as for
// ReadStats, with the same rules for missing directories and files).
func OpenCounters(paths Paths) (*Counters, error) {
	if len(paths) == 0 {
		return nil, errors.New("cgroup stats: no cgroup paths given")
	}
	_, v2 := paths.V2()
	for c, d := range paths {
		// Only the dirs read below must exist: libcontainer also reports
		// hierarchies it skipped (devices with SkipDevices) and, on hybrid
		// hosts, a cgroup2 dir with no counters we use.
		if (v2 || slices.Contains(requiredV1, c)) && d != "" {
			if _, err := os.Stat(d); err != nil {
				return nil, fmt.Errorf("cgroup stats: %w", err)
			}
		}
	}
	c := &Counters{}
	for _, h := range []string{"", "memory", "pids", "cpuacct", "cpu"} {
		if (h == "") != v2 {
			continue
		}
		dir, ok := paths[h]
		if !ok || dir == "" {
			continue
		}
		for _, src := range counterSources[h] {
			f, err := os.Open(filepath.Join(dir, src.name))
			if errors.Is(err, fs.ErrNotExist) {
				continue // an older kernel's: the counter stays zero
			}
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("cgroup stats: %w", err)
			}
			c.files = append(c.files, counterFile{f: f, parse: src.parse})
		}
	}
	return c, nil
}

// Read reads the counters now.
func (c *Counters) Read() (Stats, error) {
	var s Stats
	r := statReader{}
	var buf [4096]byte // every counter file fits: one read, never torn
	for _, cf := range c.files {
		text, err := preadAll(cf.f, buf[:0])
		if err != nil {
			return s, fmt.Errorf("cgroup stats: %w", err)
		}
		cf.parse(&s, &r, cf.f.Name(), text)
	}
	return s, r.err
}

// preadAll reads f whole from offset 0, into buf when it fits: one
// pread(2) for a counter file (os.File.ReadAt would make a second one to
// see the end). A file larger than buf is read in parts, each of which
// the kernel generates anew: Read's buffer keeps every file it reads
// within one part.
func preadAll(f *os.File, buf []byte) (string, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return "", err
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			if len(buf) == cap(buf) {
				buf = slices.Grow(buf, max(cap(buf), 512))
			}
			n, err := unix.Pread(int(fd), buf[len(buf):cap(buf)], int64(len(buf)))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				rerr = err
				return true
			}
			buf = buf[:len(buf)+n]
			if n == 0 || len(buf) < cap(buf) {
				return true
			}
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return "", &fs.PathError{Op: "read", Path: f.Name(), Err: err}
	}
	return string(buf), nil
}

// Close closes the files; Read must not be called after it.
func (c *Counters) Close() error {
	for _, cf := range c.files {
		cf.f.Close()
	}
	c.files = nil
	return nil
}

// statReader parses counter files, keeping the first error.
type statReader struct{ err error }

// int parses a single-number file ("max" counts as zero: it is a limit,
// not a counter).
func (r *statReader) int(path, text string) int64 {
	v := strings.TrimSpace(text)
	if v == "" || v == "max" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("cgroup stats: %s: %q is not a number", path, v)
	}
	return n
}

// keyed parses a flat-keyed file ("key value" per line).
func (r *statReader) keyed(path, text string) map[string]uint64 {
	m := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			if r.err == nil {
				r.err = fmt.Errorf("cgroup stats: %s: %q is not a number", path, sc.Text())
			}
			continue
		}
		m[k] = n
	}
	return m
}
