package nsjail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

// PreparedShell is a shell's id and, on cgroup v2, its cgroup, made before
// the template forks G (TEMPLATE.md section 4): there T clones G straight
// into it with clone3(CLONE_INTO_CGROUP), so G never runs
// outside it and nothing is ever migrated (v2 forbids a move between the
// template's leaf and the shell's cgroup, siblings, by the machine rule:
// a process never leaves the cgroup it started in). On v1 nothing is made
// (G is moved into a child of the template's cgroup, Shell.MoveG).
//
// Use: PrepareShell, send CgroupFile (when not nil) with the fork request,
// StartShell with the Spec's ID set to ID, then Close whatever happened:
// after a successful StartShell the cgroup is the shell's (its Destroy
// removes it), otherwise Close kills what it holds (forks of the template
// only) and removes it.
type PreparedShell struct {
	t  *Template
	id string
	// dir is the cgroup's absolute directory (tpl-<id>/sbx-<id>); "" on v1.
	dir string
	// fd is an O_PATH fd of a detached bind mount of dir (open_tree
	// OPEN_TREE_CLONE): see CgroupFile.
	fd *os.File

	mu     sync.Mutex
	taken  bool // by a shell (StartShell)
	closed bool
	// inFlight: the fork is not done yet (EndFork), so tpl-<id>'s
	// cgroup.procs may be the template root's.
	inFlight bool
}

// PrepareShell makes the id of t's next shell and, on cgroup v2, its
// cgroup tpl-<id>/<shell id>: an empty child of tpl-<id> (every controller
// enabled there; StartShell sets the shell's limits on it with
// libcontainer's cgroups manager, and libcontainer makes the init's own
// beside it, <shell id>-init), whose cgroup.procs belongs
// to the template's host root (HostIDBase+1), and so does tpl-<id>'s until
// the fork is done: T, whose host credentials those are, may then clone G
// into it (the kernel checks write access to cgroup.procs of the
// destination and of the common ancestor, tpl-<id>: experiment E7).
// The caller gives both back to root once it holds G (EndFork; StartShell
// makes sure), Close if no shell took the cgroup. Made with the default
// CPU weight, not a background shell's (StartShell writes that): T's clone
// of G into it and G's work before its pidfd is sent are the template's
// part of the fork, which the pool runs at the foreground weight
// (server/warmpool forkLock.holdForeground).
//
// One fork of a template between PrepareShell and EndFork at a time (the
// pool holds the template's fork lock from one to the other,
// server/warmpool forkSource.forking): tpl-<id>'s cgroup.procs is the
// template root's while any prepared shell of t is in flight (SECURITY.md
// case 70).
func (r *Runner) PrepareShell(t *Template) (*PreparedShell, error) {
	p := &PreparedShell{t: t, id: newID()}
	if t.dirV2 == "" {
		return p, nil
	}
	dir := filepath.Join(t.dirV2, p.id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("unable to create the shell's cgroup: %w", err)
	}
	p.dir = dir
	fail := func(err error) (*PreparedShell, error) {
		p.Close()
		return nil, err
	}
	if err := os.Chown(filepath.Join(dir, "cgroup.procs"), r.opts.HostIDBase+1, r.opts.HostIDBase+1); err != nil {
		return fail(fmt.Errorf("unable to hand the shell's cgroup.procs to the template: %w", err))
	}
	p.inFlight = true
	if err := t.beginFork(r.opts.HostIDBase + 1); err != nil {
		p.inFlight = false
		return fail(fmt.Errorf("unable to hand tpl-<id>'s cgroup.procs to the template: %w", err))
	}
	// A detached bind mount of the directory, not the directory itself:
	// the fd goes to the template, and a plain fd of a
	// directory of the worker's cgroupfs would let its holder walk ".."
	// out of the cgroup tree into the worker's own mount namespace, the
	// host's filesystem (runc's CVE-2024-21626, a leaked /sys/fs/cgroup fd
	// turned into a container escape; E7: ".." of a plain fd is tpl-<id>).
	// The root of a detached mount has no parent: ".." stays on it
	// (SECURITY.md case 70). clone3 takes an O_PATH fd of the directory.
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("unable to make a detached mount of the shell's cgroup: %w", err))
	}
	p.fd = os.NewFile(uintptr(fd), "cgroup-"+p.id)
	// Read-only: opening cgroup.procs (or any file) for writing through
	// the mount fails with EROFS, while clone3's CLONE_INTO_CGROUP, which
	// checks only the inodes' permissions (cgroup_css_set_fork:
	// cgroup_may_write, inode_permission), still forks into it. A
	// template taken over can then never hold a writable cgroup.procs of
	// a shell, so it cannot move its own processes, or another
	// execution's, into a shell at a later fork, when tpl-<id>'s
	// cgroup.procs is its again (the kernel checks the destination only
	// at open, the common ancestor at each write: SECURITY.md case 70).
	// What keeps the template's processes from making it writable again
	// is seccomp: mount_setattr on a detached mount needs CAP_SYS_ADMIN
	// over the caller's own mount namespace only, which G has (root of
	// U_F until its drop, in the shell's mount namespace, which U_F
	// owns), and the template profile refuses mount_setattr, open_tree,
	// move_mount, fsmount and mount (EPERM, inherited from the execution
	// profile; seccomp TestTemplateProfileTable). T alone has
	// only CAP_SETUID and CAP_SETGID, and its mount namespace is U_T's.
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fail(fmt.Errorf("unable to make the detached mount of the shell's cgroup read-only: %w", err))
	}
	t.preparedMu.Lock()
	if t.prepared == nil {
		t.prepared = map[string]*PreparedShell{}
	}
	t.prepared[p.id] = p
	t.preparedMu.Unlock()
	return p, nil
}

// ID is the shell's id: StartShell's Spec.ID.
func (p *PreparedShell) ID() string { return p.id }

// CgroupFile is what the template clones G into (cgroup v2): an O_PATH
// fd of a detached bind mount of the shell's cgroup directory, nil on v1.
// It is the PreparedShell's until Close.
func (p *PreparedShell) CgroupFile() *os.File { return p.fd }

// Close closes the cgroup's fd and, unless a shell took the cgroup,
// kills what it holds and removes it. Idempotent.
func (p *PreparedShell) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.fd != nil {
		p.fd.Close()
	}
	if p.dir == "" {
		return nil
	}
	var errs []error
	if err := p.endForkLocked(); err != nil {
		errs = append(errs, err)
	}
	p.t.preparedMu.Lock()
	delete(p.t.prepared, p.id)
	p.t.preparedMu.Unlock()
	if p.taken {
		return errors.Join(errs...)
	}
	// What is in it was cloned into it by the template, or moved into
	// it by a process of tpl-<id> (the kernel's common-ancestor check):
	// the template's processes, none of the host's.
	if _, err := os.Stat(p.dir); err == nil {
		if err := cgroup.KillAll(cgroup.Paths{"": p.dir}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroupDir(p.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ErrTemplateUnusable: the template may not fork again (an earlier fork's
// tpl-<id>/cgroup.procs could not be taken back from it, SECURITY.md case
// 70): stop it and start another.
var ErrTemplateUnusable = errors.New("tpl-<id>'s cgroup.procs could not be taken back from this template after a fork: it may not fork again")

// beginFork hands tpl-<id>'s cgroup.procs to the template's host root
// (uid) for a fork in flight: the common ancestor T's clone3
// CLONE_INTO_CGROUP must be allowed to write to (E7).
func (t *Template) beginFork(uid int) error {
	t.preparedMu.Lock()
	defer t.preparedMu.Unlock()
	if t.chownBackFailed {
		return ErrTemplateUnusable
	}
	if t.forksInFlight == 0 {
		if err := os.Chown(filepath.Join(t.dirV2, "cgroup.procs"), uid, uid); err != nil {
			return err
		}
	}
	t.forksInFlight++
	return nil
}

// EndFork ends p's fork: the shell's cgroup.procs and, when no other fork
// of the template is in flight, tpl-<id>'s go back to root. From then on
// an fd of the shell's cgroup.procs the template kept fails at every
// write: the kernel checks write access to the destination's cgroup.procs
// when it is opened, but to the common ancestor's (tpl-<id>) at each
// write, with the opener's credentials (__cgroup_procs_write; tools/v2vm
// TestKeptCgroupProcsFD). The caller calls it once it holds G's pidfd,
// before it lets another fork of the template begin (PrepareShell), and
// StartShell again before it checks that G is alone in the cgroup, so
// nothing can join G after the check (SECURITY.md case 70). An error
// makes the template unusable (ErrTemplateUnusable). No-op on v1;
// idempotent.
func (p *PreparedShell) EndFork() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.endForkLocked()
}

func (p *PreparedShell) endForkLocked() error {
	if !p.inFlight {
		return nil
	}
	p.inFlight = false
	var errs []error
	t := p.t
	t.preparedMu.Lock()
	t.forksInFlight--
	if t.forksInFlight == 0 {
		if err := os.Chown(filepath.Join(t.dirV2, "cgroup.procs"), 0, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			// tpl-<id>'s cgroup.procs stays the template's between
			// forks: no shell of it may start (the caller fails), and
			// the template must not fork again.
			t.chownBackFailed = true
			errs = append(errs, fmt.Errorf("unable to take tpl-<id>'s cgroup.procs back from the template: %w", err))
		}
	}
	t.preparedMu.Unlock()
	if err := os.Chown(filepath.Join(p.dir, "cgroup.procs"), 0, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("unable to take the shell's cgroup.procs back from the template: %w", err))
	}
	return errors.Join(errs...)
}

// takePrepared marks id's prepared cgroup as the shell's: it reports
// whether PrepareShell made it for t and no shell took it yet.
func (t *Template) takePrepared(id string) (*PreparedShell, bool) {
	t.preparedMu.Lock()
	p := t.prepared[id]
	t.preparedMu.Unlock()
	if p == nil {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.taken || p.closed {
		return nil, false
	}
	p.taken = true
	return p, true
}

// release undoes takePrepared (the shell's start failed before anything
// owned the cgroup).
func (p *PreparedShell) release() {
	p.mu.Lock()
	p.taken = false
	p.mu.Unlock()
}

// removeCgroupDir removes an empty cgroup directory; a cgroup whose last
// process just exited may stay busy for a moment (EBUSY). Gone already is
// not an error.
func removeCgroupDir(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("rmdir %s: %w", dir, err)
		}
		time.Sleep(wait)
	}
}
