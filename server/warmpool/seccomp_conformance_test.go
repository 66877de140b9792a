package warmpool_test

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/seccomp"
)

// deniedSyscallsScript is the seccomp package's probe suite (TestProbeDenied,
// SECURITY.md cases 9, 10 and 26) as a conformance script, so that it runs
// cold and warm, on zygotes and template forks (TestWarmMatchesCold), with
// the pool's own runtime image and filter: every syscall the default profile
// denies, made with zero arguments as sysprobe's "nr N" makes it, clone with
// each CLONE_NEW* flag (with CLONE_THREAD, EINVAL if let through), socket
// of the refused families and, on x86_64, an x32 call (in a child: it kills
// the calling thread). The script prints each outcome; the test pins them
// on the cold run (wantDeniedSyscalls) and compareResults holds the warm
// run to it. ok is false where libseccomp's tables are not built in
// (-tags seccomp).
func deniedSyscallsScript(t *testing.T) (script string, ok bool) {
	native, err := seccomp.NativeArch()
	if err != nil {
		return "", false
	}
	p := seccomp.Default()
	above, err := p.ENOSYSAbove(native)
	if err != nil {
		return "", false
	}
	nr := func(name string) int {
		n, ok := seccomp.SyscallNumber(name, native)
		if !ok {
			t.Fatalf("%s unknown on %s", name, native)
		}
		return n
	}
	var calls []string
	call := func(label string, n int, args ...uint64) {
		a := make([]string, 6)
		for i := range a {
			a[i] = "0"
			if i < len(args) {
				a[i] = fmt.Sprint(args[i])
			}
		}
		calls = append(calls, fmt.Sprintf("(%q, %d, (%s))", label, n, strings.Join(a, ", ")))
	}
	for _, d := range p.Denied {
		for _, name := range d.Names {
			if n, ok := seccomp.SyscallNumber(name, native); ok {
				call(name, n)
			}
		}
	}
	for name, flag := range map[string]uint64{"NEWUSER": unix.CLONE_NEWUSER, "NEWNS": unix.CLONE_NEWNS,
		"NEWPID": unix.CLONE_NEWPID, "NEWNET": unix.CLONE_NEWNET, "NEWUTS": unix.CLONE_NEWUTS,
		"NEWIPC": unix.CLONE_NEWIPC, "NEWCGROUP": unix.CLONE_NEWCGROUP} {
		call("clone-"+name, nr("clone"), flag|unix.CLONE_THREAD)
	}
	for name, fam := range map[string]uint64{"netlink": unix.AF_NETLINK, "packet": unix.AF_PACKET,
		"vsock": unix.AF_VSOCK, "alg": unix.AF_ALG, "unix-with-high-bits": 1<<32 | unix.AF_UNIX} {
		call("socket-"+name, nr("socket"), fam, 1)
	}
	call("first-number-above-profile", above+1)
	x32 := "None"
	if native == seccomp.ArchX86_64 {
		x32 = "0x40000000 | 39" // x32 getpid
	}
	return `import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CALLS = [` + strings.Join(calls, ",\n    ") + `]
out = []
for label, nr, args in sorted(CALLS):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    out.append("%s=%s" % (label, "let-through" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())))
X32 = ` + x32 + `
if X32 is not None:
    pid = os.fork()
    if pid == 0:
        libc.syscall(ctypes.c_long(X32))
        os._exit(0)
    st = os.waitpid(pid, 0)[1]
    out.append("x32-getpid=%s" % (signal.Signals(os.WTERMSIG(st)).name if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st)))
print("\n".join(out))
`, true
}

// wantDeniedSyscalls checks the cold run's outcomes of deniedSyscallsScript:
// each call refused by the filter (EPERM, ENOSYS above the profile's
// numbers and for clone3, EAFNOSUPPORT for the refused families), the x32
// call killed by SIGSYS.
func wantDeniedSyscalls(t *testing.T, stdout string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) < 20 {
		t.Fatalf("denied syscalls: only %d outcomes:\n%s", len(lines), stdout)
	}
	for _, l := range lines {
		label, got, _ := strings.Cut(l, "=")
		want := []string{"EPERM", "ENOSYS"}
		switch {
		case strings.HasPrefix(label, "socket-"):
			want = []string{"EAFNOSUPPORT"}
		case label == "x32-getpid":
			want = []string{"SIGSYS"}
		}
		ok := false
		for _, w := range want {
			ok = ok || got == w
		}
		if !ok {
			t.Errorf("denied syscalls: %s = %s, want one of %v", label, got, want)
		}
	}
	t.Logf("denied syscalls: %d outcomes checked", len(lines))
}
