package session

import (
	"cmp"
	"slices"
	"time"
)

// The janitor, every Config.JanitorInterval (and on Tidy): sessions unused
// for Retention are deleted with their files; kernels idle for their
// session's idle timeout are stopped (files kept); then, while the idle
// kernels together account more memory than IdleMemoryBudget, the
// longest-idle one is stopped. A session in use (an execution reserved
// with Begin, or its volume lent to the file API) is never touched. The
// choices are pure functions of a snapshot, below; Tidy applies them,
// checking under the lock that nothing changed in between.

// idleView is what the janitor's choice needs of one session.
type idleView struct {
	id          string
	inUse       bool          // busy, or its volume lent
	kernel      bool          // a live kernel (idle, since the session is not in use)
	lastUsed    time.Time     // end of its last use
	idleTimeout time.Duration // the session's
	memory      int64         // the kernel's memory now, when kernel
}

// stopChoice is a kernel to stop and why (ReasonIdleTimeout,
// ReasonMemoryBudget).
type stopChoice struct {
	id, reason string
}

// chooseJanitor decides what to expire (oldest first) and which idle
// kernels to stop at now. Sessions in use are skipped; an expired session's
// kernel goes with it.
func chooseJanitor(now time.Time, retention time.Duration, budget int64, views []idleView) (expire []string, stops []stopChoice) {
	idle := make([]idleView, 0, len(views))
	for _, v := range views {
		if v.inUse {
			continue
		}
		if now.Sub(v.lastUsed) >= retention {
			expire = append(expire, v.id)
			continue
		}
		if !v.kernel {
			continue
		}
		if now.Sub(v.lastUsed) >= v.idleTimeout {
			stops = append(stops, stopChoice{v.id, ReasonIdleTimeout})
			continue
		}
		idle = append(idle, v)
	}
	expire = sortedByIdle(views, expire)
	// Longest idle first: its user is the least likely to come back soon.
	slices.SortFunc(idle, func(a, b idleView) int {
		return cmp.Or(a.lastUsed.Compare(b.lastUsed), cmp.Compare(a.id, b.id))
	})
	var total int64
	for _, v := range idle {
		total += v.memory
	}
	for _, v := range idle {
		if total <= budget {
			break
		}
		stops = append(stops, stopChoice{v.id, ReasonMemoryBudget})
		total -= v.memory
	}
	return expire, stops
}

// sortedByIdle orders ids as their sessions' last use, oldest first.
func sortedByIdle(views []idleView, ids []string) []string {
	last := make(map[string]time.Time, len(views))
	for _, v := range views {
		last[v.id] = v.lastUsed
	}
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(last[a].Compare(last[b]), cmp.Compare(a, b)) })
	return ids
}

// janitor runs Tidy every JanitorInterval until Close.
func (m *Manager) janitor() {
	defer close(m.janitorDone)
	t := time.NewTicker(m.cfg.JanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stopJanitor:
			return
		case <-t.C:
			m.Tidy()
			m.wakeSpares() // a spare that failed to be made is retried, a spare kernel that ended or aged replaced
		}
	}
}

// Tidy runs the janitor now: idle kernels that ended by themselves are
// reaped, expired sessions deleted, idle kernels stopped (idle timeout,
// then the memory budget), and last uses written to disk.
func (m *Manager) Tidy() {
	type snap struct {
		s        *session
		k        Kernel
		lastUsed time.Time
		idle     time.Duration
	}
	var snaps []snap
	type reap struct {
		s *session
		k Kernel
	}
	var reaped []reap
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	now := m.cfg.Now()
	for _, s := range m.sessions {
		if s.gone {
			continue
		}
		if k := s.kernel; k != nil && !s.executing && ended(k) {
			s.kernel = nil
			s.setEndedLocked(k.EndReason())
			s.active.Add(1)
			reaped = append(reaped, reap{s, k})
		}
		snaps = append(snaps, snap{s, s.kernel, s.rec.LastUsedAt, s.rec.idleTimeout()})
	}
	inUse := make(map[*session]bool, len(snaps))
	for _, sn := range snaps {
		inUse[sn.s] = sn.s.busy || sn.s.lends > 0
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	for _, r := range reaped {
		r.k.Close()
		r.s.active.Done()
	}

	views := make([]idleView, 0, len(snaps))
	byID := make(map[string]snap, len(snaps))
	for _, sn := range snaps {
		v := idleView{id: sn.s.id, inUse: inUse[sn.s], kernel: sn.k != nil, lastUsed: sn.lastUsed,
			idleTimeout: sn.idle}
		if v.kernel && !v.inUse {
			v.memory = sn.k.MemoryBytes()
		}
		views = append(views, v)
		byID[v.id] = sn
	}
	expire, stops := chooseJanitor(now, m.cfg.Retention, m.cfg.IdleMemoryBudget, views)
	for _, id := range expire {
		sn := byID[id]
		m.remove(sn.s, "retention", func() bool { return m.unchangedLocked(sn.s, sn.k, sn.lastUsed) })
	}
	for _, c := range stops {
		sn := byID[c.id]
		m.mu.Lock()
		ok := m.unchangedLocked(sn.s, sn.k, sn.lastUsed)
		if ok {
			sn.s.kernel = nil
			sn.s.setEndedLocked(c.reason)
			sn.s.active.Add(1) // Delete waits for the kernel to let go of the volume
		}
		m.mu.Unlock()
		if ok {
			m.log.Info("idle kernel stopped", "session", c.id, "why", c.reason)
			sn.k.Close()
			sn.s.active.Done()
		}
	}
	for _, sn := range snaps {
		if err := m.flush(sn.s, false); err != nil {
			m.log.Error("session's last use not saved", "session", sn.s.id, "err", err)
		}
	}
}

// unchangedLocked tells whether s is still as the janitor saw it: not in
// use, not used since, with the same kernel.
func (m *Manager) unchangedLocked(s *session, k Kernel, lastUsed time.Time) bool {
	return !m.closed && !s.gone && !s.busy && s.lends == 0 && s.kernel == k && s.rec.LastUsedAt.Equal(lastUsed)
}
