package nsjail

import (
	"context"
	"log/slog"
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
	// Logger receives one line per event; nil means slog.Default().
	Logger *slog.Logger
}

// Runner starts sandboxes. It is safe for concurrent use.
type Runner struct {
	opts Options
	log  *slog.Logger
}

// HostUID is the host uid that the sandbox user (10001) appears as; a
// Spec.Workspace must be owned by it (and HostGID) to be writable inside.
func (r *Runner) HostUID() int { return r.opts.HostIDBase + SandboxUID }

// HostGID is the host gid of the sandbox group (10001).
func (r *Runner) HostGID() int { return r.opts.HostIDBase + SandboxGID }

// Run starts spec in a fresh sandbox, waits for it to finish, kills its whole
// process tree at the deadline or when ctx is cancelled, and removes every
// trace of it. The error is non-nil only when spec is invalid, in which case
// nothing was started; every failure after that is a Result with
// StatusSandboxError.
func (r *Runner) Run(ctx context.Context, spec Spec) (*Result, error) {
	panic("not implemented yet")
}
