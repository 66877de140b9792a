package cgroup

import (
	"path/filepath"
	"reflect"
	"testing"

	occgroups "github.com/opencontainers/cgroups"
)

func TestNewHierarchy(t *testing.T) {
	cases := []struct {
		host string
		want Paths
	}{
		{"dev-hybrid", Paths{
			"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "cpuset": "/sys/fs/cgroup/cpuset",
			"memory":  "/sys/fs/cgroup/memory/process_api/b4efea9fdf31db9d426ac05ecc8f3381",
			"devices": "/sys/fs/cgroup/devices", "freezer": "/sys/fs/cgroup/freezer", "blkio": "/sys/fs/cgroup/blkio",
			"pids": "/sys/fs/cgroup/pids", "name=systemd": "/sys/fs/cgroup/systemd", "": "/sys/fs/cgroup/unified",
		}},
		{"legacy-systemd", Paths{
			"cpu":          "/sys/fs/cgroup/cpu,cpuacct/system.slice/sandboxd.service",
			"cpuacct":      "/sys/fs/cgroup/cpu,cpuacct/system.slice/sandboxd.service",
			"memory":       "/sys/fs/cgroup/memory/system.slice/sandboxd.service",
			"pids":         "/sys/fs/cgroup/pids/system.slice/sandboxd.service",
			"name=systemd": "/sys/fs/cgroup/systemd/system.slice/sandboxd.service",
			"freezer":      "/sys/fs/cgroup/freezer",
		}},
		// Host paths in /proc/self/cgroup, the container's cgroup as the
		// mounts' root: the own cgroup is the mount point itself.
		{"legacy-docker", Paths{
			"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
			"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
		}},
		{"unified-systemd", Paths{"": "/sys/fs/cgroup/system.slice/sandboxd.service"}},
		{"unified-container", Paths{"": "/sys/fs/cgroup"}},
		{"unified-hostns", Paths{"": "/sys/fs/cgroup"}},
	}
	for _, c := range cases {
		mi := openT(t, filepath.Join(hosts, c.host, "mountinfo"))
		mode, err := modeFromMountinfo(mi)
		if err != nil {
			t.Fatal(err)
		}
		mi.Seek(0, 0)
		h, err := NewHierarchy(mode, mi, openT(t, filepath.Join(hosts, c.host, "cgroup")))
		if err != nil {
			t.Fatalf("%s: %v", c.host, err)
		}
		if !reflect.DeepEqual(h.Own, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.host, h.Own, c.want)
		}
	}
}

// Our own dirs are where libcontainer nests a relative Cgroups.Path: it
// resolves them with the same library's GetOwnCgroupPath (v1).
func TestHostMatchesLibcontainer(t *testing.T) {
	h, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode.V2() {
		t.Skip("v1 comparison; on v2 libcontainer nests under the parent of /proc/self/cgroup (see Hierarchy.base)")
	}
	for ctrl, dir := range h.Own {
		want, err := occgroups.GetOwnCgroupPath(ctrl)
		if err != nil {
			t.Errorf("%q: libcontainer: %v", ctrl, err)
			continue
		}
		if ctrl == "" && want != dir {
			// libcontainer puts hybrid cgroup2 dirs at the unified mount's
			// root, whatever our own path is; equal when that is "/".
			t.Logf("hybrid cgroup2: libcontainer %s, ours %s", want, dir)
			continue
		}
		if want != dir {
			t.Errorf("%q: ours %s, libcontainer %s", ctrl, dir, want)
		}
	}
}

func TestParentDirs(t *testing.T) {
	v1 := &Hierarchy{Mode: Legacy, Own: Paths{"memory": "/m/own", "cpu": "/c,a/own", "cpuacct": "/c,a/own"}}
	got, err := v1.ParentDirs("sandboxd")
	if err != nil {
		t.Fatal(err)
	}
	want := Paths{"memory": "/m/own/sandboxd", "cpu": "/c,a/own/sandboxd", "cpuacct": "/c,a/own/sandboxd"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("v1: %v, want %v", got, want)
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/../../x", "/abs", "a//b", "supervisor", "supervisor/x"} {
		if _, err := v1.ParentDirs(bad); err == nil {
			t.Errorf("parent %q accepted", bad)
		}
	}
	v2 := &Hierarchy{Mode: Unified, Own: Paths{"": "/sys/fs/cgroup/system.slice/sandboxd.service"}}
	if _, err := v2.ParentDirs("sandboxd"); err == nil {
		t.Error("v2 before delegation: libcontainer would nest beside the worker's cgroup; want an error")
	}
	v2.Own[""] += "/supervisor"
	got, err = v2.ParentDirs("sandboxd")
	if want := "/sys/fs/cgroup/system.slice/sandboxd.service/sandboxd"; err != nil || got[""] != want || len(got) != 1 {
		t.Errorf("v2 delegated: %v, %v; want %s", got, err, want)
	}
}

// Paths.V2 is the one test of whether a cgroup's paths are v2: the cgroup2
// dir alone, as libcontainer's fs2 manager reports it.
func TestPathsV2(t *testing.T) {
	for _, c := range []struct {
		name  string
		paths Paths
		dir   string
		v2    bool
	}{
		{"unified", Paths{"": "/sys/fs/cgroup/s/sbx"}, "/sys/fs/cgroup/s/sbx", true},
		{"hybrid", Paths{"": "/sys/fs/cgroup/unified/s/sbx", "memory": "/sys/fs/cgroup/memory/s/sbx"}, "", false},
		{"legacy", Paths{"memory": "/sys/fs/cgroup/memory/s/sbx", "cpu": "/sys/fs/cgroup/cpu/s/sbx"}, "", false},
		{"empty cgroup2 dir", Paths{"": ""}, "", false},
		{"none", nil, "", false},
	} {
		dir, ok := c.paths.V2()
		if ok != c.v2 || (ok && dir != c.dir) {
			t.Errorf("%s: V2() = %q, %v; want %q, %v", c.name, dir, ok, c.dir, c.v2)
		}
	}
}
