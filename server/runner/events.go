package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sync"

	"github.com/sandboxd/sandboxd/nsjail"
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
		Type     *string         `json:"type"`
		Error    json.RawMessage `json:"error"`
		Mime     json.RawMessage `json:"mime"`
		Name     *string         `json:"name"`
		ExitCode *int            `json:"exit_code"`
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
		for _, p := range []bool{wire.Error != nil, wire.Mime != nil, wire.Name != nil, wire.ExitCode != nil} {
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
	case EventDone:
		if err := only("exit_code", wire.ExitCode != nil); err != nil {
			return ev, err
		}
		if *wire.ExitCode < 0 || *wire.ExitCode > maxExitCode {
			return ev, fmt.Errorf("event %s: exit code out of range", describe(line))
		}
		ev.ExitCode = *wire.ExitCode
	default:
		return ev, fmt.Errorf("event %s: unknown type", describe(line))
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
	// Done takes the done event (a Job with Done) for Reader.Done.
	Done bool
}

// Outcome is what a Reader kept of an execution's events.
type Outcome struct {
	// Error is the last error event, nil when none.
	Error *Error
	// Display are the display events, in order (at most maxDisplays).
	Display []Display
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
// an EventFunc. The reading, the stop and the drain are nsjail.Capture's
// (keeping none of the bytes: the lines are taken as they come). Stop must
// be called.
type Reader struct {
	c    *nsjail.Capture
	want Want
	on   EventFunc
	// done delivers the first done event's exit code (Done).
	done     chan int
	doneSeen bool // under mu

	mu       sync.Mutex
	out      Outcome
	figures  int    // the figure events passed on (at most MaxFigures)
	line     []byte // the line being read, without its newline
	skipping bool   // the line being read is too long: dropped up to its end
	read     int64
}

// NewReader starts reading r. on, when not nil, gets each accepted event.
func NewReader(r *os.File, want Want, on EventFunc) *Reader {
	rd := &Reader{want: want, on: on, done: make(chan int, 1)}
	rd.c = nsjail.NewCapture(r, 0, rd.add)
	return rd
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
	if len(line) == 0 {
		return // the runner ends a line the code left open before its done event
	}
	ev, err := DecodeEvent(line)
	if err != nil {
		rd.out.Dropped++
		return
	}
	switch {
	case ev.Type == EventDone:
		// The execution's end, for nsjail.Spec.Done: once, never passed
		// on. A second one is the code's and changes nothing.
		if !rd.want.Done || rd.doneSeen {
			rd.out.Dropped++
			return
		}
		rd.doneSeen = true
		rd.done <- ev.ExitCode
		return
	case ev.Type == EventError:
		rd.out.Error = ev.Error
	case ev.Type == EventDisplay && rd.want.Display && len(rd.out.Display) < maxDisplays:
		rd.out.Display = append(rd.out.Display, Display{Mime: ev.Mime})
	case ev.Type == EventFigure && rd.want.Figures && rd.figures < MaxFigures:
		rd.figures++
	default:
		rd.out.Dropped++
		return
	}
	if rd.on != nil {
		rd.on(ev)
	}
}

// Done delivers the exit code of the first done event read, with
// Want.Done: the value for nsjail.Spec.Done. It never closes.
func (rd *Reader) Done() <-chan int { return rd.done }

// Stop ends the reading and closes the pipe (nsjail.Capture.Stop): what
// the pipe holds at this moment (all the writers wrote, once the
// execution is over) is read, what comes later dropped. A line cut off at
// the end is dropped.
func (rd *Reader) Stop() Outcome {
	rd.c.Stop()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if len(rd.line) > 0 || rd.skipping {
		rd.out.Dropped++
	}
	return rd.out
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
