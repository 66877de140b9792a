package nsjail

import (
	"os"
	"sync"
	"time"
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
			c.mu.Lock()
			c.total += int64(n)
			if room := c.limit - int64(len(c.buf)); room > 0 {
				c.buf = append(c.buf, chunk[:min(int64(n), room)]...)
			}
			c.mu.Unlock()
		}
		if err != nil { // io.EOF once every writer is gone, or abort
			return
		}
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
