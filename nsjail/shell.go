package nsjail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/seccomp"
	"golang.org/x/sys/unix"
)

// A shell (issue 17, server/warmpool/TEMPLATE.md section 3 steps 3-6) is
// what libcontainer makes of a cold sandbox for one fork of a template,
// minus the process: nsjail's own buildConfig for the execution's Spec,
// except that the user and pid namespaces are joined from the fork's
// process G (pid 1 of its own pid namespace, root of its own user
// namespace, both children of the template's) instead of created, and the
// cgroup is a child of the template's. libcontainer's init sets everything
// up and blocks on its exec fifo; StartShell then takes the namespaces it
// made (as fds) and the seccomp program the kernel holds for it, and
// SIGKILLs and reaps it before it ever execs. G later joins those
// namespaces, moves into the shell's cgroup (v1: MoveG) and loads the
// program.

// shellNamespaces are the namespaces a shell's init makes, in the order of
// Shell.NamespaceFiles. An array, and unexported: G joins the fds in this
// order (setns with the type each must be), so nothing may reorder it.
var shellNamespaces = [...]string{"mnt", "net", "ipc", "uts", "cgroup"}

// shellInitSuffix names, on cgroup v2, the shell init's cgroup beside the
// shell's (G's), <shell id><suffix>: see StartShell.
const shellInitSuffix = "-init"

// ShellNamespaces are the namespaces a shell's init makes (/proc/PID/ns
// names), in the order of Shell.NamespaceFiles; a fresh copy.
func ShellNamespaces() []string {
	ns := shellNamespaces // the array copied: the slice is the caller's
	return ns[:]
}

// Shell is a started shell. Destroy must be called on it, and its
// container must only ever be killed and removed: never Exec or Run it,
// and never libcontainer.Load it for anything else (Sweep's Load,
// Signal(SIGKILL), which kills through the cgroup, and Destroy join no
// namespace). Its state.json records the user and pid
// namespaces as the paths it joined them by, /proc/<worker pid>/fd/N, fds
// StartShell closed on return: a runc exec (or a worker restarted under
// another pid, or any later holder of those fd numbers, another shell's
// namespace fds say) would make libcontainer join whatever those paths
// name then, i.e. another execution's namespaces or none of the sandbox's.
type Shell struct {
	r   *Runner
	id  string
	tpl *Template
	c   *libcontainer.Container
	log *slog.Logger
	// g is a pidfd of G (a duplicate of the one StartShell was given) and
	// gpid its host pid: StartShell checked that g is G's.
	g    *os.File
	gpid int
	// unclaim ends the template's claim on G (Template.claimG): once
	// MoveG placed it (from then on openFork refuses it by its cgroup),
	// or at Destroy. Once: a second release could drop another shell's
	// claim on a reused pid.
	unclaim func()
	// tfd is a pidfd of T, G's parent, which reports G's exit, and tpid its
	// host pid (openParent): a fork whose T died can no longer report, so
	// it is dead as a sandbox (Pending.Alive).
	tfd  *os.File
	tpid int
	// ns are the shell's namespaces, in ShellNamespaces order, until
	// CloseNamespaces or Destroy.
	nsMu sync.Mutex
	ns   []*os.File
	prog seccomp.Program
	// rlimits are the shell's config's (buildConfig's for spec).
	rlimits []Rlimit
	// lim and output are spec's, for the sandbox the shell becomes
	// (Pending).
	lim    Limits
	output OutputFunc
	// cgroupPaths are the shell's cgroup directories, children of the
	// template's.
	cgroupPaths cgroup.Paths
	// background is spec's Background: the shell's cgroup is at the
	// background CPU weight until its hand-off.
	background  bool
	destroyOnce sync.Once
	destroyErr  error
}

// StartShell makes the shell for fork G of template t: g is a pidfd of G
// (G sent it; G's pid is read from the pidfd, never taken from a message).
// spec is the execution's (rootfs, workspace, hostname, limits; Args[0] is
// looked up by libcontainer's init, which fails the start if it is
// missing, and never executed; Env and Cwd are G's business, Stdin and
// ExtraFiles are not allowed).
//
// Before anything is created StartShell checks that G is a fork of t
// (SECURITY.md case 65):
// G's user namespace is a child of t's (U_F of U_T), its pid namespace is a
// child of t's, owned by G's user namespace, and G is its pid 1, its uid and gid maps, as the host sees
// them, are a cold sandbox's, and G has no shell yet: it is still the
// template's root with every capability of its user namespace, in the
// template's own cgroup (isUnplacedFork), and no other shell being made has
// taken it (Template.claimG). Every one of those reads goes through a
// /proc/<G's pid> directory fd that is known to be G's because G's pidfd
// still referred to a live process after it was opened (a pid is not
// reused while its process lives, zombie included: SECURITY.md case 41's
// pattern). A template that sent the pidfd of anything else (itself,
// another fork's G, a process of another template) gets an error, and
// nothing joins that process's namespaces. G's oom_score_adj is then
// reset to a cold process's (resetOOMScoreAdj).
//
// libcontainer joins the user and pid namespaces by the paths
// /proc/<worker pid>/fd/N of the fds opened then, never by
// /proc/<G's pid>/ns/..., which runc's init opens later, when the pid
// could be another process's.
//
// ctx bounds the start: at its end the shell's cgroup (the init, nothing
// else) is killed and StartShell fails (see the comment at Start).
func (r *Runner) StartShell(ctx context.Context, t *Template, spec Spec, g *os.File) (*Shell, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if len(spec.ExtraFiles) > 0 || spec.Stdin != nil {
		return nil, errors.New("a shell runs no command: it takes no stdin or extra files")
	}
	if g == nil {
		return nil, errors.New("a shell needs G's pidfd")
	}
	id, lim, log := r.prepare(&spec)
	log = log.With("template", t.ID())
	fail := func(format string, a ...any) (*Shell, error) {
		return nil, startFailed(id, log, "shell start failed", format, a...)
	}
	keepG := false // the shell started: it keeps G's pidfd (and its cgroup)
	if t.dirV2 != "" {
		// v2: G was forked into the shell's cgroup, which must be the one
		// PrepareShell made for this id (and no other shell's).
		prepared, ok := t.takePrepared(id)
		if !ok {
			return fail("cgroup v2: no cgroup prepared for shell %s (PrepareShell), or another shell took it", id)
		}
		defer func() {
			if !keepG {
				prepared.release()
			}
		}()
		// G is there (the template sent its pidfd): the fork is done, and
		// the template's access to cgroup.procs of the shell and of
		// tpl-<id> ends before openFork checks G is alone in the cgroup,
		// so that an fd of it the template kept can move nothing in
		// after the check (SECURITY.md case 70).
		if err := prepared.EndFork(); err != nil {
			return fail("%w", err)
		}
	}

	gfd, err := unix.FcntlInt(g.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fail("unable to duplicate G's pidfd: %w", err)
	}
	gfile := os.NewFile(uintptr(gfd), "pidfd-G")
	defer func() {
		if !keepG {
			gfile.Close()
		}
	}()
	gpid, userNS, pidNS, gCgroupNS, err := r.openFork(t, gfd, id)
	if err != nil {
		return fail("%w", err)
	}
	// openFork claimed G (Template.claimG): until MoveG placed it or the
	// shell's Destroy (Shell.unclaim).
	defer func() {
		if !keepG {
			t.unclaimG(gpid)
		}
	}()
	tfile, tpid, err := openParent(gpid, gfile)
	if err != nil {
		return fail("%w", err)
	}
	defer func() {
		if !keepG {
			tfile.Close()
		}
	}()
	defer userNS.Close()
	defer pidNS.Close()
	if gCgroupNS != nil {
		defer gCgroupNS.Close()
	}
	cfg, err := r.buildConfig(id, &spec, lim)
	if err != nil {
		return fail("unable to build sandbox config: %w", err)
	}
	self := os.Getpid()
	for i := range cfg.Namespaces {
		switch cfg.Namespaces[i].Type {
		case configs.NEWUSER:
			cfg.Namespaces[i].Path = fmt.Sprintf("/proc/%d/fd/%d", self, userNS.Fd())
		case configs.NEWPID:
			cfg.Namespaces[i].Path = fmt.Sprintf("/proc/%d/fd/%d", self, pidNS.Fd())
		}
	}
	// A child of the template's cgroup: G moves (v1) only within the
	// subtree it was forked in.
	cfg.Cgroups.Path = path.Join(t.cgroupRel, id)
	if t.dirV2 != "" {
		// v2: G is already in tpl-<id>/<id>, and libcontainer creates no
		// container in a cgroup that holds a process ("container's cgroup
		// is not empty"). The shell's limits go on G's cgroup here, with
		// libcontainer's own cgroups manager, before anything of an
		// execution exists; the init gets a cgroup of its own beside it,
		// tpl-<id>/<id>-init, with the same limits, made by libcontainer
		// as a cold sandbox's is. (Not below G's: libcontainer enables
		// every controller it can in each ancestor, a cgroup holding G
		// takes the threaded ones, and its children then become threaded,
		// whose cgroup.procs cannot be read.) Nothing is ever moved: G was
		// born in <id>, the init is placed in its cgroup as every sandbox's
		// init is, and dies there before it execs.
		dir := filepath.Join(t.dirV2, id)
		m, err := fs2.NewManager(cfg.Cgroups, dir)
		if err == nil {
			err = m.Set(cfg.Cgroups.Resources)
		}
		if err != nil {
			return fail("unable to set the shell's limits on G's cgroup: %w", err)
		}
		cfg.Cgroups.Path = path.Join(t.cgroupRel, id+shellInitSuffix)
	}

	// Marked as a cold sandbox is (SECURITY.md case 29).
	c, err := r.createMarked(id, cfg, log)
	if err != nil {
		return fail("unable to create shell: %w", err)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		r.destroy(c, log)
		return fail("unable to open %s: %w", os.DevNull, err)
	}
	proc := &libcontainer.Process{Args: spec.Args, Env: withPath(spec.Env), Cwd: "/", UID: inside.UID, GID: inside.GID,
		Stdin: devnull, Stdout: devnull, Stderr: devnull, Init: true}
	// The deadline: G, root of U_F, holds CAP_KILL over the shell's init
	// from the moment it joins PID_F, and can SIGSTOP it; libcontainer's
	// Start would then wait for the init's next sync message forever, and
	// so would the worker's refill. At ctx's end every process of the
	// shell's cgroup is killed: the init's stages, which libcontainer puts
	// there before the first of them clones, and nothing else (v1: G is
	// still in the template's cgroup: isUnplacedFork, and MoveG cannot be
	// called on a shell not yet returned; v2: the init's cgroup is its
	// own, beside G's). Start then fails on the closed sync pipe. The
	// paths are read now: State waits for the container's lock, which
	// Start holds.
	state, err := c.State()
	if err != nil || len(state.CgroupPaths) == 0 {
		devnull.Close()
		r.destroy(c, log)
		return fail("unable to read the shell's cgroup paths before its start (%v)", err)
	}
	stopWatch := context.AfterFunc(ctx, func() {
		// A cancel is the caller giving up (the warm pool closing), not a
		// stalled start: said as such, not as an error.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			log.Error("shell start past its deadline: killing the shell's cgroup")
		} else {
			log.Info("shell start cancelled: killing the shell's cgroup", "cause", ctx.Err())
		}
		if err := cgroup.KillAll(state.CgroupPaths); err != nil {
			log.Error("unable to kill the shell's cgroup", "error", err)
		}
	})
	defer stopWatch()
	// `runc create`: the init sets up every namespace, mount and limit,
	// drops to the sandbox user, loads the seccomp filter (before the fifo:
	// no_new_privs is set) and blocks on its exec fifo. Container.Exec,
	// which would let it exec, is never called.
	err = c.Start(proc)
	devnull.Close()
	if err != nil {
		r.destroy(c, log)
		reapInitZombies(pidNS, log)
		return fail("unable to start shell: %w", errors.Join(err, ctx.Err()))
	}
	initPid, err := proc.Pid()
	if err != nil {
		// Start succeeded, so the process exists; without its pid it can
		// only be killed through the cgroup, which Destroy does.
		r.destroy(c, log)
		return fail("unable to read the shell init's pid: %w", err)
	}
	s := &Shell{r: r, id: id, tpl: t, c: c, log: log, g: gfile, gpid: gpid, tfd: tfile, tpid: tpid, lim: lim, output: spec.Output,
		background: spec.Background, unclaim: sync.OnceFunc(func() { t.unclaimG(gpid) })}
	for _, l := range cfg.Rlimits {
		s.rlimits = append(s.rlimits, Rlimit{Resource: l.Type, Soft: l.Soft, Hard: l.Hard})
	}
	// Everything below reads the init through its pid: it is our child and
	// not reaped until killInit (LoadedProgram never reaps), so the pid is
	// its own, zombie included. killInit signals it through libcontainer's
	// process handle, which holds a pidfd of the init (os.FindProcess, Go
	// 1.23+), never by pid: G, root of the init's user namespace, can
	// SIGKILL the init at any moment, and a kill(2) by pid after anything
	// had reaped it would be a SIGKILL, as root, of whatever host process
	// took the pid next.
	killInit := func() {
		_ = proc.Signal(unix.SIGKILL)
		_, _ = proc.Wait()
	}
	if err := s.takeInit(initPid, userNS, pidNS, gCgroupNS); err != nil {
		killInit()
		r.destroy(c, log)
		s.closeNamespaces()
		return fail("%w", err)
	}
	// The init dies before it ever execs: no process but G's will be in
	// the sandbox, and no unfiltered one (SECURITY.md case 66). It must be
	// reaped too: G, pid 1 of PID_F, cannot finish exiting while any
	// process of PID_F is unreaped (E4).
	killInit()
	if !stopWatch() {
		// The deadline came (its kill may have hit the init at any step
		// above): whatever was read is not to be trusted.
		r.destroy(c, log)
		s.closeNamespaces()
		return fail("shell start ended by its context: %w", ctx.Err())
	}
	keepG = true
	t.shells.Add(1)
	return s, nil
}

// reapInitZombies reaps the worker's exited children that were in pidNS
// (G's, PID_F): what a failed libcontainer Start leaves when the init dies
// mid-start (killed by G, which holds CAP_KILL over it, or by the
// deadline's kill): libcontainer learns the final init's pid from the
// init itself and may fail before it keeps a handle to wait for it, and
// the init is the worker's child (CLONE_PARENT). Left unreaped, it keeps G,
// pid 1 of PID_F, from ever finishing its exit (E4), so T never reports.
// Each candidate is pinned by a pidfd opened before its /proc files are
// read and found alive (a zombie is) after: a zombie child of the worker
// in PID_F is a shell's init and nothing else (no other child of the
// worker is ever in a fork's pid namespace), so no other sandbox's exit
// status is taken.
func reapInitZombies(pidNS *os.File, log *slog.Logger) {
	want, err := nsIDOf(int(pidNS.Fd()))
	if err != nil {
		return
	}
	self := strconv.Itoa(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		func() {
			defer unix.Close(fd)
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				return
			}
			if pp := statusField(string(b), "PPid"); len(pp) != 1 || pp[0] != self {
				return
			}
			if st := statusField(string(b), "State"); len(st) == 0 || st[0] != "Z" {
				return
			}
			var st unix.Stat_t
			if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &st); err != nil ||
				(nsID{uint64(st.Dev), st.Ino}) != want {
				return
			}
			if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != nil {
				return
			}
			var info unix.Siginfo
			if err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil); err == nil {
				log.Warn("reaped a shell init libcontainer left behind", "pid", pid)
			}
		}()
	}
}

// takeInit reads what the worker keeps of the shell's init: its cgroup
// paths, its namespaces as fds, and the seccomp program the kernel holds
// for it, after checking that it runs in G's user and pid namespaces.
func (s *Shell) takeInit(initPid int, userNS, pidNS, gCgroupNS *os.File) error {
	state, err := s.c.State()
	if err != nil {
		return fmt.Errorf("unable to read the shell's state: %w", err)
	}
	s.cgroupPaths = state.CgroupPaths
	if s.tpl.dirV2 != "" {
		// v2: the shell's cgroup is G's (the init's is beside it).
		s.cgroupPaths = cgroup.Paths{"": filepath.Join(s.tpl.dirV2, s.id)}
	}
	for _, want := range []struct {
		name string
		f    *os.File
	}{{"user", userNS}, {"pid", pidNS}} {
		if err := sameNamespace(fmt.Sprintf("/proc/%d/ns/%s", initPid, want.name), want.f); err != nil {
			return fmt.Errorf("the shell's init is not in G's %s namespace: %w", want.name, err)
		}
	}
	for _, n := range shellNamespaces {
		if n == "cgroup" && gCgroupNS != nil {
			// v2: G keeps the cgroup namespace T's clone3 gave it, rooted
			// at its own cgroup (the init's is rooted at the init's
			// leaf); G's setns into its own is a no-op.
			fd, err := unix.FcntlInt(gCgroupNS.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				return err
			}
			s.ns = append(s.ns, os.NewFile(uintptr(fd), "cgroup-ns-G"))
			continue
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", initPid, n))
		if err != nil {
			return fmt.Errorf("unable to open the shell's %s namespace: %w", n, err)
		}
		s.ns = append(s.ns, f)
	}
	prog, err := seccomp.LoadedProgram(initPid)
	if err != nil {
		return fmt.Errorf("unable to read the shell init's seccomp program: %w", err)
	}
	if s.prog, err = s.r.sameProgram(prog); err != nil {
		return err
	}
	return nil
}

// sameProgram returns the seccomp program every shell of this Runner
// loads: the first shell's, read from the kernel. A later shell's must be
// the same (the program depends only on the Runner's profile), byte for
// byte (a few KiB: a comparison costs less than a hash); a difference is
// an error (the kernel, libcontainer or the profile changed under a
// running worker), never a second program.
func (r *Runner) sameProgram(p seccomp.Program) (seccomp.Program, error) {
	r.shellProgMu.Lock()
	defer r.shellProgMu.Unlock()
	if r.shellProg == nil {
		r.shellProg = p
		return p, nil
	}
	if !bytes.Equal(p, r.shellProg) {
		return nil, fmt.Errorf("the shell init's seccomp program (%d instructions) differs from the one this worker read before (%d instructions)",
			p.Len(), r.shellProg.Len())
	}
	return r.shellProg, nil
}

// openFork opens G's user and pid namespaces and checks that G is a fork
// of t (see StartShell). G's pid is read from gfd's fdinfo; /proc/<pid> is
// opened as a directory, and gfd's process found alive after that open:
// the directory is then G's for good (a /proc/<pid> fd stays bound to the
// process it was opened for, and reads through it fail once that process
// is gone, whatever reuses the pid), and every later read goes through it.
// It then claims G (Template.claimG: the caller unclaims it unless a
// shell keeps it) and resets G's oom_score_adj (see resetOOMScoreAdj).
func (r *Runner) openFork(t *Template, gfd int, shellID string) (gpid int, userNS, pidNS, cgroupNS *os.File, err error) {
	gpid, err = pidfdPid(gfd)
	if err != nil {
		return 0, nil, nil, nil, err
	}
	dirfd, err := unix.Open(fmt.Sprintf("/proc/%d", gpid), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, nil, nil, nil, err
	}
	defer unix.Close(dirfd)
	if err := unix.PidfdSendSignal(gfd, 0, nil, 0); err != nil {
		return 0, nil, nil, nil, fmt.Errorf("G (pid %d) is gone: %w", gpid, err)
	}
	open := func(name string) (*os.File, error) {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open /proc/%d/%s: %w", gpid, name, err)
		}
		return os.NewFile(uintptr(fd), fmt.Sprintf("/proc/%d/%s", gpid, name)), nil
	}
	read := func(name string) (string, error) {
		f, err := open(name)
		if err != nil {
			return "", err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		return string(b), err
	}
	closeAll := func() {
		for _, f := range []*os.File{userNS, pidNS, cgroupNS} {
			if f != nil {
				f.Close()
			}
		}
	}
	if userNS, err = open("ns/user"); err != nil {
		return 0, nil, nil, nil, err
	}
	if pidNS, err = open("ns/pid"); err != nil {
		closeAll()
		return 0, nil, nil, nil, err
	}
	if t.dirV2 != "" {
		if cgroupNS, err = open("ns/cgroup"); err != nil {
			closeAll()
			return 0, nil, nil, nil, err
		}
	}
	uidMap, err1 := read("uid_map")
	gidMap, err2 := read("gid_map")
	status, err3 := read("status")
	cgroups, err4 := read("cgroup")
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		closeAll()
		return 0, nil, nil, nil, err
	}
	var errs []error
	// The template's namespace fds stay open while they are read: Stop
	// closes them under nsMu, and a start after it fails.
	t.nsMu.RLock()
	if t.nsClosed {
		errs = append(errs, errors.New("the template has stopped"))
	} else {
		if err := isChildNamespace(userNS, t.userNS); err != nil {
			errs = append(errs, fmt.Errorf("user namespace: %w", err))
		}
		if err := isChildNamespace(pidNS, t.pidNS); err != nil {
			errs = append(errs, fmt.Errorf("pid namespace: %w", err))
		}
	}
	t.nsMu.RUnlock()
	// PID_F must be owned by U_F, as a cold sandbox's pid namespace is by
	// its user namespace. A template that cloned G into a new pid
	// namespace but not a new user namespace makes one owned by U_T: privilege over it
	// (its /proc mount, ns_last_pid, signalling its init) then belongs to
	// U_T's root, the template, and to nothing of the sandbox, a shape
	// no test covers; refused. (Such a clone needs CAP_SYS_ADMIN in U_T,
	// which templateCaps leave out today; the check keeps the shape out
	// whatever the template's capabilities become.)
	if err := isOwnedBy(pidNS, userNS); err != nil {
		errs = append(errs, fmt.Errorf("pid namespace: %w", err))
	}
	// v2: G keeps the cgroup namespace T's clone3 (CLONE_NEWCGROUP |
	// CLONE_INTO_CGROUP) made for it, rooted at its shell's cgroup: it
	// must be one U_F owns, i.e. made for this fork, never T's (the
	// worker's, where the code would see the host's cgroup paths).
	if cgroupNS != nil {
		if err := isOwnedBy(cgroupNS, userNS); err != nil {
			errs = append(errs, fmt.Errorf("cgroup namespace: %w", err))
		}
	}
	base := r.opts.HostIDBase
	for _, m := range []struct {
		name, got string
		id        int
	}{{"uid_map", uidMap, inside.UID}, {"gid_map", gidMap, inside.GID}} {
		// As the host sees it: inside id, host id, count.
		want := fmt.Sprintf("0 %d 1\n%d %d 1", base, m.id, base+m.id)
		if normalizeMap(m.got) != want {
			errs = append(errs, fmt.Errorf("%s is %q, want a cold sandbox's %q", m.name, normalizeMap(m.got), want))
		}
	}
	if nspid := statusField(status, "NSpid"); len(nspid) < 2 || nspid[len(nspid)-1] != "1" {
		errs = append(errs, fmt.Errorf("G is not pid 1 of its own pid namespace (NSpid %v)", nspid))
	}
	// A fork that has not been placed yet: still the template's root, with
	// every capability of U_F, in the template's own cgroup. Without this a
	// template could send the pidfd of a G that already has a shell (moved
	// into that shell's cgroup, maybe dropped and running an execution's
	// code) and get a second shell's namespace fds handed to it, or have
	// the worker reset that execution's oom_score_adj.
	if err := isUnplacedFork(status, cgroups, t, base, shellID); err != nil {
		errs = append(errs, err)
	} else if t.dirV2 != "" {
		// v2: and alone there (nothing forked or moved in beside it).
		b, err := os.ReadFile(filepath.Join(t.dirV2, shellID, "cgroup.procs"))
		if err != nil {
			errs = append(errs, err)
		} else if procs := strings.Fields(string(b)); len(procs) != 1 || procs[0] != strconv.Itoa(gpid) {
			errs = append(errs, fmt.Errorf("the shell's cgroup holds %v, want G (%d) alone", procs, gpid))
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll()
		return 0, nil, nil, nil, fmt.Errorf("%w %s: %w", ErrNotAFork, t.ID(), err)
	}
	if !t.claimG(gpid) {
		closeAll()
		return 0, nil, nil, nil, fmt.Errorf("%w %s: G (pid %d) is already another shell's", ErrNotAFork, t.ID(), gpid)
	}
	if err := resetOOMScoreAdj(dirfd); err != nil {
		t.unclaimG(gpid)
		closeAll()
		return 0, nil, nil, nil, err
	}
	return gpid, userNS, pidNS, cgroupNS, nil
}

// isUnplacedFork checks, from G's /proc status and cgroup files, that G is
// as a fork is before it has a shell: all its uids and gids the template
// root's (host HostIDBase+1, as the worker sees them), every capability in
// its effective set (U_F's root: a dropped G has none), and on v1 in the
// template's own cgroup in every hierarchy the template has (a G already
// moved into a shell's is in tpl-<id>/sbx-<id>); on v2 in the cgroup
// prepared for this shell, tpl-<id>/<shellID>, where T cloned it (a G of
// another shell is in that shell's).
func isUnplacedFork(status, cgroups string, t *Template, base int, shellID string) error {
	root := strconv.Itoa(base + 1)
	for _, k := range []string{"Uid", "Gid"} {
		f := statusField(status, k)
		if len(f) != 4 || slices.IndexFunc(f, func(s string) bool { return s != root }) >= 0 {
			return fmt.Errorf("G's %s is %v, want the template root's %s (a G that changed its ids is not a fresh fork)", k, f, root)
		}
	}
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return err
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("cap_last_cap: %w", err)
	}
	full := uint64(1)<<(last+1) - 1
	if f := statusField(status, "CapEff"); len(f) != 1 {
		return fmt.Errorf("G's CapEff is %v", f)
	} else if eff, err := strconv.ParseUint(f[0], 16, 64); err != nil || eff != full {
		return fmt.Errorf("G's CapEff is %s, want every capability (%x): a G that dropped any is not a fresh fork", f[0], full)
	}
	if t.dirV2 != "" {
		// "0::path", the path relative to the worker's cgroup namespace
		// (G has not joined its shell's yet): the shell's directory ends
		// with it.
		want := filepath.Join(t.dirV2, shellID)
		for _, l := range strings.Split(strings.TrimSpace(cgroups), "\n") {
			if p, ok := strings.CutPrefix(l, "0::"); ok {
				if !strings.HasPrefix(p, "/") || path.Base(p) != shellID || !strings.HasSuffix(want, p) {
					return fmt.Errorf("G's cgroup is %q, not its shell's %s", p, want)
				}
				return nil
			}
		}
		return fmt.Errorf("G has no cgroup v2 line: %q", cgroups)
	}
	// v1 lines are "id:controllers:path", the path relative to the
	// worker's cgroup namespace; the template's directories end with it.
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(cgroups), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			lines[c] = parts[2]
		}
	}
	for ctrl, tdir := range t.s.cgroupPaths {
		if tdir == "" {
			continue
		}
		p, ok := lines[ctrl]
		if !ok || !strings.HasPrefix(p, "/") || path.Base(p) != t.ID() || !strings.HasSuffix(tdir, p) {
			return fmt.Errorf("G's %s cgroup is %q, not the template's own %s", ctrl, p, tdir)
		}
	}
	return nil
}

// resetOOMScoreAdj gives G, through its /proc directory fd, the worker's
// own oom_score_adj, which is what a cold sandbox's process inherits. G
// inherited the template's -1000 (templateOOMScoreAdj) and, with it, the
// template's oom_score_adj_min of -1000, which the kernel sets whenever a
// privileged process writes the value: left so, the code in G could lower
// its own oom_score_adj back to -1000 without any privilege (the kernel
// lets a process go down to its min), make itself unkillable by the OOM
// killer, and turn its cgroup's memory limit into a stuck OOM (cgroup v1
// under_oom) or the host's OOM killer's problem. Written by the worker
// (CAP_SYS_RESOURCE), it sets both the value and the min, as for a cold
// process.
func resetOOMScoreAdj(dirfd int) error {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return err
	}
	fd, err := unix.Openat(dirfd, "oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("unable to open G's oom_score_adj: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(strings.TrimSpace(string(own)))); err != nil {
		return fmt.Errorf("unable to reset G's oom_score_adj: %w", err)
	}
	return nil
}

// pidfdPid is the host pid of the process pidfd fd refers to, from its
// fdinfo; an error when fd is not a pidfd or its process is gone.
func pidfdPid(fd int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	f := statusField(string(b), "Pid")
	if len(f) != 1 {
		return 0, errors.New("not a pidfd")
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("the pidfd's process is gone or not visible (Pid: %s)", f[0])
	}
	return pid, nil
}

// statusField is the whitespace-separated value of key in a
// /proc/.../status or fdinfo text, nil when absent.
func statusField(text, key string) []string {
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.Fields(v)
		}
	}
	return nil
}

// normalizeMap is an id map's lines with single spaces.
func normalizeMap(m string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(m), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

// nsGetParent is NS_GET_PARENT (linux/nsfs.h, _IO(0xb7, 0x2)): an fd of
// the parent of a user or pid namespace.
const nsGetParent = 0xb7<<8 | 0x2

// nsGetUserNS is NS_GET_USERNS (linux/nsfs.h, _IO(0xb7, 0x1)): an fd of
// the user namespace that owns a namespace.
const nsGetUserNS = 0xb7<<8 | 0x1

// isOwnedBy checks that namespace ns is owned by user namespace owner.
func isOwnedBy(ns, owner *os.File) error {
	ufd, _, errno := unix.Syscall(unix.SYS_IOCTL, ns.Fd(), nsGetUserNS, 0)
	if errno != 0 {
		return fmt.Errorf("NS_GET_USERNS: %w", errno)
	}
	defer unix.Close(int(ufd))
	got, err := nsIDOf(int(ufd))
	if err != nil {
		return err
	}
	want, err := nsIDOf(int(owner.Fd()))
	if err != nil {
		return err
	}
	if got != want {
		return errors.New("not owned by G's user namespace")
	}
	return nil
}

// isChildNamespace checks that namespace child's parent is parent.
func isChildNamespace(child, parent *os.File) error {
	pfd, _, errno := unix.Syscall(unix.SYS_IOCTL, child.Fd(), nsGetParent, 0)
	if errno != 0 {
		return fmt.Errorf("NS_GET_PARENT: %w", errno)
	}
	defer unix.Close(int(pfd))
	got, err := nsIDOf(int(pfd))
	if err != nil {
		return err
	}
	want, err := nsIDOf(int(parent.Fd()))
	if err != nil {
		return err
	}
	if got != want {
		return errors.New("not a child of the template's")
	}
	return nil
}

// sameNamespace checks that the namespace at path is f's.
func sameNamespace(path string, f *os.File) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	want, err := nsIDOf(int(f.Fd()))
	if err != nil {
		return err
	}
	if (nsID{uint64(st.Dev), st.Ino}) != want {
		return errors.New("a different namespace")
	}
	return nil
}

// ID is the shell's id (its container, cgroup and state directory name).
func (s *Shell) ID() string { return s.id }

// GPid is G's host pid, as read from its pidfd. It is G's only while G
// lives: signal G through GPidfd.
func (s *Shell) GPid() int { return s.gpid }

// GPidfd is the shell's pidfd of G, valid until Destroy.
func (s *Shell) GPidfd() *os.File { return s.g }

// NamespaceFiles are the shell's namespaces, in ShellNamespaces order, for
// G to join (setns); nil once CloseNamespaces or Destroy closed them. They
// keep the namespaces alive while no process is in them.
func (s *Shell) NamespaceFiles() []*os.File {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	return slices.Clone(s.ns)
}

// CloseNamespaces closes the namespace fds once G holds the namespaces.
func (s *Shell) CloseNamespaces() { s.closeNamespaces() }

func (s *Shell) closeNamespaces() {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	for _, f := range s.ns {
		f.Close()
	}
	s.ns = nil
}

// SeccompProgram is the program G loads: the one the kernel held for the
// shell's init, i.e. a cold sandbox's (the same for every shell of this
// Runner). It must not be modified.
func (s *Shell) SeccompProgram() seccomp.Program { return s.prog }

// Rlimit is one resource limit (setrlimit(2)) of a sandbox's process.
type Rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

// Rlimits are the resource limits libcontainer gives a cold sandbox's
// process for the shell's spec (buildConfig's): G sets them before its drop
// (its init never execs, so nothing reads them from it). A fresh copy.
func (s *Shell) Rlimits() []Rlimit { return slices.Clone(s.rlimits) }

// CgroupPaths are the shell's cgroup directories, one per hierarchy,
// children of the template's.
func (s *Shell) CgroupPaths() cgroup.Paths { return s.cgroupPaths }

// MoveG moves G into the shell's cgroup on cgroup v1 (no CLONE_INTO_CGROUP
// there; TEMPLATE.md section 4): G was forked in the template's cgroup,
// and the shell's is a child of it, so G never leaves the subtree it
// started in. It moves only G (the pidfd StartShell checked), only from
// the template's own cgroup (or the shell's: moving twice is a no-op), and
// only into the shell's: a directory that is not a child of the
// template's, or a G found anywhere else, is an error and nothing more is
// written. On v2 it moves nothing: G was born in the shell's cgroup
// (PrepareShell, CLONE_INTO_CGROUP), and a move between the template's
// leaf and the shell's would be one between siblings; it only checks that
// G is there (checkGIn).
//
// v1 has no way to move by pidfd: G's pid is written to cgroup.procs. The
// attack this defends against: G dies between the membership check and
// the write, T (its parent, template code) reaps it at once, a host
// process takes the freed pid, and the write moves that host process into
// the shell's cgroup (out of the subtree it started in), where the
// caller's Destroy would then SIGKILL it. Two rules close it:
//
//   - Protocol (TEMPLATE.md section 11, step 4): T never reaps G until the
//     worker has finished MoveG. T waits for G with
//     waitid(WEXITED|WNOWAIT), which leaves G a zombie, and reaps it only
//     on the worker's go-ahead; a zombie's pid is not reused.
//   - The worker does not rely on T (template code, which a compromised
//     template controls): MoveG holds G's pid itself for the whole check
//     and write (pinG: it ptrace-attaches G, and a traced process that
//     dies stays a zombie its parent cannot reap until the tracer lets it
//     go), and attaches only after it found G's pidfd alive, so the pid
//     attached is G's. A G it cannot attach (already traced, say) is an
//     error, with nothing written.
//
// So the only pid MoveG ever writes is G's (a zombie G's write moves
// nothing), and after a failed MoveG the shell's cgroup holds at most G and
// what G forked there, all of them forks of the template: Destroy's kill of
// everything in it kills nothing else. After the writes MoveG checks, G
// still pinned, that G is listed in every one of the shell's cgroups, and
// fails if it is not (G died).
func (s *Shell) MoveG() error {
	err := s.moveG()
	if err == nil {
		s.unclaim()
	}
	return err
}

func (s *Shell) moveG() error {
	if dir, v2 := s.cgroupPaths.V2(); v2 {
		return s.checkGIn(dir)
	}
	type move struct{ from, to string }
	var moves []move
	seen := map[string]bool{}
	for ctrl, dir := range s.cgroupPaths {
		if dir == "" || seen[dir] {
			continue
		}
		seen[dir] = true
		tdir := s.tpl.s.cgroupPaths[ctrl]
		if tdir == "" || filepath.Dir(dir) != tdir || filepath.Base(dir) != s.id {
			return fmt.Errorf("cgroup %s (%s) is not the shell's child of the template's %q", dir, ctrl, tdir)
		}
		moves = append(moves, move{tdir, dir})
	}
	slices.SortFunc(moves, func(a, b move) int { return strings.Compare(a.to, b.to) })
	pid := strconv.Itoa(s.gpid)
	return pinG(s.gpid, s.g, s.log, func() error {
		for _, m := range moves {
			inFrom, err1 := inCgroup(m.from, pid)
			inTo, err2 := inCgroup(m.to, pid)
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			if inTo {
				continue
			}
			if !inFrom {
				return fmt.Errorf("G (pid %d) is not in the template's cgroup %s: not moved", s.gpid, m.from)
			}
			if err := os.WriteFile(filepath.Join(m.to, "cgroup.procs"), []byte(pid), 0); err != nil {
				return fmt.Errorf("unable to move G into %s: %w", m.to, err)
			}
		}
		// A G that died (a zombie: pinned, not reaped) is listed nowhere.
		for _, m := range moves {
			in, err := inCgroup(m.to, pid)
			if err != nil {
				return err
			}
			if !in {
				return fmt.Errorf("G (pid %d) is not in %s after the move: it died", s.gpid, m.to)
			}
		}
		return nil
	})
}

// checkGIn is MoveG on v2: G must be in the shell's cgroup dir, alone
// (listed alone in its cgroup.procs, its pidfd alive after the read, so the
// pid listed was G's), and the directory a child of tpl-<id> named after
// the shell. Nothing is written. Alone again, after openFork's check: the
// chown back of cgroup.procs (PreparedShell.EndFork) does not wait for a
// clone3 CLONE_INTO_CGROUP whose permission check passed just before it,
// and by now libcontainer's writes to the shell's cgroups, which take the
// kernel's cgroup_mutex as that clone3 does, have let any such fork land
// where this read sees it (SECURITY.md case 70).
func (s *Shell) checkGIn(dir string) error {
	if s.tpl.dirV2 == "" || filepath.Dir(dir) != s.tpl.dirV2 || filepath.Base(dir) != s.id {
		return fmt.Errorf("cgroup %s is not the shell's child of the template's %q", dir, s.tpl.dirV2)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	if err := unix.PidfdSendSignal(int(s.g.Fd()), 0, nil, 0); err != nil {
		return fmt.Errorf("G (pid %d) is gone: %w", s.gpid, err)
	}
	if procs := strings.Fields(string(b)); len(procs) != 1 || procs[0] != strconv.Itoa(s.gpid) {
		return fmt.Errorf("the shell's cgroup %s holds %v, want G (pid %d) alone", dir, procs, s.gpid)
	}
	return nil
}

// pinReleaseGrace is how long pinG waits for G's ptrace stop when it lets
// G go before it SIGKILLs G (a G that does not stop is in a killable-only
// wait, a vfork's say, which template code never needs before its
// hand-off: a template that does it is broken or hostile).
const pinReleaseGrace = 10 * time.Second

// pinG runs f while the worker holds pid, G's, so that it cannot be reused:
// it ptrace-attaches pid (PTRACE_SEIZE: G does not stop, and is not
// otherwise disturbed) and checks G's pidfd before and after the attach:
// alive (a zombie included) after it, the pid attached was G's. While
// attached, a G that dies stays a zombie that only the tracer can see: T
// cannot reap it, and its pid cannot be reused. Afterwards G is let go:
// interrupted and detached, or, when it died, waited for as its tracer,
// which hands the zombie (and its exit status) back to T. A G that does
// not reach its stop within pinReleaseGrace is SIGKILLed through its
// pidfd. ptrace needs what seccomp.LoadedProgram needs (CAP_SYS_PTRACE;
// yama's ptrace_scope below 3).
//
// It all runs on a thread of its own, locked to it: ptrace requests and
// the tracer's waits must come from the thread that attached. Should the
// pid attached not be known to be G's (G reaped between the checks, by a
// hostile template before the go-ahead, say, and its pid taken since:
// SECURITY.md case 71), the worker does not touch that process any
// further: the thread ends instead (a goroutine that ends locked to its
// thread ends the thread), and the kernel detaches its tracee as for any
// tracer's exit (ptrace(2)): a running one runs on, a stopped one resumes
// (with the signal of a signal-delivery stop), an exited one is its
// parent's to reap, its status untaken, whoever the parent is.
func pinG(pid int, pidfd *os.File, log *slog.Logger, f func() error) error {
	return onOwnThread(func() (error, bool) { return pinOnThread(pid, pidfd, log, f) })
}

// onOwnThread runs f on a goroutine locked to its thread and returns f's
// error. When f says to end the thread, the goroutine ends still locked,
// and Go then ends the thread (after onOwnThread returned): the kernel
// detaches whatever that thread traced, as ptrace(2) says a tracer's exit
// does.
func onOwnThread(f func() (err error, endThread bool)) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, end := f()
		if !end {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// pinOnThread is pinG's work on its locked thread; abandon says the thread
// must end (see pinG).
func pinOnThread(pid int, pidfd *os.File, log *slog.Logger, f func() error) (err error, abandon bool) {
	pt := func(req int, data uintptr) error { return ptrace(req, pid, data) }
	alive := func() error { return unix.PidfdSendSignal(int(pidfd.Fd()), 0, nil, 0) }
	// Checked before the attach too, so that a G already reaped has its
	// pid left alone.
	if err := alive(); err != nil {
		return fmt.Errorf("G (pid %d) is gone: %w", pid, err), false
	}
	if err := pt(unix.PTRACE_SEIZE, 0); err != nil {
		return fmt.Errorf("unable to pin G (pid %d) with ptrace: %w", pid, err), false
	}
	if err := alive(); err != nil {
		return fmt.Errorf("G (pid %d) is gone: %w", pid, err), true
	}
	defer func() {
		if !releaseG(pid, pidfd, log, pt) {
			abandon = true
		}
	}()
	return f(), false
}

// ptrace makes request req of tracee pid, addr 0; it must come from the
// thread that attached.
func ptrace(req, pid int, data uintptr) error {
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(pid), 0, data, 0, 0); e != 0 {
		return e
	}
	return nil
}

// releaseG lets G go after pinG (see there). It runs on pinG's locked
// thread; false means it could not, and pinG ends the thread, which
// detaches G as the kernel does for a tracer's exit.
func releaseG(pid int, pidfd *os.File, log *slog.Logger, pt func(int, uintptr) error) bool {
	// ESRCH: G is a zombie: the wait below hands it back.
	_ = pt(unix.PTRACE_INTERRUPT, 0)
	timer := time.AfterFunc(pinReleaseGrace, func() {
		log.Error("G did not stop to be released from its pin: killed", "pid", pid)
		_ = unix.PidfdSendSignal(int(pidfd.Fd()), unix.SIGKILL, nil, 0)
	})
	defer timer.Stop()
	for {
		// As G's tracer, not its parent: reaping a dead G here only
		// detaches it and hands the zombie, with its exit status, to T.
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ECHILD {
			return true // not (or no longer) our tracee
		}
		if err != nil {
			log.Error("unable to release G from its pin; its thread ends instead", "pid", pid, "error", err)
			return false
		}
		if !ws.Stopped() {
			return true // exited or killed: handed to T
		}
		// A stop with no ptrace event is a signal-delivery stop (a signal
		// G got while pinned, before the interrupt's stop): detaching
		// delivers that signal, as if G had never been traced. Any other
		// stop (the interrupt's, a group stop) detaches with none.
		var sig uintptr
		if int(ws)>>16 == 0 {
			sig = uintptr(ws.StopSignal())
		}
		err = pt(unix.PTRACE_DETACH, sig)
		if err == unix.ESRCH {
			continue // killed since its stop: its exit is the next wait's
		}
		if err != nil {
			log.Error("unable to detach from G; its thread ends instead", "pid", pid, "error", err)
			return false
		}
		return true
	}
}

// inCgroup tells whether pid is listed in dir's cgroup.procs.
func inCgroup(dir, pid string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false, err
	}
	return slices.Contains(strings.Fields(string(b)), pid), nil
}

// Destroy ends the shell: it kills every process in its cgroup (G and what
// G started, once G moved in; T, G's parent, is in the template's cgroup
// and reaps it), removes the cgroup, the state directory and the owner
// marker, and closes the namespace fds and G's pidfd. A G that never moved
// in is not killed: it is still the template's. Idempotent; what could not
// be removed keeps its marker, for Sweep.
func (s *Shell) Destroy() error {
	s.destroyOnce.Do(func() {
		s.closeNamespaces()
		var errs []error
		if err := cgroup.KillAll(s.cgroupPaths); err != nil {
			errs = append(errs, err)
		}
		// libcontainer's destroy of a container in a joined pid namespace
		// also kills what its cgroup holds, then removes it.
		if err := s.c.Destroy(); err != nil {
			errs = append(errs, err)
		} else if dir, v2 := s.cgroupPaths.V2(); v2 && s.tpl.dirV2 != "" {
			// libcontainer removed the init's cgroup; G's is ours.
			if err := removeCgroupDir(dir); err != nil {
				errs = append(errs, err)
			} else if err := s.r.unmarkOwned(s.id); err != nil {
				errs = append(errs, err)
			}
		} else if err := s.r.unmarkOwned(s.id); err != nil {
			errs = append(errs, err)
		}
		s.g.Close()
		s.tfd.Close()
		s.unclaim()
		s.tpl.shells.Done()
		s.destroyErr = errors.Join(errs...)
		if s.destroyErr != nil {
			s.log.Error("unable to destroy shell", "error", s.destroyErr)
		}
	})
	return s.destroyErr
}
