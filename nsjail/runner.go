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
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
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
	// maps to; the sandbox user 10001 is HostIDBase+10001 on the host
	// (default 1<<30, far from any real account).
	HostIDBase int
	// Seccomp is the filter every sandbox gets (default: the seccomp
	// package's audited profile).
	Seccomp *configs.Seccomp
	// Logger receives one line per event; nil means slog.Default().
	Logger *slog.Logger
}

// Runner starts sandboxes. It is safe for concurrent use.
type Runner struct {
	opts           Options
	log            *slog.Logger
	seccomp        *configs.Seccomp
	swapAccounting bool
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
	if filepath.IsAbs(opts.CgroupParent) || strings.Contains(opts.CgroupParent, "..") {
		return nil, fmt.Errorf("cgroup parent must be a relative path without '..', got: %q", opts.CgroupParent)
	}
	if opts.HostIDBase == 0 {
		opts.HostIDBase = 1 << 30
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
	r := &Runner{opts: opts, log: opts.Logger, seccomp: opts.Seccomp}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.swapAccounting = swapAccounting()
	return r, nil
}

// swapAccounting reports whether memory+swap can be limited: always on v2,
// on v1 only when the kernel accounts swap (memory.memsw.* exists).
func swapAccounting() bool {
	if cgroups.IsCgroup2UnifiedMode() {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

// HostUID is the host uid that the sandbox user (10001) appears as; a
// Spec.Workspace must be owned by it (and HostGID) to be writable inside.
func (r *Runner) HostUID() int { return r.opts.HostIDBase + SandboxUID }

// HostGID is the host gid of the sandbox group (10001).
func (r *Runner) HostGID() int { return r.opts.HostIDBase + SandboxGID }

// StateRoot is where libcontainer keeps each live sandbox's state.
func (r *Runner) StateRoot() string { return r.opts.StateRoot }

// CgroupParent is the relative cgroup path under which sandboxes live.
func (r *Runner) CgroupParent() string { return r.opts.CgroupParent }

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sbx-" + hex.EncodeToString(b[:])
}

// Run starts spec in a fresh sandbox, waits for it to finish, kills its whole
// process tree at the deadline or when ctx is cancelled, and removes every
// trace of it. The error is non-nil only when spec is invalid, in which case
// nothing was started; every failure after that is a Result with
// StatusSandboxError.
func (r *Runner) Run(ctx context.Context, spec Spec) (*Result, error) {
	sb, err := r.Start(spec)
	if err != nil {
		var se *startError
		if errors.As(err, &se) {
			return se.result, nil
		}
		return nil, err
	}
	return sb.Wait(ctx), nil
}

// startError carries the sandbox_error Result of a start that failed after
// validation.
type startError struct{ result *Result }

func (e *startError) Error() string { return e.result.Error }

// Sandbox is one started execution. Wait must be called exactly once.
type Sandbox struct {
	r         *Runner
	id        string
	spec      Spec
	lim       Limits
	c         *libcontainer.Container
	proc      *libcontainer.Process
	stdout    *capture
	stderr    *capture
	startedAt time.Time
	log       *slog.Logger
}

// ID is the sandbox's id (its container, cgroup and state directory name).
func (s *Sandbox) ID() string { return s.id }

// Start validates spec and starts its command in a fresh sandbox. The
// returned Sandbox must be waited for. A validation error means nothing was
// started; any other error is a *startError carrying a sandbox_error Result,
// and everything that was created is already removed.
func (r *Runner) Start(spec Spec) (*Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	lim := spec.Limits.withDefaults()
	id := spec.ID
	if id == "" {
		id = newID()
	}
	log := r.log.With("sandbox", id)
	fail := func(format string, a ...any) (*Sandbox, error) {
		now := time.Now()
		res := &Result{ID: id, Status: StatusSandboxError, ExitCode: -1, LimitsHit: []string{},
			StartedAt: now, FinishedAt: now, Error: fmt.Sprintf(format, a...)}
		log.Error("sandbox start failed", "error", res.Error)
		return nil, &startError{res}
	}

	cfg, err := r.buildConfig(id, &spec, lim)
	if err != nil {
		return fail("unable to build sandbox config: %v", err)
	}
	c, err := libcontainer.Create(r.opts.StateRoot, id, cfg)
	if err != nil {
		return fail("unable to create sandbox: %v", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_ = c.Destroy()
		return fail("unable to create stdout pipe: %v", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = c.Destroy()
		outR.Close()
		outW.Close()
		return fail("unable to create stderr pipe: %v", err)
	}
	env := spec.Env
	if !hasEnv(env, "PATH") {
		env = append(env[:len(env):len(env)], "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
	}
	proc := &libcontainer.Process{
		Args:       spec.Args,
		Env:        env,
		Cwd:        cwd,
		UID:        SandboxUID,
		GID:        SandboxGID,
		Stdin:      spec.Stdin,
		Stdout:     outW,
		Stderr:     errW,
		ExtraFiles: spec.ExtraFiles,
		Init:       true,
	}
	startedAt := time.Now()
	err = c.Run(proc)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		destroy(c, log)
		return fail("unable to start sandbox: %v", err)
	}
	log.Debug("sandbox started", "start_ms", time.Since(startedAt).Milliseconds())
	return &Sandbox{
		r: r, id: id, spec: spec, lim: lim, c: c, proc: proc,
		stdout:    newCapture(outR, lim.StdoutBytes),
		stderr:    newCapture(errR, lim.StderrBytes),
		startedAt: startedAt, log: log,
	}, nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// Wait waits for the command to finish, enforcing the deadline (counted from
// now) and ctx, then collects the result and removes the sandbox.
func (s *Sandbox) Wait(ctx context.Context) *Result {
	res := &Result{ID: s.id, StartedAt: s.startedAt, LimitsHit: []string{}}

	exited := make(chan error, 1)
	var state *os.ProcessState
	go func() {
		var err error
		state, err = s.proc.Wait()
		exited <- err
	}()
	deadline := time.NewTimer(s.lim.Timeout)
	defer deadline.Stop()

	var killedFor Status
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-deadline.C:
		killedFor = StatusTimeout
	case <-ctx.Done():
		killedFor = StatusCancelled
	}
	if killedFor != "" {
		// SIGKILL to the sandbox's init: the kernel then kills every other
		// process of its pid namespace (pid_namespaces(7)), double-forked,
		// setsid and signal-ignoring ones included.
		if err := s.c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
			s.log.Error("unable to kill sandbox", "error", err)
		}
		waitErr = <-exited
	}
	res.FinishedAt = time.Now()

	// Every process of the pid namespace is gone once init is reaped, so the
	// pipes are at EOF; the grace only guards against the impossible.
	for _, c := range []*capture{s.stdout, s.stderr} {
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
			s.log.Error("output stream still open after the sandbox exited; closing it")
			c.abort()
			<-c.done
		}
		c.r.Close()
	}

	stats := s.readStats()
	destroy(s.c, s.log)

	res.Stdout, res.Stderr = s.stdout.buf, s.stderr.buf
	res.StdoutBytes, res.StderrBytes = s.stdout.total, s.stderr.total
	res.StdoutTruncated, res.StderrTruncated = s.stdout.truncated(), s.stderr.truncated()
	if res.StdoutTruncated {
		res.hit(LimitStdout)
	}
	if res.StderrTruncated {
		res.hit(LimitStderr)
	}
	res.Usage = Usage{
		WallMS:          res.FinishedAt.Sub(res.StartedAt).Milliseconds(),
		CPUMS:           int64(stats.CPUUsageNS / 1e6),
		PeakMemoryBytes: stats.MemoryPeakBytes,
		PidsPeak:        stats.PidsPeak,
	}
	if stats.PidsLimitHits > 0 {
		res.hit(LimitPids)
	}
	if stats.OOMKills > 0 {
		res.hit(LimitMemory)
	}

	res.ExitCode = -1
	if state != nil {
		if ws, ok := state.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Exited():
				res.ExitCode = ws.ExitStatus()
			case ws.Signaled():
				res.Signal = unix.SignalName(ws.Signal())
				res.ExitCode = 128 + int(ws.Signal())
			}
		}
	}
	switch {
	case killedFor == StatusTimeout:
		res.Status = StatusTimeout
		res.hit(LimitTimeout)
	case killedFor == StatusCancelled:
		res.Status = StatusCancelled
	case stats.OOMKills > 0:
		// From the cgroup's own counter: the OOM-killed process need not be
		// init (a shell whose child was killed may still exit 0).
		res.Status = StatusOOM
	case state == nil:
		res.Status = StatusSandboxError
		res.Error = fmt.Sprintf("unable to wait for the sandbox: %v", waitErr)
	case res.ExitCode == 0 && res.Signal == "":
		res.Status = StatusSucceeded
	default:
		res.Status = StatusFailed
	}
	s.log.Info("sandbox finished", "status", res.Status, "exit_code", res.ExitCode,
		"wall_ms", res.Usage.WallMS, "limits_hit", res.LimitsHit)
	return res
}

// destroy removes the container's cgroups and state directory. libcontainer
// refuses to destroy a running container, so anything still alive (it should
// not be) is killed first.
func destroy(c *libcontainer.Container, log *slog.Logger) {
	if err := c.Destroy(); err != nil {
		_ = c.Signal(unix.SIGKILL)
		if err := c.Destroy(); err != nil {
			log.Error("unable to destroy sandbox", "error", err)
		}
	}
}
