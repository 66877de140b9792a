package volume

// The file API: the worker (root) reads and writes a tree that untrusted
// code writes at the same time. SECURITY.md case 38: every path is checked
// (CheckPath), then resolved one component at a time from directory fds,
// never following a symlink (openat2 RESOLVE_NO_SYMLINKS, O_NOFOLLOW) nor
// leaving the volume (RESOLVE_BENEATH, RESOLVE_NO_XDEV); only directories and
// regular files the sandbox user owns are entered, read, replaced or
// deleted; files are opened O_NONBLOCK and checked with fstat on the opened
// fd, so a FIFO, socket or device swapped in at any moment is refused, never
// opened for real and never waited on.

import (
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// DefaultListLimit is List's limit when it is given none (limit <= 0).
const DefaultListLimit = 1000

// MaxListExamined bounds the directory entries one List looks at: a million
// hard links or empty names cost a bounded walk.
const MaxListExamined = 100_000

// putTempPrefix names the instant between linking an upload into its
// directory and renaming it over its final name.
const putTempPrefix = ".sandboxd-put-"

// openat2 opens name, a single component, under dirfd.
func openat2(dirfd int, name string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolveFlags}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		// EAGAIN: a concurrent rename or mount; try again.
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && i < 8 {
			continue
		}
		return fd, err
	}
}

// fileError maps an errno met at p to the package's typed errors, keeping
// both in the chain.
func fileError(p string, err error) error {
	var kind error
	switch {
	case errors.Is(err, unix.ENOENT):
		kind = ErrNotFound
	case errors.Is(err, unix.ELOOP):
		kind = fmt.Errorf("%w (a symlink)", ErrNotRegular)
	case errors.Is(err, unix.ENOTDIR):
		kind = fmt.Errorf("%w (a file where a directory is needed)", ErrNotRegular)
	case errors.Is(err, unix.EISDIR):
		kind = fmt.Errorf("%w (a directory)", ErrNotRegular)
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENXIO):
		kind = ErrNotRegular
	case errors.Is(err, unix.ENAMETOOLONG):
		kind = ErrNameTooLong
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EFBIG):
		kind = ErrQuota
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
		kind = ErrNotEmpty
	default:
		return fmt.Errorf("%s: %w", p, err)
	}
	return fmt.Errorf("%s: %w: %w", p, kind, err)
}

// check refuses what the file API does not touch: anything not owned by the
// sandbox user is invisible (ErrNotFound: the ballast, root's), anything but
// a regular file (or, with dirOK, a directory) is ErrNotRegular.
func (v *Volume) check(p string, st *unix.Stat_t, dirOK bool) error {
	var what string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		if !dirOK {
			what = "a directory"
		}
	case unix.S_IFLNK:
		what = "a symlink"
	case unix.S_IFIFO:
		what = "a FIFO"
	case unix.S_IFSOCK:
		what = "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		what = "a device"
	default:
		what = "of unknown type"
	}
	if what != "" {
		return fmt.Errorf("%s: %w (%s)", p, ErrNotRegular, what)
	}
	if int(st.Uid) != v.m.UID {
		return fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	return nil
}

// openRoot opens the volume's root directory, and makes sure it is the
// mounted volume, not the empty mount point under it.
func (v *Volume) openRoot() (int, error) {
	fd, err := unix.Open(v.Path(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("volume %s: %w", v.dir, err)
	}
	var stx unix.Statx_t
	err = unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE, &stx)
	if err == nil && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		err = ErrNotMounted
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("volume %s: %w", v.dir, err)
	}
	return fd, nil
}

// madeDir is a directory Put created, to remove again if the Put fails.
type madeDir struct {
	parent int
	name   string
}

// openDir opens dir (a checked path; "" is the root) under root, one
// component at a time. With create, missing directories are made, owned by
// the sandbox user, and returned in made (each holding its parent's fd: the
// caller must call undoDirs).
func (v *Volume) openDir(root int, dir string, create bool) (fd int, made []madeDir, err error) {
	cur, err := unix.Dup(root)
	if err != nil || dir == "" {
		return cur, nil, err
	}
	parts := strings.Split(dir, "/")
	for i, c := range parts {
		at := strings.Join(parts[:i+1], "/")
		next, err := openat2(cur, c, unix.O_RDONLY|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) && create {
			next, made, err = v.mkdirAt(cur, c, made)
		}
		if err != nil {
			unix.Close(cur)
			return -1, made, fileError(at, err)
		}
		unix.Close(cur)
		cur = next
		var st unix.Stat_t
		if err = unix.Fstat(cur, &st); err == nil {
			err = v.check(at, &st, true)
		}
		if err != nil {
			unix.Close(cur)
			return -1, made, err
		}
	}
	return cur, made, nil
}

// mkdirAt makes the directory name under parent for Put and opens it.
func (v *Volume) mkdirAt(parent int, name string, made []madeDir) (int, []madeDir, error) {
	err := unix.Mkdirat(parent, name, 0o700)
	if errors.Is(err, unix.EEXIST) { // made meanwhile, by the sandbox or another Put
		fd, err := openat2(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
		return fd, made, err
	}
	if err != nil {
		return -1, made, err
	}
	dup, err := unix.Dup(parent)
	if err != nil {
		unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		return -1, made, err
	}
	made = append(made, madeDir{dup, name})
	fd, err := openat2(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, made, err
	}
	// Made as root 0700, handed over through the fd: never a chown by
	// path, which a swapped symlink could redirect.
	if err := errors.Join(unix.Fchown(fd, v.m.UID, v.m.GID), unix.Fchmod(fd, 0o755)); err != nil {
		unix.Close(fd)
		return -1, made, err
	}
	return fd, made, nil
}

// undoDirs removes, innermost first, the directories Put made (if they are
// still empty) and closes the parents' fds.
func undoDirs(made []madeDir, remove bool) {
	for i := len(made) - 1; i >= 0; i-- {
		if remove {
			unix.Unlinkat(made[i].parent, made[i].name, unix.AT_REMOVEDIR)
		}
		unix.Close(made[i].parent)
	}
}

func splitPath(p string) (dir, base string) {
	dir, base = path.Split(p)
	return strings.TrimSuffix(dir, "/"), base
}

// Put writes r to p, replacing a regular file there, creating the missing
// parent directories, and returns the size and hex SHA-256 written. The
// data streams into an unnamed file (O_TMPFILE) in p's directory, is
// fsynced, then linked and renamed into place: no partial file is ever
// visible, and an upload cut short (a quota hit, a client gone, a worker
// killed) leaves nothing behind. Over the quota (bytes or files) it returns
// ErrQuota and the volume's usage is as before. The file belongs to the
// sandbox user, mode 0644.
func (v *Volume) Put(p string, r io.Reader) (size int64, sum string, err error) {
	if err := CheckPath(p); err != nil {
		return 0, "", err
	}
	root, err := v.openRoot()
	if err != nil {
		return 0, "", err
	}
	defer unix.Close(root)
	dirPath, base := splitPath(p)
	dir, made, err := v.openDir(root, dirPath, true)
	defer func() { undoDirs(made, err != nil) }()
	if err != nil {
		return 0, "", err
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	switch err := unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if err := v.check(p, &st, false); err != nil {
			return 0, "", err
		}
	case !errors.Is(err, unix.ENOENT):
		return 0, "", fileError(p, err)
	}
	fd, err := unix.Openat(dir, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, "", fileError(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := errors.Join(unix.Fchown(fd, v.m.UID, v.m.GID), unix.Fchmod(fd, 0o644)); err != nil {
		return 0, "", fileError(p, err)
	}
	h := sha256.New()
	w := &recordingWriter{w: f}
	size, err = io.CopyBuffer(io.MultiWriter(w, h), r, make([]byte, 256<<10))
	if err != nil {
		if w.err != nil {
			return 0, "", fileError(p, w.err)
		}
		return 0, "", fmt.Errorf("%s: read upload: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		return 0, "", fileError(p, err)
	}
	tmp := putTempPrefix + RandomHex(6)
	if err := linkTmpfile(fd, dir, tmp); err != nil {
		return 0, "", fileError(p, err)
	}
	if err := unix.Renameat(dir, tmp, dir, base); err != nil {
		unix.Unlinkat(dir, tmp, 0)
		return 0, "", fileError(p, err)
	}
	if err := unix.Fsync(dir); err != nil {
		return 0, "", fileError(p, err)
	}
	return size, hex.EncodeToString(h.Sum(nil)), nil
}

// linkTmpfile gives the O_TMPFILE fd a name in dir: AT_EMPTY_PATH needs
// CAP_DAC_READ_SEARCH, which the worker has; /proc/self/fd otherwise.
func linkTmpfile(fd, dir int, name string) error {
	err := unix.Linkat(fd, "", dir, name, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
		err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), dir, name, unix.AT_SYMLINK_FOLLOW)
	}
	return err
}

// recordingWriter remembers the writer's error, to tell a full volume from
// a client that went away.
type recordingWriter struct {
	w   io.Writer
	err error
}

func (r *recordingWriter) Write(p []byte) (int, error) {
	n, err := r.w.Write(p)
	if err != nil {
		r.err = err
	}
	return n, err
}

// OpenFile opens the regular file p for reading, never following a link and
// never blocking (a FIFO, socket or device is ErrNotRegular, refused before
// any open that could have an effect). The caller closes the file; with
// its FileInfo, http.ServeContent serves Range and conditional requests.
func (v *Volume) OpenFile(p string) (*os.File, fs.FileInfo, error) {
	if err := CheckPath(p); err != nil {
		return nil, nil, err
	}
	root, err := v.openRoot()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(root)
	dirPath, base := splitPath(p)
	dir, _, err := v.openDir(root, dirPath, false)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(dir)
	// O_PATH first: it opens the entry itself, whatever it is, with no
	// effect (no FIFO handshake, no device open), for the type check.
	pfd, err := openat2(dir, base, unix.O_PATH)
	if err != nil {
		return nil, nil, fileError(p, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return nil, nil, fileError(p, err)
	}
	if err := v.check(p, &st, false); err != nil {
		return nil, nil, err
	}
	// The entry may be swapped between the two opens: O_NONBLOCK keeps a
	// FIFO from blocking, and the fstat of this fd is what counts.
	fd, err := openat2(dir, base, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, nil, fileError(p, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, fileError(p, err)
	}
	if err := v.check(p, &st, false); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fileError(p, err)
	}
	return f, fi, nil
}

// SHA256 is the hex SHA-256 of f's content (the ETag of a GET), read with
// pread: f's offset does not move.
func SHA256(f *os.File) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(h, io.NewSectionReader(f, 0, fi.Size()), make([]byte, 256<<10)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Delete removes the regular file p, or the empty directory p
// (ErrNotEmpty otherwise). Anything else is ErrNotRegular.
func (v *Volume) Delete(p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	root, err := v.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dirPath, base := splitPath(p)
	dir, _, err := v.openDir(root, dirPath, false)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fileError(p, err)
	}
	if err := v.check(p, &st, true); err != nil {
		return err
	}
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	// Swapped since the fstatat, the entry is removed, never followed.
	if err := unix.Unlinkat(dir, base, flags); err != nil {
		return fileError(p, err)
	}
	if err := unix.Fsync(dir); err != nil {
		return fileError(p, err)
	}
	return nil
}

// Entry is one regular file in a listing.
type Entry struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mtime"`
}

// List returns the regular files whose path starts with prefix ("" for
// all; "data/" for everything under data; "data/re" for what under data
// starts with re), sorted by name: the first limit of them by name
// (DefaultListLimit when limit <= 0), whatever order the directories give.
// It walks without following links, at most MaxDepth deep and
// MaxListExamined entries far, keeping only the limit first names seen;
// truncated says that files were left out (more than limit matched, or the
// walk stopped at MaxListExamined: then the first by name among those
// examined). A prefix naming nothing lists nothing. Symlinks, FIFOs,
// sockets, devices and what the sandbox user does not own are left out.
func (v *Volume) List(prefix string, limit int) (entries []Entry, truncated bool, err error) {
	dirPath, err := splitPrefix(prefix)
	if err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	root, err := v.openRoot()
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(root)
	dir, _, err := v.openDir(root, dirPath, false)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRegular) {
		return []Entry{}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	l := &lister{v: v, prefix: prefix, limit: limit, budget: MaxListExamined, out: entryHeap{}}
	depth := 0
	if dirPath != "" {
		depth = strings.Count(dirPath, "/") + 1
	}
	err = l.walk(dir, dirPath, depth)
	out := []Entry(l.out)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, l.truncated, err
}

type lister struct {
	v         *Volume
	prefix    string
	limit     int
	budget    int
	out       entryHeap // the limit first names seen
	truncated bool
}

// add keeps e if it is among the limit first names seen.
func (l *lister) add(e Entry) {
	switch {
	case len(l.out) < l.limit:
		heap.Push(&l.out, e)
		return
	case e.Name < l.out[0].Name:
		l.out[0] = e
		heap.Fix(&l.out, 0)
	}
	l.truncated = true
}

// entryHeap is a max-heap by name: its root is the last name kept.
type entryHeap []Entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].Name > h[j].Name }
func (h entryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *entryHeap) Push(x any)        { *h = append(*h, x.(Entry)) }
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// walk lists the directory fd (which it closes), whose path is rel and
// which is depth components deep.
func (l *lister) walk(fd int, rel string, depth int) error {
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	for {
		names, err := d.Readdirnames(256)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", rel, err)
		}
		for _, name := range names {
			if l.budget == 0 {
				l.truncated = true
				return nil
			}
			l.budget--
			full := name
			if rel != "" {
				full = rel + "/" + name
			}
			if !strings.HasPrefix(full, l.prefix) {
				continue
			}
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || l.v.check(full, &st, true) != nil {
				continue // gone meanwhile, not the user's, or not a file or directory
			}
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				l.add(Entry{Name: full, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix()).UTC()})
				continue
			}
			if depth+1 >= MaxDepth {
				continue // its files would be deeper than any path may be
			}
			child, err := openat2(fd, name, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				continue
			}
			if err := l.walk(child, full, depth+1); err != nil {
				return err
			}
		}
	}
}

// MakeDirs makes the directory p and its missing parents, owned by the
// sandbox user (the layout a session's code expects: input/,
// output/artifacts/). Existing directories are kept as they are; anything
// else in the way is ErrNotRegular.
func (v *Volume) MakeDirs(p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	root, err := v.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dir, made, err := v.openDir(root, p, true)
	undoDirs(made, err != nil)
	if err != nil {
		return err
	}
	return unix.Close(dir)
}
