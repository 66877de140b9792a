package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// buildCLI builds the real sandboxd binary once per test.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandboxd")
	out, err := exec.Command("go", "build", "-tags", "seccomp", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func TestRunJSON(t *testing.T) {
	nsjailtest.RequireRoot(t)
	bin := buildCLI(t)
	rootfs := nsjailtest.BusyboxRootfs(t)
	cmd := exec.Command(bin, "run", "--rootfs", rootfs, "--memory", "64MiB", "--pids", "16", "--timeout", "5s", "--json",
		"--", "sh", "-c", "echo out; echo err >&2; exit 4")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("a command that ran must exit 0 (its own exit code is in the result): %v", err)
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("stdout is not exactly one JSON object: %v\n%s", err, out)
	}
	if res["status"] != "failed" || res["exit_code"] != float64(4) || res["stdout"] != "out\n" || res["stderr"] != "err\n" {
		t.Fatalf("result: %v", res)
	}
	for _, k := range []string{"limits_hit", "stdout_truncated", "stderr_truncated", "usage", "started_at", "finished_at"} {
		if _, ok := res[k]; !ok {
			t.Errorf("result lacks %q", k)
		}
	}
}

// The sandbox is removed in the background once its result is known; the
// CLI must let that finish before it exits (a race: several runs make a
// missed wait show up).
func TestRunLeavesNothing(t *testing.T) {
	nsjailtest.RequireRoot(t)
	bin := buildCLI(t)
	rootfs := nsjailtest.BusyboxRootfs(t)
	dirs, err := nsjailtest.ParentCgroupDirs(runCgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		out, err := exec.Command(bin, "run", "--rootfs", rootfs, "--json", "--", "true").Output()
		if err != nil {
			t.Fatal(err)
		}
		var res struct{ ID string }
		if err := json.Unmarshal(out, &res); err != nil || res.ID == "" {
			t.Fatalf("result %s: %v", out, err)
		}
		if _, err := os.Stat(filepath.Join(runStateRoot, res.ID)); !os.IsNotExist(err) {
			t.Errorf("state directory of %s left behind: %v", res.ID, err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, res.ID)); !os.IsNotExist(err) {
				t.Errorf("cgroup %s left behind", filepath.Join(d, res.ID))
			}
		}
	}
}

func TestRunOwnErrors(t *testing.T) {
	bin := buildCLI(t)
	for name, args := range map[string][]string{
		"no command":      {"run", "--rootfs", "/"},
		"no rootfs":       {"run", "--", "true"},
		"missing rootfs":  {"run", "--rootfs", "/nonexistent", "--", "true"},
		"bad memory":      {"run", "--rootfs", "/", "--memory", "lots", "--", "true"},
		"bad timeout":     {"run", "--rootfs", "/", "--timeout", "-1s", "--", "true"},
		"unknown flag":    {"run", "--rootfs", "/", "--bogus", "--", "true"},
		"unknown command": {"frobnicate"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("%s: want a non-zero exit, got %v", name, err)
			continue
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "sandboxd") {
			t.Errorf("%s: want one line starting with sandboxd, got %q", name, out)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "256MiB": 256 << 20, "2GiB": 2 << 30, "64KiB": 64 << 10, "1G": 1 << 30} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-5", "12XB", "MiB", "1.5GiB", "99999999999999GiB"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}
