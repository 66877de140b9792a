package cgroup

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
		got, err := ModeFromMountinfo(openT(t, filepath.Join(hosts, host, "mountinfo")))
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
	if _, err := ModeFromMountinfo(strings.NewReader("garbage\n")); err == nil {
		t.Error("garbage mountinfo: no error")
	}
}

// DetectMode (containerd's statfs) and the mountinfo decision agree here.
func TestDetectModeMatchesMountinfo(t *testing.T) {
	want, err := ModeFromMountinfo(openT(t, "/proc/self/mountinfo"))
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

func TestOwnPaths(t *testing.T) {
	own, err := OwnPaths()
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
