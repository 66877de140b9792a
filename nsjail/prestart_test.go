package nsjail_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// A sandbox pre-started in the background (the warm pool's refill) has
// the background CPU weight until its hand-off, and a cold sandbox's from
// then on (issue 17, M4: a refill takes little CPU from executions that
// want it; niceness could not, a warm sandbox being alone in its cgroup).
// A sandbox started cold cannot be started in the background: nothing
// would ever raise it.
func TestPrestartInTheBackground(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.ProbeRootfs(t)
	if _, err := r.Start(nsjail.Spec{Rootfs: rootfs, Args: sh("true"), Background: true}); err == nil || !strings.Contains(err.Error(), "pre-started") {
		t.Fatalf("a cold start in the background: %v, want a refusal", err)
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer ctlW.Close()
	p, err := r.Prestart(nsjail.Spec{Rootfs: rootfs, Args: sh(`read job <&3; exit 0`), Background: true}, ctlR)
	ctlR.Close()
	if err != nil {
		t.Fatal(err)
	}
	paths := nsjail.PendingCgroupPaths(p)
	if w, bg := nsjailtest.CPUWeight(t, paths); !bg {
		t.Errorf("before its hand-off: CPU weight %d, want the background weight", w)
	}
	sb, _, _ := p.Handoff(nsjail.HandoffOptions{Timeout: 30 * time.Second})
	if w, bg := nsjailtest.CPUWeight(t, paths); bg {
		t.Errorf("after its hand-off: CPU weight %d, want the foreground weight", w)
	}
	ctlW.WriteString("go\n")
	wantStatus(t, sb.Wait(context.Background()), nsjail.StatusSucceeded)
}

// A hand-off's CPU time counts from the hand-off: what the sandbox burnt
// while it was prepared (a zygote's import, here a busy loop) is not the
// execution's, whether the warm pool opened the counter files ahead
// (OpenCounters) or not.
func TestHandoffCountsCPUFromTheHandOff(t *testing.T) {
	r := newRunner(t)
	for _, ahead := range []bool{true, false} {
		t.Run(map[bool]string{true: "counters opened ahead", false: "counters opened at the hand-off"}[ahead], func(t *testing.T) {
			ws := t.TempDir()
			if err := os.Chown(ws, r.HostUID(), r.HostGID()); err != nil {
				t.Fatal(err)
			}
			ctlR, ctlW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer ctlW.Close()
			// The loop's CPU, as the shell's own times say it, lands in
			// /workspace/burnt once it is over.
			p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Workspace: ws,
				Args: sh(`i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; times > /workspace/t; mv /workspace/t /workspace/burnt
read job <&3; exit 0`),
				Limits: nsjail.Limits{Timeout: time.Minute}}, ctlR)
			ctlR.Close()
			if err != nil {
				t.Fatal(err)
			}
			var burnt []byte
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
				if burnt, err = os.ReadFile(filepath.Join(ws, "burnt")); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the loop did not end")
				}
			}
			// times: "0m1.23s 0m0.04s" for the shell, then its children.
			var m1, m2 int
			var user, sys float64
			if _, err := fmt.Sscanf(string(burnt), "%dm%fs %dm%fs", &m1, &user, &m2, &sys); err != nil {
				t.Fatalf("times said %q: %v", burnt, err)
			}
			burntMS := int64((float64(m1*60+m2*60) + user + sys) * 1000)
			if burntMS < 100 {
				t.Fatalf("the loop burnt only %d ms of CPU (%q): nothing to tell apart", burntMS, burnt)
			}
			if ahead {
				if err := p.OpenCounters(); err != nil {
					t.Fatal(err)
				}
			}
			sb, _, _ := p.Handoff(nsjail.HandoffOptions{Timeout: 30 * time.Second})
			if _, err := ctlW.WriteString("go\n"); err != nil {
				t.Fatal(err)
			}
			res := sb.Wait(context.Background())
			wantStatus(t, res, nsjail.StatusSucceeded)
			if res.Usage.CPUMS > burntMS/2 {
				t.Fatalf("cpu_ms %d after the hand-off, where the loop before it burnt %d", res.Usage.CPUMS, burntMS)
			}
		})
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
	res := p.Retire(30*time.Second, nil)
	wantStatus(t, res, nsjail.StatusFailed)
	if res.ExitCode != 3 || string(res.Stderr) != "cannot prepare\n" {
		t.Fatalf("exit %d, stderr %q", res.ExitCode, res.Stderr)
	}

	p, err = r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`sleep 1011`)})
	if err != nil {
		t.Fatal(err)
	}
	res = p.Retire(100*time.Millisecond, nil)
	wantStatus(t, res, nsjail.StatusTimeout)
	r.WaitForCleanup()
	if pids := nsjailtest.ProcessesMatching("sleep 1011"); len(pids) > 0 {
		t.Fatalf("a retired sandbox's processes survived: %v", pids)
	}
}

// mustPanic calls f and fails unless it panics with a message containing
// want.
func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("panic %v, want one containing %q", r, want)
		}
	}()
	f()
}

// A pre-started sandbox is handed off or retired once: a second Handoff
// would reset a running execution's output and start time, and a Retire
// after a Handoff (or a Handoff after a Retire) would wait for it twice.
// Each misuse panics and leaves the sandbox as it was; a second Wait
// returns the first's result.
func TestPrestartIsHandedOffOrRetiredOnce(t *testing.T) {
	r := newRunner(t)
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer ctlW.Close()
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t),
		Args: sh(`read job <&3; echo "got $job"; exit 3`)}, ctlR)
	ctlR.Close()
	if err != nil {
		t.Fatal(err)
	}
	sb, _, _ := p.Handoff(nsjail.HandoffOptions{Timeout: 30 * time.Second})
	if p.MemoryBytes() != 0 {
		t.Error("a handed-off sandbox still reports its memory as the pool's")
	}
	mustPanic(t, "Handoff on pre-started sandbox "+p.ID()+", already handed off", func() { p.Handoff(nsjail.HandoffOptions{}) })
	mustPanic(t, "Retire on pre-started sandbox "+p.ID()+", already handed off", func() { p.Retire(time.Millisecond, nil) })
	if _, err := ctlW.WriteString("1\n"); err != nil {
		t.Fatal(err)
	}
	res := sb.Wait(context.Background())
	wantStatus(t, res, nsjail.StatusFailed)
	if res.ExitCode != 3 || string(res.Stdout) != "got 1\n" {
		t.Fatalf("exit %d, stdout %q", res.ExitCode, res.Stdout)
	}
	if again := sb.Wait(context.Background()); again != res {
		t.Fatalf("a second Wait returned %+v, not the first's result", again)
	}

	p, err = r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`exit 4`)})
	if err != nil {
		t.Fatal(err)
	}
	res = p.Retire(30*time.Second, nil)
	wantStatus(t, res, nsjail.StatusFailed)
	mustPanic(t, "Retire on pre-started sandbox "+p.ID()+", already retired", func() { p.Retire(time.Millisecond, nil) })
	mustPanic(t, "Handoff on pre-started sandbox "+p.ID()+", already retired", func() { p.Handoff(nsjail.HandoffOptions{}) })
	if p.MemoryBytes() != 0 {
		t.Error("a retired sandbox reports memory")
	}
}

// Concurrent Waits on one sandbox wait for it once and share its result.
func TestConcurrentWaitsShareOneResult(t *testing.T) {
	r := newRunner(t)
	sb, err := r.Start(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`sleep 0.1; exit 5`)})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan *nsjail.Result, 4)
	for range cap(results) {
		go func() { results <- sb.Wait(context.Background()) }()
	}
	first := <-results
	wantStatus(t, first, nsjail.StatusFailed)
	for range cap(results) - 1 {
		if res := <-results; res != first {
			t.Fatalf("two Waits returned different results: %+v and %+v", first, res)
		}
	}
}

// The pool's /metrics reads a ready sandbox's memory while a request may be
// handing it off: the two must not race (go test -race), and the memory of
// a sandbox is its pool's only while it waits.
func TestMemoryBytesRacesHandoff(t *testing.T) {
	r := newRunner(t)
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`sleep 1012`)})
	if err != nil {
		t.Fatal(err)
	}
	// The reader and the hand-off share no synchronisation but the
	// Pending's own: the sleeps only let both run.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p.MemoryBytes() != 0 {
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	sb, _, _ := p.Handoff(nsjail.HandoffOptions{Timeout: time.Millisecond})
	<-done
	if p.MemoryBytes() != 0 {
		t.Error("a handed-off sandbox still reports its memory as the pool's")
	}
	wantStatus(t, sb.Wait(context.Background()), nsjail.StatusTimeout)

	p, err = r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh(`sleep 1012`)})
	if err != nil {
		t.Fatal(err)
	}
	if p.MemoryBytes() <= 0 {
		t.Error("a waiting sandbox reports no memory")
	}
	p.Retire(time.Millisecond, nil)
}
