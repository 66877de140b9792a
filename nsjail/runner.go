package nsjail

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/seccomp"
	"golang.org/x/sys/unix"
)

// Options configure a Runner. Zero fields take the defaults named on each.
type Options struct {
	// StateRoot holds libcontainer's per-sandbox state directories
	// (default /run/sandboxd/state). Keep it out of the binary's directory:
	// libcontainer's /proc/self/exe sealing (the CVE-2019-5736 defence) falls
	// back to copying the whole binary into memory on every start otherwise.
	StateRoot string
	// CgroupParent is the path, relative to the worker's own cgroup in each
	// hierarchy, under which every sandbox gets its own cgroup (default
	// "sandboxd"). It is always relative: sandboxd never creates or writes a
	// cgroup outside the one it was started in.
	CgroupParent string
	// HostIDBase is the host uid and gid that uid/gid 0 inside the sandbox
	// maps to; the sandbox user inside.UID is HostIDBase+inside.UID on the host
	// (default 1<<30, far from any real account).
	HostIDBase int
	// Seccomp is the filter every sandbox gets (default: the seccomp
	// package's audited profile).
	Seccomp *configs.Seccomp
	// TemplateSeccomp is the filter of every template's process
	// (StartTemplate), which its forks keep under the execution filter
	// they load: it must allow everything Seccomp allows and answer no
	// call with a harsher action (SECURITY.md case 63). Default, when
	// Seccomp is left to its default too: the seccomp package's template
	// profile (seccomp.Template). A Runner given its own Seccomp and no
	// TemplateSeccomp starts no template.
	TemplateSeccomp *configs.Seccomp
	// Logger receives one line per event; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultHostIDBase is Options.HostIDBase when left zero.
const DefaultHostIDBase = 1 << 30

// Runner starts sandboxes. It is safe for concurrent use.
type Runner struct {
	opts           Options
	log            *slog.Logger
	seccomp        *configs.Seccomp
	swapAccounting bool
	// cleanups counts this Runner's sandboxes whose removal is under way.
	cleanups sync.WaitGroup
	// shellProg is the seccomp program the first shell's init held
	// (Runner.sameProgram); under shellProgMu.
	shellProgMu sync.Mutex
	shellProg   seccomp.Program
}

// NewRunner checks that this host can run sandboxes and prepares the state
// root. It starts nothing.
func NewRunner(opts Options) (*Runner, error) {
	if opts.StateRoot == "" {
		opts.StateRoot = "/run/sandboxd/state"
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = "sandboxd"
	}
	if opts.HostIDBase == 0 {
		opts.HostIDBase = DefaultHostIDBase
	}
	if opts.HostIDBase < 65536 || opts.HostIDBase > 1<<31 {
		return nil, fmt.Errorf("host id base must be in [65536, 2^31], got: %d", opts.HostIDBase)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("sandboxd must run as root (it creates user namespaces with fixed id maps, cgroups and mounts)")
	}
	if err := os.MkdirAll(opts.StateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("unable to create state root: %w", err)
	}
	cg, err := cgroup.Host()
	if err != nil {
		return nil, fmt.Errorf("unable to prepare the sandboxes' parent cgroup: %w", err)
	}
	// On v2 this moves the worker into a leaf of its own cgroup and
	// delegates cpu, memory and pids to the sandboxes' parent; on v1 it only
	// checks the hierarchies and creates the parent under our own cgroups.
	if err := cg.PrepareParent(opts.CgroupParent); err != nil {
		return nil, fmt.Errorf("unable to prepare the sandboxes' parent cgroup: %w", err)
	}
	if opts.Seccomp == nil {
		filter, err := seccomp.Default().Libcontainer()
		if err != nil {
			return nil, fmt.Errorf("unable to compile the seccomp profile: %w", err)
		}
		opts.Seccomp = filter
		if opts.TemplateSeccomp == nil {
			if opts.TemplateSeccomp, err = seccomp.Template().Libcontainer(); err != nil {
				return nil, fmt.Errorf("unable to compile the template seccomp profile: %w", err)
			}
		}
	}
	r := &Runner{opts: opts, log: opts.Logger, seccomp: opts.Seccomp}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.swapAccounting = cg.SwapAccounting()
	return r, nil
}

// HostUID is the host uid that the sandbox user (inside.UID) appears as; a
// Spec.Workspace must be owned by it (and HostGID) to be writable inside.
func (r *Runner) HostUID() int { return r.opts.HostIDBase + inside.UID }

// HostGID is the host gid of the sandbox group (inside.GID).
func (r *Runner) HostGID() int { return r.opts.HostIDBase + inside.GID }

// StateRoot is where libcontainer keeps each live sandbox's state.
func (r *Runner) StateRoot() string { return r.opts.StateRoot }

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sbx-" + hex.EncodeToString(b[:])
}

// Run starts spec in a fresh sandbox, waits for it to finish, kills its whole
// process tree at the deadline or when ctx is cancelled, and removes every
// trace of it. The error is non-nil only when spec is invalid, in which case
// nothing was started; every failure after that, a StartError included, is
// a Result with StatusSandboxError.
func (r *Runner) Run(ctx context.Context, spec Spec) (*Result, error) {
	sb, err := r.Start(spec)
	if err != nil {
		var se *StartError
		if errors.As(err, &se) {
			return se.Result(), nil
		}
		return nil, err
	}
	return sb.Wait(ctx), nil
}

// StartError is Start's error when a valid Spec failed to start: our
// failure (libcontainer's, the kernel's), not the command's. Everything
// that was created is already removed.
type StartError struct {
	// ID is the sandbox's id.
	ID string
	// At is when the start failed.
	At time.Time
	// Err says which step failed and why.
	Err error
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Result is the failed start as the sandbox_error Result that Run returns.
func (e *StartError) Result() *Result {
	return &Result{ID: e.ID, Status: StatusSandboxError, ExitCode: -1, LimitsHit: []string{},
		StartedAt: e.At, FinishedAt: e.At, Error: e.Err.Error()}
}

// Sandbox is one started execution. It must be waited for.
type Sandbox struct {
	r    *Runner
	id   string
	lim  Limits
	c    *libcontainer.Container
	proc firstProcess
	// shell is set when the sandbox is a template fork's (Shell.Pending):
	// its first process is G, whom the worker did not start and cannot
	// reap, and it is killed through its cgroup and removed by the shell's
	// Destroy.
	shell     *Shell
	stdout    *capture
	stderr    *capture
	startedAt time.Time
	log       *slog.Logger
	mntns     *os.File
	// cgroupPaths are the sandbox's cgroup directories, set by start and
	// only read after it (by Wait, Handoff, a Pending's MemoryBytes in
	// another goroutine): nil if they could not be read, which leaves the
	// counters zero.
	cgroupPaths cgroup.Paths
	// cgroupAlso is a cgroup directory of the worker's that goes with the
	// sandbox, removed after libcontainer's and before the owner marker
	// (a template's tpl-<id> on v2, which holds its leaf and its shells'
	// cgroups): should it stay, so does the marker, for Sweep.
	cgroupAlso string
	// exitReport and cpuBaselineNS are set by a Pending's Handoff: the
	// command's wait status as reported from inside the sandbox
	// (HandoffOptions.ExitReport), and the CPU time spent before the
	// hand-off, subtracted from the reported usage.
	exitReport    <-chan syscall.WaitStatus
	cpuBaselineNS uint64
	// done is Spec.Done (HandoffOptions.Done).
	done <-chan int
	// noDeadline is HandoffOptions.NoDeadline: lim.Timeout does not apply.
	noDeadline bool
	// waitOnce runs Wait's work once (two would reap, close and destroy
	// twice); result is what it returned.
	waitOnce sync.Once
	result   *Result
	// fz guards frozen (Freeze froze the sandbox) and ending (Wait began
	// to end it: never frozen again). See freeze.go.
	fz     sync.Mutex
	frozen bool
	ending bool
	// releaseAnchor, under fz, releases the freezer anchor the first
	// Freeze took (cgroup.AcquireFreezerAnchor); nil when none is held.
	releaseAnchor func() error
	// A template fork's sandbox holds its template's foreground CPU
	// weight (Template.HoldForeground) while it serves an execution and
	// is not frozen: fgServing from the hand-off until the end begins,
	// fgRelease while held. Under fz.
	fgServing bool
	fgRelease func()
	// peak follows the memory high-water mark from ResetMemoryPeak on
	// (peakReset: a reset succeeded); counters are the cgroup's counter
	// files, opened by the first read (Stats, or readCounters: the warm
	// pool's OpenCounters while it prepares, else the hand-off or the
	// result); both under peakMu.
	peakMu    sync.Mutex
	peak      *cgroup.PeakMeter
	peakReset bool
	counters  *cgroup.Counters
	// countersClosed: closePeak ran (the cgroup is about to go); no read
	// opens them again.
	countersClosed bool
	// background: the sandbox is at the background CPU weight
	// (Spec.Background) until its hand-off. Set at the start, read once by
	// the hand-off.
	background bool
}

// firstProcess is what a Sandbox knows of its first process: a
// *libcontainer.Process (the init, the worker's child), or a template
// fork's G (gProcess).
type firstProcess interface {
	Pid() (int, error)
	// Wait returns once the process has exited; the state is nil when the
	// worker cannot reap it (G: its parent is the template, T).
	Wait() (*os.ProcessState, error)
}

// ID is the sandbox's id (its container, cgroup and state directory name).
func (s *Sandbox) ID() string { return s.id }

// Start validates spec and starts its command in a fresh sandbox. The
// returned Sandbox must be waited for. A validation error means nothing was
// started; any other error is a *StartError, and everything that was created
// is already removed.
func (r *Runner) Start(spec Spec) (*Sandbox, error) {
	if spec.Background {
		// Nothing would ever raise its weight.
		return nil, errors.New("only a pre-started sandbox starts in the background (Spec.Background): its hand-off raises its CPU weight")
	}
	return r.start(spec, spec.ExtraFiles)
}

// start is Start, passing extraFiles to the command as fds 3, 4, ...
func (r *Runner) start(spec Spec, extraFiles []*os.File) (*Sandbox, error) {
	return r.startWith(spec, startOptions{extraFiles: extraFiles})
}

// startOptions are what differs between a cold sandbox (the zero value
// but for extraFiles) and a template's (template.go).
type startOptions struct {
	// extraFiles are passed to the command as fds 3, 4, ...
	extraFiles []*os.File
	// tune, when set, changes buildConfig's config before the container
	// is created.
	tune func(*configs.Config)
	// asRoot runs the command as uid/gid 0 of the sandbox's user
	// namespace instead of inside.UID/GID.
	asRoot bool
	// v2ParentGoes: on cgroup v2, the parent of the sandbox's cgroup (a
	// template's tpl-<id>, which libcontainer makes with the leaf) is the
	// sandbox's too, removed with it (Sandbox.cgroupAlso), a failed start
	// included.
	v2ParentGoes bool
}

// startWith is start with o.
func (r *Runner) startWith(spec Spec, o startOptions) (*Sandbox, error) {
	extraFiles := o.extraFiles
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	id, lim, log := r.prepare(&spec)
	fail := func(format string, a ...any) (*Sandbox, error) {
		return nil, startFailed(id, log, "sandbox start failed", format, a...)
	}

	cfg, err := r.buildConfig(id, &spec, lim)
	if err != nil {
		return fail("unable to build sandbox config: %w", err)
	}
	if o.tune != nil {
		o.tune(cfg)
	}
	c, err := r.createMarked(id, cfg, log)
	if err != nil {
		return fail("unable to create sandbox: %w", err)
	}
	var cgroupAlso string
	if o.v2ParentGoes {
		if state, err := c.State(); err == nil {
			if d, ok := cgroup.Paths(state.CgroupPaths).V2(); ok {
				cgroupAlso = filepath.Dir(d)
			}
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		r.destroy(c, log, cgroupAlso)
		return fail("unable to create stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		r.destroy(c, log, cgroupAlso)
		outR.Close()
		outW.Close()
		return fail("unable to create stderr pipe: %w", err)
	}
	env := withPath(spec.Env)
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
	}
	uid, gid := inside.UID, inside.GID
	if o.asRoot {
		uid, gid = 0, 0
	}
	proc := &libcontainer.Process{
		Args:       spec.Args,
		Env:        env,
		Cwd:        cwd,
		UID:        uid,
		GID:        gid,
		Stdin:      spec.Stdin,
		Stdout:     outW,
		Stderr:     errW,
		ExtraFiles: extraFiles,
		Init:       true,
	}
	startedAt := time.Now()
	err = c.Run(proc)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		r.destroy(c, log, cgroupAlso)
		return fail("unable to start sandbox: %w", err)
	}
	log.Debug("sandbox started", "start_ms", time.Since(startedAt).Milliseconds())
	// Read once, now: filled lazily, a Pending's MemoryBytes (the pool's
	// /metrics) and its Handoff would both write it.
	var cgroupPaths cgroup.Paths
	if state, err := c.State(); err == nil {
		cgroupPaths = state.CgroupPaths
	} else {
		log.Warn("unable to read sandbox state for its cgroup paths", "error", err)
	}
	// Hold the sandbox's mount namespace: otherwise its last process's exit
	// tears it down synchronously (umount + an RCU grace period, several ms)
	// before the exit is reported. Released, off the result path, by Wait.
	var mntns *os.File
	if pid, err := proc.Pid(); err == nil {
		mntns, _ = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	}
	return &Sandbox{
		mntns: mntns,
		r:     r, id: id, lim: lim, c: c, proc: proc,
		stdout:    newCapture(outR, lim.StdoutBytes, spec.Output.ForStream(StreamStdout)),
		stderr:    newCapture(errR, lim.StderrBytes, spec.Output.ForStream(StreamStderr)),
		startedAt: startedAt, log: log, cgroupPaths: cgroupPaths, cgroupAlso: cgroupAlso,
		done: spec.Done, background: spec.Background,
	}, nil
}

// prepare is what every start (a sandbox's, a shell's) takes from its
// spec first: its id (a new one unless the spec names it), its limits with
// the defaults filled in, and its logger.
func (r *Runner) prepare(spec *Spec) (id string, lim Limits, log *slog.Logger) {
	lim = spec.Limits.withDefaults()
	id = spec.ID
	if id == "" {
		id = newID()
	}
	log = r.log
	if spec.Logger != nil {
		log = spec.Logger
	}
	return id, lim, log.With("sandbox", id)
}

// startFailed logs and returns a start's StartError.
func startFailed(id string, log *slog.Logger, msg, format string, a ...any) error {
	err := &StartError{ID: id, At: time.Now(), Err: fmt.Errorf(format, a...)}
	level := slog.LevelError
	if errors.Is(err.Err, context.Canceled) {
		// Whoever started it no longer wants it (a request gone, the pool
		// closing): nothing went wrong.
		level = slog.LevelInfo
	}
	log.Log(context.Background(), level, msg, "error", err.Error())
	return err
}

// createMarked creates container id from cfg, marked as sandboxd's before
// its state directory or any cgroup exists (SECURITY.md case 29: Sweep
// removes only what carries the marker), so a worker killed at any point
// leaves nothing unmarked. A state directory already there is someone
// else's: never marked, an error.
func (r *Runner) createMarked(id string, cfg *configs.Config, log *slog.Logger) (*libcontainer.Container, error) {
	if _, err := os.Lstat(r.stateDir(id)); !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("state directory %s exists (%v)", r.stateDir(id), err)
	}
	if err := r.markOwned(id); err != nil {
		return nil, fmt.Errorf("unable to mark it as sandboxd's: %w", err)
	}
	c, err := libcontainer.Create(r.opts.StateRoot, id, cfg)
	if err != nil {
		if uerr := r.unmarkOwned(id); uerr != nil {
			log.Error("unable to remove the owner marker", "error", uerr)
		}
		return nil, err
	}
	return c, nil
}

// withPath is env with the sandbox's default PATH added when it has none.
func withPath(env []string) []string {
	if hasEnv(env, "PATH") {
		return env
	}
	return append(env[:len(env):len(env)], "PATH="+inside.DefaultPath)
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// destroy removes the container's cgroups and state directory, then the
// cgroupAlso directories (those not empty), then its owner marker.
// libcontainer refuses to destroy a running container, so anything still
// alive (it should not be) is killed first. What could not be removed
// keeps its marker, for the next Sweep.
func (r *Runner) destroy(c *libcontainer.Container, log *slog.Logger, cgroupAlso ...string) {
	if err := c.Destroy(); err != nil {
		_ = c.Signal(unix.SIGKILL)
		if err := c.Destroy(); err != nil {
			log.Error("unable to destroy sandbox", "error", err)
			return
		}
	}
	for _, dir := range cgroupAlso {
		if dir == "" {
			continue
		}
		if err := removeCgroupDir(dir); err != nil {
			log.Error("unable to remove the sandbox's cgroup; its owner marker stays, for Sweep", "dir", dir, "error", err)
			return
		}
	}
	if err := r.unmarkOwned(c.ID()); err != nil {
		log.Error("unable to remove the owner marker", "error", err)
	}
}
