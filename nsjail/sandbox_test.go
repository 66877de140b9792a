package nsjail_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"golang.org/x/sys/unix"
)

// Every test binary gets its own state root and cgroup parent, so the
// leftover check at the end sees only what this binary created.
var (
	testStateRoot    = nsjailtest.StateRoot
	testCgroupParent = nsjailtest.CgroupParent
)

func TestMain(m *testing.M) {
	switch os.Getenv("CRASHY_WORKER") {
	case "1":
		crashyWorker()
		return
	case "template":
		crashyTemplateWorker()
		return
	}
	os.Exit(nsjailtest.RunAndCheck(m))
}

var quietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func newRunner(t testing.TB) *nsjail.Runner {
	t.Helper()
	return nsjailtest.NewRunner(t, nsjail.Options{StateRoot: testStateRoot, CgroupParent: testCgroupParent, Logger: quietLog})
}

func run(t *testing.T, r *nsjail.Runner, spec nsjail.Spec) *nsjail.Result {
	t.Helper()
	if spec.Rootfs == "" {
		spec.Rootfs = nsjailtest.ProbeRootfs(t)
	}
	res, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Status == nsjail.StatusSandboxError {
		t.Fatalf("sandbox error: %s", res.Error)
	}
	return res
}

func sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}

func wantStatus(t *testing.T, res *nsjail.Result, want nsjail.Status) {
	t.Helper()
	if res.Status != want {
		t.Fatalf("status = %s, want %s (exit %d, signal %q, limits %v)\nstdout: %s\nstderr: %s",
			res.Status, want, res.ExitCode, res.Signal, res.LimitsHit, res.Stdout, res.Stderr)
	}
}

func wantLimit(t *testing.T, res *nsjail.Result, limit string) {
	t.Helper()
	if !slices.Contains(res.LimitsHit, limit) {
		t.Fatalf("limits_hit = %v, want %s in it (status %s)\nstderr: %s", res.LimitsHit, limit, res.Status, res.Stderr)
	}
}

func TestExitCodesAndOutput(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh("echo out; echo err >&2; exit 0")})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	res = run(t, r, nsjail.Spec{Args: sh("exit 3")})
	wantStatus(t, res, nsjail.StatusFailed)
	if res.ExitCode != 3 || res.Signal != "" {
		t.Fatalf("exit %d signal %q, want 3", res.ExitCode, res.Signal)
	}
	// A signal we did not send is a failure, not a timeout or an OOM.
	res = run(t, r, nsjail.Spec{Args: []string{"/bin/probe", "segv"}})
	wantStatus(t, res, nsjail.StatusFailed)
	if res.Signal != "SIGSEGV" || res.ExitCode != 139 {
		t.Fatalf("signal %q exit %d, want SIGSEGV", res.Signal, res.ExitCode)
	}
	if res.StartedAt.IsZero() || res.FinishedAt.Before(res.StartedAt) {
		t.Fatalf("bad timestamps %v %v", res.StartedAt, res.FinishedAt)
	}
}

func TestStdinIsPassed(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: []string{"cat"}, Stdin: strings.NewReader("hello stdin")})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if string(res.Stdout) != "hello stdin" {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

func TestInvalidSpecStartsNothing(t *testing.T) {
	r := newRunner(t)
	for name, spec := range map[string]nsjail.Spec{
		"no rootfs":       {Args: []string{"true"}},
		"relative rootfs": {Rootfs: "rel", Args: []string{"true"}},
		"missing rootfs":  {Rootfs: "/nonexistent-rootfs", Args: []string{"true"}},
		"no command":      {Rootfs: "/"},
		"bad id":          {Rootfs: "/", ID: "../escape", Args: []string{"true"}},
		"bad env":         {Rootfs: "/", Args: []string{"true"}, Env: []string{"NOEQUALS"}},
		"negative pids":   {Rootfs: "/", Args: []string{"true"}, Limits: nsjail.Limits{Pids: -1}},
	} {
		if _, err := r.Run(context.Background(), spec); err == nil {
			t.Errorf("%s: Run accepted an invalid spec", name)
		}
	}
	entries, _ := os.ReadDir(testStateRoot)
	if len(entries) != 0 {
		t.Fatalf("state root has %d entries after rejected specs", len(entries))
	}
}

// A valid spec that cannot start (its command does not exist) is a
// *nsjail.StartError from Start, a sandbox_error Result from Run, and
// leaves nothing behind.
func TestStartFailureIsAStartError(t *testing.T) {
	r := newRunner(t)
	spec := nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: []string{"/no/such/command"}}
	sb, err := r.Start(spec)
	var se *nsjail.StartError
	if sb != nil || !errors.As(err, &se) || !strings.HasPrefix(se.ID, "sbx-") || !strings.Contains(err.Error(), "unable to start sandbox") {
		t.Fatalf("Start = %v, %v; want a *nsjail.StartError", sb, err)
	}
	res, err := r.Run(context.Background(), spec)
	if err != nil || res.Status != nsjail.StatusSandboxError || !strings.Contains(res.Error, "unable to start sandbox") {
		t.Fatalf("Run = %+v, %v; want a sandbox_error result", res, err)
	}
	r.WaitForCleanup()
	if entries, _ := os.ReadDir(testStateRoot); len(entries) != 0 {
		t.Fatalf("state root has %d entries after failed starts", len(entries))
	}
}

// SECURITY.md case 1: fork bomb and thread bomb.
func TestForkBombHitsPidsLimit(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{
		Args:   sh(`bomb() { bomb | bomb & }; bomb; sleep 2; echo survived`),
		Limits: nsjail.Limits{Pids: 32, Timeout: 5 * time.Second},
	})
	wantLimit(t, res, nsjail.LimitPids)
	// The pids controller refuses fork with EAGAIN, which the shell reports.
	if !bytes.Contains(res.Stderr, []byte("can't fork: Resource temporarily unavailable")) {
		t.Fatalf("want the shell's fork to fail with EAGAIN, stderr: %.300s", res.Stderr)
	}
}

func TestThreadBombHitsPidsLimit(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: []string{"/bin/probe", "threadbomb"},
		Limits: nsjail.Limits{Pids: 48, Timeout: 10 * time.Second}})
	wantStatus(t, res, nsjail.StatusFailed)
	wantLimit(t, res, nsjail.LimitPids)
	if !bytes.Contains(res.Stderr, []byte("errno=11")) { // EAGAIN from clone
		t.Fatalf("want the runtime to report EAGAIN, stderr: %.500s", res.Stderr)
	}
}

// SECURITY.md case 2: memory bomb. The OOM-killed process is a child of a shell
// that exits 0: the status comes from the cgroup's counter, not exit codes.
func TestMemoryBombIsOOM(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{
		Args:   sh(`x=$(head -c 200000000 /dev/zero | tr '\0' a); echo "$x" | wc -c; exit 0`),
		Limits: nsjail.Limits{MemoryBytes: 32 << 20, Timeout: 20 * time.Second},
	})
	wantStatus(t, res, nsjail.StatusOOM)
	wantLimit(t, res, nsjail.LimitMemory)
	if res.Usage.PeakMemoryBytes < 16<<20 {
		t.Fatalf("peak memory %d, want close to the 32MiB limit", res.Usage.PeakMemoryBytes)
	}
	// The worker is unaffected: the next sandbox runs normally.
	wantStatus(t, run(t, r, nsjail.Spec{Args: []string{"true"}}), nsjail.StatusSucceeded)
}

// SECURITY.md cases 3 and 33: /tmp and /dev/shm fill up at their size, and
// empty files at their inode limit; case 4: the root is read-only.
func TestFilesystemLimits(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{
		Args: sh(`
			dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1 | grep -o 'No space left on device' | head -1
			dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1 | grep -o 'No space left on device' | head -1
			for p in /rootfile /bin/newfile /etc/passwd; do echo x 2>&1 > $p | grep -o 'Read-only file system'; done
			mkdir /usr/x 2>&1 | grep -o 'Read-only file system'
			# Empty files cost no bytes: the inode limit stops them.
			rm -f /tmp/fill /dev/shm/fill
			for d in /tmp /dev/shm; do
				i=0; while [ $i -lt 5000 ] && true 2>/dev/null > $d/e$i; do i=$((i+1)); done; echo $d $i
			done`),
		Limits: nsjail.Limits{TmpBytes: 4 << 20, ShmBytes: 2 << 20},
	})
	wantStatus(t, res, nsjail.StatusSucceeded)
	// 1024 inodes each, one of them the root directory.
	want := "No space left on device\nNo space left on device\n" + strings.Repeat("Read-only file system\n", 4) +
		"/tmp 1023\n/dev/shm 1023\n"
	if string(res.Stdout) != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

func TestRootfsIsUnchanged(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.ProbeRootfs(t)
	before := treeDigest(t, rootfs)
	run(t, r, nsjail.Spec{Args: sh(`rm -rf /bin/* 2>/dev/null; echo x > /etc/passwd; touch /new; true`)})
	if after := treeDigest(t, rootfs); after != before {
		t.Fatal("the rootfs changed after a sandbox tried to write to it")
	}
}

func treeDigest(t *testing.T, dir string) string {
	h := sha256.New()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %d %d\n", p, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func TestWorkspaceIsWritable(t *testing.T) {
	r := newRunner(t)
	ws := t.TempDir()
	if err := os.Chown(ws, r.HostUID(), r.HostGID()); err != nil {
		t.Fatal(err)
	}
	res := run(t, r, nsjail.Spec{Args: sh("pwd; echo data > out.txt; ls -ln out.txt"), Workspace: ws, Cwd: inside.Workspace})
	wantStatus(t, res, nsjail.StatusSucceeded)
	got, err := os.ReadFile(filepath.Join(ws, "out.txt"))
	if err != nil || string(got) != "data\n" {
		t.Fatalf("workspace file: %q %v (stdout %s, stderr %s)", got, err, res.Stdout, res.Stderr)
	}
	if !bytes.HasPrefix(res.Stdout, []byte(inside.Workspace+"\n")) || !bytes.Contains(res.Stdout, fmt.Appendf(nil, " %d ", inside.UID)) {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

// SECURITY.md case 5: busy loop and a SIGTERM-ignoring process.
func TestTimeoutKillsBusyAndTermIgnoringProcesses(t *testing.T) {
	r := newRunner(t)
	for name, script := range map[string]string{
		"busy loop":     `while :; do :; done`,
		"ignores TERM":  `trap '' TERM INT HUP; while :; do sleep 1; done`,
		"busy children": `for i in 1 2 3; do (while :; do :; done) & done; wait`,
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			res := run(t, r, nsjail.Spec{Args: sh(script), Limits: nsjail.Limits{Timeout: 500 * time.Millisecond}})
			wantStatus(t, res, nsjail.StatusTimeout)
			wantLimit(t, res, nsjail.LimitTimeout)
			if res.Signal != "SIGKILL" {
				t.Fatalf("signal %q, want SIGKILL", res.Signal)
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the deadline did not stop the sandbox (took %s)", time.Since(start))
			}
		})
	}
}

func TestCancel(t *testing.T) {
	r := newRunner(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	res, err := r.Run(ctx, nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh("sleep 60")})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, res, nsjail.StatusCancelled)
}

// SECURITY.md case 6 and 7: a setsid daemon that outlives main, and a grandchild
// holding stdout open. Main exits at once; the collection must not hang and
// no process may survive.
func TestNoProcessSurvivesAndNoHang(t *testing.T) {
	r := newRunner(t)
	marker := fmt.Sprintf("sandboxd-survivor-%d", time.Now().UnixNano())
	res := run(t, r, nsjail.Spec{
		Args:   sh(fmt.Sprintf(`(setsid sh -c 'exec -a %s sleep 2900' &) ; (sleep 2900 &) ; echo main done`, marker)),
		Limits: nsjail.Limits{Timeout: 30 * time.Second},
	})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if res.Usage.WallMS > 10_000 {
		t.Fatalf("collection waited for the grandchildren (%d ms)", res.Usage.WallMS)
	}
	if pids := nsjailtest.ProcessesMatching(marker); len(pids) > 0 {
		t.Fatalf("processes survived the execution: %v", pids)
	}
	if pids := nsjailtest.ProcessesMatching("sleep 2900"); len(pids) > 0 {
		t.Fatalf("processes survived the execution: %v", pids)
	}
}

// SECURITY.md case 8: a 1 GB flood, invalid UTF-8 and one giant line; its
// head and its tail are kept.
func TestOutputFloodIsCapped(t *testing.T) {
	r := newRunner(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := run(t, r, nsjail.Spec{
		Args:   sh(`head -c 1000000000 /dev/zero | tr '\0' '\377'; printf 'end'; printf 'tail' >&2`),
		Limits: nsjail.Limits{StdoutBytes: 64 << 10, Timeout: 60 * time.Second},
	})
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	wantStatus(t, res, nsjail.StatusSucceeded)
	wantLimit(t, res, nsjail.LimitStdout)
	if !res.StdoutTruncated || len(res.Stdout) != 64<<10 || res.StdoutBytes != 1_000_000_003 {
		t.Fatalf("truncated=%v kept=%d total=%d", res.StdoutTruncated, len(res.Stdout), res.StdoutBytes)
	}
	if res.Stdout[0] != 0xff || !bytes.HasSuffix(res.Stdout, []byte("\xff\xffend")) || string(res.Stderr) != "tail" || res.StderrTruncated {
		t.Fatalf("content mangled: %x…%x %q", res.Stdout[:4], res.Stdout[len(res.Stdout)-8:], res.Stderr)
	}
	if grew := int64(after.TotalAlloc) - int64(before.TotalAlloc); grew > 32<<20 {
		t.Fatalf("the worker allocated %d MiB while draining 1 GB", grew>>20)
	}
}

// SECURITY.md case 11: the inside view.
func TestInsideView(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(`id -u; id -g; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; /bin/probe setuid0; hostname`)})
	wantStatus(t, res, nsjail.StatusSucceeded)
	want := fmt.Sprintf("%d\n%d\n", inside.UID, inside.GID) +
		"CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n" +
		"CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nEPERM\nsandbox\n"
	if string(res.Stdout) != want {
		t.Fatalf("inside view:\n%s\nwant:\n%s", res.Stdout, want)
	}
}

// SECURITY.md case 12: /proc/sys, sysrq-trigger and /sys are not writable;
// kcore and keys are masked. Case 10 (network): only loopback exists. Each
// path gets the errno its protection gives: EACCES for the root-only files
// under the read-only binds of /proc (the permission check comes first),
// EROFS for sysfs (the sandbox's own, mounted read-only); ENOENT only where
// this kernel has no such file (checked on the host: this one is built
// without CONFIG_MAGIC_SYSRQ and CONFIG_UEVENT_HELPER).
func TestProcAndSysAreProtected(t *testing.T) {
	knobs := []struct{ path, errno string }{
		{"/proc/sys/kernel/hostname", "EACCES"},
		{"/proc/sysrq-trigger", "EACCES"},
		{"/sys/kernel/uevent_helper", "EROFS"}, // a helper the host would run
		{"/proc/sys/vm/drop_caches", "EACCES"},
		{"/sys/kernel/rcu_expedited", "EROFS"}, // a sysfs knob this kernel has
	}
	masked := []string{"/proc/kcore", "/proc/keys"}
	var script strings.Builder
	for _, k := range knobs {
		fmt.Fprintf(&script, "/bin/probe openwrite %s\n", k.path)
	}
	for _, m := range masked {
		fmt.Fprintf(&script, "if [ -e %[1]s ]; then wc -c < %[1]s; else echo absent; fi\n", m)
	}
	script.WriteString("ls /sys/class/net\n")
	var want []string
	onHost := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for _, k := range knobs {
		if !onHost(k.path) {
			k.errno = "ENOENT"
		}
		want = append(want, k.errno)
	}
	for _, m := range masked {
		if onHost(m) {
			want = append(want, "0") // bound to /dev/null: empty
		} else {
			want = append(want, "absent")
		}
	}
	want = append(want, "lo")

	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(script.String())})
	wantStatus(t, res, nsjail.StatusSucceeded)
	got := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q (paths %v, masked %v, then the interfaces)\nstderr: %s", got, want, knobs, masked, res.Stderr)
	}
}

// SECURITY.md case 10: the network namespace has only loopback, so every
// address off this host is unreachable (no exfiltration, no SSRF towards
// the metadata service or the LAN), while loopback itself works.
func TestOnlyLoopbackIsReachable(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(`
		for a in "1.1.1.1 53" "10.0.0.1 80" "169.254.169.254 80" "192.168.1.1 80" "2606:4700::1111 53" "::ffff:8.8.8.8 53"; do
			/bin/probe connect $a
		done
		/bin/probe connect 127.0.0.1 9
		/bin/probe connect ::1 9`)})
	wantStatus(t, res, nsjail.StatusSucceeded)
	want := strings.Repeat("ENETUNREACH\n", 6) + "ECONNREFUSED\nECONNREFUSED\n"
	if string(res.Stdout) != want {
		t.Fatalf("connect results:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

// SECURITY.md case 27 (Docker's GHSA-6fw5-f8r9-fgfm): each CPU's thermal
// throttle counters are hidden: the directory is an empty tmpfs inside.
// Only hosts whose CPUs have them (Intel, bare metal) can run it.
func TestThermalThrottleIsMasked(t *testing.T) {
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu*/thermal_throttle")
	if len(dirs) == 0 {
		t.Skip("no /sys/devices/system/cpu/cpu*/thermal_throttle on this host")
	}
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(`for d in "$@"; do echo "$d $(ls -A "$d" | wc -l)"; done`, dirs...)})
	wantStatus(t, res, nsjail.StatusSucceeded)
	for _, d := range dirs {
		if !strings.Contains(string(res.Stdout), d+" 0\n") {
			t.Errorf("%s is not empty inside the sandbox:\n%s", d, res.Stdout)
		}
	}
}

// SECURITY.md case 28: each sandbox gets a new session keyring of its own,
// as runc gives a container by default, instead of the worker's. The probe
// needs keyctl, which the real profile denies (SECURITY.md case 9), so this
// sandbox runs under the profile plus keyctl.
func TestSessionKeyringIsTheSandboxOwn(t *testing.T) {
	nsjailtest.RequireRoot(t)
	filter := nsjailtest.KeyctlProfile(t)
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: testStateRoot, CgroupParent: testCgroupParent, Seccomp: filter, Logger: quietLog})
	worker, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, r, nsjail.Spec{Args: []string{"/bin/probe", "keyring"}})
	wantStatus(t, res, nsjail.StatusSucceeded)
	serial, desc, _ := strings.Cut(strings.TrimSpace(string(res.Stdout)), " ")
	if serial == strconv.Itoa(worker) {
		t.Errorf("the sandbox shares the worker's session keyring %d: %s", worker, res.Stdout)
	}
	if want := ";_ses." + res.ID; !strings.HasSuffix(desc, want) {
		t.Errorf("session keyring inside: %q, want a keyring named _ses.%s", res.Stdout, res.ID)
	}
}

// SECURITY.md case 13: nothing of the worker's environment leaks in.
func TestEnvironmentIsOnlyTheSpec(t *testing.T) {
	r := newRunner(t)
	t.Setenv("SANDBOXD_TEST_SECRET", "hunter2")
	res := run(t, r, nsjail.Spec{Args: []string{"env"}, Env: []string{"ALLOWED=1"}})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if bytes.Contains(res.Stdout, []byte("hunter2")) {
		t.Fatal("the worker's environment leaked into the sandbox")
	}
	got := strings.Fields(string(res.Stdout))
	slices.Sort(got)
	// HOME comes from the sandbox user's passwd entry (libcontainer sets it).
	if want := []string{"ALLOWED=1", "HOME=/tmp", "PATH=" + inside.DefaultPath}; !slices.Equal(got, want) {
		t.Fatalf("env = %v, want %v", got, want)
	}
}

// SECURITY.md case 14 (CVE-2019-5736): the sandbox cannot open the runtime's
// binary for writing through /proc/self/exe or /proc/1/exe.
func TestCannotOverwriteRuntimeBinary(t *testing.T) {
	r := newRunner(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := fileDigest(t, self)
	res := run(t, r, nsjail.Spec{Args: sh(`/bin/probe openwrite /proc/self/exe; /bin/probe openwrite /proc/1/exe`)})
	wantStatus(t, res, nsjail.StatusSucceeded)
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if l == "OK" {
			t.Fatalf("an exe link was writable: %s", res.Stdout)
		}
	}
	if after := fileDigest(t, self); after != before {
		t.Fatal("the worker binary changed")
	}
}

func fileDigest(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// SECURITY.md case 15 (CVE-2024-21626): a host fd left open without CLOEXEC
// must not reach the sandbox.
func TestNoHostFdsLeak(t *testing.T) {
	r := newRunner(t)
	fd, err := syscall.Open("/etc/hostname", syscall.O_RDONLY, 0) // no O_CLOEXEC, on purpose
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	res := run(t, r, nsjail.Spec{Args: []string{"/bin/probe", "fds"}})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if got := strings.TrimSpace(string(res.Stdout)); got != "0 1 2" {
		t.Fatalf("open fds inside: %q, want \"0 1 2\"", got)
	}
}

// SECURITY.md case 16: no mknod, and /dev holds only the five nodes.
func TestDevices(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(`/bin/probe mknod /tmp/mem; /bin/probe mknod /dev/shm/null2
		for f in /dev/*; do [ -c "$f" ] && [ ! -L "$f" ] && echo "$f"; done
		echo hi > /dev/null && head -c 4 /dev/urandom | wc -c; echo x > /dev/full 2>/dev/null || echo full`)})
	wantStatus(t, res, nsjail.StatusSucceeded)
	want := "EPERM\nEPERM\n/dev/full\n/dev/null\n/dev/random\n/dev/urandom\n/dev/zero\n4\nfull\n"
	if string(res.Stdout) != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

func TestUsageIsReported(t *testing.T) {
	r := newRunner(t)
	res := run(t, r, nsjail.Spec{Args: sh(`i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done`),
		Limits: nsjail.Limits{Timeout: 30 * time.Second}})
	wantStatus(t, res, nsjail.StatusSucceeded)
	if res.Usage.CPUMS <= 0 || res.Usage.WallMS <= 0 || res.Usage.PeakMemoryBytes <= 0 {
		t.Fatalf("usage not reported: %+v", res.Usage)
	}
}

// SECURITY.md case 18: concurrent sandboxes share nothing.
func TestConcurrentSandboxesAreIsolated(t *testing.T) {
	r := newRunner(t)
	const n = 4
	rootfs := nsjailtest.ProbeRootfs(t) // t.Fatal must not run in the goroutines
	results := make([]*nsjail.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs,
				Args: sh(fmt.Sprintf(`echo %d > /tmp/mine-%d; echo %d > /dev/shm/mine-%d; sleep 0.3; cat /tmp/mine-* /dev/shm/mine-*; ls /tmp; ls /dev/shm`, i, i, i, i))})
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		})
	}
	wg.Wait()
	for i, res := range results {
		if res == nil {
			continue
		}
		wantStatus(t, res, nsjail.StatusSucceeded)
		// Its own files only, each with its own number.
		want := fmt.Sprintf("%d\n%d\nmine-%d\nmine-%d\n", i, i, i, i)
		if string(res.Stdout) != want {
			t.Errorf("sandbox %d saw %q, want %q", i, res.Stdout, want)
		}
	}
}

// SECURITY.md case 34: a sandbox whose first process the host killed is not
// alive from the moment of the kill, though wait(2) sees it only once the
// kernel has torn it down.
func TestAliveSeesAKillAtOnce(t *testing.T) {
	r := newRunner(t)
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: []string{"sleep", "2900"}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() {
		t.Error("a sleeping sandbox is not alive")
	}
	pid, err := nsjailtest.InitPid(r.StateRoot(), p.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	alive := p.Alive()
	res := p.Retire(30*time.Second, nil)
	if alive {
		t.Error("a killed sandbox is still alive")
	}
	if res.Signal != "SIGKILL" {
		t.Errorf("signal %q, want SIGKILL", res.Signal)
	}
}

// An exit report is the command's wait status: a signal is reported as one,
// and nothing of the sandbox outlives Wait.
func TestExitReportCarriesASignal(t *testing.T) {
	r := newRunner(t)
	p, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.ProbeRootfs(t), Args: sh("sleep 1010")})
	if err != nil {
		t.Fatal(err)
	}
	report := make(chan syscall.WaitStatus, 1)
	report <- syscall.WaitStatus(syscall.SIGSEGV) | 0x80 // killed, core dumped
	sb, _, _ := p.Handoff(nsjail.HandoffOptions{ExitReport: report})
	res := sb.Wait(context.Background())
	if res.Status != nsjail.StatusFailed || res.Signal != "SIGSEGV" || res.ExitCode != 128+int(syscall.SIGSEGV) {
		t.Fatalf("status %s signal %q exit %d, want failed SIGSEGV %d", res.Status, res.Signal, res.ExitCode, 128+int(syscall.SIGSEGV))
	}
	r.WaitForCleanup()
	if pids := nsjailtest.ProcessesMatching("sleep 1010"); len(pids) > 0 {
		t.Fatalf("processes survived the report: %v", pids)
	}
}

// Spec.ExtraFiles become fds 3, 4, ... of the command (the runner's events
// pipe), and nothing else of the host's is open beside them.
func TestExtraFilesAreFds(t *testing.T) {
	r := newRunner(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	res := run(t, r, nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(t), Args: sh(`echo events >&3; ls /proc/self/fd`), ExtraFiles: []*os.File{pw}})
	pw.Close()
	wantStatus(t, res, nsjail.StatusSucceeded)
	got := make([]byte, 64)
	n, _ := pr.Read(got)
	if string(got[:n]) != "events\n" {
		t.Fatalf("fd 3 carried %q", got[:n])
	}
	// 0-2, the extra file and ls's own directory fd.
	if fds := strings.Fields(string(res.Stdout)); !slices.Equal(fds, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("open fds %v, want 0-3 and ls's own", fds)
	}
	if _, err := r.Prestart(nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(t), Args: sh("true"), ExtraFiles: []*os.File{pr}}); err == nil {
		t.Errorf("Prestart took Spec.ExtraFiles")
	}
}
