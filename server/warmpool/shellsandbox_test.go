package warmpool_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/seccomp"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// A template fork as a sandbox (nsjail.Shell.Pending; TEMPLATE.md plan
// step 5): given its shell, its exit report and a hand-off, Wait reports
// what a cold run would (exit code, output, timeout, OOM), kills what the
// code left through the shell's cgroup, and removes the shell; the
// template is untouched and keeps forking.

// codeWorkspace is a workspace holding each of files (name → source).
func codeWorkspace(t *testing.T, files map[string]string) string {
	t.Helper()
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// forkPending forks lab's template, gives the fork a shell for spec and
// places it, and returns it as a pre-started sandbox with its exit report.
func forkPending(t *testing.T, r *nsjail.Runner, lab *tplLab, spec nsjail.Spec) (*tplFork, *nsjail.Pending, <-chan syscall.WaitStatus, cgroup.Paths) {
	t.Helper()
	f := lab.fork(true)
	sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(spec), f.g)
	if err != nil {
		t.Fatalf("StartShell: %v", err)
	}
	p := sh.Pending(f.stdout, f.stderr)
	lab.place(f, sh)
	return f, p, warmpool.ReadExitReport(f.report), sh.CgroupPaths()
}

// runFork hands path to a placed fork and waits for its result.
func runFork(t *testing.T, f *tplFork, p *nsjail.Pending, report <-chan syscall.WaitStatus, path string, timeout time.Duration) *nsjail.Result {
	t.Helper()
	sb, _, _ := p.Handoff(nsjail.HandoffOptions{Timeout: timeout, ExitReport: report})
	line, err := warmpool.EncodeHandoff(warmpool.Handoff{Path: path, Argv: []string{path}, Cwd: "/workspace"})
	if err != nil {
		t.Fatal(err)
	}
	sendLine(t, f.ctl, line)
	return sb.Wait(context.Background())
}

func TestShellSandboxResult(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := codeWorkspace(t, map[string]string{
		"exit3.py": "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n",
		// A child in its own session that outlives the code, and the
		// code then spinning past its deadline.
		"spin.py": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(3600)\nwhile True:\n    pass\n",
		"bomb.py": "x = bytearray(512 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n",
		// Exits at once, leaving a double-forked child behind.
		"leave.py": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(3600)\n    os._exit(0)\nos.wait()\nprint('left one')\n",
	})
	lim := nsjail.Limits{MemoryBytes: 256 << 20, Pids: 64}
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}, Workspace: ws, WorkspaceReadOnly: true, Limits: lim}
	lab := startTplLab(t, r, rootfs, nil, "")

	cases := []struct {
		file    string
		timeout time.Duration
		status  nsjail.Status
		code    int
		stdout  string
		stderr  string
	}{
		{file: "exit3.py", timeout: time.Minute, status: nsjail.StatusFailed, code: 3, stdout: "to stdout\n", stderr: "to stderr\n"},
		{file: "spin.py", timeout: 2 * time.Second, status: nsjail.StatusTimeout, code: 137}, // SIGKILL, as a cold run reports it
		{file: "bomb.py", timeout: time.Minute, status: nsjail.StatusOOM},
		{file: "leave.py", timeout: time.Minute, status: nsjail.StatusSucceeded, code: 0, stdout: "left one\n"},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			f, p, report, paths := forkPending(t, r, lab, spec)
			res := runFork(t, f, p, report, "/workspace/"+c.file, c.timeout)
			if res.Status != c.status {
				t.Fatalf("status %s (exit %d, %s), want %s\nstdout %q\nstderr %q\nlog: %s",
					res.Status, res.ExitCode, res.Error, c.status, res.Stdout, res.Stderr, lab.logText())
			}
			if c.status != nsjail.StatusOOM && res.ExitCode != c.code {
				t.Errorf("exit code %d, want %d", res.ExitCode, c.code)
			}
			if string(res.Stdout) != c.stdout || (c.stderr != "" && string(res.Stderr) != c.stderr) {
				t.Errorf("stdout %q stderr %q, want %q and %q", res.Stdout, res.Stderr, c.stdout, c.stderr)
			}
			if c.status == nsjail.StatusOOM && !strings.Contains(strings.Join(res.LimitsHit, ","), nsjail.LimitMemory) {
				t.Errorf("limits hit %v, want memory", res.LimitsHit)
			}
			// Nothing of the execution outlives its result (leave.py's
			// grandchild among it): after T's report Wait kills nothing,
			// relying on G's exit as PID_F's init having taken every
			// process of the namespace with it. Read before the shell's
			// removal, which runs in the background, kills the cgroup and
			// removes it (a cgroup already gone shows nothing).
			for ctrl, dir := range paths {
				if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil && len(strings.Fields(string(b))) > 0 {
					t.Errorf("the shell's %s cgroup still holds %v when its result is out", ctrl, strings.Fields(string(b)))
				}
			}
			r.WaitForCleanup()
			for ctrl, dir := range paths {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("the shell's %s cgroup %s is still there after Wait (%v)", ctrl, dir, err)
				}
			}
			if !reaped(t, f, time.Minute) {
				t.Errorf("T did not reap G after its sandbox's Wait")
			}
		})
	}
	// The template is untouched by its forks' ends: it forks again, and
	// its cgroup holds only T.
	f, p, report, _ := forkPending(t, r, lab, spec)
	if res := runFork(t, f, p, report, "/workspace/exit3.py", time.Minute); res.Status != nsjail.StatusFailed || res.ExitCode != 3 {
		t.Errorf("a fork after the others: %s exit %d (%s)", res.Status, res.ExitCode, res.Error)
	}
	if log := lab.logText(); log != "" {
		t.Errorf("the template logged: %s", log)
	}
}

// TestShellSandboxRetire: a placed fork that gets no execution is retired:
// G, told nothing, is killed at the grace's end through the shell's
// cgroup, and the shell is removed.
func TestShellSandboxRetire(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}, Workspace: codeWorkspace(t, nil), WorkspaceReadOnly: true}
	lab := startTplLab(t, r, rootfs, nil, "")
	f, p, _, paths := forkPending(t, r, lab, spec)
	if !p.Alive() {
		t.Fatal("a placed fork is not alive")
	}
	res := p.Retire(500*time.Millisecond, nil)
	if res.Status != nsjail.StatusTimeout {
		t.Errorf("retired: %s (%s), want timeout: G was told nothing and killed", res.Status, res.Error)
	}
	// As the pool retires one: told (its control socket closed, as the
	// pool's retire does) and its exit report given, G's own exit 0 is
	// the result, timed from the retirement (it was a sandbox_error with
	// a wall time from the zero time in every retirement's log line).
	f2, p2, report, _ := forkPending(t, r, lab, spec)
	f2.ctl.Close()
	res2 := p2.Retire(30*time.Second, report)
	if res2.Status != nsjail.StatusSucceeded || res2.ExitCode != 0 || res2.Usage.WallMS < 0 || res2.Usage.WallMS > 30_000 {
		t.Errorf("retired after its EOF: %s exit %d wall %d ms (%s), want succeeded, 0, within the grace",
			res2.Status, res2.ExitCode, res2.Usage.WallMS, res2.Error)
	}
	r.WaitForCleanup()
	for ctrl, dir := range paths {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the shell's %s cgroup %s is still there (%v)", ctrl, dir, err)
		}
	}
	if !reaped(t, f, time.Minute) {
		t.Error("T did not reap G after the retirement")
	}
}

// TestShellCheckConfined: the host's check of G before the pool counts a
// fork ready (SECURITY.md case 67) refuses a G that has not dropped (no
// join yet: the template's root, every capability) and passes one that
// has; and it refuses a G that dropped but loaded a filter other than the
// shell's program (one that allows everything: the code would run under
// the template's profile only), which the filter count alone passes.
func TestShellCheckConfined(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}, Workspace: codeWorkspace(t, nil), WorkspaceReadOnly: true}
	lab := startTplLab(t, r, rootfs, nil, "")
	shell := func() (*tplFork, *nsjail.Shell) {
		f := lab.fork(true)
		sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(spec), f.g)
		if err != nil {
			t.Fatal(err)
		}
		p := sh.Pending(f.stdout, f.stderr)
		t.Cleanup(func() { p.Retire(time.Second, nil) })
		if err := sh.MoveG(); err != nil {
			t.Fatal(err)
		}
		return f, sh
	}
	f, sh := shell()
	if err := sh.CheckConfined(); err == nil || !strings.Contains(err.Error(), "CapEff") {
		t.Errorf("G before its join: %v, want refused for its capabilities", err)
	}
	lab.join(f, sh)
	if err := sh.CheckConfined(); err != nil {
		t.Errorf("G after READY: %v", err)
	}
	if tracer := nsjailtest.ProcStatus(t, sh.GPid(), "TracerPid"); tracer != "0" {
		t.Errorf("G is traced by %s after the check", tracer)
	}

	f, sh = shell()
	j := warmpool.JoinOf(sh)
	j.Seccomp = seccomp.EncodeProgram([]unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW}})
	lab.joinWith(f, sh, j)
	if err := sh.CheckConfined(); err == nil || !strings.Contains(err.Error(), "not the shell's program") {
		t.Errorf("G with an allow-all filter: %v, want refused for its filter", err)
	}
}
