package nsjail

import (
	"errors"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Output streams, as an OutputFunc names them.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// OutputFunc is given each chunk of a sandbox's output as it is read, for
// streaming it live: every byte the command writes, including what the cap
// cuts from the result. It runs on the stream's reading goroutine and must
// neither block (the command's writes wait while it does: its pipe fills)
// nor keep chunk (the buffer is reused).
type OutputFunc func(stream string, chunk []byte)

// ForStream is fn bound to one stream, nil when fn is.
func (fn OutputFunc) ForStream(stream string) func([]byte) {
	if fn == nil {
		return nil
	}
	return func(b []byte) { fn(stream, b) }
}

// capture reads one output stream of the sandbox until EOF. It keeps at most
// limit bytes: the head of the stream (half the limit) and, once that is
// full, its tail in a ring, so the last lines, where a traceback is, always
// survive; what falls between is drained and counted. A flood (SECURITY.md
// case 8) costs the worker one fixed buffer per stream, never more memory:
// buf grows up to limit and is then only overwritten.
type capture struct {
	mu    sync.Mutex
	r     *os.File
	limit int64
	// buf holds the head in buf[:head] and, once len(buf) == limit, the
	// tail as a ring in buf[head:] whose oldest byte is at head+pos.
	buf   []byte
	head  int64
	pos   int64
	total int64
	// onChunk, when set, is given every chunk read (see OutputFunc).
	onChunk func([]byte)
	done    chan struct{}
}

func newCapture(r *os.File, limit int64, onChunk func([]byte)) *capture {
	c := &capture{r: r, limit: limit, head: limit / 2, onChunk: onChunk, done: make(chan struct{})}
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

// add counts b, keeps it (head, then the tail's ring) and passes it to the
// chunk callback in effect when it was read: one set later (a warm
// sandbox's hand-off) never sees output from before it. The callback runs
// outside the lock, on the reading goroutine, so it sees the chunks in
// order.
func (c *capture) add(b []byte) {
	c.mu.Lock()
	c.total += int64(len(b))
	c.keep(b)
	fn := c.onChunk
	c.mu.Unlock()
	if fn != nil {
		fn(b)
	}
}

// keep stores b: appended while buf is under the limit, then written into
// the tail's ring, of which only the last limit-head bytes matter.
func (c *capture) keep(b []byte) {
	if room := c.limit - int64(len(c.buf)); room > 0 {
		n := min(int64(len(b)), room)
		c.buf = append(c.buf, b[:n]...)
		b = b[n:]
	}
	if len(b) == 0 { // buf is full only when b is left
		return
	}
	ring := c.buf[c.head:]
	size := int64(len(ring))
	if size == 0 {
		return
	}
	if int64(len(b)) > size {
		// Only the last size bytes survive; they start the ring anew.
		b = b[int64(len(b))-size:]
	}
	n := int64(copy(ring[c.pos:], b))
	copy(ring, b[n:])
	c.pos = (c.pos + int64(len(b))) % size
}

// kept is what the capture kept, in stream order: the ring is rotated in
// place (no second buffer) so that buf is head then tail. Call it once the
// stream is read; it leaves buf unusable for further writes.
func (c *capture) kept() []byte {
	if c.pos != 0 {
		ring := c.buf[c.head:]
		slices.Reverse(ring[:c.pos])
		slices.Reverse(ring[c.pos:])
		slices.Reverse(ring)
		c.pos = 0
	}
	return c.buf
}

// omitted counts the bytes cut between the head and the tail.
func (c *capture) omitted() int64 { return c.total - int64(len(c.buf)) }

// abort makes a blocked Read return; used only when a stream is still open
// after every process of the sandbox is gone, which should never happen.
func (c *capture) abort() { _ = c.r.SetReadDeadline(time.Unix(1, 0)) }

// reset forgets what was captured so far and returns it (a warm sandbox's
// preload chatter must not become part of the execution's output), and
// gives what is read from now on to onChunk: in one step, so no chunk is
// both dropped and streamed, or kept and not streamed.
func (c *capture) reset(onChunk func([]byte)) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.kept()
	c.buf, c.total, c.pos, c.onChunk = nil, 0, 0, onChunk
	return old
}

func (c *capture) truncated() bool { return c.omitted() > 0 }

// Capture reads one output stream up to a cap, as a sandbox's stdout and
// stderr are read (the rest is drained and counted, never buffered), for
// streams that end on the caller's word rather than at EOF: a session
// kernel's execution writes into pipes that a process it left running may
// hold open forever.
type Capture struct{ c *capture }

// Captured is what a Capture kept of its stream.
type Captured struct {
	// Bytes is what was kept, at most the cap: the stream's head and
	// tail; Total counts everything read; Omitted the bytes cut between
	// the two; Truncated says Total went past the cap (Omitted > 0).
	Bytes     []byte
	Total     int64
	Omitted   int64
	Truncated bool
}

// NewCapture starts reading r, the read end of a pipe, keeping at most
// limit bytes (head and tail). onChunk, when not nil, is given every chunk
// read, in order (see OutputFunc). Stop must be called.
func NewCapture(r *os.File, limit int64, onChunk func([]byte)) *Capture {
	return &Capture{newCapture(r, limit, onChunk)}
}

// Stop ends the capture and closes r: it reads, without blocking, what the
// pipe holds at this moment (all the writer wrote before Stop, when it is
// done writing) and drops whatever comes later (the writer gets EPIPE).
// Idempotent in effect only once: call it once.
func (c *Capture) Stop() Captured {
	cc := c.c
	cc.stop()
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return Captured{Bytes: cc.kept(), Total: cc.total, Omitted: cc.omitted(), Truncated: cc.truncated()}
}

// stop ends the capture and closes r, as Capture.Stop.
func (c *capture) stop() {
	// Wake the reading goroutine; what it read is counted, what is still
	// in the pipe is drained below.
	_ = c.r.SetReadDeadline(time.Unix(1, 0))
	<-c.done
	_ = c.r.SetReadDeadline(time.Time{})
	// A failed drain loses only what was still in the pipe; the stream is
	// closed either way.
	_ = c.drainBuffered()
	c.r.Close()
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
