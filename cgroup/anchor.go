package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// The v1 freezer's cost is not the freezing: since Linux 6.1 every task's
// freezing() check sits behind a global static key (freezer_active) that
// counts the freezer cgroups in a FREEZING or FROZEN state, and the key's
// 0 → 1 and 1 → 0 changes patch the kernel's text, with IPIs to every
// CPU. With one session kernel frozen between executions and nothing else
// frozen on the host, each thaw and each freeze was such a change: 1.5 ms
// each on this 2-core VM (kernel 6.18), 30-60× the write itself (measured
// with an empty frozen cgroup beside it: 0.05 ms freeze, 0.02 ms thaw).
//
// So a sandbox that may be frozen holds an anchor: an empty cgroup,
// frozen, beside the sandboxes in the freezer hierarchy (<own>/<parent>/
// _freezer-anchor: not a valid sandbox id, so never a sandbox's cgroup),
// made when the first such sandbox freezes (or the worker opens its
// sessions: Hierarchy.AcquireFreezerAnchor) and removed when the last
// holder lets go. Only an anchor this process made is used: one that
// exists already (a killed worker's) is not adopted but left to the
// start-up sweep, which removes it (the machine's rule: never write to a
// cgroup we did not create). While it exists the key stays on, and a
// kernel's thaw and freeze change only its own cgroup. It holds no task
// and limits nothing; v2's freezer (cgroup.freeze) does not use the key,
// so there is no anchor on v2.
const anchorName = "_freezer-anchor"

// anchors counts, per anchor directory, the sandboxes of this process that
// hold it.
var anchors = struct {
	sync.Mutex
	held map[string]int
}{held: map[string]int{}}

// AcquireFreezerAnchor takes a hold on the freezer anchor beside the
// sandbox whose cgroups are paths, creating and freezing it for the first
// hold. It returns the release to call once the sandbox is gone, and a
// no-op one (and no error) on v2 or without a freezer hierarchy. An error
// leaves nothing held: the anchor only saves time, the caller may go on.
func AcquireFreezerAnchor(paths Paths) (release func() error, err error) {
	dir := anchorDir(paths)
	if dir == "" {
		return acquireAnchor("")
	}
	// The key counts frozen cgroups host-wide, so any anchor keeps it on:
	// while this process holds one (the server holds its own from
	// start-up), a sandbox takes a hold on that one instead of making
	// another beside itself (a template fork's cgroup is a level deeper,
	// under its template's).
	anchors.Lock()
	for held := range anchors.held {
		dir = held
		break
	}
	anchors.Unlock()
	return acquireAnchor(dir)
}

// AcquireFreezerAnchor takes a hold on the freezer anchor under the
// sandboxes' parent without a sandbox: for a caller that will freeze
// sandboxes under it for a while (the warm pool, which hands out session
// kernels), so that even the first freeze of each flips nothing.
func (h *Hierarchy) AcquireFreezerAnchor(parent string) (release func() error, err error) {
	if h.Mode.V2() {
		return acquireAnchor("")
	}
	dirs, err := h.ParentDirs(parent)
	if err != nil {
		return nil, err
	}
	if dirs["freezer"] == "" {
		return acquireAnchor("")
	}
	if err := os.MkdirAll(dirs["freezer"], 0o755); err != nil {
		return nil, fmt.Errorf("cgroup freezer anchor: %w", err)
	}
	return acquireAnchor(filepath.Join(dirs["freezer"], anchorName))
}

func acquireAnchor(dir string) (release func() error, err error) {
	if dir == "" {
		return func() error { return nil }, nil
	}
	anchors.Lock()
	defer anchors.Unlock()
	if anchors.held[dir] == 0 {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup freezer anchor (one left by a killed worker goes with the next start-up sweep): %w", err)
		}
		// An empty cgroup is FROZEN as soon as it is asked to be.
		if err := writeFile(filepath.Join(dir, "freezer.state"), "FROZEN"); err != nil {
			unix.Rmdir(dir)
			return nil, fmt.Errorf("cgroup freezer anchor: %w", err)
		}
	}
	anchors.held[dir]++
	var once sync.Once
	return func() (err error) {
		once.Do(func() { err = releaseAnchor(dir) })
		return err
	}, nil
}

func releaseAnchor(dir string) error {
	anchors.Lock()
	defer anchors.Unlock()
	anchors.held[dir]--
	if anchors.held[dir] > 0 {
		return nil
	}
	delete(anchors.held, dir)
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroup freezer anchor: rmdir %s: %w", dir, err)
	}
	return nil
}

// removeIdleAnchor removes the anchor under the sandboxes' parent freezer
// directory when this process holds none there: one a killed worker left.
// rmdir of an empty cgroup works frozen or not.
func removeIdleAnchor(parentDir string) error {
	if parentDir == "" {
		return nil
	}
	dir := filepath.Join(parentDir, anchorName)
	anchors.Lock()
	defer anchors.Unlock()
	if anchors.held[dir] > 0 {
		return nil
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroup freezer anchor: rmdir %s: %w", dir, err)
	}
	return nil
}

// anchorDir is the anchor beside the sandbox whose cgroups are paths, or
// "" when there is none to make (v2, no freezer hierarchy).
func anchorDir(paths Paths) string {
	if _, ok := paths.V2(); ok {
		return ""
	}
	dir := paths["freezer"]
	if dir == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(dir), anchorName)
}
