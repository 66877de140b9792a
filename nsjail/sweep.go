package nsjail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

// ownerSuffix names the file, beside a sandbox's state directory in the
// state root (<id> + ownerSuffix), that says sandboxd created it. Start
// writes it before libcontainer creates the directory (libcontainer refuses
// a directory that exists, so the marker cannot be inside it), and removes
// it only after libcontainer removed the cgroups and then the directory. So
// every container and cgroup of ours has a marker for as long as it exists,
// SIGKILL of the worker at any point included; a marker without a directory
// is what a worker killed just before Create or just after a removal left.
const ownerSuffix = ".sandboxd-owner"

// legacyOwnerMarker is the marker inside the state directory that workers
// before ownerSuffix wrote right after Create; still honoured.
const legacyOwnerMarker = "sandboxd-owner"

// markOwned creates the owner marker of sandbox id, which must not exist.
func (r *Runner) markOwned(id string) error {
	f, err := os.OpenFile(r.ownerFile(id), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString("sandboxd\n")
	return errors.Join(err, f.Close())
}

// unmarkOwned removes the owner marker of sandbox id once its cgroups and
// state directory are gone.
func (r *Runner) unmarkOwned(id string) error {
	if err := os.Remove(r.ownerFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (r *Runner) ownerFile(id string) string { return filepath.Join(r.opts.StateRoot, id+ownerSuffix) }

// isOwned reports whether sandbox id carries an owner marker as a regular
// file: beside its state directory, or (legacy) inside it.
func (r *Runner) isOwned(id string) bool {
	for _, p := range []string{r.ownerFile(id), filepath.Join(r.stateDir(id), legacyOwnerMarker)} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// Sweep removes every sandbox left behind by a worker that died without
// cleaning up (SIGKILL, OOM, power loss): for each state directory under the
// state root that carries sandboxd's marker, it kills what is still running
// (only the init libcontainer recorded, identified by pid and start time, so
// a reused pid is never signalled) and destroys the container, which removes
// its cgroups; then it kills and removes the cgroups of marked sandboxes
// whose start died half-way (a directory without state.json, or a marker
// without a directory), and their markers. Anything unmarked, under the
// state root or the cgroup parent, is left alone and logged: a mistaken
// state_root or cgroup_parent (pointing at runc's, or at a parent with other
// cgroups) never kills someone else's containers (SECURITY.md case 29). Call
// it on start, before serving; it must not run concurrently with Run or
// Start.
func (r *Runner) Sweep() (removed []string, err error) {
	entries, err := os.ReadDir(r.opts.StateRoot)
	if err != nil {
		return nil, fmt.Errorf("unable to read state root: %w", err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	var errs []error
	ours := map[string]bool{}
	var halfStarted []string
	for _, e := range entries {
		id := e.Name()
		if owned, ok := strings.CutSuffix(id, ownerSuffix); ok && e.Type().IsRegular() {
			if !names[owned] {
				// A marker alone: any cgroups of its sandbox are swept
				// below, then the marker goes.
				ours[owned] = true
				halfStarted = append(halfStarted, owned)
			}
			continue // else it goes with its directory
		}
		if !e.IsDir() || !r.isOwned(id) {
			r.log.Warn("sweep: leaving an entry sandboxd did not create", "path", r.stateDir(id))
			continue
		}
		ours[id] = true
		c, err := libcontainer.Load(r.opts.StateRoot, id)
		if err != nil {
			// No usable state.json: a start that died half-way. Its init
			// may be running in its cgroups; they are swept below, then the
			// directory goes.
			halfStarted = append(halfStarted, id)
			continue
		}
		if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
			r.log.Warn("sweep: unable to kill orphan sandbox", "sandbox", id, "error", err)
		}
		if err := r.destroyWhenStopped(id); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
			continue
		}
		if err := r.unmarkOwned(id); err != nil {
			errs = append(errs, err)
		}
		r.log.Info("swept orphan sandbox", "sandbox", id)
		removed = append(removed, id)
	}
	// The cgroups of marked sandboxes that are still there (half-started
	// ones); no other child of the parent is touched.
	cgRemoved, cgErr := cgroup.SweepOrphans(r.opts.CgroupParent, func(id string) bool { return ours[id] }, r.log)
	if cgErr != nil {
		// Keep the half-started state directories and markers: the marker
		// is what lets the next sweep retry their cgroups.
		errs = append(errs, cgErr)
	} else {
		for _, id := range halfStarted {
			if err := os.RemoveAll(r.stateDir(id)); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := r.unmarkOwned(id); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, id)
		}
	}
	for _, id := range cgRemoved {
		if !slices.Contains(removed, id) {
			removed = append(removed, id)
		}
	}
	return removed, errors.Join(errs...)
}

func (r *Runner) stateDir(id string) string { return filepath.Join(r.opts.StateRoot, id) }

// destroyWhenStopped retries Destroy of sandbox id while its killed init is
// being torn down by the kernel (a loaded container is not our child, so we
// cannot wait(2)). It loads the container afresh for every try: the state
// libcontainer loaded is what Destroy acts on, and a container loaded while
// its init was alive stays "created" (Destroy SIGKILLs the recorded pid) or
// "running" for good. Loaded again, an init that has died is gone from the
// state (libcontainer checks its pid and start time), so a pid reused since
// then is never signalled: the supervisor reaps what the sweep kills while
// the sweep still runs (server/supervisor), so the pid is free at once.
func (r *Runner) destroyWhenStopped(id string) error {
	var err error
	for try := range 200 {
		var c *libcontainer.Container
		if c, err = libcontainer.Load(r.opts.StateRoot, id); err != nil {
			if try > 0 && errors.Is(err, libcontainer.ErrNotExist) {
				return nil // an earlier try removed it, then failed
			}
			return err
		}
		if err = c.Destroy(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}
