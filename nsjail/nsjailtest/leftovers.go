package nsjailtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/cgroup"
)

// CheckNoLeftovers reports every trace of a sandbox that outlived the suite:
// state directories under stateRoot, and cgroups under cgroupParent (relative
// to this process's own cgroup) in every mounted hierarchy. Empty parent
// cgroups, which this process created, are removed.
func CheckNoLeftovers(stateRoot, cgroupParent string) error {
	var errs []error
	if entries, err := os.ReadDir(stateRoot); err == nil && len(entries) > 0 {
		errs = append(errs, fmt.Errorf("state root %s holds %d entries (first: %s)", stateRoot, len(entries), entries[0].Name()))
	}
	dirs, err := ParentCgroupDirs(cgroupParent)
	if err != nil {
		errs = append(errs, err)
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		for _, e := range entries {
			if e.IsDir() {
				errs = append(errs, fmt.Errorf("cgroup %s left behind", filepath.Join(dir, e.Name())))
			}
		}
		if len(errs) == 0 {
			_ = os.Remove(dir)
		}
	}
	return errors.Join(errs...)
}

// ParentCgroupDirs lists <mountpoint>/<own cgroup>/<parent> for every cgroup
// hierarchy mounted on this host, from /proc/self/mountinfo and
// /proc/self/cgroup.
func ParentCgroupDirs(parent string) ([]string, error) {
	// On v2 the runner has moved this process into <own>/supervisor, so its
	// own cgroup is no longer the sandboxes' grandparent: ask the cgroup
	// package, which knows the delegation layout.
	if h, err := cgroup.Host(); err == nil && h.Mode.V2() {
		dirs, err := h.ParentDirs(parent)
		if err != nil {
			return nil, err
		}
		dir, _ := dirs.V2()
		return []string{dir}, nil
	}
	own := map[string]string{} // controller list ("memory", "cpu,cpuacct", "" for v2) → path
	data, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			own[parts[1]] = parts[2]
		}
	}
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(fields) {
			continue
		}
		fstype, mnt, opts := fields[sep+1], fields[4], fields[sep+3]
		var key string
		switch fstype {
		case "cgroup2":
			key = ""
		case "cgroup":
			for _, o := range strings.Split(opts, ",") {
				if o == "rw" || o == "ro" || o == "relatime" || o == "noexec" || o == "nosuid" || o == "nodev" {
					continue
				}
				if key != "" {
					key += ","
				}
				key += o
			}
		default:
			continue
		}
		if p, ok := own[key]; ok {
			dirs = append(dirs, filepath.Join(mnt, p, parent))
		}
	}
	return dirs, sc.Err()
}

// ProcessesMatching returns the pids of host processes whose command line
// contains s.
func ProcessesMatching(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), []byte(s)) && !dying(e.Name()) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// dying reports whether /proc/PID is a process that is already killed: a
// zombie, or SIGKILL pending. Such a process does not survive, but one in
// uninterruptible I/O (a busy disk: other test packages run in parallel)
// still shows its command line until that I/O ends.
func dying(pid string) bool {
	status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return true // gone meanwhile
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch key {
		case "State":
			if strings.HasPrefix(value, "Z") || strings.HasPrefix(value, "X") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(value, 16, 64); err == nil && mask&(1<<(9-1)) != 0 { // SIGKILL
				return true
			}
		}
	}
	return false
}

// RunAndCheck runs m's tests (each Runner made with NewRunner has waited
// for the background removal of its sandboxes when its test ended) and
// returns a failing exit code if anything of this binary's
// sandboxes (StateRoot and CgroupParent, plus any extra state-root/cgroup
// pairs) outlived them. The empty parents are removed. Use it as
// os.Exit(nsjailtest.RunAndCheck(m)) in TestMain.
func RunAndCheck(m *testing.M, extra ...[2]string) int {
	code := m.Run()
	// After the leftover check, which reports a mount leaked under a copy
	// (and RemoveUnmounted leaves such a copy alone).
	defer RemoveRootfsCopies()
	if os.Geteuid() != 0 {
		return code
	}
	for _, p := range append([][2]string{{StateRoot, CgroupParent}}, extra...) {
		if err := CheckNoLeftovers(p[0], p[1]); err != nil {
			fmt.Fprintln(os.Stderr, "LEFTOVERS after the suite:", err)
			code = 1
		}
		os.RemoveAll(p[0])
	}
	os.Remove(filepath.Dir(StateRoot))
	return code
}
