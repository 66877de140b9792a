package warmpool

// The hand-off protocol between the pool and zygote.py, the first process
// of every warm sandbox, is defined here, once, for the Go side. zygote.py
// repeats the constants in its PROTOCOL block; TestZygoteMirrorsProtocol
// checks that the two agree, and TestZygoteCodecsAgree runs a hand-off
// message and real exit reports through both sides' codecs.
//
//  1. Start. The pool pre-starts a sandbox running zygoteArgs: zygote.py
//     with the preload's module names joined by PreloadSep as its one
//     argument, and three pipes (zygoteFiles): ControlFD (pool → the code's
//     process: the hand-off), ReadyFD and ExitReportFD (zygote → pool).
//  2. Ready. The zygote imports the preload, forks the process the code
//     will run in, and writes ReadyByte on ReadyFD, which it then closes.
//     The code's process closes ReadyFD and ExitReportFD: it never holds a
//     channel the pool trusts (SECURITY.md case 25).
//  3. Hand-off. The pool writes one Handoff message, JSON ending with
//     MessageEnd (EncodeHandoff), on ControlFD. The code's process waits
//     with poll and reads up to MessageEnd only, so that a message it never
//     took stays in the pipe, where the pool finds it (the sandbox died
//     first: SECURITY.md case 34); it then closes ControlFD and runs the
//     file as `python3 PATH` would. EOF on ControlFD without a message
//     retires the sandbox: both processes exit 0.
//  4. Exit report. The zygote reaps the code's process, kills whatever that
//     left, writes its wait status in decimal and MessageEnd on
//     ExitReportFD (DecodeExitReport), and exits with the same status, a
//     signal N as 128+N, which nsjail cross-checks (see
//     nsjail.HandoffOptions.ExitReport).

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/nsjail"
)

//go:embed zygote.py
var zygoteSource string

// The fds of the zygote and the code's process (see zygoteFiles).
const (
	ControlFD    = 3
	ReadyFD      = 4
	ExitReportFD = 5
)

const (
	// ReadyByte, on ReadyFD, says the preload is done.
	ReadyByte byte = 'R'
	// PreloadSep joins the preload's module names into one argument.
	PreloadSep = ","
	// MessageEnd ends the hand-off message and the exit report.
	MessageEnd byte = '\n'
)

// Handoff is the message that gives the code's process its execution.
type Handoff struct {
	// Path is the file to run, as `python3 PATH`.
	Path string `json:"path"`
	// Argv is the code's sys.argv.
	Argv []string `json:"argv"`
	// Cwd is the working directory ("/" when empty).
	Cwd string `json:"cwd"`
}

// EncodeHandoff is h as its message: one line, as encoding/json escapes
// every control character in strings.
func EncodeHandoff(h Handoff) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode the hand-off: %w", err)
	}
	return append(b, MessageEnd), nil
}

// maxExitReportBytes bounds what is read of an exit report: a wait status
// is at most 0xFFFF, five digits, and MessageEnd.
const maxExitReportBytes = 16

// DecodeExitReport is the wait status of an exit report, line, read up to
// and with its MessageEnd.
func DecodeExitReport(line []byte) (syscall.WaitStatus, error) {
	if len(line) == 0 || line[len(line)-1] != MessageEnd {
		return 0, errors.New("exit report: no end")
	}
	status, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil || status < 0 || status > 0xFFFF {
		return 0, fmt.Errorf("exit report %q is not a wait status", line)
	}
	return syscall.WaitStatus(status), nil
}

// zygoteArgs is the command line of a warm sandbox's first process. -P
// keeps the cwd (the workspace) off its sys.path: no directory the sandbox
// can write is there when the zygote imports (SECURITY.md case 35). -I would
// also drop the template's PYTHON* variables, which a cold run honours.
func zygoteArgs(preload []string) []string {
	return []string{"python3", "-P", "-c", zygoteSource, strings.Join(preload, PreloadSep)}
}

// zygoteFiles orders the pipes' sandbox ends as Prestart takes them, so
// that each becomes its protocol fd.
func zygoteFiles(control, ready, exitReport *os.File) []*os.File {
	files := make([]*os.File, 3)
	files[ControlFD-nsjail.FirstFileFD] = control
	files[ReadyFD-nsjail.FirstFileFD] = ready
	files[ExitReportFD-nsjail.FirstFileFD] = exitReport
	return files
}

// readReady waits for ReadyByte on r.
func readReady(r io.Reader) error {
	b := make([]byte, 1)
	n, err := r.Read(b)
	if n == 1 && b[0] == ReadyByte {
		return nil
	}
	if err == nil {
		err = errors.New("unexpected ready byte")
	}
	return err
}

// readExitReport delivers the wait status the zygote reports on r, its
// ExitReportFD, once the code's process has exited; the channel closes
// without a value when the pipe ends otherwise (the zygote died). Only the
// zygote holds ExitReportFD: the code's process closes it before it reads
// its hand-off, and cannot reach the zygote's (SECURITY.md case 25).
func readExitReport(r *os.File) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	go func() {
		defer close(ch)
		defer r.Close()
		// Up to MessageEnd, not EOF: the zygote holds the pipe until the
		// kernel has torn it down, which is what the report saves waiting for.
		line, err := bufio.NewReaderSize(io.LimitReader(r, maxExitReportBytes), maxExitReportBytes).ReadBytes(MessageEnd)
		if err != nil {
			return
		}
		if status, err := DecodeExitReport(line); err == nil {
			ch <- status
		}
	}()
	return ch
}
