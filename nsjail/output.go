package nsjail

import (
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// capture reads one output stream of the sandbox until EOF. It keeps at most
// limit bytes and drains and counts the rest, so a flood (SECURITY.md case 8)
// costs the worker a fixed buffer, never more memory.
type capture struct {
	mu    sync.Mutex
	r     *os.File
	limit int64
	buf   []byte
	total int64
	done  chan struct{}
}

func newCapture(r *os.File, limit int64) *capture {
	c := &capture{r: r, limit: limit, done: make(chan struct{})}
	go c.loop()
	return c
}

func (c *capture) loop() {
	defer close(c.done)
	chunk := make([]byte, 64<<10)
	for {
		n, err := c.r.Read(chunk)
		if n > 0 {
			c.add(chunk[:n])
		}
		if err != nil { // io.EOF once every writer is gone, or abort
			return
		}
	}
}

// add counts b and keeps what fits under the limit.
func (c *capture) add(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(b))
	if room := c.limit - int64(len(c.buf)); room > 0 {
		c.buf = append(c.buf, b[:min(int64(len(b)), room)]...)
	}
}

// abort makes a blocked Read return; used only when a stream is still open
// after every process of the sandbox is gone, which should never happen.
func (c *capture) abort() { _ = c.r.SetReadDeadline(time.Unix(1, 0)) }

// reset forgets what was captured so far and returns it (a warm sandbox's
// preload chatter must not become part of the execution's output).
func (c *capture) reset() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.buf
	c.buf, c.total = nil, 0
	return old
}

func (c *capture) truncated() bool { return c.total > int64(len(c.buf)) }

// Capture reads one output stream up to a cap, as a sandbox's stdout and
// stderr are read (the rest is drained and counted, never buffered), for
// streams that end on the caller's word rather than at EOF: a session
// kernel's execution writes into pipes that a process it left running may
// hold open forever.
type Capture struct{ c *capture }

// Captured is what a Capture kept of its stream.
type Captured struct {
	// Bytes is what was kept, at most the cap; Total counts everything
	// read; Truncated says Total went past the cap.
	Bytes     []byte
	Total     int64
	Truncated bool
}

// NewCapture starts reading r, the read end of a pipe, keeping at most
// limit bytes. Stop must be called.
func NewCapture(r *os.File, limit int64) *Capture { return &Capture{newCapture(r, limit)} }

// Stop ends the capture and closes r: it reads, without blocking, what the
// pipe holds at this moment (all the writer wrote before Stop, when it is
// done writing) and drops whatever comes later (the writer gets EPIPE).
// Idempotent in effect only once: call it once.
func (c *Capture) Stop() Captured {
	cc := c.c
	// Wake the reading goroutine; what it read is counted, what is still
	// in the pipe is drained below.
	_ = cc.r.SetReadDeadline(time.Unix(1, 0))
	<-cc.done
	_ = cc.r.SetReadDeadline(time.Time{})
	// A failed drain loses only what was still in the pipe; the stream is
	// closed either way.
	_ = cc.drainBuffered()
	cc.r.Close()
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return Captured{Bytes: cc.buf, Total: cc.total, Truncated: cc.truncated()}
}

// drainBuffered reads the bytes the pipe holds now (FIONREAD), without
// waiting for more: a writer that keeps writing cannot keep Stop reading.
func (c *capture) drainBuffered() error {
	rc, err := c.r.SyscallConn()
	if err != nil {
		return err
	}
	chunk := make([]byte, 64<<10)
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		left, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ)
		if err != nil {
			rerr = err
			return true
		}
		for left > 0 {
			n, err := unix.Read(int(fd), chunk[:min(left, len(chunk))])
			if n <= 0 || err != nil {
				rerr = err
				return true
			}
			left -= n
			c.add(chunk[:n])
		}
		return true // never wait for more
	})
	return errors.Join(err, rerr)
}
