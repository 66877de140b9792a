package nsjail

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/seccomp"
)

// A shell becomes a sandbox like a pre-started one (Shell.Pending): the
// warm pool hands its execution to G over G's own channel, and Wait
// reports what a cold run of it would. What differs is the first process:
// G is the template's (T's) child, not the worker's, so the worker learns
// that G ended from G's pidfd (never by pid: SECURITY.md case 41) and how
// from T's exit
// report (HandoffOptions.ExitReport, required in practice: without it the
// status is unknown and Wait reports sandbox_error), kills through the
// shell's cgroup, and removes the sandbox with Shell.Destroy.

// ErrNotAFork is StartShell's error for a pidfd that is not of a fresh fork
// of the template (SECURITY.md case 65): the template sent something else,
// so it is broken or compromised.
var ErrNotAFork = errors.New("not a fork of template")

// CheckConfined checks from the host that G has confined itself as a cold
// sandbox's process is, before it is given any request (SECURITY.md case
// 67; G does it itself, and says READY on a pipe its template held too: a
// broken or compromised template could say it early). No capability in
// any set, the sandbox user's ids in every slot and no supplementary
// group, no_new_privs, the execution's seccomp filter on top of the
// template's (one filter more than T holds, and the last one byte for
// byte the shell's program), one thread. G's status is read between two
// checks of its pidfd, so it is G's; its filter while G is pinned (pinG).
func (s *Shell) CheckConfined() error {
	g := gProcess{pid: s.gpid, pidfd: s.g}
	if g.exited() {
		return errors.New("G has ended")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.gpid))
	if g.exited() {
		return errors.New("G has ended")
	}
	if err != nil {
		return fmt.Errorf("unable to read G's status: %w", err)
	}
	status := string(b)
	var bad []string
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := statusField(status, k); len(v) != 1 || strings.Trim(v[0], "0") != "" {
			bad = append(bad, fmt.Sprintf("%s %v", k, v))
		}
	}
	for k, id := range map[string]int{"Uid": s.r.HostUID(), "Gid": s.r.HostGID()} {
		v := statusField(status, k)
		if len(v) != 4 || slices.ContainsFunc(v, func(x string) bool { return x != strconv.Itoa(id) }) {
			bad = append(bad, fmt.Sprintf("%s %v, want %d", k, v, id))
		}
	}
	if v := statusField(status, "NoNewPrivs"); len(v) != 1 || v[0] != "1" {
		bad = append(bad, fmt.Sprintf("NoNewPrivs %v", v))
	}
	if v := statusField(status, "Seccomp"); len(v) != 1 || v[0] != "2" {
		bad = append(bad, fmt.Sprintf("Seccomp %v", v))
	}
	if v := statusField(status, "Seccomp_filters"); len(v) != 1 || v[0] != strconv.Itoa(s.tpl.seccompFilters+1) {
		bad = append(bad, fmt.Sprintf("Seccomp_filters %v, want the template's %d and one more", v, s.tpl.seccompFilters))
	}
	if v := statusField(status, "Groups"); len(v) != 0 {
		bad = append(bad, fmt.Sprintf("Groups %v", v))
	}
	if v := statusField(status, "Threads"); len(v) != 1 || v[0] != "1" {
		bad = append(bad, fmt.Sprintf("Threads %v", v))
	}
	if len(bad) > 0 {
		return fmt.Errorf("G is not confined: %s", strings.Join(bad, "; "))
	}
	// Which filter G added: the count says one, and it must be the program
	// this shell was given. A template that had G load another (RET_ALLOW,
	// say) would leave the code under the template's own profile, which
	// allows clone3 whole, unshare of a user and a pid namespace, and
	// setns (case 63).
	var top seccomp.Program
	err = pinG(s.gpid, s.g, s.log, func() error {
		var err error
		top, _, err = seccomp.TopFilter(s.gpid)
		return err
	})
	if err != nil {
		return fmt.Errorf("unable to read G's seccomp filter: %w", err)
	}
	if !bytes.Equal(top, s.prog) {
		return fmt.Errorf("G is not confined: its last seccomp filter (%d instructions) is not the shell's program (%d)", top.Len(), s.prog.Len())
	}
	return nil
}

// Pending makes the shell a pre-started sandbox whose first process is G,
// from the moment G is in its cgroup (MoveG) and waits for its execution.
// stdout and stderr are the read ends of the pipes G has on fds 1 and 2
// (the fork request's); Pending takes them over. Called before
// CloseNamespaces it holds the shell's mount namespace as Prestart does,
// so that G's exit does not wait for its teardown. The Pending owns the
// shell: its Retire, or its Handoff's Sandbox's Wait, destroys it; never
// call Destroy while it may be waited for.
func (s *Shell) Pending(stdout, stderr *os.File) *Pending {
	var mntns *os.File
	s.nsMu.Lock()
	if len(s.ns) > 0 && shellNamespaces[0] == "mnt" {
		if fd, err := unix.FcntlInt(s.ns[0].Fd(), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			mntns = os.NewFile(uintptr(fd), "mntns-"+s.id)
		}
	}
	s.nsMu.Unlock()
	sb := &Sandbox{
		r: s.r, id: s.id, lim: s.lim, c: s.c, shell: s, log: s.log,
		proc:        gProcess{pid: s.gpid, pidfd: s.g, tpid: s.tpid, tpidfd: s.tfd},
		stdout:      newCapture(stdout, s.lim.StdoutBytes, s.output.ForStream(StreamStdout)),
		stderr:      newCapture(stderr, s.lim.StderrBytes, s.output.ForStream(StreamStderr)),
		cgroupPaths: s.cgroupPaths, mntns: mntns, background: s.background,
	}
	return &Pending{s: sb}
}

// gProcess is a template fork's G as a sandbox's first process, with T,
// its parent, which reports its exit (tpidfd nil: not known).
type gProcess struct {
	pid    int
	pidfd  *os.File
	tpid   int
	tpidfd *os.File
}

// parentAlive reports whether T is running and has not been sent SIGKILL,
// its status read between two checks of its pidfd (SECURITY.md case 41's
// pattern: the worker reaps an ended T, whose pid may then be anyone's). A
// fork whose T was killed or stopped never gets its exit report (T's death
// ends G too, as pid 1 of an ancestor pid namespace, but not at once):
// handed an execution, it would run the code and end in
// sandbox_error, where a zygote's sandbox killed just before its hand-off
// is found dead and the execution runs cold (SECURITY.md case 34).
func (g gProcess) parentAlive() bool {
	if g.tpidfd == nil {
		return true
	}
	f := gProcess{pid: g.tpid, pidfd: g.tpidfd}
	if f.exited() {
		return false
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.tpid))
	return err == nil && !f.exited() && statusAlive(string(status))
}

// openParent opens a pidfd of T, G's parent, while it is known to be G's
// parent: G's PPid read before the pidfd is opened and again after it,
// each read of G's status followed by a check that g (G's pidfd) is still
// alive. A PPid unchanged across the open means T was G's parent all
// along: had T died, G would have been reparented (killed as T's pid
// namespace ends) and its PPid changed, so the pid was T's when the
// pidfd was opened. The worker only ever polls T's pidfd and reads T's
// status: it signals nothing through it.
func openParent(gpid int, g *os.File) (*os.File, int, error) {
	gp := gProcess{pid: gpid, pidfd: g}
	ppid := func() (int, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", gpid))
		if gp.exited() {
			return 0, fmt.Errorf("G (pid %d) is gone", gpid)
		}
		if err != nil {
			return 0, fmt.Errorf("unable to read G's status: %w", err)
		}
		v := statusField(string(b), "PPid")
		if len(v) != 1 {
			return 0, fmt.Errorf("no PPid in G's status (%v)", v)
		}
		return strconv.Atoi(v[0])
	}
	tpid, err := ppid()
	if err != nil {
		return nil, 0, err
	}
	fd, err := unix.PidfdOpen(tpid, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("G's parent (pid %d), the template, is gone: %w", tpid, err)
	}
	f := os.NewFile(uintptr(fd), "pidfd-T")
	if again, err := ppid(); err != nil || again != tpid {
		f.Close()
		return nil, 0, fmt.Errorf("G's parent (pid %d), the template, is gone (G's parent now %d, %v)", tpid, again, err)
	}
	return f, tpid, nil
}

// Pid refuses: G's pid is G's only while G lives (a zombie included), and
// T reaps it once the worker's go-ahead came, after which the number may be
// anyone's. G is reached through its pidfd (Pending.GPidfd).
func (g gProcess) Pid() (int, error) {
	return 0, errors.New("a template fork's G is not the worker's child: its pid may be reused; use its pidfd")
}

// Wait returns once G has exited: its pidfd polls readable then (Linux
// 5.3+), zombie or reaped. The state is nil: G's wait status is T's to
// collect, and reaches the worker as T's exit report.
func (g gProcess) Wait() (*os.ProcessState, error) {
	fds := []unix.PollFd{{Fd: int32(g.pidfd.Fd()), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("unable to wait for G: %w", err)
		}
		if n > 0 {
			return nil, nil
		}
	}
}

// exited tells, without blocking, whether G has exited.
func (g gProcess) exited() bool {
	fds := []unix.PollFd{{Fd: int32(g.pidfd.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err != nil || n > 0
}

// GPidfd returns a new pidfd of a template fork's G, the process that runs
// the code (a kernel's, say), which the caller must close; ok is false for
// a sandbox that is not a template fork (its first process is a zygote,
// whose child runs the code).
func (p *Pending) GPidfd() (fd int, ok bool, err error) {
	if p.s.shell == nil {
		return -1, false, nil
	}
	fd, err = unix.FcntlInt(p.s.shell.g.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, true, fmt.Errorf("unable to duplicate G's pidfd: %w", err)
	}
	return fd, true, nil
}
