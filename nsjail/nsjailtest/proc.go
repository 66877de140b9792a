package nsjailtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/seccomp"
)

// Fataler is what the helpers below need of a test (testing.TB has it, as
// has a lab driven outside a test).
type Fataler interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
}

// ProcStatus is field key of /proc/<pid>/status, trimmed.
func ProcStatus(t Fataler, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in the status of %d", key, pid)
	return ""
}

// PPid is pid's parent.
func PPid(t Fataler, pid int) int {
	t.Helper()
	p, err := strconv.Atoi(ProcStatus(t, pid, "PPid"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// PidfdPid is the pid of the process f (a pidfd of this process) refers to,
// from its fdinfo.
func PidfdPid(t Fataler, f *os.File) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no Pid in fdinfo: %s", b)
	return 0
}

// CgroupProcs lists the pids in a cgroup's directories, each once.
func CgroupProcs(t Fataler, paths cgroup.Paths) []string {
	t.Helper()
	var out []string
	for _, d := range paths {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, p := range strings.Fields(string(b)) {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// KeyctlProfile is the default seccomp profile plus keyctl, compiled for
// a Runner: for tests that read a sandbox's session keyring, which the
// real profile denies (SECURITY.md case 9).
func KeyctlProfile(t Fataler) *configs.Seccomp {
	t.Helper()
	return compile(t, keyctlProfile())
}

// KeyctlTemplateProfile is the template profile over KeyctlProfile's
// (seccomp.TemplateOf), for a Runner with KeyctlProfile that starts
// templates (Options.TemplateSeccomp).
func KeyctlTemplateProfile(t Fataler) *configs.Seccomp {
	t.Helper()
	return compile(t, seccomp.TemplateOf(keyctlProfile()))
}

func keyctlProfile() *seccomp.Profile {
	p := seccomp.Default()
	for i := range p.Denied {
		p.Denied[i].Names = slices.DeleteFunc(p.Denied[i].Names, func(n string) bool { return n == "keyctl" })
	}
	p.Rules = append(p.Rules, seccomp.Rule{Names: []string{"keyctl"}, Action: seccomp.ActAllow, Group: "test",
		Reason: "the test reads the sandbox's session keyring"})
	return p
}

func compile(t Fataler, p *seccomp.Profile) *configs.Seccomp {
	t.Helper()
	filter, err := p.Libcontainer()
	if err != nil {
		t.Fatal(err)
	}
	return filter
}

// ForkViewDifference is the one way the inside view of a template fork's
// code differs from a cold sandbox's (server/warmpool/TEMPLATE.md section
// 6, SECURITY.md case 63): G holds the template's seccomp filter under the
// execution filter it loaded, a cold process the execution filter alone.
// Key: the view's field (/proc/self/status Seccomp_filters); value: what a
// cold run and a fork read.
var ForkViewDifference = map[string][2]string{"seccomp_filters": {"1", "2"}}

// CPUWeight is the CPU weight of the cgroup at paths as its files say it
// (v1 cpu.shares, v2 cpu.weight), and whether that is the background
// weight (cgroup.BackgroundShares, cgroup.BackgroundWeight) or the
// foreground one; any other value, or no such file, fails the test.
func CPUWeight(t Fataler, paths cgroup.Paths) (weight int, background bool) {
	t.Helper()
	weight, background, err := ReadCPUWeight(paths)
	if err != nil {
		t.Fatal(err)
	}
	return weight, background
}

// ReadCPUWeight is CPUWeight's reading, which fails (an fs.ErrNotExist or
// ENODEV for a cgroup removed meanwhile) instead of the test.
func ReadCPUWeight(paths cgroup.Paths) (weight int, background bool, err error) {
	file, bg, fg := filepath.Join(paths["cpu"], "cpu.shares"), cgroup.BackgroundShares, cgroup.ForegroundShares
	if dir, v2 := paths.V2(); v2 {
		file, bg, fg = filepath.Join(dir, "cpu.weight"), cgroup.BackgroundWeight, cgroup.ForegroundWeight
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false, err
	}
	w, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || (w != bg && w != fg) {
		return 0, false, fmt.Errorf("%s: %q is neither the background weight %d nor the foreground %d (%v)", file, b, bg, fg, err)
	}
	return w, w == bg, nil
}
