package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Program is a classic BPF seccomp program as the kernel holds it: the
// bytes of a struct sock_filter array (8 bytes per instruction, host byte
// order), what seccomp(SECCOMP_SET_MODE_FILTER) takes in a struct
// sock_fprog. A template fork (server/warmpool/TEMPLATE.md section 6)
// loads the one a cold sandbox's process runs under, read from the kernel
// rather than compiled again, so that it is byte for byte the program
// libcontainer loaded (libseccomp's output plus runc's ENOSYS stub).
type Program []byte

// Len is the number of instructions.
func (p Program) Len() int { return len(p) / 8 }

// Instructions decodes p.
func (p Program) Instructions() []unix.SockFilter {
	out := make([]unix.SockFilter, 0, p.Len())
	for b := []byte(p); len(b) >= 8; b = b[8:] {
		out = append(out, unix.SockFilter{Code: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3],
			K: binary.NativeEndian.Uint32(b[4:])})
	}
	return out
}

// EncodeProgram is prog as a Program.
func EncodeProgram(prog []unix.SockFilter) Program {
	out := make(Program, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.NativeEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.NativeEndian.AppendUint32(out, f.K)
	}
	return out
}

// cldTrapped is si_code CLD_TRAPPED (asm-generic/siginfo.h): waitid's
// report of a ptrace stop.
const cldTrapped = 4

// stopTimeout bounds LoadedProgram's wait for its ptrace stop.
const stopTimeout = 10 * time.Second

// LoadedProgram reads, with PTRACE_SECCOMP_GET_FILTER, the one seccomp
// filter the kernel holds for thread tid. It fails when tid has no filter
// or more than one: a cold sandbox's process has exactly the one
// libcontainer loaded, and a program read from a process with a stack of
// filters would be only the last of them. tid is attached (PTRACE_SEIZE),
// interrupted, read and detached; the caller must make sure tid is the
// process it means (its own unreaped child, so the pid cannot be reused)
// and that nothing else waits for it meanwhile.
//
// LoadedProgram never reaps tid: it waits for the ptrace stop with
// waitid(WNOWAIT), which leaves an exited tid a zombie. A tid that dies
// between the attach and the stop (a template fork's G, root of the user
// namespace the shell's init runs in, can SIGKILL that init at any time)
// is an error, and its pid stays the caller's child's until the caller
// reaps it: were it reaped here, the caller's later kill of "its child"
// would be a SIGKILL, as root, of whatever host process took the freed
// pid.
//
// A thread that does not stop within stopTimeout is an error.
//
// Requirements (the worker meets them as root, outside any seccomp
// filter): CAP_SYS_PTRACE over tid (PTRACE_SEIZE of a process of another
// user, and of a non-dumpable one such as runc's init), CAP_SYS_ADMIN in
// the initial user namespace (PTRACE_SECCOMP_GET_FILTER), a
// kernel.yama.ptrace_scope below 3 (3 forbids every attach, root's
// included), and a caller not under a seccomp filter that denies ptrace
// (sandboxd's own profile is for sandboxes, never for the worker).
func LoadedProgram(tid int) (Program, error) {
	// ptrace requests must come from the thread that attached.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := ptrace(unix.PTRACE_SEIZE, tid, 0, 0); err != nil {
		return nil, fmt.Errorf("PTRACE_SEIZE: %w", err)
	}
	defer func() { _ = ptrace(unix.PTRACE_DETACH, tid, 0, 0) }()
	prog, filters, err := TopFilter(tid)
	if err != nil {
		return nil, err
	}
	if filters != 1 {
		return nil, fmt.Errorf("thread %d holds %d seccomp filters, want one", tid, filters)
	}
	return prog, nil
}

// TopFilter reads, with PTRACE_SECCOMP_GET_FILTER, the last seccomp filter
// loaded by thread tid, and how many it holds, which the calling thread
// has attached (PTRACE_SEIZE) and keeps attached: it interrupts tid and
// waits, with WNOWAIT and within stopTimeout, for its ptrace stop, which
// it leaves to the caller's wait or detach. It never reaps tid.
// Requirements: as LoadedProgram's.
func TopFilter(tid int) (prog Program, filters int, err error) {
	if err := ptrace(unix.PTRACE_INTERRUPT, tid, 0, 0); err != nil {
		return nil, 0, fmt.Errorf("PTRACE_INTERRUPT: %w", err)
	}
	// Polled, with a deadline, not waited for: an interrupt can be lost.
	// Seen here: a process seized while libcontainer's init was about to
	// execve its command from a thread other than the leader, the execve
	// (de_thread) gave the leader's pid and the ptrace link to that
	// thread but not the pending interrupt, and a blocking waitid hung
	// the test binary for good.
	var info unix.Siginfo
	// The stop takes tens of microseconds: the first looks come soon.
	for deadline, wait := time.Now().Add(stopTimeout), 20*time.Microsecond; ; wait = min(2*wait, time.Millisecond) {
		// WNOWAIT: see LoadedProgram's doc comment (never reap tid). With
		// WNOHANG and nothing to report, the kernel writes a zero
		// si_signo.
		info = unix.Siginfo{}
		err := unix.Waitid(unix.P_PID, tid, &info, unix.WSTOPPED|unix.WEXITED|unix.WNOWAIT|unix.WALL|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("waitid for the ptrace stop: %w", err)
		}
		if info.Signo != 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("thread %d did not stop for ptrace within %v", tid, stopTimeout)
		}
		time.Sleep(wait)
	}
	if info.Code != cldTrapped {
		return nil, 0, fmt.Errorf("thread %d did not stop for ptrace (waitid si_code %d, signal %d)", tid, info.Code, info.Signo)
	}
	// PTRACE_SECCOMP_GET_FILTER counts from the first filter loaded (the
	// kernel's get_nth_filter): the last one is at the highest index that
	// answers, found by asking each in turn (ENOENT past it).
	var last uintptr
	n, err := ptraceN(unix.PTRACE_SECCOMP_GET_FILTER, tid, 0, 0)
	if err != nil {
		// EINVAL: not in filter mode (no filter at all).
		return nil, 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER: %w", err)
	}
	for {
		m, err := ptraceN(unix.PTRACE_SECCOMP_GET_FILTER, tid, last+1, 0)
		if errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER %d: %w", last+1, err)
		}
		last, n = last+1, m
	}
	if n == 0 || n > unix.BPF_MAXINSNS {
		return nil, 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER: %d instructions", n)
	}
	insns := make([]unix.SockFilter, n)
	got, err := ptraceN(unix.PTRACE_SECCOMP_GET_FILTER, tid, last, uintptr(unsafe.Pointer(&insns[0])))
	if err != nil {
		return nil, 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER: %w", err)
	}
	if got != n {
		return nil, 0, fmt.Errorf("PTRACE_SECCOMP_GET_FILTER: %d instructions, then %d", n, got)
	}
	return EncodeProgram(insns), int(last) + 1, nil
}

func ptraceN(req, tid int, addr, data uintptr) (uintptr, error) {
	n, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), addr, data, 0, 0)
	if e != 0 {
		return 0, e
	}
	return n, nil
}

func ptrace(req, tid int, addr, data uintptr) error {
	_, err := ptraceN(req, tid, addr, data)
	return err
}
