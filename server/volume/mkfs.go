package volume

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	// inodeSize: 256-byte inodes keep nanosecond and post-2038 timestamps.
	inodeSize = 256
	// firstInode: ext4 reserves inodes 1-10; lost+found takes 11.
	firstInode = 11
	// groupBytes: one bitmap block maps 32768 blocks (128 MiB), and a
	// group has one superblock copy, descriptors and bitmaps.
	groupBytes = 8 * blockSize * blockSize
)

// imageSize is how big the image must be for ext4 to offer m's quota: the
// quota, plus ext4's reserve (s_resv_clusters: 2% of the blocks, at most
// 4096, that no writer may use, root included, so that punching holes and
// converting unwritten extents never fail), plus the inode tables, bitmaps,
// superblock copies and group descriptors, plus a little slack. It errs on
// the generous side; the ballast takes up the rest. (mke2fs shrinks the
// block groups of a small filesystem to have enough of them for the
// inodes: at most 32768 a group, one bitmap block.)
func imageSize(m meta) int64 {
	inodes := m.MaxFiles + firstInode + 1
	size := m.MaxBytes + min(m.MaxBytes/49, 4096*blockSize+blockSize) + inodes*inodeSize
	size += (size/groupBytes + 1) * 4 * blockSize
	size += 1 << 20
	return roundUp(size, blockSize)
}

// makeImage creates the image file, sparse (or fully allocated) and formats
// it: 4 KiB blocks, no reserved blocks (-m 0: root would otherwise get more
// than the sandbox, and the API runs as root), at least the quota's inodes,
// no journal (see the package doc), no resize inode (volumes never grow),
// remount read-only on errors, the root directory owned by the sandbox user.
// assume_storage_prezeroed: a new sparse or fallocated file reads as zeros,
// so mke2fs skips zeroing the inode tables and marks them zeroed, and the
// kernel's lazy-init thread does not write them either: the image stays a
// few hundred KiB until files are written.
func makeImage(image string, size int64, m meta) error {
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil && m.Preallocated {
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("image of %d bytes: %w", size, err)
	}
	args := []string{"-q", "-F",
		"-b", strconv.Itoa(blockSize), "-I", strconv.Itoa(inodeSize), "-m", "0",
		"-N", strconv.FormatInt(m.MaxFiles+firstInode+1, 10),
		"-L", "sandboxd", "-e", "remount-ro",
		"-O", "^has_journal,^resize_inode,extent",
		"-E", fmt.Sprintf("root_owner=%d:%d,assume_storage_prezeroed=1,nodiscard", m.UID, m.GID),
		image}
	if out, err := exec.Command(tool("mkfs.ext4"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// addBallast pins what the filesystem offers beyond the quota, so that an
// empty volume offers exactly m.MaxFiles inodes and m.MaxBytes of blocks:
// empty root-owned files for the extra inodes (mke2fs rounds the inode
// count up to whole inode-table blocks in every group) and one fallocated
// file (unwritten extents: no data is ever written, the image stays sparse)
// for the extra blocks. They live in lost+found, which the sandbox user
// cannot enter; the file API does not enter it either.
func addBallast(mnt string, m meta) error {
	dir, err := unix.Open(filepath.Join(mnt, ballastDir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	blocks, err := unix.Openat(dir, "sandboxd-ballast", unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return err
	}
	defer unix.Close(blocks)
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return err
	}
	extra := int64(st.Ffree) - m.MaxFiles
	if extra < 0 {
		return fmt.Errorf("%d inodes free, fewer than %d", st.Ffree, m.MaxFiles)
	}
	for i := range extra {
		fd, err := unix.Openat(dir, "sandboxd-ballast-"+strconv.FormatInt(i, 10), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	// Last, the blocks: the inode ballast above may have grown lost+found.
	// Allocating may itself take an extent-tree block, so measure again
	// until exact.
	target := m.MaxBytes / blockSize
	var length int64
	for i := 0; ; i++ {
		if err := unix.Statfs(mnt, &st); err != nil {
			return err
		}
		delta := int64(st.Bavail) - target
		if delta == 0 {
			break
		}
		length += delta * blockSize
		if i == 8 || length < 0 {
			return fmt.Errorf("cannot pin the extra blocks: %d blocks available, want %d", st.Bavail, target)
		}
		if delta > 0 {
			err = unix.Fallocate(blocks, 0, 0, length)
		} else {
			err = unix.Ftruncate(blocks, length)
		}
		if err != nil {
			return fmt.Errorf("ballast of %d bytes: %w", length, err)
		}
	}
	if int64(st.Ffree) != m.MaxFiles {
		return fmt.Errorf("%d inodes free after the ballast, want %d", st.Ffree, m.MaxFiles)
	}
	return nil
}
