package volume

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Defaults and bounds of Options.
const (
	DefaultMaxBytes = 500 << 20
	DefaultMaxFiles = 10_000
	MinBytes        = 1 << 20
	MaxBytesLimit   = 1 << 40
	MinFiles        = 16
	// MaxFilesLimit: every inode costs 256 bytes of inode table in the
	// image and e2fsck time after a crash.
	MaxFilesLimit = 1 << 22
)

// Names inside a volume directory, and of the leftovers Sweep removes.
const (
	metaName       = "volume.json"
	imageName      = "volume.img"
	mntName        = "mnt"
	creatingPrefix = ".creating-"
	removingPrefix = ".removing-"
	// ballastDir is mkfs's lost+found (root-owned, 0700): the sandbox user
	// can neither enter it nor delete it, and the file API never enters a
	// directory it does not own.
	ballastDir = "lost+found"
)

// Options of a new volume.
type Options struct {
	// MaxBytes is the quota of disk blocks (file data, directories, extent
	// trees, xattrs), rounded up to 4 KiB. Zero means DefaultMaxBytes.
	MaxBytes int64
	// MaxFiles is the quota of inodes (files, directories, symlinks; not
	// hard links). Zero means DefaultMaxFiles.
	MaxFiles int64
	// UID and GID are the sandbox user's ids as the host sees them
	// (nsjail.Runner.HostUID/HostGID): the owner of the volume's root and of
	// every file and directory Put creates. Never root.
	UID, GID int
	// Preallocate reserves the image's blocks on the host disk at Create
	// (fallocate), so that many sparse volumes can never promise together
	// more than the host disk holds: a volume whose image cannot grow gets
	// I/O errors, turns read-only, and loses the writes in flight. It costs
	// MaxBytes of host disk per volume from the start.
	Preallocate bool
}

// meta is volume.json.
type meta struct {
	Format       int   `json:"format"`
	MaxBytes     int64 `json:"max_bytes"`
	MaxFiles     int64 `json:"max_files"`
	UID          int   `json:"uid"`
	GID          int   `json:"gid"`
	Preallocated bool  `json:"preallocated"`
}

const metaFormat = 1

func (o Options) meta() (meta, error) {
	m := meta{Format: metaFormat, MaxBytes: o.MaxBytes, MaxFiles: o.MaxFiles, UID: o.UID, GID: o.GID, Preallocated: o.Preallocate}
	if m.MaxBytes == 0 {
		m.MaxBytes = DefaultMaxBytes
	}
	if m.MaxFiles == 0 {
		m.MaxFiles = DefaultMaxFiles
	}
	var errs []error
	if m.MaxBytes < MinBytes || m.MaxBytes > MaxBytesLimit {
		errs = append(errs, fmt.Errorf("max bytes must be in [%d, %d], got: %d", MinBytes, int64(MaxBytesLimit), m.MaxBytes))
	}
	if m.MaxFiles < MinFiles || m.MaxFiles > MaxFilesLimit {
		errs = append(errs, fmt.Errorf("max files must be in [%d, %d], got: %d", MinFiles, MaxFilesLimit, m.MaxFiles))
	}
	if m.UID <= 0 || m.GID <= 0 {
		errs = append(errs, fmt.Errorf("uid and gid must be the sandbox user's host ids (> 0), got: %d:%d", m.UID, m.GID))
	}
	m.MaxBytes = roundUp(m.MaxBytes, blockSize)
	return m, errors.Join(errs...)
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// Volume is one mounted session workspace.
type Volume struct {
	dir string
	m   meta
}

// Dir is the volume's directory, as given to Create or Open.
func (v *Volume) Dir() string { return v.dir }

// Path is the mounted filesystem: bind it into the sandbox at /workspace.
func (v *Volume) Path() string { return filepath.Join(v.dir, mntName) }

// Usage is what a volume holds, against its quota.
type Usage struct {
	Bytes, Files       int64
	MaxBytes, MaxFiles int64
}

// Usage reads the filesystem's counters (statfs): what an empty volume
// offers (its quota) minus what it offers now. ErrNotMounted if it is not.
func (v *Volume) Usage() (Usage, error) {
	st, err := v.statfs()
	if err != nil {
		return Usage{}, err
	}
	u := Usage{MaxBytes: v.m.MaxBytes, MaxFiles: v.m.MaxFiles,
		Bytes: v.m.MaxBytes - int64(st.Bavail)*st.Bsize, Files: v.m.MaxFiles - int64(st.Ffree)}
	// After e2fsck recreated a lost+found, say, the volume offers a little
	// less than its quota; it never reports negative usage.
	u.Bytes, u.Files = max(u.Bytes, 0), max(u.Files, 0)
	return u, nil
}

// ErrNotMounted: the volume was closed, or its mount is gone.
var ErrNotMounted = errors.New("volume is not mounted")

func (v *Volume) statfs() (*unix.Statfs_t, error) {
	// Without its mount, the directory would report the host filesystem.
	if ok, err := isMountRoot(v.Path()); err != nil || !ok {
		return nil, errors.Join(fmt.Errorf("volume %s: %w", v.dir, ErrNotMounted), err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(v.Path(), &st); err != nil {
		return nil, fmt.Errorf("volume %s: statfs: %w", v.dir, err)
	}
	return &st, nil
}

// Create makes a new volume in dir, which must not exist (fs.ErrExist),
// mounts it and returns it. Every directory above dir must be searchable by
// the sandbox's mapped root (o+x), which binds Path by name, as for
// work_root. Everything is built under a temporary name next
// to dir and renamed into place only when complete and mounted.
func Create(dir string, opts Options) (v *Volume, err error) {
	m, err := opts.meta()
	if err != nil {
		return nil, fmt.Errorf("create volume: %w", err)
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("create volume: dir must be absolute, got: %q", dir)
	}
	dir = filepath.Clean(dir)
	parent, base := filepath.Split(dir)
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return nil, fmt.Errorf("create volume: %w", err)
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil, fmt.Errorf("create volume %s: %w", dir, fs.ErrExist)
	}
	tmp, err := os.MkdirTemp(parent, creatingPrefix+base+"-")
	if err != nil {
		return nil, fmt.Errorf("create volume: %w", err)
	}
	lock, err := lockDir(tmp, true)
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("create volume: %w", err)
	}
	defer lock.Close()
	defer func() {
		if err != nil {
			if cerr := destroy(tmp); cerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up %s: %w", tmp, cerr))
			}
		}
	}()
	// 0711: the sandbox's mapped root binds mnt by path, so it must be able
	// to search this directory; it can neither list it nor read the image.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, fmt.Errorf("create volume: %w", err)
	}
	if err := build(tmp, m); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", dir, err)
	}
	if err := writeMeta(tmp, m); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", dir, err)
	}
	crashPoint("create", tmp)
	// NOREPLACE: of two Creates of one dir, exactly one wins.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = fs.ErrExist
		}
		return nil, fmt.Errorf("create volume %s: %w", dir, err)
	}
	if err := SyncDir(parent); err != nil {
		// It is in place and mounted: a caller that retries would find it
		// exists, so hand it over rather than half-remove it.
		slog.Warn("volume created but its directory entry may not survive a host crash", "dir", dir, "err", err)
	}
	return &Volume{dir: dir, m: m}, nil
}

// build makes, mounts and sizes the image in the directory tmp.
func build(tmp string, m meta) error {
	image, mnt := filepath.Join(tmp, imageName), filepath.Join(tmp, mntName)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	size := imageSize(m)
	// imageSize errs on the generous side; should ext4 still keep more for
	// itself than it allows for, try again bigger.
	for attempt := 0; ; attempt++ {
		if err := makeImage(image, size, m); err != nil {
			return err
		}
		if err := attachAndMount(image, mnt, m.Preallocated); err != nil {
			return err
		}
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			return err
		}
		if int64(st.Ffree) < m.MaxFiles+1 {
			return fmt.Errorf("mkfs.ext4 made %d inodes, want %d", st.Ffree, m.MaxFiles+1)
		}
		short := (m.MaxBytes/blockSize - int64(st.Bavail)) * blockSize
		if short <= 0 {
			break
		}
		if err := unmount(mnt); err != nil {
			return err
		}
		if err := os.Remove(image); err != nil {
			return err
		}
		if attempt == 3 {
			return fmt.Errorf("ext4 keeps more than expected: image of %d bytes is %d short", size, short)
		}
		size += 2*short + 1<<20
	}
	if err := addBallast(mnt, m); err != nil {
		return fmt.Errorf("ballast: %w", err)
	}
	if err := os.Chmod(mnt, 0o700); err != nil {
		return err
	}
	return syncFS(mnt)
}

// Open attaches to the volume in dir: if it is still mounted (the worker
// restarted), it reuses the mount; otherwise it checks the image (e2fsck -p:
// after a host crash it is marked not clean) and mounts it. A directory
// without volume.json (never created, or a leftover) is fs.ErrNotExist.
func Open(dir string) (*Volume, error) {
	dir = filepath.Clean(dir)
	lock, err := lockDir(dir, true)
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", dir, err)
	}
	defer lock.Close()
	// Read under the lock: a Remove that held it has renamed dir away.
	m, err := readMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", dir, err)
	}
	if err := ensureMounted(dir, m); err != nil {
		return nil, fmt.Errorf("open volume %s: %w", dir, err)
	}
	return &Volume{dir: dir, m: m}, nil
}

func ensureMounted(dir string, m meta) error {
	image, mnt := filepath.Join(dir, imageName), filepath.Join(dir, mntName)
	loopDev, attached, err := loopOf(image)
	if err != nil {
		return err
	}
	mntDev, mounted, err := mountedDevice(mnt)
	if err != nil {
		return err
	}
	switch {
	case attached && mounted && loopDev == mntDev:
		return nil
	case attached:
		// Mounting it again through a second loop device would corrupt it.
		return fmt.Errorf("its image is attached to loop device %d:%d but that is not mounted on %s (a lazily unmounted volume still in use?)",
			unix.Major(loopDev), unix.Minor(loopDev), mnt)
	case mounted:
		return fmt.Errorf("something else is mounted on %s", mnt)
	}
	if err := fsck(image); err != nil {
		return err
	}
	return attachAndMount(image, mnt, m.Preallocated)
}

// Close unmounts the volume; its files stay in the image for Open. It is
// idempotent. Close only when no sandbox has the volume bound: a sandbox's
// bind keeps the filesystem, and so its loop device, alive after the
// unmount, and Open refuses to mount an image that is still attached
// until that sandbox is gone.
func (v *Volume) Close() error {
	lock, err := lockDir(v.dir, true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed
	}
	if err != nil {
		return fmt.Errorf("close volume %s: %w", v.dir, err)
	}
	defer lock.Close()
	if err := unmount(v.Path()); err != nil {
		return fmt.Errorf("close volume %s: %w", v.dir, err)
	}
	return nil
}

// MoveParentTo renames from, the directory that holds the volume's
// directory (v.Dir()'s parent: else an error, nothing renamed; the caller
// says which directory it means to move, as it owns it), to dir, the
// volume and its mount with it (a mount
// moves with the directory it is in), and returns the volume there, in
// dir under its old base name; v must not be used after. dir must not
// exist (fs.ErrExist: RENAME_NOREPLACE) and must be on the same
// filesystem. The session manager keeps spare volumes made ahead of time,
// each in a directory of its own, and renames one into a new session's
// directory, so that a session's creation does not wait for mkfs (one
// rename: no mkdir of the session's directory nor rmdir of the spare's on
// the request path). Call it only while no sandbox has the volume bound:
// a sandbox binds Path by name.
//
// The rename survives the process's death at once (the page cache), a
// host crash only once the caller has synced dir's parent (SyncDir): the
// session manager syncs it with the rest of a new session, off the
// request path. A rename is one atomic change of both directories (one
// journal transaction): the old parent needs no fsync of its own for the
// volume never to show in both places.
func (v *Volume) MoveParentTo(from, dir string) (*Volume, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("move volume: dir must be absolute, got: %q", dir)
	}
	dir = filepath.Clean(dir)
	parent := filepath.Dir(v.dir)
	if filepath.Clean(from) != parent {
		return nil, fmt.Errorf("move volume %s: %q does not hold it", v.dir, from)
	}
	lock, err := lockDir(v.dir, true)
	if err != nil {
		return nil, fmt.Errorf("move volume %s: %w", v.dir, err)
	}
	defer lock.Close()
	if err := unix.Renameat2(unix.AT_FDCWD, parent, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = fs.ErrExist
		}
		return nil, fmt.Errorf("move volume %s to %s: %w", v.dir, dir, err)
	}
	return &Volume{dir: filepath.Join(dir, filepath.Base(v.dir)), m: v.m}, nil
}

// Remove unmounts the volume and deletes it, files and all. It is
// idempotent.
func (v *Volume) Remove() error { return Remove(v.dir) }

// Remove deletes the volume in dir, mounted or not: it first renames dir
// away, so a Remove cut short leaves a leftover for Sweep, never a volume
// that Open would resurrect half-deleted.
func Remove(dir string) error {
	dir = filepath.Clean(dir)
	lock, err := lockDir(dir, true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove volume %s: %w", dir, err)
	}
	defer lock.Close()
	parent, base := filepath.Split(dir)
	trash := filepath.Join(parent, removingPrefix+base+"-"+RandomHex(6))
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove volume %s: %w", dir, err)
	}
	crashPoint("remove", trash)
	if err := destroy(trash); err != nil {
		return fmt.Errorf("remove volume %s: %w", dir, err)
	}
	return nil
}

// Sweep removes what interrupted Creates and Removes left under root (their
// images unmounted first) and returns the names of the complete volumes
// there, for the caller to Open or Remove. Run it at start-up: a Create in
// progress in this or another process is skipped (it holds its lock), but
// one that has not yet taken its lock would be swept.
func Sweep(root string) (volumes []string, err error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep volumes in %s: %w", root, err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(root, e.Name())
		if strings.HasPrefix(e.Name(), creatingPrefix) || strings.HasPrefix(e.Name(), removingPrefix) {
			lock, err := lockDir(p, false)
			if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err == nil {
				err = destroy(p)
				lock.Close()
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("sweep %s: %w", p, err))
			}
			continue
		}
		if _, err := os.Lstat(filepath.Join(p, metaName)); err == nil && e.IsDir() {
			volumes = append(volumes, e.Name())
		}
	}
	return volumes, errors.Join(errs...)
}

// destroy unmounts d/mnt and deletes the entries a volume directory holds.
// Never RemoveAll: were the unmount to fail, it would delete the session's
// files through the mount.
func destroy(d string) error {
	if err := unmount(filepath.Join(d, mntName)); err != nil {
		return err
	}
	for _, name := range []string{imageName, metaName, mntName} {
		if err := os.Remove(filepath.Join(d, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return os.Remove(d)
}

func writeMeta(dir string, m meta) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, metaName), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(data, '\n'))
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close(), SyncDir(dir))
}

func readMeta(dir string) (meta, error) {
	var m meta
	data, err := os.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("%s: %w", metaName, err)
	}
	if m.Format != metaFormat {
		return m, fmt.Errorf("%s: format %d, want %d", metaName, m.Format, metaFormat)
	}
	if _, err := (Options{MaxBytes: m.MaxBytes, MaxFiles: m.MaxFiles, UID: m.UID, GID: m.GID}).meta(); err != nil {
		return m, fmt.Errorf("%s: %w", metaName, err)
	}
	return m, nil
}

// lockDir takes an exclusive flock on dir, waiting for it or not.
func lockDir(dir string, wait bool) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// SyncDir makes dir's entries durable (fsync of the directory): a file
// created, renamed or removed in it survives a host crash. The session
// manager's record writes use it too.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// crashPoint lets tests kill the process where a crash would hurt most.
var crashPoint = func(stage, dir string) {}

// RandomHex is n random bytes in hex: the unique part of a temporary
// name (and of a generated session id).
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// tool finds an e2fsprogs command: on PATH, else in /usr/sbin or /sbin,
// which a service's PATH may lack.
func tool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p
		}
	}
	return name
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// fsck runs e2fsck -p (preen) on an image that is not mounted: a no-op for
// a clean one; after a host crash it makes the safe repairs, and anything
// worse is an error rather than a mount of a damaged filesystem.
func fsck(image string) error {
	out, err := exec.Command(tool("e2fsck"), "-p", image).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.ExitCode() < 4:
		// 1: errors corrected; 2: likewise, "reboot" (meant for a root fs).
		slog.Warn("volume image repaired by e2fsck", "image", image, "exit", exit.ExitCode(), "output", string(out))
		return nil
	default:
		return fmt.Errorf("e2fsck -p %s: %w: %s", image, err, strings.TrimSpace(string(out)))
	}
}
