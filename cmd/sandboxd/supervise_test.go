package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"golang.org/x/sys/unix"
)

// A container's pid 1 is `sandboxd supervise serve` (tools/deploy/image),
// and its serve is SIGKILLed (the OOM killer) while a session's kernel
// idles frozen (SECURITY.md case 60). The supervisor thaws and kills the
// kernel and exits 137 at once; the pid namespace empties (on cgroup v1 a
// frozen task never dies, and pid 1's exit would wait for it for good);
// the kernel's cgroup is gone and nothing of the worker is left.
func TestSuperviseCleansUpAfterServeIsKilled(t *testing.T) {
	s := startSupervised(t, "supervise-kill")
	frozen := frozenSessionKernel(t, s)
	kernelPids := readPids(t, filepath.Join(frozen, "cgroup.procs"))
	if len(kernelPids) == 0 {
		t.Fatalf("the frozen cgroup %s holds no process", frozen)
	}
	var pidfds []int
	for _, p := range kernelPids {
		fd, err := unix.PidfdOpen(p, 0)
		if err != nil {
			t.Fatalf("pidfd of kernel process %d: %v", p, err)
		}
		defer unix.Close(fd)
		pidfds = append(pidfds, fd)
	}
	pidns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", s.supervisor))
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := syscall.Kill(s.serve, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := s.wait(t, 60*time.Second)
	t.Logf("supervisor exited %d, %v after serve's SIGKILL", code, time.Since(start).Round(time.Millisecond))
	if code != 128+int(syscall.SIGKILL) {
		t.Fatalf("supervisor exit status %d, want 137 (serve's SIGKILL)", code)
	}
	for i, fd := range pidfds {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err != nil || n != 1 {
			t.Errorf("kernel process %d is still alive (poll %d, %v)", kernelPids[i], n, err)
		}
	}
	if left := processesIn(t, pidns); len(left) > 0 {
		t.Errorf("processes %v still in the supervisor's pid namespace %s", left, pidns)
	}
	if _, err := os.Stat(frozen); !os.IsNotExist(err) {
		t.Errorf("the kernel's frozen cgroup %s is still there (%v)", frozen, err)
	}
	if err := nsjailtest.CheckNoLeftovers(s.state, s.cgroup); err != nil {
		t.Error(err)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "worker ended without its drain") || !strings.Contains(logs, "swept orphan sandbox") {
		t.Errorf("the supervisor's log does not show its sweep:\n%s", tail(logs, 4000))
	}
}

// SIGTERM to the supervisor reaches serve, which drains (closing the
// frozen kernel) and exits 0; so does the supervisor, and nothing is left.
func TestSuperviseForwardsSIGTERM(t *testing.T) {
	s := startSupervised(t, "supervise-term")
	frozen := frozenSessionKernel(t, s)
	if err := syscall.Kill(s.supervisor, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := s.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("supervisor exit status %d after SIGTERM, want 0 (serve drained)", code)
	}
	if _, err := os.Stat(frozen); !os.IsNotExist(err) {
		t.Errorf("the kernel's frozen cgroup %s is still there (%v)", frozen, err)
	}
	if err := nsjailtest.CheckNoLeftovers(s.state, s.cgroup); err != nil {
		t.Error(err)
	}
	if logs := s.logs.String(); !strings.Contains(logs, "forwarding signal") || strings.Contains(logs, "worker ended without its drain") {
		t.Errorf("the supervisor's log:\n%s", tail(logs, 4000))
	}
}

// supervised is `unshare --pid --fork --mount-proc sandboxd supervise
// serve`: the supervisor is pid 1 of a new pid namespace with its own
// /proc (as in a container; libcontainer reads /proc by its own pids),
// never the host's.
type supervised struct {
	*worker
	supervisor, serve int // host pids
	exited            bool
}

func startSupervised(t *testing.T, name string) *supervised {
	t.Helper()
	nsjailtest.RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	rootfs := nsjailtest.RuntimeRootfs(t)
	w := startWorkerCmd(t, name, rootfs, func(bin string) *exec.Cmd {
		// --kill-child: if the test ends early, its supervisor goes with unshare.
		return exec.Command("unshare", "--pid", "--kill-child", "--mount-proc", bin, "supervise", "serve")
	}, "EXECUTION_POOL_SIZE=1")
	s := &supervised{worker: w}
	// Registered after the worker's: runs first. A supervisor that could
	// not end (the test failed: a frozen kernel holds its pid namespace)
	// is killed, and what it left is swept as the next serve would.
	t.Cleanup(func() {
		if s.exited {
			return
		}
		w.cmd.Process.Kill()
		if r, err := nsjail.NewRunner(nsjail.Options{StateRoot: w.state, CgroupParent: w.cgroup}); err == nil {
			if _, err := r.Sweep(); err != nil {
				t.Errorf("sweep after the test: %v", err)
			}
		}
		<-w.exited
		s.exited = true
		if err := nsjailtest.CheckNoLeftovers(w.state, w.cgroup); err != nil {
			t.Error(err)
		}
	})
	kids := childPids(t, w.cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("unshare has children %v, want the supervisor alone", kids)
	}
	s.supervisor = kids[0]
	for _, p := range childPids(t, s.supervisor) {
		argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if a := strings.Split(string(argv), "\x00"); len(a) > 1 && a[1] == "serve" {
			s.serve = p
		}
	}
	if s.serve == 0 {
		t.Fatalf("the supervisor %d has no serve child", s.supervisor)
	}
	// The supervisor keeps off the OOM killer where it may lower its
	// score (CAP_SYS_RESOURCE, which this VM's bounding set lacks: then it
	// says so); serve keeps the score it was started with.
	adj := strings.TrimSpace(readFile(t, fmt.Sprintf("/proc/%d/oom_score_adj", s.supervisor)))
	if haveCapSysResource(t) && adj != "-1000" {
		t.Errorf("supervisor's oom_score_adj %s, want -1000", adj)
	}
	if !haveCapSysResource(t) && !strings.Contains(w.logs.String(), "unable to exempt the supervisor from the OOM killer") {
		t.Errorf("supervisor without CAP_SYS_RESOURCE: oom_score_adj %s and no warning", adj)
	}
	if adj := strings.TrimSpace(readFile(t, fmt.Sprintf("/proc/%d/oom_score_adj", s.serve))); adj == "-1000" {
		t.Errorf("serve's oom_score_adj is the supervisor's -1000")
	}
	return s
}

// wait returns unshare's exit status, which is the supervisor's, failing
// the test if it does not come within timeout.
func (s *supervised) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-s.worker.exited:
		s.exited = true
	case <-time.After(timeout):
		t.Fatalf("the supervisor did not exit within %v (a frozen process in its pid namespace?)", timeout)
	}
	return s.cmd.ProcessState.ExitCode()
}

// frozenSessionKernel creates a session, runs one execution in its kernel
// and returns the kernel's frozen cgroup (the freezer hierarchy's on v1).
func frozenSessionKernel(t *testing.T, s *supervised) string {
	t.Helper()
	var sess struct {
		ID string `json:"id"`
	}
	call(t, s.base, "POST", "/v1/sessions", `{"kernel": true}`, http.StatusCreated, &sess)
	var r execAnswer
	call(t, s.base, "POST", "/v1/sessions/"+sess.ID+"/executions", `{"code": "x = 41\nprint(x + 1)"}`, http.StatusOK, &r)
	if r.Status != "succeeded" || r.Stdout != "42\n" {
		t.Fatalf("session execution: %+v", r)
	}
	var frozen []string
	waitFor(t, "a frozen kernel cgroup", func() bool {
		frozen = frozenCgroups(t, s.cgroup)
		return len(frozen) > 0
	})
	if len(frozen) != 1 {
		t.Fatalf("frozen cgroups %v, want the session kernel's alone", frozen)
	}
	return frozen[0]
}

// frozenCgroups lists the frozen sandbox cgroups under the sandboxes'
// parent (v1: freezer.state FROZEN; v2: cgroup.events "frozen 1"): its
// children and, with template forks, the shells' cgroups below each
// template's (tpl-<id>/sbx-<id>); the freezer anchor, which holds no
// process, is not one.
func frozenCgroups(t *testing.T, parent string) []string {
	t.Helper()
	dirs, err := nsjailtest.ParentCgroupDirs(parent)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for len(dirs) > 0 {
		d := dirs[0]
		dirs = dirs[1:]
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), "_") {
				continue
			}
			p := filepath.Join(d, e.Name())
			if strings.HasPrefix(e.Name(), "tpl-") {
				dirs = append(dirs, p) // a template's: its shells are below
				continue
			}
			if b, err := os.ReadFile(filepath.Join(p, "freezer.state")); err == nil && strings.TrimSpace(string(b)) == "FROZEN" {
				out = append(out, p)
			}
			if b, err := os.ReadFile(filepath.Join(p, "cgroup.events")); err == nil && slices.Contains(strings.Split(string(b), "\n"), "frozen 1") {
				out = append(out, p)
			}
		}
	}
	return out
}

// childPids lists pid's children, over all its threads.
func childPids(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// processesIn lists the host's processes whose pid namespace is ns
// (a /proc/PID/ns/pid link's text).
func processesIn(t *testing.T, ns string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && l == ns {
			out = append(out, pid)
		}
	}
	return out
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(readFile(t, path)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%s: %q", path, f)
		}
		out = append(out, n)
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// haveCapSysResource reports whether this process (and so the supervisor
// it starts) has CAP_SYS_RESOURCE.
func haveCapSysResource(t *testing.T) bool {
	t.Helper()
	for _, line := range strings.Split(readFile(t, "/proc/self/status"), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
