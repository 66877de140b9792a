// Package runner is the code that runs a user's Python inside a sandbox,
// runner.py, and the events channel it reports on. One runner serves every
// kind of execution: a cold single-shot one runs `python3 -P -c RUNNER JOB`
// (Args), a warm one hands the same Job to the zygote, which loads the
// runner (server/warmpool), and a session's kernel runs each cell through
// the runner's run_code. The runner runs the code as `python3 FILE` would
// (or as a notebook cell), prints an uncaught exception exactly as Python
// prints it for the user's file (the harness's frames removed), makes
// stdout and stderr unbuffered, and writes events, one JSON object per
// line, on a pipe to the worker:
//
//	{"type":"error","error":{...}}      the code raised (Error)
//	{"type":"display","mime":{...}}     the value of a final expression (Display)
//	{"type":"figure","name":"figure-1.png"}  a pyplot figure saved as an artifact
//	{"type":"done","exit_code":0}       the end of a single-shot execution (Done)
//
// The pipe is the events fd: EventsFD in a single-shot sandbox (cold:
// nsjail.Spec.ExtraFiles; warm: passed with the hand-off and dup2'd there),
// any fd the kernel got it on for a cell. The code runs in the same process
// and can write anything on it: the Reader trusts nothing it reads
// (SECURITY.md case 50). An event changes only the answer of the execution
// that wrote it, and only within bounds.
//
// A single-shot Job with Done set ends with a done event: once the code
// is done and the runner has done what the interpreter's exit would
// (threads joined, atexit callbacks run, files and streams flushed), the
// process that ran the file writes the exit code it would exit with and
// then waits to be ended instead of exiting. The worker freezes the
// sandbox on that word, reads it and answers, and kills it afterwards
// (nsjail.Spec.Done): the kernel's teardown of the interpreter's address
// space, milliseconds for one that imported the data stack, is no longer
// on the answer's path. The code can write the event too, which decides
// only what the code decides anyway (its exit code, and when it ends:
// whatever it left running is stopped as at its exit; SECURITY.md case
// 72).
//
// runner.py repeats the constants below in its PROTOCOL block;
// TestRunnerMirrorsProtocol checks that both agree.
package runner

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

//go:embed runner.py
var Source string

const (
	// EventsFD is the events fd of a single-shot execution.
	EventsFD = 3
	// MaxLineBytes bounds one event line, its newline included; a longer
	// line is dropped whole.
	MaxLineBytes = 256 << 10
	// MaxEventsBytes bounds what is read of one execution's events; the
	// rest is drained and dropped.
	MaxEventsBytes = 1 << 20
	// MaxFigures bounds the figures one execution captures (and the
	// figure events kept).
	MaxFigures = 64
	// maxDisplays bounds the display events kept: the runner writes one
	// (the final expression's value), and the answer documents at most one.
	maxDisplays = 1
	// maxFrames bounds an error's traceback entries.
	maxFrames = 100
	// maxExitCode is the highest exit code a done event may carry.
	maxExitCode = 255
)

// Event types.
const (
	EventError   = "error"
	EventDisplay = "display"
	EventFigure  = "figure"
	EventDone    = "done"
)

// Mime types of a display.
const (
	MimeText     = "text/plain"
	MimeMarkdown = "text/markdown"
)

// FigureNameFormat names the figures the runner saves in ArtifactsDir,
// counting from 1 and skipping names that exist.
const FigureNameFormat = "figure-%d.png"

// ArtifactsDir is where the runner saves figures, inside the sandbox.
var ArtifactsDir = inside.Path(inside.ArtifactsDir)

// Job is a single-shot execution, as the runner takes it: the JSON argument
// of a cold run (Args), the warm hand-off's fields.
type Job struct {
	// Path is the file to run, as `python3 PATH`.
	Path string `json:"path"`
	// Argv is the code's sys.argv ([Path] when empty).
	Argv []string `json:"argv,omitempty"`
	// Cwd is the working directory ("/" when empty).
	Cwd string `json:"cwd,omitempty"`
	// Display reports the value of a final expression (EventDisplay).
	Display bool `json:"display,omitempty"`
	// Figures saves the pyplot figures left open or shown (EventFigure).
	Figures bool `json:"figures,omitempty"`
	// EventsFD is the events fd (EventsFD), or 0: no events.
	EventsFD int `json:"events_fd,omitempty"`
	// Done ends the execution with a done event instead of the
	// process's exit (EventDone); only with EventsFD.
	Done bool `json:"done,omitempty"`
}

// Args is the command line that runs j cold: python with -P (no directory
// the code can write is on sys.path while the runner imports, SECURITY.md
// case 35) running the runner, j its one argument.
func Args(python string, j Job) []string {
	b, _ := json.Marshal(j) // strings and bools only: never fails
	return []string{python, "-P", "-c", Source, string(b)}
}

// JobOf is the Job of args when they are Args's, for the warm pool, which
// hands the same job to a warm sandbox.
func JobOf(args []string) (Job, bool) {
	var j Job
	if len(args) != 5 || (args[0] != "python3" && args[0] != "python") || args[1] != "-P" || args[2] != "-c" || args[3] != Source {
		return j, false
	}
	if err := json.Unmarshal([]byte(args[4]), &j); err != nil || j.Path == "" {
		return j, false
	}
	return j, true
}

// Error is the typed error of code that raised: the answer's `error`.
type Error struct {
	// Type is the exception's type as Python prints it ("KeyError",
	// "pandas.errors.ParserError").
	Type string `json:"type"`
	// Message is str(exception) (a SyntaxError's msg).
	Message string `json:"message"`
	// Line is the failing line of the user's code (the innermost frame of
	// the user's file, or where a SyntaxError is), nil when none.
	Line *int `json:"line"`
	// Offset is a SyntaxError's column (1-based), when known.
	Offset *int `json:"offset,omitempty"`
	// Traceback is the outermost exception's frames, outermost first,
	// the runner's own removed.
	Traceback []Frame `json:"traceback"`
	// Text is the traceback as Python prints it (chained and grouped
	// exceptions included), bounded: its head and its tail.
	Text string `json:"text"`
	// Hint helps with a KeyError on a DataFrame column: the columns it has.
	Hint string `json:"hint,omitempty"`
}

// Frame is one entry of a traceback.
type Frame struct {
	File     string `json:"file"`
	Line     int    `json:"line"`
	Function string `json:"function"`
	Source   string `json:"source"`
}

// Display is a displayed value: Mime holds MimeText and maybe MimeMarkdown.
type Display struct {
	Mime map[string]string `json:"mime"`
}

// Event is one event as DecodeEvent reads it: Error for EventError, Mime
// for EventDisplay, Name for EventFigure, ExitCode for EventDone (which the
// Reader delivers on Done, never to its EventFunc). A figure's size is never
// the sandbox's word (SECURITY.md case 51): the answer's artifact carries
// the worker's reading of the PNG.
type Event struct {
	Type  string
	Error *Error
	Mime  map[string]string
	Name  string
	// ExitCode is a done event's, 0-255.
	ExitCode int
}

// EventFunc receives an execution's events as they are read (the streaming
// answer's hook). It is called from the Reader's goroutine, one event at a
// time; it must not block for long.
type EventFunc func(Event)

// describe is for the error messages of a bad line.
func describe(line []byte) string {
	if len(line) > 80 {
		return fmt.Sprintf("%q… (%d bytes)", line[:80], len(line))
	}
	return fmt.Sprintf("%q", line)
}
