package volume

// Attaching an image to a loop device and mounting it, with ioctls rather
// than losetup and mount(8): one fewer exec, and typed errors.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// blockSize is the filesystem's and the loop device's block size.
const blockSize = 4096

// mountFlags: no set-id binaries and no device nodes, whatever the sandbox
// or an upload manages to put there; noexec because the interpreter and its
// libraries come from the read-only runtime image and a session has no
// reason to run a binary (or mmap a shared object) of its own: a native
// payload dropped by one execution cannot be executed by a later one.
// noatime: reads by the code do not turn into metadata writes.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME

// mountData: a filesystem the kernel finds damaged turns read-only instead
// of being written further. discard (sparse images only) punches the blocks
// of deleted files out of the image, so the image's disk footprint follows
// the session's usage down as well as up.
func mountData(preallocated bool) string {
	if preallocated {
		return "errors=remount-ro"
	}
	return "errors=remount-ro,discard"
}

// attachAndMount attaches image to a free loop device and mounts it on mnt.
// The device has LO_FLAGS_AUTOCLEAR: it detaches itself when the mount (its
// last user) goes, and at once if the mount fails, since our fd is then its
// last user.
func attachAndMount(image, mnt string, preallocated bool) error {
	backing, err := os.OpenFile(image, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open image: %w", err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	// Another process (losetup, another worker) may take the free device
	// between GET_FREE and CONFIGURE: it then answers EBUSY, and we ask again.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: blockSize}
		// Direct I/O: the image's blocks are cached once (as the volume's
		// files), not a second time as the image file's pages.
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:unix.LO_NAME_SIZE-1], image)
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 32 {
			loop.Close()
			continue
		}
		if err != nil {
			loop.Close()
			return fmt.Errorf("attach %s to %s: %w", image, dev, err)
		}
		err = unix.Mount(dev, mnt, "ext4", mountFlags, mountData(preallocated))
		loop.Close()
		if err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", dev, image, mnt, err)
		}
		return nil
	}
}

// unmount unmounts mnt if it is a mount point, lazily if it is busy (the
// worker still streams a file from it): the filesystem, and with it the
// loop device, then goes when its last user does. UMOUNT_NOFOLLOW: mnt is
// ours, but refuse to act through a symlink anyway.
func unmount(mnt string) error {
	for i := 0; i < 4; i++ {
		if ok, err := isMountRoot(mnt); err != nil || !ok {
			return err
		}
		err := unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
	}
	return fmt.Errorf("unmount %s: still a mount point", mnt)
}

// isMountRoot reports whether dir is the root of a mount (statx's
// STATX_ATTR_MOUNT_ROOT; Linux 5.8). A missing dir is not one.
func isMountRoot(dir string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("statx %s: %w", dir, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, fmt.Errorf("statx %s: the kernel does not report mount roots (needs Linux 5.8)", dir)
	}
	return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// mountedDevice returns the device of the filesystem mounted on mnt, if mnt
// is a mount root.
func mountedDevice(mnt string) (dev uint64, mounted bool, err error) {
	if mounted, err = isMountRoot(mnt); err != nil || !mounted {
		return 0, false, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(mnt, &st); err != nil {
		return 0, false, err
	}
	return st.Dev, true, nil
}

// loopOf finds the loop device the image is attached to, by the backing
// file's device and inode (paths change when a volume directory is renamed):
// it returns the device's number (its dev_t), or ok=false.
func loopOf(image string) (dev uint64, ok bool, err error) {
	var img unix.Stat_t
	if err := unix.Stat(image, &img); err != nil {
		return 0, false, err
	}
	// Only attached loop devices have a loop/ directory in sysfs.
	attached, err := filepath.Glob("/sys/block/loop*/loop")
	if err != nil {
		return 0, false, err
	}
	for _, a := range attached {
		name := filepath.Base(filepath.Dir(a))
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "loop")); err != nil {
			continue
		}
		info, err := loopStatus("/dev/" + name)
		if err != nil {
			continue // detached meanwhile, or not ours to read
		}
		if info.Device != img.Dev || info.Inode != img.Ino {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat("/dev/"+name, &st); err != nil {
			return 0, false, fmt.Errorf("%s holds %s: %w", name, image, err)
		}
		return st.Rdev, true, nil
	}
	return 0, false, nil
}

func loopStatus(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}
