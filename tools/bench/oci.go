package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sandboxd/sandboxd/nsjail/inside"
)

// deniedSyscalls fail with EPERM in the peers' seccomp profile: the SECURITY.md
// case 9 set (ptrace, mount, namespaces, keyring, bpf, perf, userfaultfd,
// io_uring: the usual container-escape and kernel-attack-surface calls) plus
// what Docker's default profile also refuses (modules, kexec, clock and host
// settings, swap, reboot, the new mount API, cross-process memory access).
var deniedSyscalls = []string{
	"ptrace", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
	"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"create_module", "get_kernel_syms", "query_module", "reboot", "swapon", "swapoff",
	"acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"sethostname", "setdomainname", "iopl", "ioperm", "modify_ldt", "vhangup",
	"open_tree", "open_tree_attr", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
	"mount_setattr", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
	"quotactl", "quotactl_fd", "syslog", "uselib", "process_vm_readv",
	"process_vm_writev", "kcmp", "mknod", "mknodat", "fanotify_init", "nfsservctl",
	"_sysctl", "afs_syscall", "tuxcall", "security", "vserver", "getpmsg", "putpmsg",
	"pidfd_getfd", "memfd_secret", "listns", "statmount", "listmount",
	"lsm_set_self_attr", "uprobe", "uretprobe",
}

// enosysSyscalls fail with ENOSYS: glibc falls back from clone3 to clone
// only on ENOSYS, and EPERM would break thread creation.
var enosysSyscalls = []string{"clone3"}

// peerSeccomp is an allowlist: every known syscall but the denied ones, and
// ENOSYS for anything else (syscalls newer than the list).
func peerSeccomp() *specs.LinuxSeccomp {
	eperm, enosys := uint(1), uint(38)
	var allowed []string
	for _, s := range amd64Syscalls {
		if !slices.Contains(deniedSyscalls, s) && !slices.Contains(enosysSyscalls, s) {
			allowed = append(allowed, s)
		}
	}
	return &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &enosys,
		Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: allowed, Action: specs.ActAllow},
			{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: enosysSyscalls, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
}

// peerLimits are the limits every peer gets, those of sandboxd's dynamic
// policy: 1 GiB memory without swap, 1 CPU, 128 tasks, 256 MiB /tmp.
type peerLimits struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
}

var defaultPeerLimits = peerLimits{MemoryBytes: 1 << 30, CPUs: 1, Pids: 128}

// peerEnv is the environment of every peer's process: what sandboxd gives a
// sandbox (HOME and matplotlib's cache dir on the tmpfs, one BLAS thread per
// CPU), so the same work is done everywhere.
var peerEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/tmp",
	"LANG=C.UTF-8",
	"MPLBACKEND=Agg",
	"MPLCONFIGDIR=/tmp/matplotlib",
	"OMP_NUM_THREADS=1",
	"OPENBLAS_NUM_THREADS=1",
	"MKL_NUM_THREADS=1",
	"PYTHONDONTWRITEBYTECODE=1",
}

// ociSpec is a runc/crun config comparable to a sandboxd sandbox: user,
// pid, net, mount, ipc, uts and cgroup namespaces; uid/gid inside.UID/GID
// (mapped to host 100000+UID); no capabilities; no_new_privs; a read-only root; tmpfs /tmp
// and /dev/shm; seccomp allowlist; memory, CPU and pids limits in cgroupsPath.
func ociSpec(rootfs string, args []string, cgroupsPath string, lim peerLimits) *specs.Spec {
	period := uint64(100_000)
	quota := int64(lim.CPUs * float64(period))
	mem := lim.MemoryBytes
	pids := lim.Pids
	caps := &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}, Ambient: []string{}}
	return &specs.Spec{
		Version: "1.0.2",
		Process: &specs.Process{
			User:            specs.User{UID: inside.UID, GID: inside.GID},
			Args:            args,
			Env:             peerEnv,
			Cwd:             "/tmp",
			Capabilities:    caps,
			NoNewPrivileges: true,
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		},
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Hostname: "sandbox",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=64m"}},
			// runc chmods a tmpfs to the mode of the directory it covers (the
			// image's /tmp is 1755), so the sandbox user must own it instead.
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("uid=%d", inside.UID), fmt.Sprintf("gid=%d", inside.GID), "size=256m"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath: cgroupsPath,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Seccomp: peerSeccomp(),
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
				"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// writeBundle writes dir/config.json for spec; the root stays where it is
// (an absolute root.path), so every bundle shares the one unpacked rootfs.
func writeBundle(dir string, spec *specs.Spec) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
}

// ownCgroups maps each mounted cgroup hierarchy (by its controller list, ""
// for v2) to this process's cgroup path in it, from /proc/self/cgroup.
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			own[parts[1]] = parts[2]
		}
	}
	return own, nil
}

// peerCgroupsPath picks the absolute cgroupsPath for a runc/crun container
// named id. runc and crun apply one path in every hierarchy, and the team
// rule is to create cgroups only below our own in each one; so the path is
// <deepest own path>/<id>, accepted only when every other own path is a
// prefix of it (here: "/" everywhere but memory). Otherwise there is no safe
// single path and the caller skips cgroup limits for the peers, saying so.
func peerCgroupsPath(own map[string]string, id string) (string, error) {
	deepest := "/"
	for _, p := range own {
		if len(p) > len(deepest) {
			deepest = p
		}
	}
	for ctrl, p := range own {
		if p != "/" && !strings.HasPrefix(deepest+"/", strings.TrimSuffix(p, "/")+"/") {
			return "", fmt.Errorf("own cgroups diverge (%q: %s vs %s): no single cgroupsPath nests under all of them", ctrl, p, deepest)
		}
	}
	return filepath.Join(deepest, id), nil
}
