package seccomp

import (
	"golang.org/x/sys/unix"
)

// cloneNewMask is every namespace-creating clone flag. clone(2) with any of
// them is refused: new namespaces (above all CLONE_NEWUSER) expose kernel
// code paths that were behind CAP_SYS_ADMIN and are the root of many
// privilege escalations (e.g. CVE-2022-0185, CVE-2023-32233). CLONE_NEWTIME
// (0x80) shares its bit with clone(2)'s exit-signal byte; exit signals are
// below 65, so testing it never refuses a valid call.
const cloneNewMask = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// Socket families the sandbox may create. Networking is loopback-only (own
// net namespace), so AF_INET/AF_INET6 reach nothing outside.
var allowedFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

// x86Only marks legacy syscalls that aarch64 never had (its table starts
// from the *at family).
func x86Only() []Arch { return []Arch{ArchX86_64} }

const (
	refDockerDefault = "https://github.com/moby/profiles/blob/main/seccomp/default.json"
	refClone3        = "https://github.com/opencontainers/runc/pull/2750"
)

// Default returns sandboxd's profile: an allowlist for CPython (3.14 on forky, 3.13 on trixie) with
// threads, subprocess and multiprocessing (fork, spawn, forkserver over
// AF_UNIX, POSIX semaphores in /dev/shm), numpy/OpenBLAS threads, pandas,
// scipy, scikit-learn (joblib/loky), matplotlib, openpyxl, and busybox sh.
// Everything else fails with EPERM (ENOSYS above the highest syscall number
// the profile names, so libcs fall back from syscalls newer than it).
// Each call returns a fresh copy.
func Default() *Profile {
	p := &Profile{
		Default: ActErrno(uint(unix.EPERM)),
		Arches:  []Arch{ArchX86_64, ArchAArch64},
	}
	allow := func(group, reason, ref string, names ...string) {
		p.Rules = append(p.Rules, Rule{Names: names, Action: ActAllow, Group: group, Reason: reason, Ref: ref})
	}
	allowX86 := func(group, reason string, names ...string) {
		p.Rules = append(p.Rules, Rule{Names: names, Action: ActAllow, Arches: x86Only(), Group: group, Reason: reason})
	}

	// --- files and file descriptors
	allow("files", "read and write open descriptors: the basis of all I/O", "",
		"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2")
	allow("files", "open, close and duplicate descriptors; close_range is how CPython's subprocess and runc close inherited fds (CVE-2024-21626 defence)", "",
		"openat", "close", "close_range", "dup", "dup3", "fcntl", "lseek", "flock")
	allow("files", "openat2 only adds RESOLVE_* restrictions to openat", "",
		"openat2")
	allow("files", "flush and size files; limited by RLIMIT_FSIZE and tmpfs sizes", "",
		"fsync", "fdatasync", "ftruncate", "truncate", "fallocate", "fadvise64", "readahead", "sync_file_range")
	allow("files", "in-kernel copies: shutil.copyfile uses sendfile and copy_file_range", "",
		"sendfile", "copy_file_range")
	allow("files", "file metadata (os.stat, os.path.exists, Path.glob)", "",
		"fstat", "newfstatat", "statx", "statfs", "fstatfs", "faccessat", "faccessat2", "readlinkat", "getdents64", "getcwd", "chdir", "fchdir")
	allow("files", "create, rename and remove files in writable places (/tmp, /dev/shm, /workspace); the root is read-only", "",
		"mkdirat", "unlinkat", "renameat", "renameat2", "linkat", "symlinkat", "umask")
	allow("files", "permissions and times of own files; ownership changes need CAP_CHOWN, which the sandbox lacks", "",
		"fchmod", "fchmodat", "fchmodat2", "fchown", "fchownat", "utimensat")
	allow("files", "extended attributes (shutil.copy2 copies them); security.* and trusted.* need capabilities the sandbox lacks", "",
		"getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
		"setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr")
	allow("files", "ioctl on own descriptors (FIONREAD, TCGETS for isatty). There is no tty inside the sandbox (stdio are pipes, /dev has no tty), so TIOCSTI input injection has no target", "CVE-2017-5226",
		"ioctl")
	allowX86("files", "legacy x86_64 path syscalls (aarch64 has only the *at forms); busybox and static binaries still use them",
		"open", "creat", "stat", "lstat", "access", "readlink", "getdents", "mkdir", "rmdir", "rename", "link", "unlink", "symlink",
		"chmod", "chown", "lchown", "utime", "utimes", "futimesat", "dup2")
	// mknod: only FIFOs (os.mkfifo). Device nodes need CAP_MKNOD anyway;
	// refusing them here keeps SECURITY.md case 16 independent of capabilities.
	p.Rules = append(p.Rules,
		Rule{Names: []string{"mknodat"}, Action: ActAllow, Group: "files",
			Args:   []Cond{{Index: 2, Name: "mode", Op: MaskedEqual, Mask: unix.S_IFMT, Value: unix.S_IFIFO}},
			Reason: "os.mkfifo creates FIFOs with mknodat; any other file type (devices) is refused"},
		Rule{Names: []string{"mknod"}, Action: ActAllow, Group: "files", Arches: x86Only(),
			Args:   []Cond{{Index: 1, Name: "mode", Op: MaskedEqual, Mask: unix.S_IFMT, Value: unix.S_IFIFO}},
			Reason: "busybox mkfifo on x86_64 uses mknod; only FIFOs"},
	)

	// --- memory
	allow("memory", "memory management for the allocator, the dynamic loader, numpy and mmap'd files; bounded by the memory cgroup", "",
		"brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "msync", "mlock", "munlock", "mlock2", "munlockall", "membarrier")
	allow("memory", "memfd_create: anonymous files for shared memory (multiprocessing.heap, some allocators); charged to the memory cgroup", "",
		"memfd_create")

	// --- processes and threads
	p.Rules = append(p.Rules, Rule{
		Names: []string{"clone"}, Action: ActAllow, Group: "process",
		Args: []Cond{{Index: 0, Name: "flags", Op: MaskedEqual, Mask: cloneNewMask, Value: 0}},
		Reason: "threads (pthread_create), fork, vfork and posix_spawn via clone, but never with a CLONE_NEW* flag: " +
			"new namespaces (above all user namespaces) reopen kernel attack surface meant for CAP_SYS_ADMIN",
		Ref: "CVE-2022-0185",
	}, Rule{
		Names: []string{"clone3"}, Action: ActErrno(uint(unix.ENOSYS)), Group: "process",
		Reason: "clone3 passes its flags in a struct that seccomp cannot read, so it cannot be filtered for CLONE_NEW*; " +
			"ENOSYS (not EPERM) makes glibc fall back to clone, which is filtered. EPERM would break pthread_create",
		Ref: refClone3,
	})
	allowX86("process", "legacy fork/vfork: they create no namespaces",
		"fork", "vfork")
	allow("process", "run programs (subprocess, multiprocessing spawn, busybox sh); no_new_privs is set so setuid bits are ignored", "",
		"execve", "execveat")
	allow("process", "exit and wait for children", "",
		"exit", "exit_group", "wait4", "waitid")
	allow("process", "process identity and groups within the sandbox's own pid namespace", "",
		"getpid", "getppid", "gettid", "getpgid", "setpgid", "getsid", "setsid")
	allowX86("process", "legacy getpgrp", "getpgrp")
	allow("process", "thread start-up bookkeeping done by glibc and the Go runtime", "",
		"set_tid_address", "set_robust_list", "rseq")
	allow("process", "prctl: thread names (PR_SET_NAME), PR_SET_PDEATHSIG, no_new_privs queries; the privileged options need capabilities the sandbox lacks", "",
		"prctl")
	allowX86("process", "arch_prctl sets the TLS register on x86_64 (every thread needs it)", "arch_prctl")
	allow("process", "signal only processes of the sandbox's own pid namespace", "",
		"kill", "tkill", "tgkill", "pidfd_open", "pidfd_send_signal")
	allow("process", "resource limits and usage: the kernel lets an unprivileged process only lower hard limits", "",
		"getrlimit", "setrlimit", "prlimit64", "getrusage", "times")
	allow("process", "credentials queries (os.getuid, getpass.getuser)", "",
		"getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid", "capget")

	// --- scheduling
	allow("scheduling", "CPU affinity and priorities: os.process_cpu_count, OpenBLAS and joblib size their thread pools from sched_getaffinity; cpuset and CPU limits still bound them", "",
		"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam",
		"sched_getscheduler", "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
		"sched_rr_get_interval", "sched_getattr", "sched_setattr", "getpriority", "setpriority", "getcpu")

	// --- synchronisation
	allow("sync", "futex: every lock, condition variable and POSIX semaphore (multiprocessing's SemLock lives in /dev/shm)", "",
		"futex")

	// --- signals
	allow("signals", "signal handling (Python installs SIGINT/SIGCHLD handlers, the Go runtime uses SIGURG preemption)", "",
		"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending", "rt_sigtimedwait",
		"rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "restart_syscall", "signalfd4")
	allowX86("signals", "legacy signal calls", "pause", "alarm", "signalfd")

	// --- time
	allow("time", "read clocks and sleep; setting clocks is not allowed (clock_settime, settimeofday, adjtimex are absent)", "",
		"clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday",
		"getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete",
		"timerfd_create", "timerfd_settime", "timerfd_gettime")
	allowX86("time", "legacy time(2)", "time")

	// --- event loops
	allow("events", "I/O multiplexing: selectors, asyncio, the Go runtime's netpoller, joblib/loky's executor", "",
		"pselect6", "ppoll", "epoll_create1", "epoll_ctl", "epoll_pwait", "epoll_pwait2", "eventfd2", "pipe2")
	allowX86("events", "legacy forms of the event calls",
		"select", "poll", "epoll_create", "epoll_wait", "eventfd", "pipe")

	// --- system information
	allow("info", "uname (platform module), sysinfo (os.cpu_count fallbacks), getrandom (hash seeds, secrets, numpy's default_rng)", "",
		"uname", "sysinfo", "getrandom")

	// --- network
	for _, f := range allowedFamilies {
		p.Rules = append(p.Rules, Rule{
			Names: []string{"socket"}, Action: ActAllow, Group: "network",
			Args:   []Cond{{Index: 0, Name: "domain", Op: Equal, Value: f}},
			Reason: "AF_UNIX (multiprocessing forkserver and managers), AF_INET/AF_INET6 on the loopback-only network namespace",
		})
	}
	// Every other family gets EAFNOSUPPORT, the answer a kernel without that
	// family gives, so libraries fall back instead of aborting (glibc's
	// getaddrinfo tolerates a refused AF_NETLINK socket). The families
	// refused here carry the usual socket CVEs: AF_PACKET (CVE-2020-14386),
	// AF_NETLINK/nf_tables (CVE-2024-1086), AF_VSOCK (CVE-2021-26708),
	// AF_ALG (CVE-2015-8970).
	p.Rules = append(p.Rules, Rule{
		Names: []string{"socket"}, Action: ActErrno(uint(unix.EAFNOSUPPORT)), Group: "network",
		Args:   []Cond{{Index: 0, Name: "domain", Op: Greater, Value: unix.AF_INET6}},
		Reason: "socket families above AF_INET6 (netlink, packet, vsock, alg, bluetooth, ...) are refused as unsupported",
		Ref:    "CVE-2024-1086",
	})
	for f := uint64(0); f < unix.AF_INET6; f++ {
		if f == unix.AF_UNIX || f == unix.AF_INET {
			continue
		}
		p.Rules = append(p.Rules, Rule{
			Names: []string{"socket"}, Action: ActErrno(uint(unix.EAFNOSUPPORT)), Group: "network",
			Args:   []Cond{{Index: 0, Name: "domain", Op: Equal, Value: f}},
			Reason: "AF_UNSPEC and the families between AF_INET and AF_INET6 (ax25, ipx, appletalk, netrom, bridge, atmpvc, x25) are refused as unsupported",
		})
	}
	p.Rules = append(p.Rules, Rule{
		Names: []string{"socketpair"}, Action: ActAllow, Group: "network",
		Args:   []Cond{{Index: 0, Name: "domain", Op: Equal, Value: unix.AF_UNIX}},
		Reason: "socketpair(AF_UNIX): multiprocessing pipes and subprocess; the only family socketpair supports anyway",
	})
	allow("network", "operations on sockets the sandbox was allowed to create; fd passing over AF_UNIX is how the forkserver hands out pipes", "",
		"bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "sendto", "recvfrom",
		"sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "setsockopt", "getsockopt")

	p.Denied = defaultDenied()
	return p
}

func defaultDenied() []Denial {
	return []Denial{
		{Names: []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"}, Group: "isolation",
			Reason: "read or write another process's memory or descriptors; ptrace has a long history of privilege escalations",
			Ref:    "CVE-2019-13272"},
		{Names: []string{"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "chroot"}, Group: "isolation",
			Reason: "change the mount tree; the sandbox's mounts are fixed before the command starts",
			Ref:    "CVE-2022-0185"},
		{Names: []string{"unshare", "setns"}, Group: "isolation",
			Reason: "enter or create namespaces: user namespaces expose CAP_SYS_ADMIN-only kernel code",
			Ref:    "CVE-2023-32233"},
		{Names: []string{"keyctl", "add_key", "request_key"}, Group: "isolation",
			Reason: "the kernel keyring is not namespaced",
			Ref:    "CVE-2016-0728"},
		{Names: []string{"splice", "tee", "vmsplice"}, Group: "kernel",
			Reason: "pipe page splicing, unused by the stack (shutil copies with sendfile and copy_file_range); the Dirty Pipe overwrite of read-only files went through splice",
			Ref:    "CVE-2022-0847"},
		{Names: []string{"mincore"}, Group: "kernel",
			Reason: "page-cache residency queries are a cross-process side channel; nothing in the stack calls it",
			Ref:    "CVE-2019-5489"},
		{Names: []string{"bpf"}, Group: "kernel",
			Reason: "eBPF verifier bugs are a recurring root exploit",
			Ref:    "CVE-2021-3490"},
		{Names: []string{"perf_event_open"}, Group: "kernel",
			Reason: "perf events leak kernel addresses and have had privilege escalations",
			Ref:    "CVE-2013-2094"},
		{Names: []string{"userfaultfd"}, Group: "kernel",
			Reason: "userfaultfd stalls kernel page faults, widening race windows in exploits",
			Ref:    "https://lwn.net/Articles/819834/"},
		{Names: []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}, Group: "kernel",
			Reason: "io_uring bypasses per-syscall filtering and has had many privilege escalations",
			Ref:    "CVE-2023-2598"},
		{Names: []string{"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot"}, Group: "kernel",
			Reason: "load code into or restart the kernel",
			Ref:    refDockerDefault},
		{Names: []string{"name_to_handle_at", "open_by_handle_at"}, Group: "isolation",
			Reason: "open files by handle, bypassing the mount tree (the 'shocker' container breakout)",
			Ref:    "https://lwn.net/Articles/606022/"},
		{Names: []string{"setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid", "capset"}, Group: "credentials",
			Reason: "the sandbox runs as 10001 with no capabilities; changing credentials has no legitimate use (busybox applets call setgid(getgid()) and setuid(getuid()) at start and ignore the EPERM)",
			Ref:    ""},
		{Names: []string{"clock_settime", "clock_adjtime", "settimeofday", "adjtimex"}, Group: "time",
			Reason: "the clock is not namespaced",
			Ref:    refDockerDefault},
		{Names: []string{"swapon", "swapoff", "acct", "quotactl", "syslog", "vhangup", "sethostname", "setdomainname"}, Group: "kernel",
			Reason: "host administration",
			Ref:    refDockerDefault},
		// SECURITY.md case 26: the inotify limits are per-user counts
		// charged up the user namespace chain (kernel ucounts).
		{Names: []string{"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_init", "fanotify_mark"}, Group: "isolation",
			Reason: "file-change watches, unused by the stack (asyncio and selectors poll with epoll). Their instances, watches and marks count " +
				"against the user namespace owner's limits, host root's, so one sandbox could use up fs.inotify.max_user_instances for the whole " +
				"host (systemd, journald); and a watch on the shared read-only rootfs would see the files other sandboxes open",
			Ref: "https://man7.org/linux/man-pages/man7/inotify.7.html"},
		{Names: []string{"mbind", "set_mempolicy", "migrate_pages", "move_pages", "personality", "uselib", "ustat", "sysfs", "iopl", "ioperm", "modify_ldt", "lookup_dcookie"}, Group: "kernel",
			Reason: "host-wide or legacy interfaces with no use in the sandbox (modify_ldt: CVE-2015-5157)",
			Ref:    refDockerDefault},
		{Names: []string{"shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"}, Group: "ipc",
			Reason: "System V and POSIX message-queue IPC are unused by the Python stack (multiprocessing uses futexes in /dev/shm)",
			Ref:    ""},
		{Names: []string{"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "memfd_secret", "process_mrelease", "quotactl_fd", "set_mempolicy_home_node", "futex_waitv"}, Group: "newer",
			Reason: "newer interfaces the stack does not need",
			Ref:    ""},
	}
}
