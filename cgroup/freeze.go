package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Freeze freezes every task of a sandbox's cgroup (paths as for
// ReadStats): v1 writes FROZEN to freezer.state, v2 1 to cgroup.freeze,
// and it returns once the kernel says every task is frozen. It waits with
// short sleeps growing to 0.1 ms (the task must be woken and scheduled to
// freeze, ~1 ms on a busy 2-core VM: longer sleeps only add to the
// answer), writing the request again each time, and
// gives up at timeout, thawing what it froze. A v1 cgroup can stay
// FREEZING for good: a multi-threaded process in execve waits for its
// other threads to die, which frozen they never do (seen with runc's init
// right after a start); so after stuckAfter of FREEZING it thaws, lets the
// tasks run a moment, and freezes again, as libcontainer's Pause does.
// Pause's own policy (a thaw and a 10 ms sleep after every 50 quick
// reads) put 10 ms on the 99th percentile of a session kernel's execution
// (SECURITY.md case 47).
func Freeze(paths Paths, timeout time.Duration) error {
	file, request, frozen, err := freezer(paths)
	if err != nil {
		return err
	}
	const stuckAfter = 20 * time.Millisecond
	deadline := time.Now().Add(timeout)
	attempt := time.Now()
	for wait := 10 * time.Microsecond; ; wait = min(2*wait, 100*time.Microsecond) {
		if time.Since(attempt) > stuckAfter {
			Thaw(paths)
			time.Sleep(time.Millisecond)
			attempt, wait = time.Now(), 10*time.Microsecond
		}
		if err := writeFile(file, request); err != nil {
			Thaw(paths)
			return fmt.Errorf("cgroup freeze: %w", err)
		}
		ok, err := frozen()
		if err != nil {
			Thaw(paths)
			return fmt.Errorf("cgroup freeze: %w", err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			Thaw(paths)
			return fmt.Errorf("cgroup freeze: %s not frozen after %v", filepath.Dir(file), timeout)
		}
		pause(wait)
	}
}

// pause sleeps d. Below a millisecond it blocks the thread in
// nanosleep(2) instead of using a Go timer: Go's timers wait in
// epoll_wait, whose timeout is in whole milliseconds, so on an otherwise
// idle worker time.Sleep(10*time.Microsecond) lasts a millisecond
// (runtime/netpoll_epoll.go rounds it up). A session kernel's every
// execution waited that long for its freeze, which takes tens of
// microseconds (p50 0.1 ms, but 1.1 ms whenever the worker was idle).
func pause(d time.Duration) {
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

// Thaw lets the tasks of a cgroup Freeze froze run again.
func Thaw(paths Paths) error {
	file, _, _, err := freezer(paths)
	if err != nil {
		return err
	}
	value := "THAWED"
	if _, ok := paths.V2(); ok {
		value = "0"
	}
	if err := writeFile(file, value); err != nil {
		return fmt.Errorf("cgroup thaw: %w", err)
	}
	return nil
}

// freezer is the file that freezes the cgroup, what to write there to
// freeze it, and how to tell it is frozen.
func freezer(paths Paths) (file, request string, frozen func() (bool, error), err error) {
	if dir, ok := paths.V2(); ok {
		file = filepath.Join(dir, "cgroup.freeze")
		return file, "1", func() (bool, error) {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			if err != nil {
				return false, err
			}
			for _, line := range strings.Split(string(b), "\n") {
				if line == "frozen 1" {
					return true, nil
				}
			}
			return false, nil
		}, nil
	}
	dir, ok := paths["freezer"]
	if !ok || dir == "" {
		return "", "", nil, errors.New("cgroup freeze: no freezer hierarchy")
	}
	file = filepath.Join(dir, "freezer.state")
	return file, "FROZEN", func() (bool, error) {
		b, err := os.ReadFile(file)
		return strings.TrimSpace(string(b)) == "FROZEN", err
	}, nil
}
