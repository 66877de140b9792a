package nsjail

import (
	"fmt"
	"path"

	"github.com/opencontainers/cgroups"
	devcfg "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// buildConfig turns one Spec into a libcontainer config. This is the one
// place that states what a sandbox is, in the order libcontainer applies it:
// user namespace → pid → mount (rootfs, /proc, /dev, tmpfs) → net → uts/ipc →
// cgroup → drop privileges (capabilities, no_new_privs, seccomp) → rlimits.
func (r *Runner) buildConfig(id string, spec *Spec, lim Limits) (*configs.Config, error) {
	cfg := &configs.Config{
		Rootfs:     spec.Rootfs,
		Readonlyfs: true, // CVE-2019-5736-style overwrites of the runtime need a writable root
		Hostname:   spec.Hostname,
		Namespaces: namespaces(),
		UIDMappings: []configs.IDMap{
			{ContainerID: 0, HostID: int64(r.opts.HostIDBase), Size: 1},
			{ContainerID: SandboxUID, HostID: int64(r.opts.HostIDBase + SandboxUID), Size: 1},
		},
		GIDMappings: []configs.IDMap{
			{ContainerID: 0, HostID: int64(r.opts.HostIDBase), Size: 1},
			{ContainerID: SandboxGID, HostID: int64(r.opts.HostIDBase + SandboxGID), Size: 1},
		},
		Mounts:        mounts(spec, lim),
		Devices:       devices(),
		MaskPaths:     maskedPaths,
		ReadonlyPaths: readonlyPaths,
		// Loopback only: the sandbox has no route anywhere else.
		Networks: []*configs.Network{{Type: "loopback", Address: "127.0.0.1/0", Gateway: "localhost"}},
		Cgroups:  r.cgroupConfig(id, lim),
		// An empty set, not nil: nil keeps the full bounding set.
		Capabilities:    &configs.Capabilities{},
		NoNewPrivileges: true,
		Seccomp:         r.seccomp,
		Rlimits:         rlimits(lim),
		NoNewKeyring:    true, // keyctl is denied anyway; no session keyring to leak
		Version:         "1.2.0",
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "sandbox"
	}
	return cfg, nil
}

func namespaces() configs.Namespaces {
	return configs.Namespaces{
		{Type: configs.NEWUSER},
		{Type: configs.NEWPID},
		{Type: configs.NEWNS},
		{Type: configs.NEWNET},
		{Type: configs.NEWUTS},
		{Type: configs.NEWIPC},
		{Type: configs.NEWCGROUP},
	}
}

const (
	noSuidDevExec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

func mounts(spec *Spec, lim Limits) []*configs.Mount {
	m := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: noSuidDevExec},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=64k"},
		// Python multiprocessing's semaphores live in /dev/shm.
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: noSuidDevExec,
			Data: fmt.Sprintf("mode=1777,size=%d", lim.ShmBytes)},
		{Source: "tmpfs", Destination: "/tmp", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV,
			Data: fmt.Sprintf("mode=1777,size=%d", lim.TmpBytes)},
		// Read-only sysfs of the sandbox's own network namespace: numpy and
		// joblib read CPU topology from it; nothing there is writable.
		{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: noSuidDevExec | unix.MS_RDONLY},
	}
	if spec.Workspace != "" {
		m = append(m, &configs.Mount{
			Source: spec.Workspace, Destination: WorkspaceDir, Device: "bind",
			Flags: unix.MS_BIND | unix.MS_REC | unix.MS_NOSUID | unix.MS_NODEV,
		})
	}
	return m
}

// devices are the only nodes in /dev: bind-mounted from the host (a user
// namespace cannot mknod) and allowed by the device cgroup.
func devices() []*devcfg.Device {
	mk := func(p string, major, minor int64) *devcfg.Device {
		return &devcfg.Device{
			Path: p, FileMode: 0o666, Uid: 0, Gid: 0,
			Rule: devcfg.Rule{Type: devcfg.CharDevice, Major: major, Minor: minor,
				Permissions: "rwm", Allow: true},
		}
	}
	return []*devcfg.Device{
		mk("/dev/null", 1, 3),
		mk("/dev/zero", 1, 5),
		mk("/dev/full", 1, 7),
		mk("/dev/random", 1, 8),
		mk("/dev/urandom", 1, 9),
	}
}

// maskedPaths hide kernel information that helps an attacker (kernel memory,
// keys, timing side channels); runc's defaults plus /proc/kallsyms.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/kallsyms", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
	"/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyPaths cannot be written even by the sandbox's root: /proc/sys
// (sysctls), /proc/sysrq-trigger (reboot, crash), irq and bus settings.
var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

const cpuPeriodUS = 100_000

func (r *Runner) cgroupConfig(id string, lim Limits) *cgroups.Cgroup {
	pids := lim.Pids
	var deviceRules []*devcfg.Rule
	// Deny everything, then allow the five nodes we bind in.
	deviceRules = append(deviceRules, &devcfg.Rule{Type: devcfg.WildcardDevice, Major: devcfg.Wildcard,
		Minor: devcfg.Wildcard, Permissions: "rwm", Allow: false})
	for _, d := range devices() {
		rule := d.Rule
		deviceRules = append(deviceRules, &rule)
	}
	res := &cgroups.Resources{
		Memory:    lim.MemoryBytes,
		PidsLimit: &pids,
		CpuQuota:  int64(lim.CPUs * cpuPeriodUS),
		CpuPeriod: cpuPeriodUS,
		Devices:   deviceRules,
	}
	if r.swapAccounting {
		// memory+swap == memory: the sandbox cannot swap.
		res.MemorySwap = lim.MemoryBytes
	}
	return &cgroups.Cgroup{
		// Relative: libcontainer nests it under the worker's own cgroup in
		// every hierarchy, so sandboxd never writes outside the cgroup it was
		// started in.
		Path:      path.Join(r.opts.CgroupParent, id),
		Resources: res,
	}
}

func rlimits(lim Limits) []configs.Rlimit {
	return []configs.Rlimit{
		{Type: unix.RLIMIT_NOFILE, Hard: lim.OpenFiles, Soft: lim.OpenFiles},
		{Type: unix.RLIMIT_CORE, Hard: 0, Soft: 0},
		{Type: unix.RLIMIT_FSIZE, Hard: uint64(lim.FileSizeBytes), Soft: uint64(lim.FileSizeBytes)},
	}
}
