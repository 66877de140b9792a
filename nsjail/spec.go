package nsjail

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// Limits bound what one sandbox may use. A zero field takes the default from
// DefaultLimits; there is no way to ask for "unlimited".
type Limits struct {
	// Timeout is the wall-clock deadline, counted from the start of the
	// command; at the deadline the whole process tree is killed.
	Timeout time.Duration
	// MemoryBytes is the cgroup memory limit; swap is disabled.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads) in the sandbox.
	Pids int64
	// CPUs is the CPU bandwidth in cores (CFS quota / period), e.g. 1.5.
	CPUs float64
	// StdoutBytes and StderrBytes cap what is kept of each stream; the rest
	// is drained and counted, never buffered.
	StdoutBytes int64
	StderrBytes int64
	// TmpBytes and ShmBytes size the tmpfs mounted at /tmp and /dev/shm.
	TmpBytes int64
	ShmBytes int64
	// FileSizeBytes is RLIMIT_FSIZE: no single file may grow beyond it.
	FileSizeBytes int64
	// OpenFiles is RLIMIT_NOFILE.
	OpenFiles uint64
}

// DefaultLimits are applied to every zero field of Spec.Limits.
var DefaultLimits = Limits{
	Timeout:       30 * time.Second,
	MemoryBytes:   1 << 30,
	Pids:          128,
	CPUs:          1,
	StdoutBytes:   1 << 20,
	StderrBytes:   1 << 20,
	TmpBytes:      256 << 20,
	ShmBytes:      64 << 20,
	FileSizeBytes: 1 << 30,
	OpenFiles:     1024,
}

// withDefaults returns l with every zero field taken from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	l.Timeout = cmp.Or(l.Timeout, d.Timeout)
	l.MemoryBytes = cmp.Or(l.MemoryBytes, d.MemoryBytes)
	l.Pids = cmp.Or(l.Pids, d.Pids)
	l.CPUs = cmp.Or(l.CPUs, d.CPUs)
	l.StdoutBytes = cmp.Or(l.StdoutBytes, d.StdoutBytes)
	l.StderrBytes = cmp.Or(l.StderrBytes, d.StderrBytes)
	l.TmpBytes = cmp.Or(l.TmpBytes, d.TmpBytes)
	l.ShmBytes = cmp.Or(l.ShmBytes, d.ShmBytes)
	l.FileSizeBytes = cmp.Or(l.FileSizeBytes, d.FileSizeBytes)
	l.OpenFiles = cmp.Or(l.OpenFiles, d.OpenFiles)
	return l
}

// Validate rejects limits that cannot be applied.
func (l Limits) Validate() error {
	var errs []error
	if l.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout must be > 0, got: %s", l.Timeout))
	}
	if l.MemoryBytes != 0 && l.MemoryBytes < 8<<20 {
		errs = append(errs, fmt.Errorf("memory must be >= 8MiB, got: %d bytes", l.MemoryBytes))
	}
	if l.Pids < 0 {
		errs = append(errs, fmt.Errorf("pids must be > 0, got: %d", l.Pids))
	}
	if l.CPUs < 0 || (l.CPUs > 0 && l.CPUs < 0.01) {
		errs = append(errs, fmt.Errorf("cpus must be >= 0.01, got: %g", l.CPUs))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"stdout cap", l.StdoutBytes}, {"stderr cap", l.StderrBytes},
		{"tmp size", l.TmpBytes}, {"shm size", l.ShmBytes}, {"file size limit", l.FileSizeBytes},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be >= 0, got: %d", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// Spec describes one execution.
type Spec struct {
	// ID names the sandbox (container id, cgroup leaf, state directory). It is
	// generated when empty. Allowed: inside.IDRule.
	ID string
	// Rootfs is a host directory used, read-only, as the sandbox's root.
	Rootfs string
	// Args is the command and its arguments; Args[0] is looked up in PATH
	// inside the sandbox when it has no slash.
	Args []string
	// Env is the complete environment, as KEY=VALUE. Nothing of the worker's
	// own environment is passed in.
	Env []string
	// Cwd is the working directory inside the sandbox ("/" when empty).
	Cwd string
	// Workspace is an optional host directory bound read-write at
	// inside.Workspace.
	// It must be owned by the sandbox's host uid to be writable (see
	// Runner.HostUID).
	Workspace string
	// WorkspaceReadOnly binds Workspace read-only (a session's file is
	// profiled by code that must not change it).
	WorkspaceReadOnly bool
	// Stdin is read to feed the command's standard input; nil means /dev/null.
	Stdin io.Reader
	// ExtraFiles are passed to the command as fds FirstFileFD,
	// FirstFileFD+1, ... (the runner's events pipe). Every other host fd
	// is closed. The caller keeps and closes its own copies. Prestart
	// takes its files as arguments instead.
	ExtraFiles []*os.File
	// Hostname inside the sandbox ("sandbox" when empty).
	Hostname string
	// Limits; zero fields take DefaultLimits.
	Limits Limits
	// Background makes a pre-started sandbox ready at the background CPU
	// weight (cgroup.BackgroundShares, v2 cgroup.BackgroundWeight: a
	// sixteenth of a cold sandbox's), which its hand-off raises to the
	// foreground weight: the warm pool's refills then yield the CPU to the
	// executions that want it (issue 17, M4). Only Prestart and StartShell
	// take it; a template fork's template has the foreground weight while
	// a fork of it serves and is not frozen (Template.HoldForeground).
	Background bool
	// Logger, when set, receives this sandbox's log lines instead of the
	// Runner's (the server passes one carrying execution_id and policy).
	Logger *slog.Logger
	// Output, when set, is given the command's output as it is read
	// (streaming; see OutputFunc). A pre-started sandbox takes it at its
	// hand-off (HandoffOptions.Output).
	Output OutputFunc
	// Done, when set, delivers the exit code the command's process says
	// it is done with, having flushed its output; it then waits to be
	// ended. Wait answers on that word: it freezes the sandbox, reads it,
	// and kills it after it has answered, so the kernel's teardown of the
	// process is not on the answer's path (Result.Ended closes once it is
	// gone). If the freeze fails it kills and waits first, still with the
	// word's exit code. A channel closed empty is no word: the exit
	// decides. The code can send the word too (SECURITY.md case 72). A
	// pre-started sandbox takes it at its hand-off (HandoffOptions.Done).
	Done <-chan int
}

// Validate checks a Spec before anything is started.
func (s *Spec) Validate() error {
	var errs []error
	if s.ID != "" && !inside.ValidID(s.ID) {
		errs = append(errs, fmt.Errorf("id %q is invalid: want %s", s.ID, inside.IDRule))
	}
	if s.Rootfs == "" {
		errs = append(errs, errors.New("rootfs is required"))
	} else if !filepath.IsAbs(s.Rootfs) {
		errs = append(errs, fmt.Errorf("rootfs must be an absolute path, got: %q", s.Rootfs))
	} else if fi, err := os.Stat(s.Rootfs); err != nil {
		errs = append(errs, fmt.Errorf("rootfs: %w", err))
	} else if !fi.IsDir() {
		errs = append(errs, fmt.Errorf("rootfs %q is not a directory", s.Rootfs))
	}
	if len(s.Args) == 0 || s.Args[0] == "" {
		errs = append(errs, errors.New("a command is required"))
	}
	if s.Cwd != "" && !filepath.IsAbs(s.Cwd) {
		errs = append(errs, fmt.Errorf("cwd must be absolute inside the sandbox, got: %q", s.Cwd))
	}
	if s.Workspace != "" {
		if !filepath.IsAbs(s.Workspace) {
			errs = append(errs, fmt.Errorf("workspace must be an absolute path, got: %q", s.Workspace))
		} else if fi, err := os.Stat(s.Workspace); err != nil {
			errs = append(errs, fmt.Errorf("workspace: %w", err))
		} else if !fi.IsDir() {
			errs = append(errs, fmt.Errorf("workspace %q is not a directory", s.Workspace))
		}
	}
	for i, f := range s.ExtraFiles {
		if f == nil {
			errs = append(errs, fmt.Errorf("extra file %d is nil", i))
		}
	}
	for _, kv := range s.Env {
		if i := strings.IndexByte(kv, '='); i <= 0 {
			errs = append(errs, fmt.Errorf("env entry %q is not KEY=VALUE", kv))
		}
	}
	if err := s.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
