package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
)

// The crash test's worker has a state root and cgroup parent of its own: the
// sweep treats everything under them as orphaned, so it must never see the
// sandboxes of other tests.
var (
	crashStateRoot    = fmt.Sprintf("/run/sandboxd-test-%d/crash-state", os.Getpid())
	crashCgroupParent = fmt.Sprintf("sandboxd-test-%d-crash", os.Getpid())
)

const crashWorkerEnv = "SANDBOXD_CRASH_WORKER"

// The crash worker's executions: one finished before the crash, one running
// when it comes.
const (
	crashDoneBody    = `{"id": "done-before-crash", "code": "echo kept; printf abc > /workspace/output/artifacts/a.txt"}`
	crashRunningBody = `{"id": "running-at-crash", "code": "echo x > /workspace/output/partial; sleep 1006"}`
)

// crashWorker is this test binary re-executed as a worker: it serves one
// execution to the end and then a long one, reports "started" once the
// latter's sandbox runs, and waits to be SIGKILLed.
func crashWorker() {
	fail := func(err error) { fmt.Println("error", err); os.Exit(1) }
	cfg := config.Default()
	cfg.WorkRoot = os.Getenv("CRASH_WORK_ROOT")
	cfg.ResultsDir = os.Getenv("CRASH_RESULTS")
	cfg.SessionsDir = filepath.Join(cfg.WorkRoot, "..", "sessions")
	cfg.StateRoot = os.Getenv("CRASH_STATE")
	cfg.PoolSize = 0
	rootfs := os.Getenv("CRASH_ROOTFS")
	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: cfg.StateRoot, CgroupParent: os.Getenv("CRASH_CGROUP"), Logger: quietLog})
	if err != nil {
		fail(err)
	}
	srv, err := New(Deps{Config: cfg, Sandbox: r, Logger: quietLog,
		ResolveRootfs: dirRootfs(rootfs)})
	if err != nil {
		fail(err)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		fail(err)
	}
	if rec := newRecorder(srv, "POST", "/v1/executions", crashDoneBody); rec.Code != 200 {
		fail(fmt.Errorf("first execution: %d %s", rec.Code, rec.Body))
	}
	go newRecorder(srv, "POST", "/v1/executions", crashRunningBody)
	for len(nsjailtest.ProcessesMatching("sleep 1006")) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("started")
	select {}
}

// SECURITY.md case 22: the worker is SIGKILLed mid-execution; the restart's
// sweep (SweepOrphans, what `sandboxd serve` runs first) removes the orphan
// sandbox (processes, cgroups, state), its workspace and its tmpfs, and the
// new worker serves. The result finished before the crash survives it, and
// the execution it cut short is answered interrupted, also to a retry of
// its POST (the code does not run again).
func TestRestartAfterSIGKILLSweepsOrphans(t *testing.T) {
	nsjailtest.RequireRoot(t)
	work := filepath.Join(t.TempDir(), "work")
	resultsDir := filepath.Join(t.TempDir(), "results")
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"=1", "CRASH_STATE="+crashStateRoot, "CRASH_CGROUP="+crashCgroupParent,
		"CRASH_ROOTFS="+shellRootfs(t), "CRASH_WORK_ROOT="+work, "CRASH_RESULTS="+resultsDir)
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
	// Its spare session volumes, still mounted: the restart removes them.
	sessionsDir := filepath.Join(work, "..", "sessions")
	spares, _ := filepath.Glob(filepath.Join(sessionsDir, ".spare-*"))
	t.Logf("the killed worker left %d spare session volumes", len(spares))

	// What the killed worker left: a workspace on its tmpfs, a state
	// directory, the sandbox's processes (their cgroup is nested in the
	// worker's: systemd's KillMode=control-group would end them; here only
	// the sweep does).
	if m := mountsUnder(work); len(m) != 1 {
		t.Fatalf("expected the orphan workspace mount, got %v", m)
	}
	if entries, _ := os.ReadDir(crashStateRoot); len(entries) != 2 || !entries[0].IsDir() || entries[1].Name() != entries[0].Name()+".sandboxd-owner" {
		t.Fatalf("expected one orphan state dir and its owner marker, got %v", entries)
	}
	if len(nsjailtest.ProcessesMatching("sleep 1006")) == 0 {
		t.Fatal("the orphan sandbox is not running (nothing to sweep)")
	}

	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: crashStateRoot, CgroupParent: crashCgroupParent, Logger: quietLog})
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
	cfg := config.Default()
	cfg.WorkRoot, cfg.ResultsDir, cfg.StateRoot, cfg.PoolSize = work, resultsDir, crashStateRoot, 0
	cfg.SessionsDir = sessionsDir
	rootfs := shellRootfs(t)
	cs := &countingSandbox{Runner: r}
	srv, err := New(Deps{Config: cfg, Sandbox: cs, Logger: quietLog,
		ResolveRootfs: dirRootfs(rootfs)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// The stored results are answered even before the rootfs is ready.
	var done ExecutionResponse
	if rec := newRecorder(srv, "GET", "/v1/executions/done-before-crash", ""); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &done) != nil ||
		done.Status != "succeeded" || done.Stdout != "kept\n" || len(done.Artifacts) != 1 || done.Artifacts[0].ContentBase64 != b64("abc") {
		t.Fatalf("result finished before the crash: %d %s", rec.Code, rec.Body)
	}
	var cut ExecutionResponse
	rec := newRecorder(srv, "GET", "/v1/executions/running-at-crash", "")
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &cut) != nil || cut.Status != StatusInterrupted ||
		cut.Error.String() != interruptedError || cut.Type != "dynamic" || cut.Policy.TimeoutMS != cfg.DynamicTimeoutMS ||
		cut.FinishedAt.Before(cut.StartedAt) || len(cut.Artifacts) != 0 {
		t.Fatalf("execution running at the crash: %d %s", rec.Code, rec.Body)
	}
	if err := srv.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, sp := range spares {
		if _, err := os.Lstat(sp); !os.IsNotExist(err) {
			t.Fatalf("the killed worker's spare volume %s after the restart: %v", sp, err)
		}
	}
	if rec := newRecorder(srv, "POST", "/v1/executions", crashRunningBody); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"status":"interrupted"`) {
		t.Fatalf("retried POST of the interrupted execution: %d %s", rec.Code, rec.Body)
	}
	if rec := newRecorder(srv, "POST", "/v1/executions", `{"id": "running-at-crash", "code": "echo other"}`); rec.Code != http.StatusConflict {
		t.Fatalf("another request with the interrupted id: %d %s", rec.Code, rec.Body)
	}
	if n := cs.started.Load(); n != 0 {
		t.Fatalf("%d sandboxes started for retries", n)
	}
	rec = newRecorder(srv, "POST", "/v1/executions", `{"code": "ls /workspace/output; echo fresh"}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"stdout":"artifacts\nfresh\n"`) {
		t.Fatalf("after restart: %d %s", rec.Code, rec.Body)
	}
	srv.Drain(context.Background())
	if err := nsjailtest.CheckNoLeftovers(crashStateRoot, crashCgroupParent); err != nil {
		t.Fatal(err)
	}
}
