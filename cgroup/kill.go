package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// killTimeout bounds how long KillAll waits for a cgroup to empty. SIGKILL
// cannot be ignored, so only a task stuck in uninterruptible sleep (D state,
// e.g. on a dead NFS server) makes it expire.
var killTimeout = 10 * time.Second

// KillAll SIGKILLs every process in a sandbox's cgroups (paths as from
// libcontainer's GetPaths(), child cgroups included) and returns once they
// are all gone from cgroup.procs. It is for the processes the worker started
// in its own sandbox cgroup.
//
// On cgroup v2 with Linux 5.14 or later it writes cgroup.kill, which kills
// the whole subtree atomically, forks in flight included. Otherwise (v1, older
// v2) it loops without freezing: read cgroup.procs, SIGKILL each pid, until
// empty; a fork bomb cannot outrun it because every round kills whatever
// exists and the pids limit bounds new ones. Each pid is signalled through a
// pidfd (Linux 5.3+) opened before its membership is confirmed, so a pid that
// exited and was reused by an outside process between the read and the kill
// is never hit; older kernels fall back to kill(2).
//
// Zombies leave cgroup.procs when they exit (before they are reaped), so
// KillAll does not wait for the caller to reap its own children, and the
// cgroups can be removed before that too. A cgroup that no longer exists
// holds nothing to kill: KillAll is idempotent.
func KillAll(paths Paths) error {
	dirs := uniqueDirs(paths)
	if len(dirs) == 0 {
		return errors.New("cgroup kill: no cgroup paths given")
	}
	cgroupKill(paths) // on failure the loop below does the work and reports what is left
	deadline := time.Now().Add(killTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		pids, err := procs(dirs)
		if err != nil {
			return fmt.Errorf("cgroup kill: %w", err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup kill: processes %v still in %s after %v of SIGKILL (uninterruptible sleep?)", pids, strings.Join(dirs, ", "), killTimeout)
		}
		if err := killPids(dirs, pids); err != nil {
			return fmt.Errorf("cgroup kill: %w", err)
		}
		thawV1(paths)
		time.Sleep(wait)
	}
}

// KillOnce is one round of KillAll without its wait: it sends SIGKILL to
// every process in a sandbox's cgroups (cgroup.kill on v2, else a pidfd
// per listed pid, as KillAll) and returns at once. It is for a cgroup that
// is frozen (nsjail's end of a sandbox frozen on its done word, SECURITY.md
// case 72), whose tasks cannot fork meanwhile, so one round reaches them
// all; the caller thaws it (a frozen v1 task takes the signal as it is
// thawed) and waits for their end its own way: KillAll's wait re-reads
// every hierarchy's cgroup.procs each round until they are gone, ~5 ms of
// the worker's CPU per execution on v1 (TEMPLATE.md M5), where the
// sandbox's init's exit says the same.
func KillOnce(paths Paths) error {
	dirs := uniqueDirs(paths)
	if len(dirs) == 0 {
		return errors.New("cgroup kill: no cgroup paths given")
	}
	if cgroupKill(paths) {
		return nil
	}
	pids, err := procs(dirs)
	if err != nil {
		return fmt.Errorf("cgroup kill: %w", err)
	}
	if err := killPids(dirs, pids); err != nil {
		return fmt.Errorf("cgroup kill: %w", err)
	}
	return nil
}

// cgroupKill kills a v2 cgroup's whole subtree at once through
// cgroup.kill (Linux 5.14+; frozen tasks and forks in flight included). It
// says whether it did: false on v1, on an older kernel, or on an error.
func cgroupKill(paths Paths) bool {
	d, ok := paths.V2()
	if !ok {
		return false
	}
	kill := filepath.Join(d, "cgroup.kill")
	return fileExists(kill) && writeFile(kill, "1") == nil
}

// thawV1 thaws a v1 freezer cgroup after a kill: a frozen task (a session
// kernel idles frozen, SECURITY.md case 47; a sandbox is frozen on its
// done word, case 72) takes a SIGKILL only once thawed there, and dies
// then without running its own code again. v2's freezer lets a fatal signal through (and cgroup.kill
// reaches frozen tasks). A cgroup without a freezer file is left alone.
func thawV1(paths Paths) {
	if d, ok := paths["freezer"]; ok && d != "" {
		if f := filepath.Join(d, "freezer.state"); fileExists(f) {
			_ = writeFile(f, "THAWED")
		}
	}
}

// killPids SIGKILLs pids, each only if it is still a member after a pidfd
// pins its identity.
func killPids(dirs []string, pids []int) error {
	fds := map[int]int{}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	legacy := false
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		switch {
		case err == nil:
			fds[pid] = fd
		case errors.Is(err, unix.ENOSYS):
			legacy = true // Linux < 5.3
		case errors.Is(err, unix.ESRCH), errors.Is(err, unix.EINVAL):
			// Already gone. EINVAL: an exiting process can still be listed
			// in cgroup.procs after it stopped being a thread-group leader,
			// which pidfd_open refuses (seen on 6.1 right after
			// cgroup.kill); the next round reads the list again.
		default:
			return fmt.Errorf("pidfd_open(%d): %w", pid, err)
		}
	}
	if legacy {
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill(%d): %w", pid, err)
			}
		}
		return nil
	}
	still, err := procs(dirs)
	if err != nil {
		return err
	}
	for _, pid := range still {
		fd, ok := fds[pid]
		if !ok {
			continue // new since the first read: next round
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pidfd_send_signal(%d): %w", pid, err)
		}
	}
	return nil
}

// procs lists the pids in dirs and their descendants' cgroup.procs.
func procs(dirs []string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed already (or meanwhile): nothing to kill
				}
				return err
			}
			if !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					return fmt.Errorf("%s/cgroup.procs: bad pid %q", p, f)
				}
				if !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
