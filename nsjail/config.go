package nsjail

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/cgroups"
	devcfg "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail/inside"
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
			{ContainerID: inside.UID, HostID: int64(r.opts.HostIDBase + inside.UID), Size: 1},
		},
		GIDMappings: []configs.IDMap{
			{ContainerID: 0, HostID: int64(r.opts.HostIDBase), Size: 1},
			{ContainerID: inside.GID, HostID: int64(r.opts.HostIDBase + inside.GID), Size: 1},
		},
		Mounts:        mounts(spec, lim),
		Devices:       devices(),
		MaskPaths:     maskedPaths(),
		ReadonlyPaths: readonlyPaths,
		// Loopback only: the sandbox has no route anywhere else.
		Networks: []*configs.Network{{Type: "loopback", Address: "127.0.0.1/0", Gateway: "localhost"}},
		Cgroups:  r.cgroupConfig(id, lim, spec.Background),
		// An empty set, not nil: nil keeps the full bounding set.
		Capabilities:    &configs.Capabilities{},
		NoNewPrivileges: true,
		Seccomp:         r.seccomp,
		Rlimits:         rlimits(lim),
		// A new session keyring per sandbox ("_ses.<id>", runc's default),
		// joined by libcontainer's init before seccomp is loaded: with
		// NoNewKeyring every sandbox kept the worker's session keyring, or
		// host root's user-session keyring when the worker had none
		// (SECURITY.md case 28). keyctl stays denied (SECURITY.md case 9).
		// Each live sandbox's keyring counts as one key of host uid
		// HostIDBase against kernel.keys.maxkeys (server/README.md).
		NoNewKeyring: false,
		Version:      "1.2.0",
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

// tmpfsInodes caps a sandbox tmpfs's inodes at one per 16 KiB of its size
// (at least 1024). Without nr_inodes the kernel allows half of the host's
// RAM pages, and empty files cost no bytes: their inodes and dentries
// (~1 KiB of slab each, not charged to the sandbox's v1 memory cgroup) could
// grow the host's kernel memory without bound (SECURITY.md case 33).
func tmpfsInodes(size int64) int64 { return max(1024, size/(16<<10)) }

func mounts(spec *Spec, lim Limits) []*configs.Mount {
	m := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: noSuidDevExec},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=64k,nr_inodes=128"},
		// Python multiprocessing's semaphores live in /dev/shm.
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: noSuidDevExec,
			Data: fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", lim.ShmBytes, tmpfsInodes(lim.ShmBytes))},
		{Source: "tmpfs", Destination: "/tmp", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV,
			Data: fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", lim.TmpBytes, tmpfsInodes(lim.TmpBytes))},
		// Read-only sysfs of the sandbox's own network namespace: numpy and
		// joblib read CPU topology from it; nothing there is writable.
		{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: noSuidDevExec | unix.MS_RDONLY},
	}
	if spec.Workspace != "" {
		flags := unix.MS_BIND | unix.MS_REC | unix.MS_NOSUID | unix.MS_NODEV
		if spec.WorkspaceReadOnly {
			flags |= unix.MS_RDONLY
		}
		m = append(m, &configs.Mount{
			Source: spec.Workspace, Destination: inside.Workspace, Device: "bind", Flags: flags,
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

// staticMaskedPaths hide kernel information that helps an attacker (kernel
// memory, keys, timing side channels); runc's defaults plus /proc/kallsyms
// and /sys/devices/virtual/powercap (RAPL energy counters, PLATYPUS,
// CVE-2020-8694).
var staticMaskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/kallsyms", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
	"/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
}

// maskedPaths are staticMaskedPaths plus every possible CPU's
// thermal_throttle directory (SECURITY.md case 27, Docker's
// GHSA-6fw5-f8r9-fgfm): its throttle counters, like the thermal interrupt
// counts in /proc/interrupts, are a host-wide thermal side channel on what
// runs on each core. libcontainer masks literal paths, so they are listed per
// CPU; the list is built once, without checking which exist (the kernel
// adds the directory when a CPU comes online, and libcontainer skips
// absent paths at each start). Directories after the first cost one bind
// mount each: libcontainer reuses one read-only tmpfs for all of them.
var maskedPaths = sync.OnceValue(func() []string {
	return append(slices.Clip(staticMaskedPaths), thermalThrottlePaths("/sys")...)
})

// thermalThrottlePaths lists /sys/devices/system/cpu/cpuN/thermal_throttle
// for every CPU in sysRoot's devices/system/cpu/possible.
func thermalThrottlePaths(sysRoot string) []string {
	data, err := os.ReadFile(filepath.Join(sysRoot, "devices/system/cpu/possible"))
	if err != nil {
		return nil // no sysfs CPU list, no per-CPU directories either
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(data)))
	if err != nil {
		return nil
	}
	paths := make([]string, 0, len(cpus))
	for _, n := range cpus {
		paths = append(paths, fmt.Sprintf("/sys/devices/system/cpu/cpu%d/thermal_throttle", n))
	}
	return paths
}

// maxCPUs bounds a CPU list (the kernel's NR_CPUS maximum is 8192).
const maxCPUs = 8192

// parseCPUList parses the kernel's CPU list format ("0-3,8,10-11").
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil || first < 0 {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil || last < first {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		if last >= maxCPUs || len(cpus)+last-first+1 > maxCPUs {
			return nil, fmt.Errorf("CPU list %q names more than %d CPUs", s, maxCPUs)
		}
		for n := first; n <= last; n++ {
			cpus = append(cpus, n)
		}
	}
	return cpus, nil
}

// readonlyPaths cannot be written even by the sandbox's root: /proc/sys
// (sysctls), /proc/sysrq-trigger (reboot, crash), irq and bus settings.
var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

const cpuPeriodUS = 100_000

// cgroupConfig is the sandbox's cgroup: its limits, and the background CPU
// weight when background (Spec.Background; each of libcontainer's managers
// writes its own: v1 cpu.shares, v2 cpu.weight).
func (r *Runner) cgroupConfig(id string, lim Limits, background bool) *cgroups.Cgroup {
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
	if background {
		res.CpuShares, res.CpuWeight = cgroup.BackgroundShares, cgroup.BackgroundWeight
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
