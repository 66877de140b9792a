package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// v1Sources are the files ReadStats reads on v1, per controller.
var v1Sources = map[string][]string{
	"memory":  {"memory.oom_control", "memory.max_usage_in_bytes", "memory.usage_in_bytes"},
	"pids":    {"pids.events", "pids.current", "pids.peak", "pids.max"},
	"cpu":     {"cpu.stat", "cpu.cfs_quota_us", "cpu.cfs_period_us"},
	"cpuacct": {"cpuacct.usage"},
}

// TestReadStatsV1Live drives a real v1 cgroup into its pids, CPU-quota and
// memory limits with a process it starts, then reads the counters. With
// -record it also copies the source files into testdata/cgroup/v1/sandbox.
func TestReadStatsV1Live(t *testing.T) {
	h := realHost(t)
	if h.Mode.V2() {
		t.Skip("v1 host test; v2 counters are read by TestReadStatsV2Recorded (and the VM harness)")
	}
	paths := sandboxCgroup(t, h, "stats")
	for _, kv := range [][2]string{ // in order: memsw may not go below the limit
		{"pids/pids.max", "8"},
		{"cpu/cpu.cfs_period_us", "100000"},
		{"cpu/cpu.cfs_quota_us", "10000"}, // 10% of a CPU
		{"memory/memory.limit_in_bytes", "33554432"},
		{"memory/memory.memsw.limit_in_bytes", "33554432"}, // no escape into swap
	} {
		ctrl, file, _ := strings.Cut(kv[0], "/")
		if err := writeFile(filepath.Join(paths[ctrl], file), kv[1]); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	// 300 ms of busy loop at 10% quota, a tail(1) that buffers 64 MiB of one
	// line (OOM-killed), then 20 background forks against pids.max=8 (last:
	// dash exits on a failed fork, and nothing can fork until the sleepers
	// are gone).
	script := `
		timeout 0.3 sh -c 'while :; do :; done'
		{ head -c 64M /dev/zero | tail >/dev/null; } 2>/dev/null
		(i=0; while [ $i -lt 20 ]; do sleep 0.1 & i=$((i+1)); done) 2>/dev/null
		exit 0`
	// Counters opened before the scenario must read its values after it:
	// a cgroup file read again from offset 0 shows the counter's current
	// value (what a session kernel's executions rely on).
	open, err := OpenCounters(paths)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if s, err := open.Read(); err != nil || s.CPUUsageNS != 0 || s.OOMKills != 0 || s.PidsPeak != 0 {
		t.Fatalf("fresh cgroup: %+v, %v", s, err)
	}
	cmd := startIn(t, []string{paths["memory"], paths["pids"], paths["cpu"], paths["cpuacct"]}, script)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	s, err := ReadStats(paths)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", s)
	again, err := open.Read()
	if err != nil {
		t.Fatal(err)
	}
	// The scenario's last sleeps may still run: what is in use now may
	// change between the two reads, CPU time only grow; the rest are
	// counters and marks of a scenario that is over.
	if again.CPUUsageNS < s.CPUUsageNS {
		t.Errorf("CPU time held open %d < %d read just before", again.CPUUsageNS, s.CPUUsageNS)
	}
	again.MemoryCurrentBytes, again.PidsCurrent, again.CPUUsageNS = s.MemoryCurrentBytes, s.PidsCurrent, s.CPUUsageNS
	if again != s {
		t.Errorf("counters held open read %+v, want what ReadStats reads: %+v", again, s)
	}
	if s.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want ≥ 1 (tail over the 32 MiB limit)", s.OOMKills)
	}
	if s.PidsLimitHits < 1 {
		t.Errorf("PidsLimitHits = %d, want ≥ 1 (20 forks, pids.max 8)", s.PidsLimitHits)
	}
	if s.PidsPeak != 8 {
		t.Errorf("PidsPeak = %d, want 8 (pids.max)", s.PidsPeak)
	}
	if s.MemoryPeakBytes < 16<<20 || s.MemoryPeakBytes > 32<<20 {
		t.Errorf("MemoryPeakBytes = %d, want 16..32 MiB", s.MemoryPeakBytes)
	}
	if s.CPUUsageNS < 10e6 {
		t.Errorf("CPUUsageNS = %d, want ≥ 10 ms (busy loop)", s.CPUUsageNS)
	}
	if s.CPUThrottledPeriods < 1 || s.CPUThrottledNS == 0 {
		t.Errorf("throttling = %d periods, %d ns; want > 0 (busy loop at 10%% quota)", s.CPUThrottledPeriods, s.CPUThrottledNS)
	}
	if *record {
		for ctrl, files := range v1Sources {
			dst := filepath.Join("..", "testdata", "cgroup", "v1", "sandbox", ctrl)
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				b, err := os.ReadFile(filepath.Join(paths[ctrl], f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// Recorded on this VM by TestReadStatsV1Live -record.
func TestReadStatsV1Recorded(t *testing.T) {
	dir := filepath.Join("..", "testdata", "cgroup", "v1", "sandbox")
	paths := Paths{}
	for c := range v1Sources {
		paths[c] = filepath.Join(dir, c)
	}
	paths["freezer"] = t.TempDir() // other hierarchies libcontainer reports are ignored
	paths[""] = t.TempDir()        // hybrid: the cgroup2 dir of a v1 sandbox
	got, err := ReadStats(paths)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{OOMKills: 1, PidsLimitHits: 1, MemoryPeakBytes: 33554432, MemoryCurrentBytes: 1732608,
		CPUUsageNS: 87860796, PidsCurrent: 6, PidsPeak: 8, CPUThrottledPeriods: 8, CPUThrottledNS: 692805811}
	if got != want {
		t.Errorf("\n got %+v\nwant %+v", got, want)
	}
}

// Written in the formats of Documentation/admin-guide/cgroup-v2.rst.
func TestReadStatsV2Recorded(t *testing.T) {
	paths := Paths{"": filepath.Join("..", "testdata", "cgroup", "v2", "sandbox")}
	got, err := ReadStats(paths)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{OOMKills: 2, PidsLimitHits: 17, MemoryPeakBytes: 268435456, MemoryCurrentBytes: 4194304,
		CPUUsageNS: 1834211000, PidsCurrent: 3, PidsPeak: 64, CPUThrottledPeriods: 31, CPUThrottledNS: 2703344000}
	if got != want {
		t.Errorf("\n got %+v\nwant %+v", got, want)
	}
}

func TestReadStatsErrors(t *testing.T) {
	empty := t.TempDir()
	// Older kernels: every file missing reads as zero.
	for _, paths := range []Paths{
		{"": empty},
		{"memory": empty, "pids": empty, "cpu": empty, "cpuacct": empty},
	} {
		if s, err := ReadStats(paths); err != nil || s != (Stats{}) {
			t.Errorf("%v: %+v, %v; want zeros, no error", paths, s, err)
		}
	}
	if _, err := ReadStats(nil); err == nil {
		t.Error("no paths: no error")
	}
	if _, err := ReadStats(Paths{"memory": filepath.Join(empty, "gone")}); err == nil {
		t.Error("missing cgroup dir: no error")
	}
	bad := t.TempDir()
	writeT(t, filepath.Join(bad, "memory.peak"), "lots\n")
	if _, err := ReadStats(Paths{"": bad}); err == nil || !strings.Contains(err.Error(), "memory.peak") {
		t.Errorf("malformed memory.peak: %v", err)
	}
	writeT(t, filepath.Join(bad, "memory.peak"), "1\n")
	writeT(t, filepath.Join(bad, "memory.events"), "oom_kill -1\n")
	if _, err := ReadStats(Paths{"": bad}); err == nil || !strings.Contains(err.Error(), "memory.events") {
		t.Errorf("malformed memory.events: %v", err)
	}
}

// What reading a sandbox's counters costs per execution.
func BenchmarkReadStats(b *testing.B) {
	h := realHost(b)
	paths := sandboxCgroup(b, h, "bench")
	for b.Loop() {
		if _, err := ReadStats(paths); err != nil {
			b.Fatal(err)
		}
	}
}
