package nsjail

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
	}{
		{"0", []int{0}},
		{"0-3", []int{0, 1, 2, 3}},
		{"0-1,4,6-7", []int{0, 1, 4, 6, 7}},
		{"", nil},
	} {
		got, err := parseCPUList(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"x", "3-1", "-1", "0-", "1,,2", "0-100000", "0-8191,0-8191"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

// SECURITY.md case 27: every possible CPU's thermal_throttle directory is
// masked, including CPUs that are offline now (the kernel creates the
// directory when a CPU comes online).
func TestThermalThrottleIsMaskedPerCPU(t *testing.T) {
	sys := t.TempDir()
	cpu := filepath.Join(sys, "devices/system/cpu")
	if err := os.MkdirAll(filepath.Join(cpu, "cpu0/thermal_throttle"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cpu, "possible"), []byte("0-1,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/sys/devices/system/cpu/cpu0/thermal_throttle",
		"/sys/devices/system/cpu/cpu1/thermal_throttle",
		"/sys/devices/system/cpu/cpu3/thermal_throttle",
	}
	if got := thermalThrottlePaths(sys); !slices.Equal(got, want) {
		t.Errorf("thermalThrottlePaths = %v, want %v", got, want)
	}
	if got := thermalThrottlePaths(t.TempDir()); got != nil {
		t.Errorf("without a CPU list: %v, want none", got)
	}

	// And the sandbox config carries them, with the static list.
	r := &Runner{opts: Options{HostIDBase: 1 << 30, CgroupParent: "p"}}
	cfg, err := r.buildConfig("id", &Spec{Rootfs: "/r", Args: []string{"true"}}, Limits{}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(thermalThrottlePaths("/sys"), "/proc/kcore", "/sys/devices/virtual/powercap") {
		if !slices.Contains(cfg.MaskPaths, p) {
			t.Errorf("MaskPaths lacks %s: %v", p, cfg.MaskPaths)
		}
	}
	if len(thermalThrottlePaths("/sys")) == 0 {
		t.Log("this host lists no possible CPUs in /sys")
	}
}
