package workspace

// Every workspace, cold or warm, is its own size-limited tmpfs: a run that
// fills /workspace gets ENOSPC at workspace_bytes (SECURITY.md case 3) instead
// of filling the host disk under the work root, and everything it wrote is
// freed at once by one lazy unmount, whatever it left there (no walk over
// a million hostile entries). The pages are charged to the sandbox's memory
// cgroup while it runs.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// workspaceMountFlags: no set-id binaries and no device nodes, whatever the
// sandbox manages to create there; noexec because the code is read by the
// interpreter, never executed from /workspace.
const workspaceMountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// Mount mounts a tmpfs of o.Bytes bytes on dir, its root owned by o.UID
// and o.GID (the sandbox user as the host sees it) with mode 0700.
// o.Inodes (nr_inodes) bounds its files: without it tmpfs allows half the
// host's RAM pages, and a run creating millions of empty files fills the
// kernel's inode and dentry slabs while using no bytes (SECURITY.md case 33).
func Mount(dir string, o Options) error {
	if o.Bytes <= 0 || o.Inodes <= 0 {
		// 0 means "unlimited" to tmpfs.
		return fmt.Errorf("workspace tmpfs on %s: size and inodes must be > 0, got: %d, %d", dir, o.Bytes, o.Inodes)
	}
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", o.Bytes, o.Inodes, o.UID, o.GID)
	if err := unix.Mount("sandboxd-workspace", dir, "tmpfs", workspaceMountFlags, data); err != nil {
		return fmt.Errorf("unable to mount the workspace tmpfs on %s: %w", dir, err)
	}
	return nil
}

// isMountpoint reports whether dir is the root of a mount (its device
// differs from its parent's). A path that cannot be read is not one.
func isMountpoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Dev != parent.Dev
}

// Remove lazily unmounts whatever is mounted on dir, then removes what is
// left (an empty directory, or the whole tree when nothing was mounted).
// RemoveAll never follows a symlink. It is idempotent.
func Remove(dir string) error {
	var errs []error
	for i := 0; i < 4 && isMountpoint(dir); i++ {
		// UMOUNT_NOFOLLOW: dir is a path we created, but refuse to act on a
		// symlink anyway.
		if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			errs = append(errs, fmt.Errorf("unable to unmount workspace %s: %w", dir, err))
			break
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
