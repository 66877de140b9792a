package nsjail_test

import (
	"bufio"
	"context"
	"fmt"
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
)

// crashyWorker is this test binary re-executed as a worker that starts one
// sandbox, reports its id and then waits to be SIGKILLed.
func crashyWorker() {
	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: os.Getenv("CRASHY_STATE"), CgroupParent: os.Getenv("CRASHY_CGROUP")})
	if err != nil {
		panic(err)
	}
	sb, err := r.Start(nsjail.Spec{Rootfs: os.Getenv("CRASHY_ROOTFS"), Args: []string{"sleep", "2900"}})
	if err != nil {
		panic(err)
	}
	if os.Getenv("CRASHY_FREEZE") == "1" {
		// A session kernel idling between executions.
		if err := sb.Freeze(); err != nil {
			panic(err)
		}
	}
	os.Stdout.WriteString("started " + sb.ID() + "\n")
	sb.Wait(context.Background())
}

// SECURITY.md case 22: the worker is SIGKILLed mid-execution; its sandbox dies
// with it (parent-death signal) and Sweep on restart removes every state
// directory and cgroup it left.
func TestSweepAfterWorkerCrash(t *testing.T) {
	testSweepAfterWorkerCrash(t, false)
}

// SECURITY.md case 47: the same with the sandbox frozen (a session kernel
// between executions), whose killed processes die only once thawed.
func TestSweepAfterWorkerCrashFrozen(t *testing.T) {
	testSweepAfterWorkerCrash(t, true)
}

func testSweepAfterWorkerCrash(t *testing.T, frozen bool) {
	nsjailtest.RequireRoot(t)
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CRASHY_WORKER=1", "CRASHY_STATE="+testStateRoot,
		"CRASHY_CGROUP="+testCgroupParent, "CRASHY_ROOTFS="+nsjailtest.BusyboxRootfs(t),
		"CRASHY_FREEZE="+map[bool]string{true: "1", false: "0"}[frozen])
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "started ") {
		_ = cmd.Process.Kill()
		t.Fatalf("crashy worker: %q %v", line, err)
	}
	id := strings.TrimSpace(strings.TrimPrefix(line, "started "))
	if _, err := os.Stat(testStateRoot + "/" + id); err != nil {
		t.Fatalf("no state dir for the running sandbox: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	// A parent-death signal does not reach the sandbox's init (libcontainer's
	// nsexec clones it twice and the setting is not inherited), so the
	// sandbox is still running here: on a real deployment systemd's
	// KillMode=control-group ends it with the worker (its cgroup is nested in
	// the worker's), and the sweep on restart ends it otherwise.
	r := newRunner(t)
	removed, err := r.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != id {
		t.Fatalf("swept %v, want [%s]", removed, id)
	}
	if pids := nsjailtest.ProcessesMatching("sleep 2900"); len(pids) > 0 {
		t.Fatalf("the orphan sandbox's processes survived the sweep: %v", pids)
	}
	r.WaitForCleanup()
	if err := nsjailtest.CheckNoLeftovers(testStateRoot, testCgroupParent); err != nil {
		t.Fatal(err)
	}
}

func TestClaimIsExclusive(t *testing.T) {
	dir := t.TempDir()
	r1 := newRunnerAt(t, dir+"/state", testCgroupParent+"-claim")
	r2 := newRunnerAt(t, dir+"/state", testCgroupParent+"-claim")
	release, err := r1.Claim()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Claim(); err == nil {
		t.Fatal("a second runner claimed the same state root and cgroup parent")
	}
	r3 := newRunnerAt(t, dir+"/other-state", testCgroupParent+"-claim")
	if _, err := r3.Claim(); err == nil {
		t.Fatal("a second runner claimed the same cgroup parent")
	}
	release()
	release2, err := r2.Claim()
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	release2()
}

func newRunnerAt(t *testing.T, stateRoot, cgroupParent string) *nsjail.Runner {
	t.Helper()
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: stateRoot, CgroupParent: cgroupParent, Logger: quietLog})
	t.Cleanup(func() {
		dirs, _ := nsjailtest.ParentCgroupDirs(cgroupParent)
		for _, d := range dirs {
			os.Remove(d)
		}
	})
	return r
}

// SECURITY.md case 29: the sweep removes only what carries sandboxd's
// marker. Under the same state root and cgroup parent, a running container
// without the marker (a sandbox whose marker the test removed: to the sweep,
// someone else's libcontainer container), a foreign cgroup with a process in
// it and a stray file all survive; a marked half-started sandbox (state
// directory without state.json, its cgroup holding a process) is removed.
func TestSweepRemovesOnlyMarked(t *testing.T) {
	r := newRunner(t)
	foreign, err := r.Start(nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(t), Args: []string{"sleep", "3001"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		foreign.Wait(ctx)
		r.WaitForCleanup()
	}()
	if err := os.Remove(filepath.Join(testStateRoot, foreign.ID()+".sandboxd-owner")); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(testStateRoot, "not-a-sandbox")
	if err := os.WriteFile(stray, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(stray)

	dirs, err := nsjailtest.ParentCgroupDirs(testCgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	foreignCg := cgroupWithProcess(t, dirs, "foreign-cgroup", "sleep 3002")
	const half = "sbx-half-started"
	if err := os.MkdirAll(filepath.Join(testStateRoot, half), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(testStateRoot, half, "sandboxd-owner"), []byte("sandboxd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cgroupWithProcess(t, dirs, half, "sleep 3003")

	removed, err := newRunner(t).Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{half}) {
		t.Errorf("swept %v, want only [%s]", removed, half)
	}
	if len(nsjailtest.ProcessesMatching("sleep 3003")) > 0 {
		t.Errorf("the half-started sandbox's process was not killed")
	}
	if _, err := os.Stat(filepath.Join(testStateRoot, half)); !os.IsNotExist(err) {
		t.Errorf("the half-started sandbox's state directory is still there: %v", err)
	}
	for name, pat := range map[string]string{"unmarked container": "sleep 3001", "foreign cgroup": "sleep 3002"} {
		if len(nsjailtest.ProcessesMatching(pat)) == 0 {
			t.Errorf("the %s's process was killed", name)
		}
	}
	if _, err := os.Stat(filepath.Join(testStateRoot, foreign.ID(), "state.json")); err != nil {
		t.Errorf("the unmarked container's state is gone: %v", err)
	}
	if _, err := os.Stat(stray); err != nil {
		t.Errorf("a stray file under the state root is gone: %v", err)
	}
	_ = foreignCg.Process.Kill()
	_ = foreignCg.Wait()
}

// cgroupWithProcess creates <dir>/<name> in every parent cgroup directory
// and starts sh -c "exec <command>" in one of them (not cpuset, which v1
// leaves empty). The cgroups are removed at cleanup, after the process.
func cgroupWithProcess(t *testing.T, parents []string, name, command string) *exec.Cmd {
	t.Helper()
	var join string
	var made []string
	for _, p := range parents {
		d := filepath.Join(p, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		made = append(made, d)
		if join == "" && !strings.Contains(p, "cpuset") {
			join = d
		}
	}
	cmd := exec.Command("sh", "-c", fmt.Sprintf("echo $$ > %q/cgroup.procs && exec %s", join, command))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, d := range made {
			_ = os.Remove(d)
		}
	})
	for range 500 {
		if procs, _ := os.ReadFile(filepath.Join(join, "cgroup.procs")); strings.Contains(string(procs), strconv.Itoa(cmd.Process.Pid)) {
			return cmd
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not join %s", command, join)
	return nil
}

// SECURITY.md case 29: the owner marker exists before the state directory
// (a sibling file: libcontainer refuses an existing directory) and goes after
// it, so a worker killed between libcontainer's Create and anything else
// leaves a marked directory, which the sweep removes, and a worker killed
// before Create or after a removal leaves a marker alone, which the sweep
// removes too. An unmarked directory is still left alone.
func TestSweepMarkerOutlivesNothing(t *testing.T) {
	r := newRunner(t)
	sb, err := r.Start(nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(t), Args: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(testStateRoot, sb.ID()+".sandboxd-owner")
	if fi, err := os.Lstat(marker); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("a started sandbox's owner marker: %v", err)
	}
	sb.Wait(context.Background())
	r.WaitForCleanup()
	if _, err := os.Lstat(marker); !os.IsNotExist(err) {
		t.Fatalf("the marker outlived its sandbox: %v", err)
	}

	const created, alone, foreign = "sbx-killed-after-create", "sbx-killed-before-create", "sbx-not-ours"
	for _, d := range []string{created, foreign} {
		if err := os.Mkdir(filepath.Join(testStateRoot, d), 0o711); err != nil { // as libcontainer.Create leaves it
			t.Fatal(err)
		}
	}
	for _, m := range []string{created, alone} {
		if err := os.WriteFile(filepath.Join(testStateRoot, m+".sandboxd-owner"), []byte("sandboxd\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	defer os.Remove(filepath.Join(testStateRoot, foreign))
	removed, err := newRunner(t).Sweep()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if !slices.Equal(removed, []string{created, alone}) {
		t.Errorf("swept %v, want [%s %s]", removed, created, alone)
	}
	entries, _ := os.ReadDir(testStateRoot)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, []string{foreign}) {
		t.Errorf("left under the state root: %v, want only the unmarked %s", left, foreign)
	}
}
