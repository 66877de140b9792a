package cgroup

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

const hosts = "../testdata/cgroup/hosts"

func openT(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestModeFromMountinfo(t *testing.T) {
	for host, want := range map[string]Mode{
		"dev-hybrid":        Hybrid, // this VM: v1 + a cgroup2 mount holding only hugetlb
		"legacy-systemd":    Legacy,
		"legacy-docker":     Legacy,
		"unified-systemd":   Unified,
		"unified-container": Unified,
		"unified-hostns":    Unified,
		"none":              Unavailable,
	} {
		got, err := modeFromMountinfo(openT(t, filepath.Join(hosts, host, "mountinfo")))
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		if got != want {
			t.Errorf("%s: mode %v, want %v", host, got, want)
		}
		if got.V2() != (want == Unified) {
			t.Errorf("%s: V2() = %v", host, got.V2())
		}
	}
	if _, err := modeFromMountinfo(strings.NewReader("garbage\n")); err == nil {
		t.Error("garbage mountinfo: no error")
	}
}

// DetectMode (containerd's statfs) and the mountinfo decision agree here.
func TestDetectModeMatchesMountinfo(t *testing.T) {
	want, err := modeFromMountinfo(openT(t, "/proc/self/mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	if got := DetectMode(); got != want {
		t.Errorf("DetectMode() = %v, mountinfo says %v", got, want)
	}
	t.Logf("this host: %v", want)
}

func TestParseProcCgroup(t *testing.T) {
	got, err := ParseProcCgroup(openT(t, filepath.Join(hosts, "legacy-systemd", "cgroup")))
	if err != nil {
		t.Fatal(err)
	}
	svc := "/system.slice/sandboxd.service"
	want := Paths{"freezer": "/", "pids": svc, "memory": svc, "cpu": svc, "cpuacct": svc, "name=systemd": svc}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("v1: %v, want %v", got, want)
	}
	got, err = ParseProcCgroup(openT(t, filepath.Join(hosts, "unified-systemd", "cgroup")))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Paths{"": svc}); !reflect.DeepEqual(got, want) {
		t.Errorf("v2: %v, want %v", got, want)
	}
	for _, bad := range []string{"garbage\n", "4:memory:relative/path\n"} {
		if _, err := ParseProcCgroup(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The host's own /proc/thread-self/cgroup parses to what its mode needs.
func TestParseOwnProcCgroup(t *testing.T) {
	own, err := ParseProcCgroup(openT(t, "/proc/thread-self/cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	if DetectMode() == Unified {
		if len(own) != 1 || own[""] == "" {
			t.Errorf("v2 host: %v, want only \"\"", own)
		}
	} else if own["memory"] == "" || own["pids"] == "" {
		t.Errorf("v1 host: %v lacks memory or pids", own)
	}
}

// modeFromMountinfo decides the mode from a /proc/<pid>/mountinfo text, the
// same way DetectMode does from statfs (the tests' oracle for it, and how
// they read the recorded hosts): cgroup2 at /sys/fs/cgroup is Unified;
// v1 hierarchies with any cgroup2 mount beside them are Hybrid (whether or
// not it holds controllers); v1 alone is Legacy.
func modeFromMountinfo(r io.Reader) (Mode, error) {
	mounts, err := mountinfo.GetMountsFromReader(r, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return Unavailable, fmt.Errorf("parse mountinfo: %w", err)
	}
	var v1, v2 bool
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			if m.Mountpoint == unifiedMountpoint {
				return Unified, nil
			}
			v2 = true
		} else {
			v1 = true
		}
	}
	switch {
	case v1 && v2:
		return Hybrid, nil
	case v1:
		return Legacy, nil
	}
	// Nothing, or cgroup2 only somewhere other than /sys/fs/cgroup, where
	// libcontainer would not look either.
	return Unavailable, nil
}
