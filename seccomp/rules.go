package seccomp

import (
	"slices"

	"github.com/sandboxd/sandboxd/nsjail/inside"
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

// Template returns the template profile (server/warmpool/TEMPLATE.md
// section 6, SECURITY.md case 63): the filter of a template sandbox's
// process T (nsjail.Runner.StartTemplate, running
// server/warmpool/template.py), which the forks F and G inherit.
// Each call returns a fresh copy.
func Template() *Profile { return TemplateOf(Default()) }

// TemplateOf returns exec plus templateRules, without what exec already
// allows unconditionally (its Rules are exec's, in order, then the added
// ones): exactly what template.py's T, F and G do before
// G loads exec's own program, and that exec refuses. G then runs under
// both filters; the kernel answers each call with the answer of higher
// precedence, and on a tie with the execution filter's (loaded last). So
// the template profile may only add allow rules to exec's, never remove
// or harden one: G's effective policy is then exactly exec's
// (TestTemplateStacksToTheExecutionProfile checks the compiled pair). The
// names the added rules allow leave Denied: they are allowed only under
// the rules' conditions, and every other call of them keeps exec's
// answer. exec is not changed.
func TemplateOf(exec *Profile) *Profile {
	// Names a template rule allows whatever the arguments: exec's own
	// rules for them (clone3's ENOSYS) leave the template profile, which
	// can hold one answer per unconditional name.
	replaced := map[string]bool{}
	for _, r := range templateRules() {
		if r.Action == ActAllow && len(r.Args) == 0 {
			for _, n := range r.Names {
				replaced[n] = true
			}
		}
	}
	p := &Profile{Default: exec.Default, Arches: slices.Clone(exec.Arches)}
	for _, r := range exec.Rules {
		r.Names, r.Args, r.Arches = slices.Clone(r.Names), slices.Clone(r.Args), slices.Clone(r.Arches)
		if r.Action != ActAllow {
			r.Names = slices.DeleteFunc(r.Names, func(n string) bool { return replaced[n] })
			if len(r.Names) == 0 {
				continue
			}
		}
		p.Rules = append(p.Rules, r)
	}
	added := map[string]bool{}
	for _, r := range TemplateAdditions(exec) {
		for _, n := range r.Names {
			added[n] = true
		}
		p.Rules = append(p.Rules, r)
	}
	for _, d := range exec.Denied {
		d.Names = slices.DeleteFunc(slices.Clone(d.Names), func(n string) bool { return added[n] })
		if len(d.Names) > 0 {
			p.Denied = append(p.Denied, d)
		}
	}
	return p
}

// TemplateAdditions are the rules TemplateOf appends to exec's: the
// template rules, but for names exec allows on every architecture
// whatever the arguments.
func TemplateAdditions(exec *Profile) []Rule {
	always := map[string]bool{} // allowed by exec on every architecture, whatever the arguments
	for _, r := range exec.Rules {
		if r.Action == ActAllow && len(r.Args) == 0 && len(r.Arches) == 0 {
			for _, n := range r.Names {
				always[n] = true
			}
		}
	}
	var out []Rule
	for _, r := range templateRules() {
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return always[n] })
		if len(r.Names) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// templateRules are what template.py's T and G need for a fork, before
// G's drop, that the execution profile refuses; each reason names the
// step. T otherwise needs nothing more than a sandbox's process (it writes
// each G's id maps, relays its end and talks over its socket). Not here
// because the execution profile allows them already: pidfd_open, waitid,
// prctl (PR_CAPBSET_DROP, PR_CAP_AMBIENT, no_new_privs, dumpable),
// prlimit64, chdir, sendmsg/recvmsg with fds.
func templateRules() []Rule {
	var rules []Rule
	// clone3: T's clone of each G. Its flags are in a struct seccomp
	// cannot read, so it is allowed whole: T and G before its drop may make
	// namespaces of any type with it (in a user namespace of their own, or
	// in U_F, where G is root), which clone's and unshare's flag checks keep
	// from them otherwise. Template code only: G's execution filter, loaded
	// over this one, answers clone3 ENOSYS again (ERRNO outranks ALLOW), so
	// the code never gets it (SECURITY.md case 63). No unshare: a user
	// namespace made by unshare would be the caller's own, never a child's.
	rules = append(rules, Rule{
		Names: []string{"clone3"}, Action: ActAllow, Group: "process",
		Reason: "template.py T (_clone): T clones each G with clone3(CLONE_NEWUSER|CLONE_NEWPID), on cgroup v2 with " +
			"CLONE_NEWCGROUP|CLONE_INTO_CGROUP straight into the shell's cgroup (TEMPLATE.md sections 3 and 4), which no other " +
			"call can do; its flags are a struct seccomp cannot read, so the call is allowed whole, to template code only " +
			"(G's execution filter answers ENOSYS again)",
		Ref: refClone3,
	})
	// setns: G, one fd per namespace, each with its type. Never a user or
	// pid namespace (the shell joins G's, not G the shell's), nor nstype 0
	// (any type).
	for _, ns := range []struct {
		flag uint64
		name string
	}{{unix.CLONE_NEWNS, "mount"}, {unix.CLONE_NEWNET, "net"}, {unix.CLONE_NEWIPC, "ipc"},
		{unix.CLONE_NEWUTS, "uts"}, {unix.CLONE_NEWCGROUP, "cgroup"}} {
		rules = append(rules, Rule{
			Names: []string{"setns"}, Action: ActAllow, Group: "isolation",
			Args: []Cond{{Index: 1, Name: "nstype", Op: MaskedEqual, Mask: cloneNewMask, Value: ns.flag}},
			Reason: "template.py G (_g): setns into the shell's " + ns.name + " namespace, from the fd the worker sent, its type named " +
				"(TEMPLATE.md section 3 step 7); never a user or pid namespace, nor nstype 0 (any)",
		})
	}
	// The id changes of G's drop: to root of U_F, then to the sandbox user.
	ids := func(v uint64) []Cond {
		return []Cond{{Index: 0, Name: "real", Op: Equal, Value: v}, {Index: 1, Name: "effective", Op: Equal, Value: v},
			{Index: 2, Name: "saved", Op: Equal, Value: v}}
	}
	const idReason = "template.py G (_drop): first to 0, root of U_F (G's ids are T's, unmapped there, and only a change away from 0 clears " +
		"capabilities), then to the sandbox user (TEMPLATE.md section 3 step 7); no other ids, so T itself (in U_T, where the sandbox " +
		"user is unmapped) takes none of U_T's others, the host ids of a cold sandbox's root and user"
	for _, v := range []uint64{0, inside.UID} {
		rules = append(rules, Rule{Names: []string{"setresuid"}, Action: ActAllow, Group: "credentials", Args: ids(v), Reason: idReason})
	}
	for _, v := range []uint64{0, inside.GID} {
		rules = append(rules, Rule{Names: []string{"setresgid"}, Action: ActAllow, Group: "credentials", Args: ids(v), Reason: idReason})
	}
	rules = append(rules, Rule{
		Names: []string{"setgroups"}, Action: ActAllow, Group: "credentials",
		Args:   []Cond{{Index: 0, Name: "size", Op: Equal, Value: 0}},
		Reason: "template.py G (_drop): setgroups([]) empties the supplementary groups before the change to the sandbox user; the empty list only",
	})
	// keyctl: G's own session keyring, as runc gives a cold sandbox.
	for _, op := range []struct {
		op   uint64
		what string
	}{
		{unix.KEYCTL_JOIN_SESSION_KEYRING, "KEYCTL_JOIN_SESSION_KEYRING joins a new session keyring named _ses.<shell id>"},
		{unix.KEYCTL_DESCRIBE, "KEYCTL_DESCRIBE reads its permissions"},
		{unix.KEYCTL_SETPERM, "KEYCTL_SETPERM lets others search it, as runc does"},
	} {
		rules = append(rules, Rule{
			Names: []string{"keyctl"}, Action: ActAllow, Group: "isolation",
			Args: []Cond{{Index: 0, Name: "operation", Op: Equal, Value: op.op}},
			Reason: "template.py G (_drop): " + op.what + " (SECURITY.md case 28: a fork would otherwise share T's keyring with every " +
				"other fork); no other keyctl operation",
			Ref: "CVE-2016-0728",
		})
	}
	rules = append(rules, Rule{
		Names: []string{"seccomp"}, Action: ActAllow, Group: "process",
		Args: []Cond{{Index: 0, Name: "operation", Op: Equal, Value: unix.SECCOMP_SET_MODE_FILTER},
			{Index: 1, Name: "flags", Op: MaskedEqual, Mask: 0xffffffff, Value: unix.SECCOMP_FILTER_FLAG_TSYNC}},
		Reason: "template.py G (_drop): G loads the execution's program (the one the kernel holds for the shell's init) with " +
			"SECCOMP_FILTER_FLAG_TSYNC, the last step of its drop (TEMPLATE.md section 6); a filter only adds refusals. No other " +
			"operation or flag (SPEC_ALLOW would turn off the speculative store bypass mitigation)",
	})
	return rules
}
