package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// SweepOrphans removes the sandbox cgroups a crashed worker left behind on
// this host. See Hierarchy.SweepOrphans.
func SweepOrphans(parent string, orphan func(id string) bool, log *slog.Logger) ([]string, error) {
	h, err := Host()
	if err != nil {
		return nil, err
	}
	return h.SweepOrphans(parent, orphan, log)
}

// SweepOrphans finds, in every hierarchy, the child cgroups of <own>/<parent>
// for which orphan(id) is true, kills their processes (KillAll), waits until
// they are empty and removes them, children first. It returns the ids
// removed; an id that failed is left for the next sweep and its error joined
// into err. Every other child is left alone, whatever it holds: orphan must
// name only cgroups the caller knows it created (SECURITY.md case 29; a
// mistaken parent must never kill someone else's processes). Call it at
// start-up, after PrepareParent (on v2 the sandboxes' parent is only known
// once the worker sits in its leaf) and before sandboxes start. A freezer
// anchor (anchor.go) that no sandbox of this process holds goes too.
func (h *Hierarchy) SweepOrphans(parent string, orphan func(id string) bool, log *slog.Logger) (removed []string, err error) {
	if log == nil {
		log = slog.Default()
	}
	dirs, err := h.ParentDirs(parent)
	if err != nil {
		return nil, err
	}
	orphans := map[string]Paths{} // id → controller → dir
	for ctrl, pd := range dirs {
		entries, err := os.ReadDir(pd)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no sandbox ever ran under this hierarchy
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup sweep: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || !orphan(e.Name()) {
				continue
			}
			if orphans[e.Name()] == nil {
				orphans[e.Name()] = Paths{}
			}
			orphans[e.Name()][ctrl] = filepath.Join(pd, e.Name())
		}
	}
	if _, v2 := dirs.V2(); !v2 {
		if err := removeIdleAnchor(dirs["freezer"]); err != nil {
			log.Warn("cgroup sweep: unable to remove a freezer anchor left behind", "error", err)
		}
	}
	ids := make([]string, 0, len(orphans))
	for id := range orphans {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var errs []error
	for _, id := range ids {
		paths := orphans[id]
		if err := KillAll(paths); err != nil {
			errs = append(errs, fmt.Errorf("cgroup sweep %s: %w", id, err))
			continue
		}
		var rmErr error
		for _, d := range uniqueDirs(paths) {
			rmErr = errors.Join(rmErr, removeTree(d))
		}
		if rmErr != nil {
			errs = append(errs, fmt.Errorf("cgroup sweep %s: %w", id, rmErr))
			continue
		}
		log.Info("removed orphan sandbox cgroup", "execution_id", id, "paths", uniqueDirs(paths))
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// removeTree rmdirs a cgroup and its child cgroups, deepest first. cgroupfs
// directories hold only control files, which go with the directory; rmdir
// fails (EBUSY) while any task is still inside.
func removeTree(dir string) error {
	var subs []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			subs = append(subs, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, d := range slices.Backward(subs) {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("rmdir %s: %w", d, err)
		}
	}
	return nil
}
