package cgroup

import (
	"os"
	"path/filepath"
	"testing"

	occgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
)

// The contract with nsjail, checked against libcontainer's own cgroup
// manager (no container needed): for the relative Cgroups.Path
// "<parent>/<id>" it creates exactly <ParentDirs(parent)>/<id> in every
// hierarchy, ReadStats and KillAll take its GetPaths() as they are, and
// SweepOrphans removes what it left behind.
func TestLibcontainerContract(t *testing.T) {
	h := realHost(t)
	if err := h.PrepareParent(testParent); err != nil {
		t.Fatal(err)
	}
	parents, err := h.ParentDirs(testParent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range uniqueDirs(parents) {
			os.Remove(p)
		}
	})
	pids := int64(16)
	res := &occgroups.Resources{
		Memory: 64 << 20, MemorySwap: 64 << 20, PidsLimit: &pids,
		CpuQuota: 50000, CpuPeriod: 100000, SkipDevices: true,
	}
	m, err := manager.New(&occgroups.Cgroup{Path: filepath.Join(testParent, "lc"), Resources: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(-1); err != nil { // create, join nothing
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy() })
	if err := m.Set(res); err != nil {
		t.Fatal(err)
	}
	paths := m.GetPaths()
	for c, d := range paths {
		want, ok := parents[c]
		if !ok {
			t.Errorf("libcontainer used hierarchy %q that we do not sweep (%s)", c, d)
			continue
		}
		if d != filepath.Join(want, "lc") {
			t.Errorf("%q: libcontainer %s, ours %s/lc", c, d, want)
		}
	}
	if len(paths) == 0 {
		t.Fatal("libcontainer created no cgroup")
	}

	var join []string // SkipDevices: the devices path is reported, not created
	for _, d := range uniqueDirs(paths) {
		if _, err := os.Stat(d); err == nil {
			join = append(join, d)
		}
	}
	cmd := startIn(t, join, `exec sleep 1000`)
	s, err := ReadStats(paths)
	if err != nil {
		t.Fatal(err)
	}
	if s.PidsCurrent != 1 || s.MemoryPeakBytes == 0 {
		t.Errorf("stats of a cgroup holding one sleep: %+v", s)
	}
	removed, err := h.SweepOrphans(testParent, func(id string) bool { return id == "lc" }, nil)
	if err != nil || len(removed) != 1 || removed[0] != "lc" {
		t.Fatalf("sweep: %v, %v; want [lc]", removed, err)
	}
	cmd.Wait()
	for c, d := range paths {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%q: %s still there after the sweep", c, d)
		}
	}
	if err := m.Destroy(); err != nil {
		t.Errorf("libcontainer Destroy after the sweep: %v", err)
	}
}
