package nsjail_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// SECURITY.md case 47: a frozen sandbox runs nothing until thawed, and a
// frozen sandbox still ends at once when Wait kills it (on cgroup v1 a
// SIGKILL reaches a frozen task only once thawed).
func TestFreezeThawAndKillFrozen(t *testing.T) {
	r := newRunner(t)
	ws := t.TempDir()
	if err := os.Chown(ws, r.HostUID(), r.HostGID()); err != nil {
		t.Fatal(err)
	}
	sb, err := r.Start(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Workspace: ws,
		Args:   sh(`i=0; while :; do i=$((i+1)); echo $i > /workspace/n; done`),
		Limits: nsjail.Limits{Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	count := func() string {
		b, _ := os.ReadFile(filepath.Join(ws, "n"))
		return strings.TrimSpace(string(b))
	}
	waitCount := func(after string) string {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			if n := count(); n != "" && n != after {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("the loop does not run (count %q)", count())
			}
		}
	}
	waitCount("")
	if err := sb.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozenAt := count()
	time.Sleep(200 * time.Millisecond)
	if n := count(); n != frozenAt {
		t.Fatalf("the frozen sandbox counted from %s to %s", frozenAt, n)
	}
	if err := sb.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitCount(frozenAt)
	if err := sb.Freeze(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan *nsjail.Result)
	go func() { done <- sb.Wait(ctx) }()
	select {
	case res := <-done:
		wantStatus(t, res, nsjail.StatusCancelled)
	case <-time.After(time.Minute):
		t.Fatal("Wait did not end the frozen sandbox")
	}
	if err := sb.Freeze(); err == nil {
		t.Fatal("a waited-for sandbox was frozen")
	}
	r.WaitForCleanup()
}

// SECURITY.md case 72: on its command's word that it is done (Spec.Done),
// Wait answers with that exit code and the output written before the
// word, everything of the sandbox frozen; nothing it left running runs
// again after Wait returns (a writer that would keep changing the
// workspace, a process that waits for its end), and everything is gone
// once the Runner's cleanup is. Without a word (a channel closed empty)
// the exit decides, as without Done.
func TestDoneWordEndsTheSandbox(t *testing.T) {
	r := newRunner(t)
	ws := t.TempDir()
	if err := os.Chown(ws, r.HostUID(), r.HostGID()); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	sb, err := r.Start(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Workspace: ws, Done: done,
		Args: sh(`echo before; echo warn >&2
(i=0; while :; do i=$((i+1)); echo $i > /workspace/n; done) &
exec sleep 1072`),
		Limits: nsjail.Limits{Timeout: 30 * time.Second}}) // without the word: a timeout
	if err != nil {
		t.Fatal(err)
	}
	count := func() string {
		b, _ := os.ReadFile(filepath.Join(ws, "n"))
		return strings.TrimSpace(string(b))
	}
	for deadline := time.Now().Add(time.Minute); count() == ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer does not run")
		}
	}
	done <- 5
	res := sb.Wait(context.Background())
	wantStatus(t, res, nsjail.StatusFailed)
	if res.Ended == nil {
		t.Fatal("answered on the word, but no Ended to wait for")
	}
	if res.ExitCode != 5 || string(res.Stdout) != "before\n" || string(res.Stderr) != "warn\n" {
		t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	at := count()
	time.Sleep(300 * time.Millisecond)
	if n := count(); n != at {
		t.Fatalf("the writer ran after Wait returned: %s then %s", at, n)
	}
	r.WaitForCleanup()
	select {
	case <-res.Ended:
	default:
		t.Fatal("Ended still open after the cleanup")
	}
	if pids := nsjailtest.ProcessesMatching("sleep 1072"); len(pids) > 0 {
		t.Fatalf("processes left after the cleanup: %v", pids)
	}

	// Without a freezer (or when the freeze fails) the word ends the
	// sandbox as a timeout does: killed and waited for before the answer.
	sb, err = r.Start(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Workspace: ws, Done: done,
		Args:   sh(`echo before; (while :; do :; done) & touch /workspace/started; exec sleep 1073`),
		Limits: nsjail.Limits{Timeout: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	forgot := nsjail.ForgetFreezer(sb) // v1 only
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(ws, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command does not run")
		}
	}
	done <- 6
	res = sb.Wait(context.Background())
	if res.ExitCode != 6 || string(res.Stdout) != "before\n" || (res.Ended == nil) != forgot {
		t.Fatalf("unfreezable %v: exit %d ended %v stdout %q, want the word's 6 (and an Ended only when freezable)", forgot, res.ExitCode, res.Ended, res.Stdout)
	}
	if forgot {
		if pids := nsjailtest.ProcessesMatching("sleep 1073"); len(pids) > 0 {
			t.Fatalf("unfreezable: processes left when Wait returned: %v", pids)
		}
	}
	r.WaitForCleanup()

	closed := make(chan int)
	close(closed)
	res = run(t, r, nsjail.Spec{Args: sh("exit 3"), Done: closed})
	if res.ExitCode != 3 || res.Ended != nil {
		t.Fatalf("exit %d, ended %v after a closed Done, want the command's 3 and no Ended", res.ExitCode, res.Ended)
	}
}
