package nsjail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

// Sweep removes every sandbox left behind by a worker that died without
// cleaning up (SIGKILL, OOM, power loss): for each state directory under the
// state root it kills what is still running (only the init libcontainer
// recorded, identified by pid and start time, so a reused pid is never
// signalled) and destroys the container, which removes its cgroups. Call it
// on start, before serving; it must not run concurrently with Run or Start
// (it treats every sandbox under the cgroup parent as an orphan).
func (r *Runner) Sweep() (removed []string, err error) {
	entries, err := os.ReadDir(r.opts.StateRoot)
	if err != nil {
		return nil, fmt.Errorf("unable to read state root: %w", err)
	}
	var errs []error
	for _, e := range entries {
		id := e.Name()
		c, err := libcontainer.Load(r.opts.StateRoot, id)
		if err != nil {
			// A state directory without a usable state.json: a start that
			// died half-way. Nothing runs from it; drop the directory.
			if rmErr := os.RemoveAll(r.stateDir(id)); rmErr != nil {
				errs = append(errs, rmErr)
				continue
			}
			removed = append(removed, id)
			continue
		}
		if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
			r.log.Warn("sweep: unable to kill orphan sandbox", "sandbox", id, "error", err)
		}
		if err := destroyWhenStopped(c); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", id, err))
			continue
		}
		r.log.Info("swept orphan sandbox", "sandbox", id)
		removed = append(removed, id)
	}
	// Cgroups whose state directory never existed or is already gone (a
	// crash between the two): kill what they hold and remove them.
	cgRemoved, err := cgroup.SweepOrphans(r.opts.CgroupParent, func(string) bool { return false }, r.log)
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range cgRemoved {
		if !slices.Contains(removed, id) {
			removed = append(removed, id)
		}
	}
	return removed, errors.Join(errs...)
}

func (r *Runner) stateDir(id string) string { return filepath.Join(r.opts.StateRoot, id) }

// destroyWhenStopped retries Destroy while the killed init is being torn down
// by the kernel (a loaded container is not our child, so we cannot wait(2)).
func destroyWhenStopped(c *libcontainer.Container) error {
	var err error
	for range 200 {
		if err = c.Destroy(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}
