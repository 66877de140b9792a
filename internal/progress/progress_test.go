package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeClock is the meter's clock, moved by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func status(entries int64) Status {
	return Status{Label: "unpack layer 1/1", Done: entries * 10, Total: 1000, Bytes: entries * 100, Entries: entries, Elapsed: time.Duration(entries) * time.Millisecond}
}

// Not a terminal: status updates write nothing, stage lines are whole lines.
func TestMeterNotTTYIsLineBased(t *testing.T) {
	var buf bytes.Buffer
	m := NewMeter(&buf, false)
	m.Line("stage %d", 1)
	for i := range int64(100) {
		m.Status(status(i))
	}
	m.Line("stage 2\n")
	m.Clear()
	if got, want := buf.String(), "stage 1\nstage 2\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

// A terminal: the status line is redrawn in place (carriage return, erase),
// at most every redrawEvery, and a line written meanwhile lands above it.
func TestMeterTTYRedrawsInPlace(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	m := NewMeter(&buf, true)
	m.now = clock.now
	m.Status(status(1))
	m.Status(status(2)) // within 100 ms: not drawn
	clock.t = clock.t.Add(redrawEvery)
	m.Status(status(3))
	if n := strings.Count(buf.String(), "\r\x1b[K"); n != 2 {
		t.Fatalf("%d redraws, want 2: %q", n, buf.String())
	}
	if strings.Contains(buf.String(), "\n") {
		t.Fatalf("status lines must not scroll: %q", buf.String())
	}
	buf.Reset()
	m.Line("log record")
	if want := "\r\x1b[Klog record\n" + status(3).String(); buf.String() != want {
		t.Fatalf("line under a status: %q, want %q", buf.String(), want)
	}
	buf.Reset()
	m.Clear()
	m.Clear()
	if buf.String() != "\r\x1b[K" {
		t.Fatalf("clear: %q", buf.String())
	}
	buf.Reset()
	m.Line("after")
	if buf.String() != "after\n" {
		t.Fatalf("line after clear: %q", buf.String())
	}
}

func TestStatusString(t *testing.T) {
	for _, c := range []struct {
		s    Status
		want string
	}{
		{Status{Label: "x", Done: 25, Total: 100, Bytes: 2_500_000, Entries: 10, TotalEntries: 40, Elapsed: time.Second},
			"x  25% 2.5 MB, 10/40 entries, 1s elapsed, ETA 3s"},
		{Status{Label: "x", Done: 100, Total: 100, Bytes: 999, Entries: 1, Elapsed: 1500 * time.Millisecond},
			"x 100% 999 B, 1 entries, 1.5s elapsed"},
		{Status{Label: "x", Bytes: 1_500_000_000, Elapsed: 0}, "x 1.50 GB, 0 entries, 0s elapsed"},
	} {
		if got := c.s.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.s, got, c.want)
		}
	}
}
