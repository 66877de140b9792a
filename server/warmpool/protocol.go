package warmpool

// The hand-off protocol between the pool and zygote.py, the first process
// of every warm sandbox, is defined here, once, for the Go side. zygote.py
// repeats the constants in its PROTOCOL block; TestZygoteMirrorsProtocol
// checks that the two agree, and TestZygoteCodecsAgree runs a hand-off
// message and real exit reports through both sides' codecs.
//
//  1. Start. The pool pre-starts a sandbox running zygoteArgs: zygote.py
//     with the runner's source (server/runner) and the preload's module
//     names joined by PreloadSep as its arguments, and three channels (zygoteFiles): ControlFD, one end of a
//     unix stream socketpair (pool ↔ the code's process: the hand-off, and
//     a kernel's executions), ReadyFD and ExitReportFD, pipes (zygote →
//     pool).
//  2. Ready. The zygote loads the runner, imports the preload, forks the process the code
//     will run in, and closes its ReadyFD. The code's process closes
//     ExitReportFD, rehearses a kernel hand-off and cell on dummy input
//     (zygote.py's _rehearse: the pages they write become its own before
//     any request), writes ReadyByte on ReadyFD and closes it, all before it
//     reads its hand-off: the code never holds a channel the pool trusts
//     (SECURITY.md case 25), and EOF on ReadyFD says the sandbox died.
//  3. Hand-off. The pool writes one Handoff message, JSON ending with
//     MessageEnd (EncodeHandoff), on ControlFD, with the execution's runner
//     events fd attached (SCM_RIGHTS) when Events is set. The code's process waits
//     with poll and reads up to MessageEnd only, so that a message it never
//     took stays in the socket, where the pool finds it (the pool keeps
//     the sandbox's end open too, so the bytes outlive the sandbox: the
//     sandbox died first, SECURITY.md case 34); it then closes ControlFD,
//     puts the events fd on runner.EventsFD and runs the file through the
//     runner, as a cold execution does (as `python3 PATH` would), ending
//     with the runner's done event when the message says Done (the pool
//     passes the word on: nsjail.HandoffOptions.Done). EOF on ControlFD
//     without a message retires the sandbox: both processes exit 0.
//  3k. Kernel hand-off. A Handoff with Kernel set makes the code's process
//     a session's kernel instead: it keeps ControlFD, points fds 1 and 2 at
//     /dev/null, changes to Cwd (after the pool bound the session's volume
//     there), puts it first on sys.path only with CwdOnPath, and answers with a KernelReply of Seq KernelReadySeq. Then,
//     per execution, the pool sends one KernelRequest (EncodeKernelRequest:
//     one line, Seq counting from 1) carrying, as SCM_RIGHTS, KernelFDs
//     fds: the write ends of the execution's stdout, stderr and runner
//     events pipes. The kernel puts the first two on fds 1 and 2, runs the
//     code through the runner as a cell of its persistent __main__
//     (events on the third, which it then closes), puts /dev/null back, and answers one
//     KernelReply line with the same Seq. Everything the kernel writes is
//     untrusted (the code runs in that process): DecodeKernelReply is
//     strict, and the pool decides timeouts, OOM and the pids limit itself.
//  4. Exit report. The zygote reaps the code's process, kills whatever that
//     left, writes its wait status in decimal and MessageEnd on
//     ExitReportFD (DecodeExitReport), and exits with the same status, a
//     signal N as 128+N, which nsjail cross-checks (see
//     nsjail.HandoffOptions.ExitReport).

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/server/runner"
	"golang.org/x/sys/unix"
)

//go:embed zygote.py
var zygoteSource string

// The runner (server/runner) is the zygote's first argument: it runs every
// execution's code, single-shot or a kernel's cell.

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
	// Path is the file to run, as `python3 PATH` (none for a kernel).
	Path string `json:"path"`
	// Argv is the code's sys.argv.
	Argv []string `json:"argv"`
	// Cwd is the working directory ("/" when empty).
	Cwd string `json:"cwd"`
	// Kernel makes the process a session's kernel (step 3k).
	Kernel bool `json:"kernel,omitempty"`
	// CwdOnPath puts a kernel's Cwd first on its sys.path, as an
	// interactive interpreter has it (a session's own modules beside its
	// data import). Off for a kernel that runs the worker's code on the
	// session's files (a profile): a module the session planted there
	// (pyarrow/__init__.py, which pandas imports lazily) would run inside
	// it (SECURITY.md case 45).
	CwdOnPath bool `json:"cwd_on_path,omitempty"`
	// Display and Figures are the runner's job's (runner.Job).
	Display bool `json:"display,omitempty"`
	Figures bool `json:"figures,omitempty"`
	// Events says the message carries the execution's events fd
	// (SCM_RIGHTS), which the code's process puts on runner.EventsFD.
	Events bool `json:"events,omitempty"`
	// Done is the runner's job's (runner.Job): the execution ends with
	// the runner's done event there, which the pool passes on
	// (nsjail.HandoffOptions.Done).
	Done bool `json:"done,omitempty"`
}

const (
	// KernelReadySeq is the Seq of a kernel's answer to its hand-off;
	// executions count from KernelReadySeq+1.
	KernelReadySeq = 0
	// KernelFDs is the number of fds a KernelRequest carries: stdout's,
	// stderr's and the runner's events pipe's write ends, in that order.
	KernelFDs = 3
	// maxKernelReplyBytes bounds a KernelReply line, MessageEnd included.
	maxKernelReplyBytes = 128
	// maxKernelExitCode is the highest exit code a reply may carry.
	maxKernelExitCode = 255
)

// KernelRequest is one execution sent to a kernel.
type KernelRequest struct {
	Seq uint64 `json:"seq"`
	// Code is run as a cell named CellName(Seq).
	Code string `json:"code"`
	// Env is set in os.environ for the execution, then restored.
	Env map[string]string `json:"env"`
	// Display and Figures are the runner's (runner.Job's).
	Display bool `json:"display,omitempty"`
	Figures bool `json:"figures,omitempty"`
	// DropInterrupt: a SIGINT was sent since the previous request, and
	// may have reached the kernel only after that execution answered. The
	// kernel forgets an interrupt it noted before reading this request;
	// without it, such an interrupt is this execution's (sent after it
	// started, before the kernel read it) and is raised as the code starts.
	DropInterrupt bool `json:"drop_interrupt,omitempty"`
}

// KernelReply is a kernel's answer to a KernelRequest (or to its
// hand-off, Seq KernelReadySeq).
type KernelReply struct {
	Seq uint64 `json:"seq"`
	// ExitCode is 0, 1 for an uncaught exception, N for SystemExit(N),
	// 130 for KeyboardInterrupt.
	ExitCode int `json:"exit_code"`
}

// EncodeKernelRequest is r as its line (the fds go beside it).
func EncodeKernelRequest(r KernelRequest) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode the kernel request: %w", err)
	}
	return append(b, MessageEnd), nil
}

// DecodeKernelReply parses one reply line, with its MessageEnd, strictly:
// a bounded line holding one JSON object with known fields only and an
// exit code in [0, 255] (SECURITY.md case 39: the code can write anything
// on ControlFD).
func DecodeKernelReply(line []byte) (KernelReply, error) {
	var r KernelReply
	if len(line) > maxKernelReplyBytes {
		return r, fmt.Errorf("kernel reply longer than %d bytes", maxKernelReplyBytes)
	}
	if len(line) == 0 || line[len(line)-1] != MessageEnd {
		return r, errors.New("kernel reply: no end")
	}
	// Pointers: a field left out (or null, or a reply that is null) is an
	// error, never a zero.
	var wire struct {
		Seq      *uint64 `json:"seq"`
		ExitCode *int    `json:"exit_code"`
	}
	dec := json.NewDecoder(bytes.NewReader(line[:len(line)-1]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wire); err != nil {
		return r, fmt.Errorf("kernel reply %q: %w", line, err)
	}
	if dec.More() {
		return r, fmt.Errorf("kernel reply %q: more than one value", line)
	}
	if wire.Seq == nil || wire.ExitCode == nil {
		return r, fmt.Errorf("kernel reply %q: seq or exit_code missing", line)
	}
	if *wire.ExitCode < 0 || *wire.ExitCode > maxKernelExitCode {
		return r, fmt.Errorf("kernel reply %q: exit code out of range", line)
	}
	r.Seq, r.ExitCode = *wire.Seq, *wire.ExitCode
	return r, nil
}

// CellNameFormat names the file a kernel compiles execution Seq's code
// under, as tracebacks show it ("<cell 3>"; zygote.py registers the source
// in linecache, so the lines show too).
const CellNameFormat = "<cell %d>"

// CellName is execution seq's cell name.
func CellName(seq uint64) string { return fmt.Sprintf(CellNameFormat, seq) }

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
	return []string{"python3", "-P", "-c", zygoteSource, runner.Source, strings.Join(preload, PreloadSep)}
}

// controlPair makes a warm sandbox's ControlFD channel, a unix stream
// socketpair (a kernel answers on it): the pool's end as a *net.UnixConn
// (deadlines, SCM_RIGHTS) and the sandbox's end, left blocking, as the
// zygote reads it.
func controlPair() (pool *net.UnixConn, sandbox *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("unable to create the control socketpair: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "control")
	c, err := net.FileConn(f) // a dup of f's fd, made non-blocking
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("unable to use the control socket: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "control-sandbox"), nil
}

// zygoteFiles orders the channels' sandbox ends as Prestart takes them, so
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

// Template forks (issue 17, TEMPLATE.md sections 2-3; the pool's default,
// Config.Forks). template.py is
// the template's process T: it loads zygote.py's source as a module and its
// forks' code process G ends in the zygote's own hand-off code, so steps 2
// (READY), 3, 3k and 4's report above stay as they are; template.py's
// PROTOCOL block mirrors the constants below (TestTemplateMirrorsProtocol).
//
//  T1. Start. nsjail.Runner.StartTemplate runs templateArgs with T's
//      control socket, a unix stream socketpair, as its one file
//      (TemplateFD). T imports the preload, makes itself not dumpable and
//      waits for requests.
//  T2. Fork. The pool sends a ForkRequest line (EncodeForkRequest: the
//      fork's maps, nsjail.Template.ForkIDMap) on TemplateFD with ForkFDs
//      fds (SCM_RIGHTS): the fork's ControlFD socket, ReadyFD and
//      ExitReportFD pipes' write ends and the go-ahead pipe's read end,
//      then, with ForkRequest.Cgroup (cgroup v2), ForkCgroupFDs more: the
//      shell's cgroup (nsjail.PreparedShell.CgroupFile, a detached mount
//      of its directory), into which T clones G (CLONE_INTO_CGROUP),
//      then optionally ForkOutputFDs more: the execution's stdout and
//      stderr (else G's are /dev/null; its stdin always is). T checks it
//      holds no stray fd, no shared mapping and no other thread, clones G
//      with clone3(CLONE_NEWUSER|CLONE_NEWPID) (G: root of a new user
//      namespace, pid 1 of a new pid namespace), writes G's maps, keeps
//      the exit report and the go-ahead (T5), and answers one ForkReply
//      line (DecodeForkReply); it closes its copies of the fork's other
//      fds whatever it answers (all of them if it cloned nothing).
//  T3. Pidfd. G, pid 1 of its pid namespace, sends PidfdMessage with a
//      pidfd of itself on ControlFD (nsjail.Runner.StartShell takes it,
//      and refuses anything but a fresh fork of its template: SECURITY.md
//      case 65).
//  T4. Join. After StartShell and Shell.MoveG (v2: the check that G is in
//      the shell's cgroup) the pool closes its end of
//      the go-ahead pipe (T may reap G from then on; until then a G
//      that died stays a zombie) and sends a Join line (EncodeJoin) on
//      ControlFD with the shell's namespace fds (Shell.NamespaceFiles, in
//      nsjail.ShellNamespaces order). G joins them, drops to a cold
//      process's ids, capabilities, rlimits, keyring and seccomp program,
//      reseeds, rehearses and writes ReadyByte: step 2 on. Nothing of a
//      request is sent before ReadyByte, when G is confined (SECURITY.md
//      case 67).
//  T5. Exit report. T writes G's wait status on ExitReportFD's pipe as
//      soon as G has exited (as step 4), and reaps G after the go-ahead.
//
// EOF on TemplateFD ends T (and every fork of it, in its pid namespace).

//go:embed template.py
var templateSource string

const (
	// TemplateFD is T's control socket (nsjail.FirstFileFD). It is
	// ControlFD's number too: G closes T's socket before it puts its own
	// there, so no fork holds a channel to T.
	TemplateFD = 3
	// ForkFDs is the number of channels a ForkRequest carries, in this
	// order: G's ControlFD and ReadyFD, T's exit report and go-ahead.
	ForkFDs = 4
	// ForkCgroupFDs is the number of cgroup fds a ForkRequest with Cgroup
	// carries after the channels: the shell's cgroup (v2).
	ForkCgroupFDs = 1
	// ForkOutputFDs is the number of output fds a ForkRequest may carry
	// after them: stdout's and stderr's.
	ForkOutputFDs = 2
	// PidfdMessage is the message G sends its pidfd with.
	PidfdMessage = "pidfd\n"
	// SessionKeyringPrefix names a sandbox's session keyring, followed by
	// its id, as libcontainer names a container's.
	SessionKeyringPrefix = "_ses."
	// maxForkReplyBytes bounds a ForkReply line (a refusal names what T
	// found: fds, mappings).
	maxForkReplyBytes = 64 << 10
)

// ForkRequest asks T for one fork.
type ForkRequest struct {
	// UIDMap and GIDMap are what T writes to G's uid_map and gid_map
	// (nsjail.Template.ForkIDMap).
	UIDMap string `json:"uid_map"`
	GIDMap string `json:"gid_map"`
	// Cgroup says the request carries the shell's cgroup after the
	// channels (ForkCgroupFDs; cgroup v2): T clones G into it.
	Cgroup bool `json:"cgroup,omitempty"`
}

// ForkReply is T's answer to a ForkRequest: Forked, or Refused with why.
type ForkReply struct {
	Forked  bool   `json:"forked,omitempty"`
	Refused string `json:"refused,omitempty"`
}

// Join is what G needs, besides the shell's namespace fds, to become what
// a cold sandbox's process is.
type Join struct {
	// Seccomp is the shell's program (Shell.SeccompProgram), base64 in JSON.
	Seccomp []byte `json:"seccomp"`
	// Rlimits are the shell's (Shell.Rlimits).
	Rlimits []nsjail.Rlimit `json:"rlimits"`
	// Keyring names G's new session keyring (SessionKeyringPrefix and the
	// shell's id).
	Keyring string `json:"keyring"`
	// UID and GID are the ids G takes (inside.UID, inside.GID: the one
	// definition; template.py refuses 0).
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// JoinOf is the Join for shell sh.
func JoinOf(sh *nsjail.Shell) Join {
	return Join{Seccomp: sh.SeccompProgram(), Rlimits: sh.Rlimits(), Keyring: SessionKeyringPrefix + sh.ID(),
		UID: inside.UID, GID: inside.GID}
}

// EncodeForkRequest is r as its line (the fds go beside it).
func EncodeForkRequest(r ForkRequest) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode the fork request: %w", err)
	}
	return append(b, MessageEnd), nil
}

// EncodeJoin is j as its line (the namespace fds go beside it).
func EncodeJoin(j Join) ([]byte, error) {
	b, err := json.Marshal(j)
	if err != nil {
		return nil, fmt.Errorf("encode the join: %w", err)
	}
	return append(b, MessageEnd), nil
}

// DecodeForkReply parses one reply line of T, with its MessageEnd: exactly
// one of Forked and Refused.
func DecodeForkReply(line []byte) (ForkReply, error) {
	var r ForkReply
	if len(line) > maxForkReplyBytes {
		return r, fmt.Errorf("fork reply longer than %d bytes", maxForkReplyBytes)
	}
	if len(line) == 0 || line[len(line)-1] != MessageEnd {
		return r, errors.New("fork reply: no end")
	}
	dec := json.NewDecoder(bytes.NewReader(line[:len(line)-1]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || dec.More() {
		return ForkReply{}, fmt.Errorf("fork reply %q: not one reply (%v)", line, err)
	}
	if r.Forked == (r.Refused != "") {
		return ForkReply{}, fmt.Errorf("fork reply %q: want forked or refused", line)
	}
	return r, nil
}

// templateArgs is the command line of a template's process: template.py
// with zygote.py's source, the runner's and the preload's module names as
// its arguments. -P as zygoteArgs.
func templateArgs(preload []string) []string {
	return []string{"python3", "-P", "-c", templateSource, zygoteSource, runner.Source, strings.Join(preload, PreloadSep)}
}
