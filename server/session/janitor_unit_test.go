package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestChooseJanitor(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	const gib = 1 << 30
	views := []idleView{
		// Past retention, in use: untouched.
		{id: "busy-old", inUse: true, kernel: true, lastUsed: ago(48 * time.Hour), idleTimeout: time.Minute, memory: 9 * gib},
		// Past retention: expired, kernel or not; oldest first.
		{id: "old-b", kernel: true, lastUsed: ago(25 * time.Hour), idleTimeout: time.Minute, memory: gib},
		{id: "old-a", lastUsed: ago(30 * time.Hour), idleTimeout: time.Minute},
		// Idle past its own idle timeout.
		{id: "idle-long", kernel: true, lastUsed: ago(30 * time.Minute), idleTimeout: 20 * time.Minute, memory: gib},
		// Idle within their idle timeouts: the budget decides, longest
		// idle first (ties by id).
		{id: "c", kernel: true, lastUsed: ago(10 * time.Minute), idleTimeout: time.Hour, memory: gib},
		{id: "b", kernel: true, lastUsed: ago(15 * time.Minute), idleTimeout: time.Hour, memory: gib},
		{id: "a", kernel: true, lastUsed: ago(15 * time.Minute), idleTimeout: time.Hour, memory: gib},
		{id: "d", kernel: true, lastUsed: ago(time.Minute), idleTimeout: time.Hour, memory: gib},
		// No kernel: nothing to stop.
		{id: "nokernel", lastUsed: ago(time.Hour), idleTimeout: time.Minute},
		// In use within the budget's reach: never chosen.
		{id: "busy", inUse: true, kernel: true, lastUsed: ago(time.Hour), idleTimeout: time.Minute, memory: 5 * gib},
	}
	for _, tc := range []struct {
		budget int64
		stops  string
	}{
		{4 * gib, "idle-long:idle_timeout"},
		{2*gib + 1, "idle-long:idle_timeout a:memory_budget b:memory_budget"},
		{gib, "idle-long:idle_timeout a:memory_budget b:memory_budget c:memory_budget"},
		{0, "idle-long:idle_timeout a:memory_budget b:memory_budget c:memory_budget d:memory_budget"},
	} {
		expire, stops := chooseJanitor(now, 24*time.Hour, tc.budget, views)
		if !slices.Equal(expire, []string{"old-a", "old-b"}) {
			t.Errorf("budget %d: expire %v", tc.budget, expire)
		}
		var got []string
		for _, s := range stops {
			got = append(got, s.id+":"+s.reason)
		}
		if !slices.Equal(got, strings.Fields(tc.stops)) {
			t.Errorf("budget %d: stops %v, want %s", tc.budget, got, tc.stops)
		}
	}
}

func TestIdleTimeoutStopsTheKernelKeepsTheFiles(t *testing.T) {
	e := newEnv(t, nil)
	id := e.create(Spec{Kernel: true, IdleTimeout: 10 * time.Minute}).ID
	other := e.create(Spec{Kernel: true, IdleTimeout: time.Hour}).ID
	e.exec(id, "")
	e.exec(other, "")
	k, ko := e.starter.all()[0], e.starter.all()[1]
	e.clock.Add(10*time.Minute - time.Nanosecond)
	e.m.Tidy()
	if _, closes, _ := k.counts(); closes != 0 {
		t.Fatal("kernel stopped before its idle timeout")
	}
	e.clock.Add(time.Nanosecond)
	e.m.Tidy()
	if _, closes, _ := k.counts(); closes != 1 {
		t.Fatal("kernel not stopped at its idle timeout")
	}
	if _, closes, _ := ko.counts(); closes != 0 {
		t.Fatal("a kernel within its idle timeout was stopped")
	}
	info, err := e.m.Get(id)
	if err != nil {
		t.Fatalf("the session went with its kernel: %v", err)
	}
	if info.Kernel.State != KernelNone || info.Kernel.EndReason != ReasonIdleTimeout {
		t.Fatalf("kernel info %+v", info.Kernel)
	}
	e.wantExec(id, "", ExecInfo{KernelGeneration: 2, State: StateNew, Reason: ReasonIdleTimeout})
	if st := e.m.Stats(); st.KernelStarts["new/idle_timeout"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMemoryBudgetStopsTheLongestIdleFirst(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IdleMemoryBudget = 2<<30 + 1 })
	e.starter.memory = 1 << 30
	var ids []string
	for i := range 3 {
		ids = append(ids, e.create(Spec{ID: fmt.Sprint("s", i), Kernel: true}).ID)
	}
	// Used in the order s1, s0, s2: s1 is the longest idle.
	for _, id := range []string{ids[1], ids[0], ids[2]} {
		e.exec(id, "")
		e.clock.Add(time.Second)
	}
	if st := e.m.Stats(); st.IdleKernels != 3 || st.IdleKernelBytes != 3<<30 {
		t.Fatalf("stats %+v", st)
	}
	// A busy session is never the one stopped, even the longest idle.
	r, err := e.m.Begin(ids[1])
	if err != nil {
		t.Fatal(err)
	}
	e.m.Tidy()
	if st := e.m.Stats(); st.IdleKernels != 3 {
		t.Fatalf("a kernel was stopped with two idle ones within the budget: %+v", st)
	}
	r.End() // s1 is now the most recently used
	e.m.Tidy()
	if st := e.m.Stats(); st.IdleKernels != 2 || st.IdleKernelBytes != 2<<30 {
		t.Fatalf("stats after the budget: %+v", st)
	}
	e.wantExec(ids[0], "", ExecInfo{KernelGeneration: 2, State: StateNew, Reason: ReasonMemoryBudget})
	e.wantExec(ids[1], "", ExecInfo{KernelGeneration: 1, State: StatePreserved})
	e.wantExec(ids[2], "", ExecInfo{KernelGeneration: 1, State: StatePreserved})
}

func TestRetentionDeletesTheSessionAndItsFiles(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Retention = time.Hour })
	id := e.create(Spec{Kernel: true}).ID
	busy := e.create(Spec{Kernel: true}).ID
	lent := e.create(Spec{Kernel: true}).ID
	e.exec(id, "")
	k := e.starter.last()
	r, err := e.m.Begin(busy)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.m.Lend(lent)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := e.m.Get(id); !info.ExpiresAt.Equal(info.LastUsedAt.Add(time.Hour)) {
		t.Fatalf("expires_at %v, last_used_at %v", info.ExpiresAt, info.LastUsedAt)
	}
	e.clock.Add(time.Hour)
	e.m.Tidy()
	if _, err := e.m.Get(id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired session: %v", err)
	}
	if _, closes, _ := k.counts(); closes != 1 {
		t.Fatal("the expired session's kernel was not closed")
	}
	if _, err := os.Lstat(filepath.Join(e.root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expired session's directory: %v", err)
	}
	for _, id := range []string{busy, lent} {
		if _, err := e.m.Get(id); err != nil {
			t.Fatalf("a session in use expired: %v", err)
		}
	}
	// Released, they count as used now: a full retention to go.
	r.End()
	l.Release()
	e.clock.Add(time.Hour - time.Nanosecond)
	e.m.Tidy()
	if len(e.m.List()) != 2 {
		t.Fatal("sessions expired before their retention since last use")
	}
	e.clock.Add(time.Nanosecond)
	e.m.Tidy()
	if len(e.m.List()) != 0 {
		t.Fatal("sessions outlived their retention")
	}
}
