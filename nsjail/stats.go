package nsjail

import (
	"errors"

	"github.com/sandboxd/sandboxd/cgroup"
)

// readStats reads the sandbox's cgroup counters; a failure is logged and
// leaves the counters zero (the result is still worth returning).
func (s *Sandbox) readStats() cgroup.Stats {
	if s.cgroupPaths == nil {
		return cgroup.Stats{}
	}
	st, err := s.readCounters()
	if err != nil {
		s.log.Warn("unable to read sandbox cgroup stats", "error", err)
	}
	return st
}

// readCounters reads the cgroup's counters through its counter files,
// opened once (countersLocked): the warm pool opens them while it prepares
// the sandbox (Pending.OpenCounters), so a warm execution's hand-off (its
// CPU baseline) and result read them with a pread each instead of an open,
// a read and a close by path (cgroup.Counters; ~0.2 ms on v1's paths).
// Unlike Stats, it never replaces the memory peak with the PeakMeter's.
func (s *Sandbox) readCounters() (cgroup.Stats, error) {
	s.peakMu.Lock()
	defer s.peakMu.Unlock()
	c, err := s.countersLocked()
	if err != nil {
		return cgroup.Stats{}, err
	}
	return c.Read()
}

// countersLocked returns the cgroup's counter files, opening them on first
// use; under peakMu.
func (s *Sandbox) countersLocked() (*cgroup.Counters, error) {
	if s.countersClosed {
		// A late reader (a memory metric) must not reopen the files of a
		// cgroup being removed: they would pin it until the GC ran.
		return nil, errors.New("the sandbox's cgroup is being removed")
	}
	if s.counters == nil {
		c, err := cgroup.OpenCounters(s.cgroupPaths)
		if err != nil {
			return nil, err
		}
		s.counters = c
	}
	return s.counters, nil
}

// Stats reads the sandbox's cgroup counters now: a session's kernel takes
// the difference over each of its executions. MemoryPeakBytes is the peak
// since the last ResetMemoryPeak that succeeded. It fails once the sandbox
// was removed.
func (s *Sandbox) Stats() (cgroup.Stats, error) {
	if s.cgroupPaths == nil {
		return cgroup.Stats{}, errors.New("the sandbox's cgroup paths are unknown")
	}
	s.peakMu.Lock()
	defer s.peakMu.Unlock()
	c, err := s.countersLocked()
	if err != nil {
		return cgroup.Stats{}, err
	}
	st, err := c.Read()
	if err != nil {
		return st, err
	}
	if s.peakReset && s.peak.PerFile() {
		if st.MemoryPeakBytes, err = s.peak.Read(); err != nil {
			return st, err
		}
	}
	return st, nil
}

// ResetMemoryPeak starts the sandbox's memory high-water mark over from
// its current use (cgroup.PeakMeter), so that Stats reports the peak of
// what runs from now on: a session kernel's execution's own, not the
// kernel's lifetime peak. Where the host cannot reset it (cgroup v2 before
// Linux 6.12) it fails, and Stats keeps reporting the lifetime peak.
// (pids.peak cannot be reset at all: PidsPeak stays the lifetime peak.)
func (s *Sandbox) ResetMemoryPeak() error {
	s.peakMu.Lock()
	defer s.peakMu.Unlock()
	if s.peak == nil {
		if s.cgroupPaths == nil {
			return errors.New("the sandbox's cgroup paths are unknown")
		}
		m, err := cgroup.NewPeakMeter(s.cgroupPaths)
		if err != nil {
			return err
		}
		s.peak = m
	}
	if err := s.peak.Reset(); err != nil {
		return err
	}
	s.peakReset = true
	return nil
}

// closePeak releases the peak meter and the counter files, before the
// cgroup is removed.
func (s *Sandbox) closePeak() {
	s.peakMu.Lock()
	defer s.peakMu.Unlock()
	if s.peak != nil {
		s.peak.Close()
		s.peak, s.peakReset = nil, false
	}
	if s.counters != nil {
		s.counters.Close()
		s.counters = nil
	}
	s.countersClosed = true
}
