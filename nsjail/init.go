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

// SetInitGOMAXPROCS makes every sandbox init this process starts from now on
// begin with GOMAXPROCS=1. libcontainer starts each init with this process's
// $GOMAXPROCS, and runc's init calls runtime.GOMAXPROCS(1) first thing:
// started with one P per CPU, its runtime sets the others up only to stop
// the world and drop them again, some 4 ms of CPU per sandbox start on a
// loaded 2-core VM (BenchmarkExecTrue's sandbox-cpu-ms). Go reads the
// variable when a process starts, so this process's own GOMAXPROCS stays as
// it is; the other children it starts inherit the variable (only Go programs
// read it, and sandboxed commands get an allowlisted environment only).
func SetInitGOMAXPROCS() error { return os.Setenv("GOMAXPROCS", "1") }
