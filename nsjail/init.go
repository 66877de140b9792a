package nsjail

import (
	"os"

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
}
