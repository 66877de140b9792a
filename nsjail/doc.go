// Package nsjail is one sandbox's life: a Spec is validated, turned into a
// libcontainer config, started, held to its deadline and its caller's
// context, waited for, classified into a typed Result, and removed. Each
// sandbox runs one command once, in new user, pid, net (loopback only),
// mount, ipc, uts and cgroup namespaces, as inside.UID with no
// capabilities, no_new_privs, a read-only root, a seccomp allowlist and
// cgroup limits; afterwards its container, cgroups, mounts and state are
// gone. Sweep removes what a killed worker left behind.
//
// A sandbox is started either at once for its command (Runner.Run, or
// Start then Wait) or in two phases, for the warm pool: Runner.Prestart
// starts a command that prepares and then waits for its execution on the
// caller's fds, and Pending.Handoff gives it the execution, from which
// moment its deadline, times and output count (prestart.go).
//
// The name is Google's nsjail, whose role the package took; it neither runs
// nor wraps nsjail, and is built on runc's libcontainer.
//
// The order in which the kernel features are applied is stated once, in
// config.go (buildConfig). What code sees inside (its user, PATH, workspace
// layout) is package nsjail/inside.
package nsjail
