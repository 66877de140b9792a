package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// v1Sources are the files ReadStats reads on v1, per controller.
var v1Sources = map[string][]string{
	"memory":  {"memory.oom_control", "memory.max_usage_in_bytes"},
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
	limits := map[string]string{
		"pids/pids.max":                      "8",
		"cpu/cpu.cfs_period_us":              "100000",
		"cpu/cpu.cfs_quota_us":               "10000", // 10% of a CPU
		"memory/memory.limit_in_bytes":       "33554432",
		"memory/memory.memsw.limit_in_bytes": "33554432", // no escape into swap
	}
	for k, v := range limits {
		ctrl, file, _ := strings.Cut(k, "/")
		if err := writeFile(filepath.Join(paths[ctrl], file), v); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	// 300 ms of busy loop at 10% quota, a tail(1) that buffers 64 MiB of one
	// line (OOM-killed), then 20 background forks against pids.max=8 (last:
	// dash exits on a failed fork, and nothing can fork until the sleepers
	// are gone).
	script := `
		timeout 0.3 sh -c 'while :; do :; done'
		head -c 64M /dev/zero | tail >/dev/null
		(i=0; while [ $i -lt 20 ]; do sleep 0.1 & i=$((i+1)); done) 2>/dev/null
		exit 0`
	cmd := startIn(t, []string{paths["memory"], paths["pids"], paths["cpu"], paths["cpuacct"]}, script)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scenario: %v", err)
	}
	s, err := ReadStats(paths)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", s)
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
