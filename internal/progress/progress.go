// Package progress shows how far a long job (an image unpack, an image
// build) has got. On a terminal a Meter keeps one status line redrawn in
// place: bytes and entries, percentage, elapsed time and ETA. Anywhere else
// (a log file, a pipe, journald) it writes nothing but the lines its caller
// prints per stage, so logs stay one line per event and never fill with
// carriage returns or escape sequences.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// IsTerminal reports whether f is a terminal (a tcgetattr succeeds on it).
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// redrawEvery bounds how often a terminal status line is redrawn: updates
// come once per tar entry, far more often than anyone can read.
const redrawEvery = 100 * time.Millisecond

// Meter writes stage lines and, on a terminal, one status line below them.
// It is safe for concurrent use. Output that must not be torn by the status
// line (a logger's) can be written through the Meter itself: it clears the
// status line first and redraws it after.
type Meter struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	status string    // the status line on screen, "" when none
	drawn  time.Time // when it was last drawn
	now    func() time.Time
}

// NewMeter writes to w; tty says whether w is a terminal (IsTerminal).
func NewMeter(w io.Writer, tty bool) *Meter {
	return &Meter{w: w, tty: tty, now: time.Now}
}

// TTY reports whether the meter draws status lines.
func (m *Meter) TTY() bool { return m.tty }

// Line prints one stage line (a newline is added when missing).
func (m *Meter) Line(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	m.Write([]byte(s))
}

// Write passes p through, keeping the status line (if any) below it. p
// should hold whole lines.
func (m *Meter) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.status == "" {
		return m.w.Write(p)
	}
	if _, err := io.WriteString(m.w, "\r\x1b[K"); err != nil {
		return 0, err
	}
	n, err := m.w.Write(p)
	if err == nil {
		_, err = io.WriteString(m.w, m.status)
	}
	return n, err
}

// Status redraws the status line on a terminal, at most every 100 ms; it
// does nothing elsewhere.
func (m *Meter) Status(s Status) {
	if !m.tty {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if m.status != "" && now.Sub(m.drawn) < redrawEvery {
		return
	}
	m.drawn = now
	m.status = s.String()
	io.WriteString(m.w, "\r\x1b[K"+m.status)
}

// Clear removes the status line, so the next output starts on a clean line.
func (m *Meter) Clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.status != "" {
		io.WriteString(m.w, "\r\x1b[K")
		m.status = ""
	}
}

// Status is one status line. Done/Total give the percentage and ETA (in
// whatever unit is known up front: for an unpack the compressed bytes read,
// as the uncompressed size of a layer is only known at its end); Bytes and
// Entries (of TotalEntries, when known) are what has been produced.
type Status struct {
	Label                 string
	Done, Total           int64
	Bytes                 int64
	Entries, TotalEntries int64
	Elapsed               time.Duration
}

// String formats s as "LABEL 42% 210.3 MB, 7120 entries, 3.1s elapsed, ETA 4.2s".
func (s Status) String() string {
	var b strings.Builder
	b.WriteString(s.Label)
	frac := -1.0
	if s.Total > 0 {
		frac = min(1, float64(s.Done)/float64(s.Total))
		fmt.Fprintf(&b, " %3.0f%%", 100*frac)
	}
	fmt.Fprintf(&b, " %s, %d", Bytes(s.Bytes), s.Entries)
	if s.TotalEntries > 0 {
		fmt.Fprintf(&b, "/%d", s.TotalEntries)
	}
	fmt.Fprintf(&b, " entries, %s elapsed", s.Elapsed.Round(100*time.Millisecond))
	if frac > 0.01 && frac < 1 {
		eta := time.Duration(float64(s.Elapsed) * (1 - frac) / frac)
		fmt.Fprintf(&b, ", ETA %s", eta.Round(time.Second))
	}
	return b.String()
}

// Bytes formats n in decimal units (MB = 10^6 bytes), as sizes are given
// elsewhere in the project's documents.
func Bytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
