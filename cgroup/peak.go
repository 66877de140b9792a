package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PeakMeter reads a cgroup's memory high-water mark since its last Reset:
// a session kernel's sandbox serves many executions, and each reports its
// own peak. On v1 a write to memory.max_usage_in_bytes resets the mark to
// the current use. On v2 memory.peak is reset per open file (Linux 6.12+:
// a write resets what later reads through that file see), so the meter
// holds the file open. Where no reset is possible (v2 before 6.12) Reset
// fails and the mark stays the cgroup's lifetime peak.
type PeakMeter struct {
	v1 string   // memory.max_usage_in_bytes (v1)
	f  *os.File // memory.peak, opened read-write (v2)
}

// NewPeakMeter opens the meter of the cgroup at paths (as for ReadStats).
func NewPeakMeter(paths Paths) (*PeakMeter, error) {
	if dir, ok := paths.V2(); ok {
		f, err := os.OpenFile(filepath.Join(dir, "memory.peak"), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("cgroup memory peak: %w", err)
		}
		return &PeakMeter{f: f}, nil
	}
	dir, ok := paths["memory"]
	if !ok || dir == "" {
		return nil, errors.New("cgroup memory peak: no memory hierarchy")
	}
	return &PeakMeter{v1: filepath.Join(dir, "memory.max_usage_in_bytes")}, nil
}

// Reset sets the mark to the cgroup's current use.
func (m *PeakMeter) Reset() error {
	var err error
	if m.f != nil {
		_, err = m.f.WriteAt([]byte("reset\n"), 0)
	} else {
		err = writeFile(m.v1, "0")
	}
	if err != nil {
		return fmt.Errorf("cgroup memory peak reset: %w", err)
	}
	return nil
}

// Read is the mark since the last Reset.
func (m *PeakMeter) Read() (int64, error) {
	var b []byte
	var err error
	if m.f != nil {
		buf := make([]byte, 32)
		var n int
		n, err = m.f.ReadAt(buf, 0)
		b = buf[:n]
		if n > 0 {
			err = nil // io.EOF after a short read
		}
	} else {
		b, err = os.ReadFile(m.v1)
	}
	if err != nil {
		return 0, fmt.Errorf("cgroup memory peak: %w", err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup memory peak: %q is not a number", b)
	}
	return v, nil
}

// PerFile says the mark since Reset can be read only through the meter
// (v2: the reset is the open file's); on v1 the cgroup's own
// memory.max_usage_in_bytes, which ReadStats reads, is that mark.
func (m *PeakMeter) PerFile() bool { return m.f != nil }

// Close releases the meter (the v2 file).
func (m *PeakMeter) Close() error {
	if m.f != nil {
		return m.f.Close()
	}
	return nil
}
