package nsjail

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// newTestCapture is a capture without a reading goroutine: add is called
// directly, as the goroutine would.
func newTestCapture(limit int64, onChunk func([]byte)) *capture {
	return &capture{limit: limit, head: limit / 2, onChunk: onChunk, done: make(chan struct{})}
}

// headTail is what a capture must keep of stream: all of it under the
// limit, else its first limit/2 bytes and its last limit-limit/2.
func headTail(stream []byte, limit int) []byte {
	if len(stream) <= limit {
		return stream
	}
	h := limit / 2
	return append(append([]byte{}, stream[:h]...), stream[len(stream)-(limit-h):]...)
}

// Whatever the chunking, the capture keeps the head and the tail in order,
// counts what it cut, and never holds more than the limit.
func TestCaptureKeepsHeadAndTail(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, limit := range []int{1, 2, 3, 7, 64, 1000} {
		for _, size := range []int{0, 1, limit - 1, limit, limit + 1, 2 * limit, 10*limit + 3} {
			if size < 0 {
				continue
			}
			stream := make([]byte, size)
			for i := range stream {
				stream[i] = byte(rng.IntN(256))
			}
			var streamed []byte
			c := newTestCapture(int64(limit), func(b []byte) { streamed = append(streamed, b...) })
			for rest := stream; len(rest) > 0; {
				n := min(len(rest), 1+rng.IntN(3*limit))
				c.add(rest[:n])
				rest = rest[n:]
				if cap(c.buf) > 2*limit+8 { // append's growth, never per chunk
					t.Fatalf("limit %d: buffer grew to %d", limit, cap(c.buf))
				}
			}
			want := headTail(stream, limit)
			if got := c.kept(); !bytes.Equal(got, want) {
				t.Errorf("limit %d size %d: kept %x, want %x", limit, size, got, want)
			}
			if c.omitted() != int64(size-len(want)) || c.truncated() != (size > limit) {
				t.Errorf("limit %d size %d: omitted %d truncated %v", limit, size, c.omitted(), c.truncated())
			}
			if !bytes.Equal(streamed, stream) {
				t.Errorf("limit %d size %d: the callback saw %d bytes, not the stream", limit, size, len(streamed))
			}
		}
	}
}

// The last line of a large output survives: the traceback at the end.
func TestCaptureKeepsLastLine(t *testing.T) {
	c := newTestCapture(1<<10, nil)
	line := bytes.Repeat([]byte("x"), 99)
	for range 10000 {
		c.add(append(line, '\n'))
	}
	c.add([]byte("ZeroDivisionError: division by zero\n"))
	got := c.kept()
	if len(got) != 1<<10 || !bytes.HasSuffix(got, []byte("\nZeroDivisionError: division by zero\n")) || got[0] != 'x' {
		t.Fatalf("kept %d bytes ending %q", len(got), got[len(got)-40:])
	}
	if c.omitted() != 10000*100+36-1<<10 {
		t.Fatalf("omitted %d", c.omitted())
	}
}

// A hand-off's reset drops the earlier output and streams only what comes
// after it.
func TestCaptureResetSwitchesCallback(t *testing.T) {
	var streamed []byte
	c := newTestCapture(8, nil)
	c.add([]byte("preload chatter"))
	if old := c.reset(func(b []byte) { streamed = append(streamed, b...) }); string(old) != "prel"+"tter" {
		t.Fatalf("reset returned %q", old)
	}
	c.add([]byte("abcdefghijk"))
	if got := c.kept(); string(got) != "abcdhijk" || c.omitted() != 3 || string(streamed) != "abcdefghijk" {
		t.Fatalf("after reset: kept %q omitted %d streamed %q", got, c.omitted(), streamed)
	}
}
