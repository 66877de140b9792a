package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DecodeEvent parses one event line (without its newline) strictly: a
// bounded line holding one JSON object of a known type with that type's
// fields only, each well-formed and within bounds. The code can write
// anything on the events fd (SECURITY.md case 50): whatever this refuses is
// dropped.
func DecodeEvent(line []byte) (Event, error) {
	var ev Event
	if len(line) >= MaxLineBytes {
		return ev, fmt.Errorf("event line longer than %d bytes", MaxLineBytes)
	}
	var wire struct {
		Type  *string         `json:"type"`
		Error json.RawMessage `json:"error"`
		Mime  json.RawMessage `json:"mime"`
		Name  *string         `json:"name"`
		// A figure's size, as the runner read it from the PNG it wrote
		// (for the live event only: the answer's artifact has the
		// worker's own reading).
		Width  *int `json:"width"`
		Height *int `json:"height"`
	}
	if err := strictDecode(line, &wire); err != nil {
		return ev, fmt.Errorf("event %s: %w", describe(line), err)
	}
	if wire.Type == nil {
		return ev, fmt.Errorf("event %s: no type", describe(line))
	}
	ev.Type = *wire.Type
	only := func(field string, present bool) error {
		n := 0
		for _, p := range []bool{wire.Error != nil, wire.Mime != nil, wire.Name != nil} {
			if p {
				n++
			}
		}
		if !present || n != 1 {
			return fmt.Errorf("event %s: a %s event has %s and nothing else", describe(line), ev.Type, field)
		}
		return nil
	}
	switch ev.Type {
	case EventError:
		if err := only("error", wire.Error != nil); err != nil {
			return ev, err
		}
		e, err := decodeError(wire.Error)
		if err != nil {
			return ev, fmt.Errorf("event %s: %w", describe(line), err)
		}
		ev.Error = e
	case EventDisplay:
		if err := only("mime", wire.Mime != nil); err != nil {
			return ev, err
		}
		m, err := decodeMime(wire.Mime)
		if err != nil {
			return ev, fmt.Errorf("event %s: %w", describe(line), err)
		}
		ev.Mime = m
	case EventFigure:
		if err := only("name", wire.Name != nil); err != nil {
			return ev, err
		}
		if !figureName.MatchString(*wire.Name) {
			return ev, fmt.Errorf("event %s: figure name %q is not %s", describe(line), *wire.Name, FigureNameFormat)
		}
		ev.Name = *wire.Name
		for _, n := range []*int{wire.Width, wire.Height} {
			if n != nil && (*n < 1 || *n > math.MaxInt32) {
				return ev, fmt.Errorf("event %s: figure size %d out of range", describe(line), *n)
			}
		}
		if wire.Width != nil && wire.Height != nil {
			ev.Width, ev.Height = *wire.Width, *wire.Height
		}
	default:
		return ev, fmt.Errorf("event %s: unknown type", describe(line))
	}
	if ev.Type != EventFigure && (wire.Width != nil || wire.Height != nil) {
		return ev, fmt.Errorf("event %s: a size on a %s event", describe(line), ev.Type)
	}
	return ev, nil
}

// figureName is FigureNameFormat's names, up to MaxFigures digits' worth
// of counting past names the code took.
var figureName = regexp.MustCompile(`^figure-[1-9][0-9]{0,6}\.png$`)

// strictDecode decodes exactly one JSON value of known fields from b.
func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimSpace(b[dec.InputOffset():])) != 0 {
		return errors.New("more than one value")
	}
	return nil
}

func decodeError(raw json.RawMessage) (*Error, error) {
	// Pointers: a required field left out (or null) is refused, never a
	// zero value.
	var wire struct {
		Type      *string  `json:"type"`
		Message   *string  `json:"message"`
		Line      *int     `json:"line"`
		Offset    *int     `json:"offset"`
		Traceback *[]Frame `json:"traceback"`
		Text      *string  `json:"text"`
		Hint      *string  `json:"hint"`
	}
	if err := strictDecode(raw, &wire); err != nil {
		return nil, fmt.Errorf("error: %w", err)
	}
	if wire.Type == nil || *wire.Type == "" || wire.Message == nil || wire.Traceback == nil || wire.Text == nil {
		return nil, errors.New("error: type, message, traceback or text missing")
	}
	if len(*wire.Traceback) > maxFrames {
		return nil, fmt.Errorf("error: more than %d frames", maxFrames)
	}
	for _, n := range []*int{wire.Line, wire.Offset} {
		if n != nil && (*n < 0 || *n > 1<<30) {
			return nil, fmt.Errorf("error: line or offset %d out of range", *n)
		}
	}
	for _, f := range *wire.Traceback {
		if f.Line < 0 || f.Line > 1<<30 {
			return nil, fmt.Errorf("error: frame line %d out of range", f.Line)
		}
	}
	e := &Error{Type: *wire.Type, Message: *wire.Message, Line: wire.Line, Offset: wire.Offset,
		Traceback: *wire.Traceback, Text: *wire.Text}
	if wire.Hint != nil {
		e.Hint = *wire.Hint
	}
	return e, nil
}

func decodeMime(raw json.RawMessage) (map[string]string, error) {
	var m map[string]string
	if err := strictDecode(raw, &m); err != nil {
		return nil, fmt.Errorf("mime: %w", err)
	}
	if _, ok := m[MimeText]; !ok {
		return nil, fmt.Errorf("mime: no %s", MimeText)
	}
	for k := range m {
		if k != MimeText && k != MimeMarkdown {
			return nil, fmt.Errorf("mime: %q is not %s or %s", k, MimeText, MimeMarkdown)
		}
	}
	return m, nil
}

// Want says which events an execution asked for; the others are dropped
// (an error is always wanted).
type Want struct {
	Display bool
	Figures bool
}

// Outcome is what a Reader kept of an execution's events.
type Outcome struct {
	// Error is the last error event, nil when none.
	Error *Error
	// Display are the display events, in order (at most maxDisplays).
	Display []Display
	// Figures are the figure events' names, in order (at most MaxFigures).
	Figures []string
	// Dropped counts the lines refused: invalid, too long, unwanted, over
	// a bound, or cut off at the end.
	Dropped int
	// Overflow says the events went past MaxEventsBytes: the rest was
	// drained unread.
	Overflow bool
}

// Reader reads one execution's events fd (the read end of its pipe) as
// they come, bounded (MaxLineBytes per line, MaxEventsBytes in all: a flood
// costs the worker a fixed buffer and is drained, never buffered),
// decoding each line with DecodeEvent and passing the accepted events to
// an EventFunc. Stop must be called.
type Reader struct {
	r    *os.File
	want Want
	on   EventFunc
	done chan struct{}

	mu       sync.Mutex
	out      Outcome
	line     []byte // the line being read, without its newline
	skipping bool   // the line being read is too long: dropped up to its end
	read     int64
}

// NewReader starts reading r. on, when not nil, gets each accepted event.
func NewReader(r *os.File, want Want, on EventFunc) *Reader {
	rd := &Reader{r: r, want: want, on: on, done: make(chan struct{})}
	go rd.loop()
	return rd
}

func (rd *Reader) loop() {
	defer close(rd.done)
	chunk := make([]byte, 64<<10)
	for {
		n, err := rd.r.Read(chunk)
		if n > 0 {
			rd.add(chunk[:n])
		}
		if err != nil { // EOF once every writer is gone, or Stop
			return
		}
	}
}

// add takes b, the next bytes of the stream.
func (rd *Reader) add(b []byte) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.read >= MaxEventsBytes {
		rd.out.Overflow = true
		return
	}
	if room := MaxEventsBytes - rd.read; int64(len(b)) > room {
		b = b[:room]
		rd.out.Overflow = true
	}
	rd.read += int64(len(b))
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		part := b
		if i >= 0 {
			part = b[:i]
		}
		if !rd.skipping {
			if len(rd.line)+len(part) >= MaxLineBytes {
				rd.skipping, rd.line = true, nil
			} else {
				rd.line = append(rd.line, part...)
			}
		}
		if i < 0 {
			return
		}
		b = b[i+1:]
		if rd.skipping {
			rd.out.Dropped++
			rd.skipping = false
			continue
		}
		rd.take(rd.line)
		rd.line = rd.line[:0]
	}
}

// take decodes one complete line and keeps the event if it is wanted and
// within the bounds.
func (rd *Reader) take(line []byte) {
	ev, err := DecodeEvent(line)
	if err != nil {
		rd.out.Dropped++
		return
	}
	switch {
	case ev.Type == EventError:
		rd.out.Error = ev.Error
	case ev.Type == EventDisplay && rd.want.Display && len(rd.out.Display) < maxDisplays:
		rd.out.Display = append(rd.out.Display, Display{Mime: ev.Mime})
	case ev.Type == EventFigure && rd.want.Figures && len(rd.out.Figures) < MaxFigures:
		rd.out.Figures = append(rd.out.Figures, ev.Name)
	default:
		rd.out.Dropped++
		return
	}
	if rd.on != nil {
		rd.on(ev)
	}
}

// Stop ends the reading and closes the pipe: it reads, without blocking,
// what the pipe holds at this moment (all the writers wrote, once the
// execution is over) and drops what comes later, as nsjail.Capture.Stop
// does for a kernel's output. A line cut off at the end is dropped.
func (rd *Reader) Stop() Outcome {
	_ = rd.r.SetReadDeadline(time.Unix(1, 0))
	<-rd.done
	_ = rd.r.SetReadDeadline(time.Time{})
	_ = rd.drainBuffered()
	rd.r.Close()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if len(rd.line) > 0 || rd.skipping {
		rd.out.Dropped++
	}
	return rd.out
}

// drainBuffered reads the bytes the pipe holds now (FIONREAD), without
// waiting for more: a writer that keeps writing cannot keep Stop reading.
func (rd *Reader) drainBuffered() error {
	rc, err := rd.r.SyscallConn()
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
			rd.add(chunk[:n])
		}
		return true // never wait for more
	})
	return errors.Join(err, rerr)
}

// Pipe makes an execution's events pipe: the read end for NewReader, the
// write end to pass into the sandbox (the caller closes its copy once it
// is passed).
func Pipe() (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("unable to create the events pipe: %w", err)
	}
	return r, w, nil
}
