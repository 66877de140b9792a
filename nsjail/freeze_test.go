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
