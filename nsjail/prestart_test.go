package nsjail_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// A pre-started sandbox gets its execution over the caller's fd 3: until
// the hand-off no deadline runs, and after it the execution's does, not the
// spec's (which would have passed long before). The result is the
// execution's: its exit, its output (what was written before is handed
// back, dropped), its start time.
func TestPrestartThenHandoff(t *testing.T) {
	r := newRunner(t)
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer ctlW.Close()
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t),
		Args:   sh(`echo before; read job <&3; echo "got $job"; sleep "$job"; exit 3`),
		Limits: nsjail.Limits{Timeout: time.Millisecond}}, ctlR)
	ctlR.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Longer than the spec's timeout, which must not apply yet.
	time.Sleep(100 * time.Millisecond)
	if !p.Alive() {
		t.Fatal("the pre-started sandbox died before its hand-off")
	}
	handedOff := time.Now()
	sb, dropped, _ := p.Handoff(nsjail.HandoffOptions{Timeout: 30 * time.Second})
	if _, err := ctlW.WriteString("0.2\n"); err != nil {
		t.Fatal(err)
	}
	res := sb.Wait(context.Background())
	wantStatus(t, res, nsjail.StatusFailed)
	if res.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", res.ExitCode)
	}
	// The capture may not have read "before" by the hand-off; where it is
	// depends on that, but the execution's own output ends the result.
	if all := string(dropped) + string(res.Stdout); all != "before\ngot 0.2\n" || !bytes.HasSuffix(res.Stdout, []byte("got 0.2\n")) {
		t.Fatalf("dropped %q, stdout %q", dropped, res.Stdout)
	}
	if res.StartedAt.Before(handedOff) {
		t.Fatalf("started at %v, before the hand-off at %v", res.StartedAt, handedOff)
	}
}

// A pre-started sandbox that gets no execution is retired: one that exits
// by itself within the grace gives its result with everything it wrote
// (why it failed), one that does not is killed, and nothing of either is
// left.
func TestPrestartRetire(t *testing.T) {
	r := newRunner(t)
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`echo "cannot prepare" >&2; exit 3`)})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Retire(30 * time.Second)
	wantStatus(t, res, nsjail.StatusFailed)
	if res.ExitCode != 3 || string(res.Stderr) != "cannot prepare\n" {
		t.Fatalf("exit %d, stderr %q", res.ExitCode, res.Stderr)
	}

	p, err = r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`sleep 1011`)})
	if err != nil {
		t.Fatal(err)
	}
	res = p.Retire(100 * time.Millisecond)
	wantStatus(t, res, nsjail.StatusTimeout)
	r.WaitForCleanup()
	if pids := nsjailtest.ProcessesMatching("sleep 1011"); len(pids) > 0 {
		t.Fatalf("a retired sandbox's processes survived: %v", pids)
	}
}
