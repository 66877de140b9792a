package runner

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// runnerProtocol is runner.py's PROTOCOL block: each `NAME = literal`.
func runnerProtocol(t *testing.T) map[string]string {
	t.Helper()
	const begin, end = "# --- PROTOCOL (server/runner/runner.go) ---\n", "# --- end PROTOCOL ---\n"
	_, rest, ok := strings.Cut(Source, begin)
	block, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("runner.py has no PROTOCOL block (%q ... %q)", begin, end)
	}
	line := regexp.MustCompile(`^([A-Z_]+) = (.+)$`)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("runner.py's PROTOCOL block has a line that is not NAME = value: %q", l)
		}
		got[m[1]] = m[2]
	}
	return got
}

// runner.py's constants are runner.go's, no name more, none less.
func TestRunnerMirrorsProtocol(t *testing.T) {
	want := map[string]string{
		"EVENTS_FD":          strconv.Itoa(EventsFD),
		"EVENT_ERROR":        strconv.Quote(EventError),
		"EVENT_DISPLAY":      strconv.Quote(EventDisplay),
		"EVENT_FIGURE":       strconv.Quote(EventFigure),
		"EVENT_DONE":         strconv.Quote(EventDone),
		"MIME_TEXT":          strconv.Quote(MimeText),
		"MIME_MARKDOWN":      strconv.Quote(MimeMarkdown),
		"FIGURE_NAME_FORMAT": strconv.Quote(FigureNameFormat),
		"ARTIFACTS_DIR":      strconv.Quote(ArtifactsDir),
		"MAX_LINE_BYTES":     strconv.Itoa(MaxLineBytes),
		"MAX_FIGURES":        strconv.Itoa(MaxFigures),
	}
	if got := runnerProtocol(t); !maps.Equal(got, want) {
		t.Fatalf("runner.py's PROTOCOL block is\n%q\nrunner.go says\n%q", got, want)
	}
	code := strings.Split(Source, "# --- end PROTOCOL ---\n")[1]
	repeated := regexp.MustCompile(`"type": "|"text/(plain|markdown)"|figure-%d|/workspace/output`)
	if m := repeated.FindAllString(code, -1); len(m) > 0 {
		t.Errorf("runner.py repeats protocol values outside its PROTOCOL block: %q", m)
	}
	// The runner's own budgets keep an honest error line under the bound
	// even when every character is escaped (\uXXXX, 6 bytes).
	budget := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^(_[A-Z_]+) = (\d+)`).FindAllStringSubmatch(code, -1) {
		budget[m[1]], _ = strconv.Atoi(m[2])
	}
	worst := 6 * (budget["_TEXT_CHARS"] + budget["_MESSAGE_CHARS"] + budget["_HINT_CHARS"] + budget["_FRAMES"]*(budget["_FILE_CHARS"]+budget["_FUNCTION_CHARS"]+budget["_SOURCE_CHARS"]))
	if worst == 0 || worst+4096 > MaxLineBytes {
		t.Errorf("an error event may take %d bytes, over MaxLineBytes %d (budgets %v)", worst, MaxLineBytes, budget)
	}
	if budget["_FRAMES"] > maxFrames {
		t.Errorf("the runner keeps %d frames, the reader takes %d", budget["_FRAMES"], maxFrames)
	}
}

func TestArgsJobOf(t *testing.T) {
	j := Job{Path: "/workspace/code/main.py", Cwd: "/workspace", Display: true, Figures: true, EventsFD: EventsFD}
	args := Args("python3", j)
	got, ok := JobOf(args)
	if !ok || got.Path != j.Path || got.Cwd != j.Cwd || !got.Display || !got.Figures || got.EventsFD != EventsFD {
		t.Fatalf("JobOf(Args(%+v)) = %+v, %v", j, got, ok)
	}
	for name, bad := range map[string][]string{
		"a file":       {"python3", "/workspace/code/main.py"},
		"other code":   {"python3", "-P", "-c", "print(1)", args[4]},
		"no path":      {"python3", "-P", "-c", Source, `{"cwd":"/"}`},
		"not json":     {"python3", "-P", "-c", Source, `{`},
		"another tool": {"sh", "-P", "-c", Source, args[4]},
	} {
		if _, ok := JobOf(bad); ok {
			t.Errorf("%s: JobOf accepted %q", name, bad)
		}
	}
}

const goodError = `{"type":"error","error":{"type":"KeyError","message":"'x'","line":2,"traceback":[{"file":"/workspace/code/main.py","line":2,"function":"<module>","source":"df['x']"}],"text":"Traceback...\nKeyError: 'x'\n","hint":"columns: 'a'"}}`

func TestDecodeEvent(t *testing.T) {
	ev, err := DecodeEvent([]byte(goodError))
	if err != nil || ev.Type != EventError || ev.Error.Type != "KeyError" || *ev.Error.Line != 2 || ev.Error.Offset != nil ||
		len(ev.Error.Traceback) != 1 || ev.Error.Traceback[0].Source != "df['x']" || ev.Error.Hint != "columns: 'a'" {
		t.Fatalf("DecodeEvent(good error) = %+v, %v", ev, err)
	}
	ev, err = DecodeEvent([]byte(`{"type":"error","error":{"type":"SyntaxError","message":"m","line":null,"offset":5,"traceback":[],"text":"t"}}`))
	if err != nil || ev.Error.Line != nil || *ev.Error.Offset != 5 {
		t.Fatalf("DecodeEvent(null line) = %+v, %v", ev, err)
	}
	ev, err = DecodeEvent([]byte(`{"type":"display","mime":{"text/plain":"1","text/markdown":"**1**"}}`))
	if err != nil || ev.Mime[MimeText] != "1" || ev.Mime[MimeMarkdown] != "**1**" {
		t.Fatalf("DecodeEvent(display) = %+v, %v", ev, err)
	}
	ev, err = DecodeEvent([]byte(`{"type":"figure","name":"figure-12.png"}`))
	if err != nil || ev.Name != "figure-12.png" {
		t.Fatalf("DecodeEvent(figure) = %+v, %v", ev, err)
	}
	for _, code := range []int{0, 7, 255} {
		ev, err = DecodeEvent(fmt.Appendf(nil, `{"type":"done","exit_code":%d}`, code))
		if err != nil || ev.Type != EventDone || ev.ExitCode != code {
			t.Fatalf("DecodeEvent(done %d) = %+v, %v", code, ev, err)
		}
	}
	frames := make([]string, maxFrames+1)
	for i := range frames {
		frames[i] = `{"file":"f","line":1,"function":"g","source":""}`
	}
	for name, line := range map[string]string{
		"empty":            ``,
		"garbage":          `0\n`,
		"not an object":    `["error"]`,
		"null":             `null`,
		"no type":          `{"name":"figure-1.png"}`,
		"unknown type":     `{"type":"exit","code":0}`,
		"unknown field":    `{"type":"figure","name":"figure-1.png","exit_code":0}`,
		"two values":       `{"type":"figure","name":"figure-1.png"}{"type":"figure","name":"figure-2.png"}`,
		"trailing brace":   `{"type":"figure","name":"figure-1.png"}}`,
		"wrong field":      `{"type":"figure","mime":{"text/plain":"x"}}`,
		"two payloads":     `{"type":"display","mime":{"text/plain":"x"},"name":"figure-1.png"}`,
		"figure path":      `{"type":"figure","name":"../result.json"}`,
		"figure name":      `{"type":"figure","name":"figure-0.png"}`,
		"figure subdir":    `{"type":"figure","name":"x/figure-1.png"}`,
		"mime without txt": `{"type":"display","mime":{"text/markdown":"x"}}`,
		"mime other type":  `{"type":"display","mime":{"text/plain":"x","text/html":"<script>"}}`,
		"mime not strings": `{"type":"display","mime":{"text/plain":1}}`,
		"error no text":    `{"type":"error","error":{"type":"E","message":"m","line":1,"traceback":[]}}`,
		"error no type":    `{"type":"error","error":{"type":"","message":"m","line":1,"traceback":[],"text":"t"}}`,
		"error extra":      `{"type":"error","error":{"type":"E","message":"m","line":1,"traceback":[],"text":"t","status":"succeeded"}}`,
		"error neg line":   `{"type":"error","error":{"type":"E","message":"m","line":-1,"traceback":[],"text":"t"}}`,
		"error huge line":  `{"type":"error","error":{"type":"E","message":"m","line":99999999999,"traceback":[],"text":"t"}}`,
		"frame extra":      `{"type":"error","error":{"type":"E","message":"m","line":1,"traceback":[{"file":"f","line":1,"function":"g","source":"","x":1}],"text":"t"}}`,
		"too many frames":  `{"type":"error","error":{"type":"E","message":"m","line":1,"traceback":[` + strings.Join(frames, ",") + `],"text":"t"}}`,
		// A figure's size is never the sandbox's word (SECURITY.md case 51).
		"figure size":     `{"type":"figure","name":"figure-1.png","width":640,"height":480}`,
		"size on display": `{"type":"display","mime":{"text/plain":"x"},"width":4}`,
		"too long":        `{"type":"display","mime":{"text/plain":"` + strings.Repeat("x", MaxLineBytes) + `"}}`,
		"done no code":    `{"type":"done"}`,
		"done null":       `{"type":"done","exit_code":null}`,
		"done negative":   `{"type":"done","exit_code":-1}`,
		"done over 255":   `{"type":"done","exit_code":256}`,
		"done string":     `{"type":"done","exit_code":"0"}`,
		"done fraction":   `{"type":"done","exit_code":0.5}`,
		"done and name":   `{"type":"done","exit_code":0,"name":"figure-1.png"}`,
		"done status":     `{"type":"done","exit_code":0,"status":"succeeded"}`,
	} {
		if ev, err := DecodeEvent([]byte(line)); err == nil {
			t.Errorf("%s: DecodeEvent accepted %q as %+v", name, clipTest(line), ev)
		}
	}
}

func clipTest(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

// readAll writes chunks into a fresh pipe from another goroutine, closes
// it, and returns what a Reader made of them.
func readAll(t *testing.T, want Want, on EventFunc, chunks ...string) Outcome {
	t.Helper()
	r, w, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rd := NewReader(r, want, on)
	for _, c := range chunks {
		if _, err := w.WriteString(c); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	return rd.Stop()
}

// figureCounter is an EventFunc counting the figure events passed on.
type figureCounter struct {
	mu    sync.Mutex
	names []string
}

func (f *figureCounter) on(ev Event) {
	if ev.Type == EventFigure {
		f.mu.Lock()
		f.names = append(f.names, ev.Name)
		f.mu.Unlock()
	}
}

func TestReaderKeepsWantedEvents(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	on := func(ev Event) {
		mu.Lock()
		seen = append(seen, ev.Type)
		mu.Unlock()
	}
	fig := `{"type":"figure","name":"figure-1.png"}` + "\n"
	disp := `{"type":"display","mime":{"text/plain":"1"}}` + "\n"
	// Split across writes at every awkward place: mid-line, mid-escape.
	all := fig + disp + goodError + "\n"
	var chunks []string
	for i := 0; i < len(all); i += 7 {
		chunks = append(chunks, all[i:min(i+7, len(all))])
	}
	out := readAll(t, Want{Display: true, Figures: true}, on, chunks...)
	if out.Error == nil || out.Error.Type != "KeyError" || len(out.Display) != 1 || out.Display[0].Mime[MimeText] != "1" ||
		out.Dropped != 0 || out.Overflow {
		t.Fatalf("outcome %+v", out)
	}
	if strings.Join(seen, ",") != "figure,display,error" {
		t.Errorf("callback saw %v", seen)
	}
	// Unwanted kinds are dropped, and never passed on.
	seen = nil
	out = readAll(t, Want{}, on, fig, disp)
	if len(out.Display) != 0 || out.Dropped != 2 || len(seen) != 0 {
		t.Fatalf("unwanted events: %+v, callback saw %v", out, seen)
	}
	// One display is kept, as the answer documents; more are dropped.
	seen = nil
	out = readAll(t, Want{Display: true}, on, disp, disp)
	if len(out.Display) != 1 || out.Dropped != 1 || len(seen) != 1 {
		t.Fatalf("two displays: %+v, callback saw %v", out, seen)
	}
}

// SECURITY.md case 50: garbage, huge lines and floods on the events fd
// cost the worker bounded memory, are dropped and counted, and never stop
// a valid event after them from being read.
func TestReaderHostileStream(t *testing.T) {
	fig := `{"type":"figure","name":"figure-1.png"}` + "\n"
	huge := strings.Repeat("A", 3*MaxLineBytes) // one line over the bound, written in pieces
	var figs figureCounter
	out := readAll(t, Want{Figures: true}, figs.on,
		"garbage\n", "\x00\xff\xfe\n", "{\"type\":\n", huge[:MaxLineBytes], huge[MaxLineBytes:], "\n", fig, "no newline at the end")
	if len(figs.names) != 1 || out.Dropped != 5 || out.Overflow {
		t.Fatalf("outcome %+v, figures %v, want the figure and 5 dropped", out, figs.names)
	}
	// A flood past MaxEventsBytes: read up to the bound, the rest drained.
	line := `{"type":"figure","name":"figure-1.png"}` + "\n"
	n := MaxEventsBytes/len(line) + 100
	figs = figureCounter{}
	out = readAll(t, Want{Figures: true}, figs.on, strings.Repeat(line, n))
	if !out.Overflow || len(figs.names) != MaxFigures || out.Dropped < MaxEventsBytes/len(line)-MaxFigures-1 {
		t.Fatalf("flood: overflow %v, %d figures, %d dropped", out.Overflow, len(figs.names), out.Dropped)
	}
	// Forged errors: the last one is the answer's (the runner writes its
	// own last); they change only that answer.
	second := strings.Replace(goodError, "KeyError", "ValueError", 1)
	out = readAll(t, Want{}, nil, goodError+"\n", second+"\n")
	if out.Error == nil || out.Error.Type != "ValueError" {
		t.Fatalf("two errors: %+v", out.Error)
	}
}

// With Want.Done, the first done event's exit code comes on Done, never
// to the EventFunc nor into the outcome; a second is the code's and is
// dropped; events after it are still read (the freeze decides when the
// reading ends). A line the code left open before it is ended by the
// runner's newline (and dropped), the empty line that makes is not
// counted. Without Want.Done (a session's cell) a done event is dropped.
func TestReaderDone(t *testing.T) {
	r, w, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	rd := NewReader(r, Want{Figures: true, Done: true}, func(ev Event) { seen = append(seen, ev.Type) })
	for _, l := range []string{`{"type":"disp`, "\n" + `{"type":"done","exit_code":300}` + "\n", "\n" + `{"type":"done","exit_code":3}` + "\n",
		`{"type":"done","exit_code":4}` + "\n", `{"type":"figure","name":"figure-1.png"}` + "\n"} {
		if _, err := w.WriteString(l); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case code := <-rd.Done():
		if code != 3 {
			t.Fatalf("Done delivered %d, want the first valid done's 3", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("no exit code on Done")
	}
	w.Close()
	out := rd.Stop()
	if out.Dropped != 3 || strings.Join(seen, ",") != "figure" {
		t.Fatalf("outcome %+v, callback saw %v", out, seen)
	}
	select {
	case code := <-rd.Done():
		t.Fatalf("a second exit code on Done: %d", code)
	default:
	}
	r, w, err = Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rd = NewReader(r, Want{}, nil)
	w.WriteString(`{"type":"done","exit_code":0}` + "\n")
	w.Close()
	if out := rd.Stop(); out.Dropped != 1 {
		t.Fatalf("a done event without Want.Done: %+v", out)
	}
	select {
	case code := <-rd.Done():
		t.Fatalf("an exit code on Done without Want.Done: %d", code)
	default:
	}
}

// Stop returns without the writer closing its end (a process the code left
// running holds it), with what was written before.
func TestReaderStopDoesNotWaitForEOF(t *testing.T) {
	r, w, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var figs figureCounter
	rd := NewReader(r, Want{Figures: true}, figs.on)
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(w, `{"type":"figure","name":"figure-%d.png"}`+"\n", i)
	}
	rd.Stop()
	if len(figs.names) != 3 {
		t.Fatalf("figures %v", figs.names)
	}
	if _, err := w.WriteString("late\n"); err == nil {
		t.Errorf("a write after Stop succeeded: the pipe's read end is still open")
	}
}

// The answer's error is the Error as the wire says it.
func TestErrorJSON(t *testing.T) {
	ev, err := DecodeEvent([]byte(goodError))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ev.Error)
	var back map[string]any
	json.Unmarshal(b, &back)
	for _, k := range []string{"type", "message", "line", "traceback", "text", "hint"} {
		if _, ok := back[k]; !ok {
			t.Errorf("the error's JSON has no %q: %s", k, b)
		}
	}
	if _, ok := back["offset"]; ok {
		t.Errorf("offset without a SyntaxError: %s", b)
	}
	_ = os.Stdout
}
