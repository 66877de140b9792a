package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ListenUnix listens on a unix socket at path, owned by group (a name or a
// gid; empty keeps the worker's) with mode. No client ever finds it with the
// wrong permissions, and nobody can turn its set-up against another file: it
// is bound in a fresh private directory (0700, beside path), given its group
// and mode there, then renamed into place (RENAME_NOREPLACE). Binding,
// chmod and chown under a predictable name in a directory others can write
// would be a symlink race (TOCTOU): swap the new socket for a symlink
// between bind and chmod, and root chmods (and chowns) any file the symlink
// names, e.g. /etc/shadow to 0660; clients could also connect before the
// chmod. In the private directory only root can replace the socket, and
// path's directory itself must not be writable by others unless sticky
// (then nobody else can rename or remove what is ours in it). SECURITY.md
// case 32.
//
// A stale socket left at path by a killed worker is removed first; anything
// else there (a regular file, a directory, a socket someone still listens
// on) is an error and is left alone. Closing the listener removes the
// socket, if it is still ours.
func ListenUnix(path, group string, mode os.FileMode) (net.Listener, error) {
	gid, err := lookupGroup(group)
	if err != nil {
		return nil, fmt.Errorf("worker_socket_group: %w", err)
	}
	parent := filepath.Dir(path)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	if err := checkSocketDir(parent); err != nil {
		return nil, fmt.Errorf("worker_socket %s: %w", path, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	private, err := os.MkdirTemp(parent, ".sandboxd-sock-")
	if err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	defer os.RemoveAll(private) // empty once the socket is renamed out
	dir, err := os.Open(private)
	if err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	const name = "s"
	// Through the directory's fd: short whatever path's length (sun_path is
	// 108 bytes), and the very directory just created.
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", dfd, name))
	if err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	ul := ln.(*net.UnixListener)
	// Close removes the socket under its final name (unixListener.Close).
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		return nil, fmt.Errorf("worker_socket %s: %w", path, err)
	}
	if err := unix.Fchownat(dfd, name, -1, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(err)
	}
	// Fchmodat follows symlinks, but only root can write the private
	// directory: name is the socket.
	if err := unix.Fchmodat(dfd, name, uint32(mode.Perm()), 0); err != nil {
		return fail(err)
	}
	// RENAME_NOREPLACE: whatever appeared at path meanwhile is not replaced.
	if err := unix.Renameat2(dfd, name, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ul, path: path, dev: st.Dev, ino: st.Ino}, nil
}

// checkSocketDir refuses a socket directory in which someone other than
// root or the worker could replace the socket or its name (the symlink race
// ListenUnix describes): owned by another user, or writable by group or
// others without the sticky bit.
func checkSocketDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("its directory %s is owned by uid %d, who could replace the socket: use a directory of root's", dir, st.Uid)
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("its directory %s (mode %#o) is writable by group or others without the sticky bit, who could replace the socket: use a directory only root can write", dir, st.Mode&0o7777)
	}
	return nil
}

// lookupGroup returns the gid of a group name or number; -1 for "".
func lookupGroup(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(group); err == nil {
		if gid < 0 {
			return 0, fmt.Errorf("gid must be >= 0, got: %d", gid)
		}
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// removeStaleSocket removes path if it is a socket nobody listens on. A
// missing path is fine; any other file, or a live socket, is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%v): not removing it", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: another process is serving on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: cannot tell whether it is stale: %w", path, err)
	}
	return os.Remove(path)
}

// unixListener removes its socket on Close, unless the file at path is no
// longer the one it created.
type unixListener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
}

// Addr is the socket's final name (it was bound under the temporary one).
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	var st unix.Stat_t
	if unix.Lstat(l.path, &st) == nil && st.Dev == l.dev && st.Ino == l.ino {
		if rmErr := os.Remove(l.path); rmErr != nil && err == nil {
			err = rmErr
		}
	}
	return err
}
