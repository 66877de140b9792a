package nsjail

import (
	"os"
	"runtime"

	"github.com/opencontainers/runc/libcontainer"
	// Without the devices package the cgroup manager cannot apply device
	// rules and every start fails.
	_ "github.com/opencontainers/cgroups/devices"
	// nsenter's C constructor does the namespace dance before the Go runtime
	// starts, when this binary is re-executed as "init".
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// A sandbox's first process is this very binary, re-executed by libcontainer
// as "/proc/self/exe init". Any binary that imports nsjail (sandboxd itself,
// and every test binary that starts sandboxes) must become libcontainer's init
// then, before its own main or tests run.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init() // never returns
	}
	// Keep the main goroutine on the main thread for good. libcontainer
	// enters a sandbox's mount namespace from a locked goroutine that exits
	// without unlocking (its "mount source" thread), and Go terminates such a
	// thread - except the main thread, which it wedges instead. Wedged in a
	// sandbox's mount namespace, the main thread would keep that sandbox's
	// tmpfs mounts alive after it is destroyed, and /proc/self (which follows
	// the main thread) would show the sandbox's mounts to the whole worker.
	runtime.LockOSThread()
}
