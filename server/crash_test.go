package server

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// The crash test's worker has a state root and cgroup parent of its own: the
// sweep treats everything under them as orphaned, so it must never see the
// sandboxes of other tests.
var (
	crashStateRoot    = fmt.Sprintf("/run/sandboxd-test-%d/crash-state", os.Getpid())
	crashCgroupParent = fmt.Sprintf("sandboxd-test-%d-crash", os.Getpid())
)

const crashWorkerEnv = "SANDBOXD_CRASH_WORKER"

// crashWorker is this test binary re-executed as a worker: it serves one
// long execution through the API, reports "started" once the sandbox runs,
// and waits to be SIGKILLed.
func crashWorker() {
	fail := func(err error) { fmt.Println("error", err); os.Exit(1) }
	cfg := DefaultConfig()
	cfg.WorkRoot = os.Getenv("CRASH_WORK_ROOT")
	cfg.StateRoot = os.Getenv("CRASH_STATE")
	cfg.PoolSize = 0
	rootfs := os.Getenv("CRASH_ROOTFS")
	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: os.Getenv("CRASH_CGROUP"), Logger: quietLog})
	if err != nil {
		fail(err)
	}
	srv, err := New(Deps{Config: cfg, Sandbox: r, Runner: r, Logger: quietLog,
		ResolveRootfs: func(context.Context) (string, error) { return rootfs, nil }})
	if err != nil {
		fail(err)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		fail(err)
	}
	go newRecorder(srv, "POST", "/v1/executions", `{"code": "echo x > /workspace/output/partial; sleep 1006"}`)
	for len(nsjailtest.ProcessesMatching("sleep 1006")) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("started")
	select {}
}

// SECURITY.md case 22: the worker is SIGKILLed mid-execution; the restart's
// sweep (SweepOrphans, what `sandboxd serve` runs first) removes the orphan
// sandbox (processes, cgroups, state), its workspace and its tmpfs, and the
// new worker serves.
func TestRestartAfterSIGKILLSweepsOrphans(t *testing.T) {
	nsjailtest.RequireRoot(t)
	work := filepath.Join(t.TempDir(), "work")
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"=1", "CRASH_STATE="+crashStateRoot, "CRASH_CGROUP="+crashCgroupParent,
		"CRASH_ROOTFS="+shellRootfs(t), "CRASH_WORK_ROOT="+work)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "started\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("crash worker: %q %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	// What the killed worker left: a workspace on its tmpfs, a state
	// directory, the sandbox's processes (their cgroup is nested in the
	// worker's: systemd's KillMode=control-group would end them; here only
	// the sweep does).
	if m := mountsUnder(work); len(m) != 1 {
		t.Fatalf("expected the orphan workspace mount, got %v", m)
	}
	if entries, _ := os.ReadDir(crashStateRoot); len(entries) != 1 {
		t.Fatalf("expected one orphan state dir, got %d", len(entries))
	}
	if len(nsjailtest.ProcessesMatching("sleep 1006")) == 0 {
		t.Fatal("the orphan sandbox is not running (nothing to sweep)")
	}

	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: crashStateRoot, CgroupParent: crashCgroupParent, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := SweepOrphans(r, work, quietLog); err != nil {
		t.Fatal(err)
	}
	wantNoProcess(t, "sleep 1006")
	if m := mountsUnder(work); len(m) > 0 {
		t.Fatalf("mounts left after the sweep: %v", m)
	}
	if entries, _ := os.ReadDir(work); len(entries) > 0 {
		t.Fatalf("workspaces left after the sweep: %v", entries)
	}
	if err := nsjailtest.CheckNoLeftovers(crashStateRoot, crashCgroupParent); err != nil {
		t.Fatal(err)
	}
	// The restarted worker serves.
	cfg := DefaultConfig()
	cfg.WorkRoot, cfg.StateRoot, cfg.PoolSize = work, crashStateRoot, 0
	rootfs := shellRootfs(t)
	srv, err := New(Deps{Config: cfg, Sandbox: r, Runner: r, Logger: quietLog,
		ResolveRootfs: func(context.Context) (string, error) { return rootfs, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(srv, "POST", "/v1/executions", `{"code": "ls /workspace/output; echo fresh"}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"stdout":"artifacts\nfresh\n"`) {
		t.Fatalf("after restart: %d %s", rec.Code, rec.Body)
	}
	srv.Drain(context.Background())
	if err := nsjailtest.CheckNoLeftovers(crashStateRoot, crashCgroupParent); err != nil {
		t.Fatal(err)
	}
}
