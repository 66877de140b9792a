// Package volume is a session's persistent workspace: a small ext4
// filesystem of its own, in a sparse image file, loop-mounted, whose
// mounted directory (Volume.Path) is bound into every sandbox of the
// session at /workspace. It lives on disk, independently of any sandbox: a
// Python kernel that dies, is OOM-killed or times out loses its state but
// never a file, and a worker that restarts finds the volume still mounted
// (Open reuses the mount) or mounts it again.
//
// # The quota is the filesystem's size (SECURITY.md case 37)
//
// Each volume holds at most Options.MaxBytes of blocks and Options.MaxFiles
// inodes, and it is the kernel that says no: the filesystem simply has no
// more. So the limit holds against the sandboxed code itself (which an
// API-side check could not stop), it counts what the disk really holds
// (a 10 GB sparse file costs only its written blocks; a hard link costs no
// inode and no data block, only its directory entry; directories, symlinks,
// xattrs and extent trees are blocks and inodes like any other), and the
// code gets ENOSPC while the file API gets ErrQuota. Create sizes the image
// for the requested quota plus ext4's own overhead (inode tables, bitmaps,
// and the 2% of blocks, at most 16 MiB, that ext4 withholds from every
// writer, root included), then pins whatever is left over with a root-owned
// ballast in lost+found, so that an empty volume offers exactly MaxBytes
// (rounded up to 4 KiB) and MaxFiles, and Usage reads 0/0.
//
// Alternatives, and why not:
//   - ext4 or XFS project quotas on the work root: only if the host
//     filesystem was made (ext4 -O quota,project) or mounted (XFS prjquota)
//     for them, which sandboxd cannot assume or change; and a hard link or a
//     rename across project directories muddles the accounting.
//   - tmpfs with size= and nr_inodes= (today's per-execution workspace):
//     exact and fast, but in RAM: it does not survive a worker restart or a
//     reboot, and its pages are charged to whichever memory cgroup wrote
//     them, so a session's files would count against its Python kernel's
//     memory limit.
//   - user-space accounting in the API: the code inside the sandbox writes
//     to the same directory and bypasses it.
//
// # Layout and crash safety
//
// A volume is a directory the caller names (say <root>/<session id>):
//
//	volume.json   the quota and owner, written last (see Create)
//	volume.img    the ext4 image, mode 0600: never reachable from a sandbox
//	mnt/          the mount point: Path()
//
// Create builds everything under a temporary name in the same parent and
// renames it into place only once it is mounted and complete, so an
// interrupted Create (a killed worker) leaves nothing that Open mistakes for
// a volume; Remove renames the directory away before deleting it. Sweep
// removes both kinds of leftovers and lists the complete volumes. Each
// operation on a volume directory holds an flock on it, so two Opens never
// attach one image twice (two loop devices over one ext4 image would
// corrupt it). The image has no journal: a host crash leaves it marked "not
// clean", and Open runs e2fsck -p (preen: safe repairs only, else an error)
// before it mounts such an image again. Put fsyncs what it wrote.
//
// # The file API (SECURITY.md case 38)
//
// Put, OpenFile, Delete and List act on paths relative to the volume root
// that pass CheckPath (the rules of the execution API's files[] paths).
// Everything is resolved one component at a time from directory fds with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|
// RESOLVE_NO_XDEV) and O_NOFOLLOW: the code in the sandbox writes the same
// tree concurrently and may swap any component for a symlink to a host path
// (CVE-2018-15664-style races), a FIFO that would block an open forever, a
// socket or a device node. Files are opened O_NONBLOCK and their type is
// checked with fstat on the opened fd before a byte is read; only regular
// files are read, replaced or deleted, and only in directories the sandbox
// user owns (the ballast is root's).
package volume
