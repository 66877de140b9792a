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

	"github.com/sandboxd/sandboxd/server/config"
	"golang.org/x/sys/unix"
)

// ListenUnix listens on a unix socket at path, owned by group (a name or a
// gid; empty keeps the worker's) with mode. The socket is bound under a
// temporary name, given its group and mode, then renamed into place, so no
// client ever finds it with the wrong permissions. A stale socket left at
// path by a killed worker is removed first; anything else there (a regular
// file, a directory, a socket someone still listens on) is an error and is
// left alone. Closing the listener removes the socket, if it is still ours.
func ListenUnix(path, group string, mode os.FileMode) (net.Listener, error) {
	gid, err := lookupGroup(group)
	if err != nil {
		return nil, fmt.Errorf("worker_socket_group: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	tmp := path + config.SocketTmpSuffix
	for _, p := range []string{path, tmp} {
		if err := removeStaleSocket(p); err != nil {
			return nil, fmt.Errorf("worker_socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("worker_socket: %w", err)
	}
	ul := ln.(*net.UnixListener)
	// Close removes the socket under its final name (unixListener.Close).
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("worker_socket %s: %w", path, err)
	}
	if err := os.Lchown(tmp, -1, gid); err != nil {
		return fail(err)
	}
	if err := os.Chmod(tmp, mode.Perm()); err != nil {
		return fail(err)
	}
	// RENAME_NOREPLACE: whatever appeared at path meanwhile is not replaced.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ul, path: path, dev: st.Dev, ino: st.Ino}, nil
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
