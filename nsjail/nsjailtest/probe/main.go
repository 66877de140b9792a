// Command probe runs inside test sandboxes and reports what the kernel lets
// it do. It is built statically (CGO_ENABLED=0) into a copy of the busybox
// rootfs by nsjailtest.ProbeRootfs.
package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe setuid0|fds|segv|threadbomb|keyring|openwrite PATH|mknod PATH|connect IP PORT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "setuid0":
		_, _, e := syscall.RawSyscall(syscall.SYS_SETUID, 0, 0, 0)
		fmt.Println(errName(e))
	case "fds":
		// Raw syscalls only: the os package would open the runtime's own
		// epoll and event fds first and they would show up in the list.
		fd, err := syscall.Open("/proc/self/fd", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			fail(err)
		}
		// getdents64 ends a batch early when a signal is pending (filldir64
		// checks signal_pending after the first entry; the Go runtime's
		// preemption SIGURG does it, seen under qemu in test-v2vm as only
		// "0"), so read until it returns nothing, as readdir(3) does.
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.ReadDirent(fd, buf)
			if err != nil {
				fail(err)
			}
			if n == 0 {
				break
			}
			_, _, names = syscall.ParseDirent(buf[:n], -1, names)
		}
		var fds []int
		for _, name := range names {
			if i, err := strconv.Atoi(name); err == nil && i != fd {
				fds = append(fds, i)
			}
		}
		sort.Ints(fds)
		fmt.Println(strings.Trim(fmt.Sprint(fds), "[]"))
	case "segv":
		// Die by a real fault with the default action, as a crashing native
		// extension would: reset the runtime's SIGSEGV handler, then fault.
		var act [4]uint64 // struct kernel_sigaction: handler SIG_DFL, flags, restorer, mask
		if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(syscall.SIGSEGV),
			uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
			fail(e)
		}
		var p *int
		*p = 1
	case "threadbomb":
		// Each locked goroutine holds an OS thread; the Go runtime aborts with
		// errno=11 (EAGAIN) once the pids limit refuses clone.
		for i := 0; ; i++ {
			go func() { runtime.LockOSThread(); time.Sleep(time.Hour) }()
			if i%16 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	case "openwrite":
		f, err := os.OpenFile(os.Args[2], os.O_WRONLY, 0)
		if err != nil {
			fmt.Println(errOf(err))
			return
		}
		f.Close()
		fmt.Println("OK")
	case "connect":
		// connect IP PORT: one TCP connect, raw syscalls, no DNS.
		fmt.Println(connect(os.Args[2], os.Args[3]))
	case "keyring":
		// The session keyring's serial and description (keyctl(2)
		// KEYCTL_GET_KEYRING_ID, KEYCTL_DESCRIBE); needs a filter that
		// allows keyctl.
		const getKeyringID, describe = 0, 6
		sessionKeyring := -3 // KEY_SPEC_SESSION_KEYRING
		id, _, e := syscall.RawSyscall(syscall.SYS_KEYCTL, getKeyringID, uintptr(sessionKeyring), 0)
		if e != 0 {
			fmt.Println(errName(e))
			return
		}
		buf := make([]byte, 512)
		n, _, e := syscall.RawSyscall6(syscall.SYS_KEYCTL, describe, id, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0)
		if e != 0 {
			fmt.Println(int32(id), errName(e))
			return
		}
		fmt.Println(int32(id), strings.TrimRight(string(buf[:min(int(n), len(buf))]), "\x00"))
	case "mknod":
		err := syscall.Mknod(os.Args[2], syscall.S_IFCHR|0o666, 1<<8|3)
		fmt.Println(errOf(err))
	default:
		fmt.Fprintln(os.Stderr, "unknown probe", os.Args[1])
		os.Exit(2)
	}
}

func connect(ip, port string) string {
	addr := net.ParseIP(ip)
	p, err := strconv.Atoi(port)
	if addr == nil || err != nil {
		fail(fmt.Errorf("connect: bad address %s %s", ip, port))
	}
	var sa syscall.Sockaddr
	family := syscall.AF_INET
	if v4 := addr.To4(); v4 != nil && !strings.Contains(ip, ":") {
		sa = &syscall.SockaddrInet4{Port: p, Addr: [4]byte(v4)}
	} else {
		family = syscall.AF_INET6
		sa = &syscall.SockaddrInet6{Port: p, Addr: [16]byte(addr.To16())}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return errOf(err)
	}
	defer syscall.Close(fd)
	return errOf(syscall.Connect(fd, sa))
}

func errOf(err error) string {
	if err == nil {
		return "OK"
	}
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if e, ok := err.(syscall.Errno); ok {
		return errName(e)
	}
	return err.Error()
}

func errName(e syscall.Errno) string {
	names := map[syscall.Errno]string{0: "OK", syscall.EPERM: "EPERM", syscall.EACCES: "EACCES",
		syscall.EROFS: "EROFS", syscall.ENOENT: "ENOENT", syscall.ETXTBSY: "ETXTBSY", syscall.ENOSYS: "ENOSYS", syscall.EINVAL: "EINVAL",
		syscall.ENETUNREACH: "ENETUNREACH", syscall.ECONNREFUSED: "ECONNREFUSED"}
	if n, ok := names[e]; ok {
		return n
	}
	return fmt.Sprintf("errno %d", int(e))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
