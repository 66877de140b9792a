package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/sessionid"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// Unit tests of the manager's logic on fakes (fake_test.go): no root.

func TestStatesAndReasonsAcrossExecutions(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	e.wantExec(id, "x = 1", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	e.wantExec(id, "x", ExecInfo{KernelGeneration: 1, State: StatePreserved})
	first := e.starter.last()
	// A kernel that ends during an execution: the answer says so, and the
	// next one starts a new kernel, saying why.
	for _, why := range []string{warmpool.EndTimeout, warmpool.EndOOM, warmpool.EndPids, warmpool.EndExited, warmpool.EndProtocol} {
		gen := e.starter.last()
		_, info := e.exec(id, "end:"+why)
		if info.KernelEnded != why {
			t.Fatalf("kernel ended by %s: KernelEnded %q", why, info.KernelEnded)
		}
		if _, closes, _ := gen.counts(); closes != 1 {
			t.Fatalf("the ended kernel was closed %d times, want 1", closes)
		}
		g := info.KernelGeneration
		e.wantExec(id, "x", ExecInfo{KernelGeneration: g + 1, State: StateNew, Reason: why})
	}
	if _, closes, _ := first.counts(); closes != 1 {
		t.Fatalf("first kernel closed %d times", closes)
	}
	// A kernel that ends while idle (killed between executions) is replaced
	// at the next execution, which says why.
	k := e.starter.last()
	k.end(warmpool.EndExited)
	e.wantExec(id, "x", ExecInfo{KernelGeneration: 7, State: StateNew, Reason: warmpool.EndExited})
	info, err := e.m.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Kernel.Generation != 7 || info.Kernel.State != KernelIdle || info.Kernel.StartedAt == nil || !info.Kernel.Enabled {
		t.Fatalf("kernel info %+v", info.Kernel)
	}
}

// The kernel ends between the manager's look and its Exec (ErrKernelEnded):
// the code runs in a new kernel, and the answer says why.
func TestKernelEndedBeforeTheCodeIsRetriedInANewOne(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	e.exec(id, "")
	k := e.starter.last()
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.End()
	// Ended after the Begin, before the Exec: Exec's own check may see it
	// or not; either way the code must run in a new kernel.
	k.end(warmpool.EndOOM)
	_, info, err := r.Exec(context.Background(), warmpool.KernelExec{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (ExecInfo{ID: id, KernelGeneration: 2, State: StateNew, Reason: warmpool.EndOOM}); info != want {
		t.Fatalf("got %+v, want %+v", info, want)
	}
	if execs, _, _ := k.counts(); execs != 1 {
		t.Fatalf("the ended kernel ran %d executions, want 1", execs)
	}
}

func TestKernelDisabledStartsAFreshKernelEachTime(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: false}).ID
	for g := int64(1); g <= 3; g++ {
		e.wantExec(id, "", ExecInfo{KernelGeneration: g, State: StateNew, Reason: ReasonNoKernel})
		if _, closes, _ := e.starter.last().counts(); closes != 1 {
			t.Fatalf("execution %d: its kernel closed %d times, want 1", g, closes)
		}
	}
	info, _ := e.m.Get(id)
	if info.Kernel.Enabled || info.Kernel.State != KernelNone || info.Kernel.StartedAt != nil {
		t.Fatalf("kernel info %+v", info.Kernel)
	}
	// A kernel: false session's kernel that ends by a timeout says so.
	_, x := e.exec(id, "end:timeout")
	if x.KernelEnded != warmpool.EndTimeout || x.Reason != ReasonNoKernel {
		t.Fatalf("%+v", x)
	}
	e.reopen()
	e.wantExec(id, "", ExecInfo{KernelGeneration: 5, State: StateNew, Reason: ReasonNoKernel})
}

func TestOneExecutionAtATime(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	if err := e.m.Interrupt(id); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("interrupt with nothing running: %v", err)
	}
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Begin(id); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Begin: %v, want ErrBusy", err)
	}
	if err := e.m.Interrupt(id); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("interrupt of a reserved session with no code running: %v", err)
	}
	done := make(chan ExecInfo)
	go func() {
		_, info, _ := r.Exec(context.Background(), warmpool.KernelExec{Code: "block"})
		done <- info
	}()
	waitStarted(t, e.starter)
	k := e.starter.last()
	<-k.running
	if st := e.m.Stats(); st.Busy != 1 || st.Sessions != 1 || st.IdleKernels != 0 {
		t.Fatalf("stats while running: %+v", st)
	}
	if info, _ := e.m.Get(id); info.Kernel.State != KernelBusy {
		t.Fatalf("kernel state while running: %q", info.Kernel.State)
	}
	if err := e.m.Interrupt(id); err != nil {
		t.Fatal(err)
	}
	if _, _, n := k.counts(); n != 1 {
		t.Fatalf("kernel interrupted %d times, want 1", n)
	}
	k.end(warmpool.EndTimeout) // what the kernel does with it is its own business
	<-done
	if _, _, err := r.Exec(context.Background(), warmpool.KernelExec{}); err == nil {
		t.Fatal("a second Exec in one Run was accepted")
	}
	r.End()
	r.End()
	r2, err := e.m.Begin(id)
	if err != nil {
		t.Fatalf("Begin after End: %v", err)
	}
	r2.End()
}

func waitStarted(t *testing.T, st *fakeStarter) {
	t.Helper()
	for st.last() == nil {
		time.Sleep(time.Millisecond)
	}
}

func TestStartFailureKeepsTheReason(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	e.starter.fail = errors.New("no sandbox for you")
	r, _ := e.m.Begin(id)
	if _, _, err := r.Exec(context.Background(), warmpool.KernelExec{}); err == nil || !strings.Contains(err.Error(), "no sandbox") {
		t.Fatalf("Exec with a failing starter: %v", err)
	}
	r.End()
	e.starter.fail = nil
	e.wantExec(id, "", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	if st := e.m.Stats(); st.KernelStarts["new/first_execution"] != 1 || st.IdleKernels != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDeleteWhileBusyCancelsAndRemoves(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	var got ExecInfo
	go func() {
		var err error
		_, got, err = r.Exec(context.Background(), warmpool.KernelExec{Code: "block"})
		done <- err
	}()
	waitStarted(t, e.starter)
	k := e.starter.last()
	<-k.running
	if err := e.m.Delete(id); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got.KernelEnded == "" {
		t.Fatal("the cancelled execution says its kernel lives on")
	}
	if _, closes, _ := k.counts(); closes == 0 {
		t.Fatal("kernel not closed")
	}
	r.End()
	if _, err := os.Lstat(filepath.Join(e.root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("session directory after Delete: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := e.m.Get(id); return err },
		func() error { _, err := e.m.Begin(id); return err },
		func() error { return e.m.Delete(id) },
		func() error { return e.m.Interrupt(id) },
		func() error { _, err := e.m.Lend(id); return err },
	} {
		if err := f(); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after Delete: %v, want ErrNotFound", err)
		}
	}
	// The id is free again.
	e.create(Spec{ID: id, Kernel: true})
}

// TestOwnedIDs: with an owner token, generated ids carry it (sessionid);
// a client's id of that form is accepted only with this worker's token,
// and any other id a client chooses stays the worker's own.
func TestOwnedIDs(t *testing.T) {
	own, other := sessionid.Token("worker-a"), sessionid.Token("worker-b")
	e := newEnv(t, func(c *Config) { c.Owner = own })
	gen := e.create(Spec{})
	if tok, ok := sessionid.Owner(gen.ID); !ok || tok != own {
		t.Fatalf("generated id %q: owner %q, %v; want %q", gen.ID, tok, ok, own)
	}
	e.create(Spec{ID: "se-" + own + "-mine"})
	e.create(Spec{ID: "chosen"})
	_, err := e.m.Create(Spec{ID: "se-" + other + "-theirs", Policy: "p"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), other) {
		t.Fatalf("another owner's id: %v, want ErrInvalid naming %s", err, other)
	}
	// Without worker_id, ids have no owner and the owned form is refused.
	bare := newEnv(t, nil)
	if id := bare.create(Spec{}).ID; len(id) != len("se-")+20 {
		t.Fatalf("generated id without an owner: %q", id)
	}
	if _, err := bare.m.Create(Spec{ID: "se-" + own + "-x", Policy: "p"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an owned id on a worker without worker_id: %v, want ErrInvalid", err)
	}
}

func TestCreateChecksTheSpec(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IdleTimeout = time.Minute; c.MaxIdleTimeout = time.Hour })
	gen := e.create(Spec{})
	if !strings.HasPrefix(gen.ID, "se-") || !inside.ValidID(gen.ID) {
		t.Fatalf("generated id %q", gen.ID)
	}
	if gen.IdleTimeoutMS != time.Minute.Milliseconds() {
		t.Fatalf("default idle timeout %d ms", gen.IdleTimeoutMS)
	}
	if i := e.create(Spec{IdleTimeout: time.Hour}); i.IdleTimeoutMS != time.Hour.Milliseconds() {
		t.Fatalf("idle timeout of the maximum: %d ms", i.IdleTimeoutMS)
	}
	for _, spec := range []Spec{
		{ID: "..", Policy: "p"},
		{ID: "a/b", Policy: "p"},
		{ID: ".hidden", Policy: "p"},
		{ID: strings.Repeat("a", 65), Policy: "p"},
		{ID: "ok", Policy: ""},
		{ID: "ok", Policy: "a/b"},
		{ID: "ok", Policy: "p", IdleTimeout: -1},
		// Above the maximum: refused, not capped (the one rule).
		{ID: "ok", Policy: "p", IdleTimeout: time.Hour + time.Millisecond},
	} {
		if _, err := e.m.Create(spec); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create(%+v): %v, want ErrInvalid", spec, err)
		}
	}
	if _, err := e.m.Create(Spec{ID: gen.ID, Policy: "p"}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	entries, _ := os.ReadDir(e.root)
	if len(entries) != 2 {
		t.Fatalf("refused creates left entries: %v", entries)
	}
}

func TestMaxSessions(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxSessions = 2 })
	a := e.create(Spec{}).ID
	e.create(Spec{})
	if _, err := e.m.Create(Spec{Policy: "p"}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third session: %v, want ErrTooMany", err)
	}
	if err := e.m.Delete(a); err != nil {
		t.Fatal(err)
	}
	e.create(Spec{})
}

func TestPersistenceRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	used := e.create(Spec{ID: "used", Kernel: true, IdleTimeout: 3 * time.Minute})
	fresh := e.create(Spec{ID: "fresh", Kernel: true})
	e.exec(used.ID, "x = 1")
	e.exec(used.ID, "x")
	// A use shortly before Close is not lost, however coalesced the
	// writes are.
	e.clock.Add(time.Second)
	e.exec(used.ID, "x")
	before, _ := e.m.Get(used.ID)
	k := e.starter.last()
	e.reopen()
	if _, closes, _ := k.counts(); closes != 1 {
		t.Fatalf("Close closed the kernel %d times", closes)
	}
	after, err := e.m.Get(used.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !after.LastUsedAt.Equal(before.LastUsedAt) || !after.CreatedAt.Equal(before.CreatedAt) ||
		after.IdleTimeoutMS != before.IdleTimeoutMS || after.Type != before.Type || after.Kernel.Generation != 1 {
		t.Fatalf("after a restart %+v, before %+v", after, before)
	}
	if after.Kernel.State != KernelNone || after.Kernel.EndReason != ReasonWorkerRestart {
		t.Fatalf("kernel after a restart: %+v", after.Kernel)
	}
	e.wantExec(used.ID, "x", ExecInfo{KernelGeneration: 2, State: StateRestarted, Reason: ReasonWorkerRestart})
	// A session that never ran anything lost no state.
	e.wantExec(fresh.ID, "", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	if ids := infoIDs(e.m.List()); ids != "fresh,used" {
		t.Fatalf("List: %s", ids)
	}
}

func infoIDs(infos []Info) string {
	var ids []string
	for _, i := range infos {
		ids = append(ids, i.ID)
	}
	return strings.Join(ids, ",")
}

func TestLastUseWritesAreCoalesced(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{ID: "s"}).ID
	read := func() time.Time {
		rec, err := readRecord(filepath.Join(e.root, id), id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.LastUsedAt
	}
	created := read()
	e.clock.Add(time.Second)
	e.exec(id, "")
	e.m.Tidy()
	if !read().Equal(created) {
		t.Fatal("last use written within the flush interval")
	}
	e.clock.Add(flushInterval)
	e.m.Tidy()
	if got, want := read(), created.Add(time.Second); !got.Equal(want) {
		t.Fatalf("last_used_at %v, want %v", got, want)
	}
}

func TestCloseRefusesWhatFollows(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{}).ID
	r, _ := e.m.Begin(id)
	e.m.Close()
	if _, _, err := r.Exec(context.Background(), warmpool.KernelExec{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Exec after Close: %v", err)
	}
	r.End()
	if _, err := e.m.Create(Spec{Policy: "p"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Create after Close: %v", err)
	}
	if _, err := e.m.Get(id); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	e.m.Close()
}

func TestOneManagerPerRoot(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := open(e.cfg, e.starter, nil, e.disk); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second manager on one root: %v", err)
	}
}

// Delete while the execution's kernel is still starting: the kernel that
// arrives after the session is gone is closed, never left running on a
// removed volume, and Delete waits for that. A start that failed because
// of the Delete (its context cancelled) says the session is gone too: the
// API answers 404, not the start's failure.
func TestDeleteWhileTheKernelStarts(t *testing.T) {
	for _, fails := range []bool{false, true} {
		t.Run(fmt.Sprintf("start fails %v", fails), func(t *testing.T) { testDeleteWhileTheKernelStarts(t, fails) })
	}
}

func testDeleteWhileTheKernelStarts(t *testing.T, fails bool) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	deleted := make(chan error)
	e.starter.hook = func(ctx context.Context) {
		if info, _ := e.m.Get(id); info.Kernel.State != KernelStarting {
			t.Errorf("kernel state while starting: %q", info.Kernel.State)
		}
		go func() { deleted <- e.m.Delete(id) }()
		<-ctx.Done() // Delete cancels the execution's context
		for {
			if _, err := e.m.Get(id); errors.Is(err, ErrNotFound) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if fails {
			e.starter.fail = ctx.Err() // read by StartKernel after the hook, on this goroutine
		}
	}
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = r.Exec(context.Background(), warmpool.KernelExec{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Exec in a session deleted while its kernel started: %v", err)
	}
	r.End()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if k := e.starter.last(); fails != (k == nil) {
		t.Fatalf("kernel started: %v, start failed: %v", k != nil, fails)
	} else if k != nil {
		if _, closes, _ := k.counts(); closes != 1 {
			t.Fatalf("the late kernel was closed %d times, want 1", closes)
		}
	}
	if st := e.m.Stats(); st.Sessions != 0 || len(st.KernelStarts) != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A kernel start is on disk before the code runs, not coalesced with the
// last uses: a worker killed during the execution leaves a record that
// makes its successor say the Python state was lost (worker_restart),
// never "new, first execution" (cmd/sandboxd TestServeSessionSurvivesKill9).
func TestKernelStartIsWrittenAtOnce(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	read := func() int64 {
		rec, err := readRecord(filepath.Join(e.root, id), id)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Generation
	}
	// No warm sandbox: no kernel started ahead, and the generation Create
	// wrote for one taken back. The start ahead writes that record after it
	// has said (in memory) that no kernel runs, so the disk is waited for
	// too (CI once read it in between).
	waitFor(t, func() bool { info, _ := e.m.Get(id); return info.Kernel.State == KernelNone && read() == 0 })
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.End()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, _, err := r.Exec(ctx, warmpool.KernelExec{Code: "block"})
		done <- err
	}()
	for e.starter.last() == nil {
		time.Sleep(time.Millisecond)
	}
	<-e.starter.last().running
	// While the code runs, within the flush interval, without Tidy or
	// Close: as a kill -9 would leave it.
	if g := read(); g != 1 {
		t.Fatalf("generation on disk while the code runs: %d, want 1", g)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Delete waits for the volume's lends (the file API, a profile) and
// cancels them: a write in flight never lands in a removed volume, a slow
// download does not hold the Delete, and nothing is lent once it began
// (SECURITY.md case 49).
func TestDeleteWaitsForLendsAndCancelsThem(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	l, err := e.m.Lend(id)
	if err != nil {
		t.Fatal(err)
	}
	if l.Policy != "default" || l.Ctx.Err() != nil {
		t.Fatalf("lend: policy %q, ctx %v", l.Policy, l.Ctx.Err())
	}
	deleted := make(chan error, 1)
	go func() { deleted <- e.m.Delete(id) }()
	<-l.Ctx.Done() // the lent request is told to end
	if _, err := e.m.Lend(id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lend once a Delete began: %v, want ErrNotFound", err)
	}
	select {
	case err := <-deleted:
		t.Fatalf("Delete returned (%v) while its volume was lent", err)
	default:
	}
	if _, err := os.Lstat(filepath.Join(e.root, id, volumeName)); err != nil {
		t.Fatalf("the lent volume was removed: %v", err)
	}
	l.Release()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("session directory after Delete: %v", err)
	}
	l.Release() // idempotent
}

// Close leaves lends alone (the volumes stay mounted for the next worker;
// the HTTP server's shutdown bounds the requests): it neither cancels nor
// waits for them, and lends no more.
func TestCloseLeavesLendsAlone(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{}).ID
	l, err := e.m.Lend(id)
	if err != nil {
		t.Fatal(err)
	}
	e.m.Close() // returns with the lend out
	if l.Ctx.Err() != nil {
		t.Fatal("Close cancelled a lend")
	}
	if _, err := e.m.Lend(id); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lend after Close: %v", err)
	}
	l.Release()
}

// Open refuses a Config the manager cannot work with (server/config sets
// the values; nothing is silently defaulted here but the clock and the
// janitor's pace).
func TestOpenChecksTheConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Config)
		msg  string
	}{
		{"no uid", func(c *Config) { c.UID = 0 }, "uid and gid must be"},
		{"no max sessions", func(c *Config) { c.MaxSessions = 0 }, "max sessions must be > 0"},
		{"no retention", func(c *Config) { c.Retention = 0 }, "retention must be > 0"},
		{"no idle timeout", func(c *Config) { c.IdleTimeout = 0 }, "idle timeout must be > 0"},
		{"idle above max", func(c *Config) { c.IdleTimeout = 3 * time.Hour }, "idle timeout must be <= the max idle timeout (2h0m0s)"},
		{"no budget", func(c *Config) { c.IdleMemoryBudget = 0 }, "idle memory budget must be > 0"},
	} {
		cfg := testConfig(filepath.Join(t.TempDir(), "sessions"), newFakeClock())
		c.edit(&cfg)
		m, err := open(cfg, &fakeStarter{}, nil, &fakeDisk{})
		if err == nil {
			m.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %q", c.name, err, c.msg)
		}
	}
}

// A kernel start is on disk before the code runs (written while the kernel
// starts); a start that failed is taken back, so a restarted worker does
// not say "restarted" of a session whose kernel never started.
func TestKernelStartIsSavedBeforeTheCodeRuns(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true}).ID
	e.starter.fail = errors.New("no sandbox for you")
	r, _ := e.m.Begin(id)
	if _, _, err := r.Exec(context.Background(), warmpool.KernelExec{}); err == nil {
		t.Fatal("Exec with a failing starter: no error")
	}
	r.End()
	e.starter.fail = nil
	e.reopen()
	e.wantExec(id, "", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	// No flush since (the clock stands still, no Close): written by the
	// start itself.
	rec, err := readRecord(filepath.Join(e.root, id), id)
	if err != nil || rec.Generation != 1 {
		t.Fatalf("record after the first kernel start: generation %d, %v; want 1", rec.Generation, err)
	}
	e.reopen()
	e.wantExec(id, "", ExecInfo{KernelGeneration: 2, State: StateRestarted, Reason: ReasonWorkerRestart})
}

// Create answers before its session is durable (syncCreated), and
// nothing else of the session is answered before: its code does not run
// and its volume is not lent until the sync is done. A host crash in
// between loses the session and its 201, never a file or a result.
func TestNothingIsAnsweredBeforeTheCreateIsDurable(t *testing.T) {
	// Without and with a kernel started ahead (which is there before the
	// sync is done).
	for _, warm := range []int{0, 1} {
		t.Run(fmt.Sprintf("warm %d", warm), func(t *testing.T) { testNothingIsAnsweredBeforeTheCreateIsDurable(t, warm) })
	}
}

func testNothingIsAnsweredBeforeTheCreateIsDurable(t *testing.T, warm int) {
	release := make(chan struct{})
	syncCreatedRecord = func(dir string) error {
		<-release
		return syncNewRecord(dir)
	}
	t.Cleanup(func() { syncCreatedRecord = syncNewRecord })
	e := newEnv(t, nil)
	e.starter.warm = warm
	id := e.create(Spec{Kernel: true}).ID // returns while the sync is held
	if warm > 0 {
		waitFor(t, func() bool { info, _ := e.m.Get(id); return info.Kernel.State == KernelIdle })
	}

	lent := make(chan error, 1)
	go func() {
		l, err := e.m.Lend(id)
		if err == nil {
			l.Release()
		}
		lent <- err
	}()
	execd := make(chan error, 1)
	go func() {
		r, err := e.m.Begin(id)
		if err == nil {
			_, _, err = r.Exec(context.Background(), warmpool.KernelExec{})
			r.End()
		}
		execd <- err
	}()
	// Held back: neither can have answered, nor the code run. (Checked
	// once, after a moment: a bug shows as a failure, never the other way
	// round.)
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-lent:
		t.Fatalf("Lend answered before the session was durable: %v", err)
	case err := <-execd:
		t.Fatalf("Exec answered before the session was durable: %v", err)
	default:
	}
	if k := e.starter.last(); k != nil {
		if execs, _, _ := k.counts(); execs != 0 {
			t.Fatalf("the code ran before the session was durable (%d executions)", execs)
		}
	}
	close(release)
	if err := <-lent; err != nil {
		t.Fatalf("Lend after the sync: %v", err)
	}
	if err := <-execd; err != nil {
		t.Fatalf("Exec after the sync: %v", err)
	}
	if execs, _, _ := e.starter.last().counts(); execs != 1 {
		t.Fatalf("executions after the sync: %d, want 1", execs)
	}
}

// A session's kernel is started ahead, as Create answers, when a warm
// sandbox is ready (issue 12: create + first print(1)): the first
// execution runs in it and says new/first as if it had started it, and
// the start counts once. Without a warm sandbox nothing starts ahead (no
// cold start outside admission) and the first execution starts it.
func TestKernelStartedAhead(t *testing.T) {
	e := newEnv(t, nil)
	e.starter.warm = 1
	created := e.create(Spec{Kernel: true})
	if created.Kernel.State != KernelStarting {
		t.Fatalf("kernel state as Create answers: %q, want %q", created.Kernel.State, KernelStarting)
	}
	id := created.ID
	waitFor(t, func() bool { info, _ := e.m.Get(id); return info.Kernel.State == KernelIdle })
	ahead := e.starter.last()
	if info, _ := e.m.Get(id); info.Kernel.Generation != 1 {
		t.Fatalf("generation after the start ahead: %d, want 1", info.Kernel.Generation)
	}
	e.wantExec(id, "x = 1", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	e.wantExec(id, "x", ExecInfo{KernelGeneration: 1, State: StatePreserved})
	if e.starter.last() != ahead || len(e.starter.kernels) != 1 {
		t.Fatalf("%d kernels started, want the one started ahead", len(e.starter.kernels))
	}
	if execs, _, _ := ahead.counts(); execs != 2 {
		t.Fatalf("the kernel started ahead ran %d executions, want 2", execs)
	}
	if st := e.m.Stats(); st.KernelStarts[StateNew+"/"+ReasonFirst] != 1 {
		t.Fatalf("kernel starts %v", st.KernelStarts)
	}

	// No warm sandbox left: nothing starts ahead.
	id2 := e.create(Spec{Kernel: true}).ID
	waitFor(t, func() bool { info, _ := e.m.Get(id2); return info.Kernel.State == KernelNone })
	if len(e.starter.kernels) != 1 {
		t.Fatalf("%d kernels, want none started without a warm sandbox", len(e.starter.kernels))
	}
	e.wantExec(id2, "x = 1", ExecInfo{KernelGeneration: 1, State: StateNew, Reason: ReasonFirst})
	// A kernel: false session never starts one ahead.
	e.starter.warm = 1
	id3 := e.create(Spec{Kernel: false}).ID
	if info, _ := e.m.Get(id3); info.Kernel.State != KernelNone || len(e.starter.kernels) != 2 {
		t.Fatalf("kernel: false session: %+v, %d kernels", info.Kernel, len(e.starter.kernels))
	}
}

// The first execution that comes while the kernel is being started ahead
// waits for it and runs there: one kernel, never two. A Delete during the
// start ahead closes the kernel it makes and waits for it.
func TestKernelStartedAheadRaces(t *testing.T) {
	e := newEnv(t, nil)
	e.starter.warm = 2
	release := make(chan struct{})
	e.starter.hook = func(context.Context) { <-release }
	id := e.create(Spec{Kernel: true}).ID
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan ExecInfo)
	go func() {
		_, info, err := r.Exec(context.Background(), warmpool.KernelExec{Code: "x = 1"})
		if err != nil {
			t.Error(err)
		}
		done <- info
	}()
	select {
	case info := <-done:
		t.Fatalf("the execution ran before the kernel started ahead: %+v", info)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if info := <-done; info.State != StateNew || info.Reason != ReasonFirst || info.KernelGeneration != 1 {
		t.Fatalf("first execution %+v", info)
	}
	r.End()
	if len(e.starter.kernels) != 1 {
		t.Fatalf("%d kernels started, want 1", len(e.starter.kernels))
	}

	started := make(chan struct{})
	e.starter.hook = func(ctx context.Context) { close(started); <-ctx.Done() }
	id2 := e.create(Spec{Kernel: true}).ID
	<-started
	if err := e.m.Delete(id2); err != nil {
		t.Fatal(err)
	}
	// The start saw its context cancelled (a real one fails then; the
	// fake's kernel is made anyway): whatever it made is closed.
	k := e.starter.last()
	if _, closes, _ := k.counts(); len(e.starter.kernels) != 2 || closes != 1 {
		t.Fatalf("%d kernels; the one started for the deleted session closed %d times, want 1", len(e.starter.kernels), closes)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// A Delete while the first execution waits for the kernel started ahead
// answers that execution ErrNotFound (404), never a failed start; a Close
// ends a start ahead at once instead of waiting for its own timeout.
func TestKernelStartedAheadEndsWithTheSession(t *testing.T) {
	e := newEnv(t, nil)
	e.starter.warm = 2
	started := make(chan struct{}, 2)
	e.starter.hook = func(ctx context.Context) { started <- struct{}{}; <-ctx.Done() }
	id := e.create(Spec{Kernel: true}).ID
	<-started
	r, err := e.m.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	execd := make(chan error, 1)
	go func() {
		_, _, err := r.Exec(context.Background(), warmpool.KernelExec{Code: "x = 1"})
		execd <- err
	}()
	time.Sleep(10 * time.Millisecond) // waiting for the start ahead
	deleted := make(chan error, 1)
	go func() { deleted <- e.m.Delete(id) }()
	if err := <-execd; !errors.Is(err, ErrNotFound) {
		t.Fatalf("execution during the Delete: %v, want ErrNotFound", err)
	}
	r.End()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}

	e.create(Spec{Kernel: true})
	<-started
	closed := make(chan struct{})
	go func() { e.m.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a start ahead")
	}
}
