package warmpool_test

// The warm pool's trust boundary: what the code handed to a warm sandbox can
// reach, and what the worker believes about it. A warm run must be as safe
// and as exact as a cold one.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
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
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/warmpool"
	"github.com/sandboxd/sandboxd/server/workspace"
)

// forgeryScript tries every way the code could fake the warm sandbox's exit
// report: reports written to every fd 3..64 and to the zygote's fds through
// /proc/1/fd, the zygote's memory, and signals to pid 1 that would stop or
// kill a reporter. It then does what MODE says. The attacks on pid 1 are
// made only when pid 1 is not the code's own process: in a template fork,
// as in a cold sandbox, it is (G), and the reporter, T, is outside the
// sandbox's pid namespace, where no pid reaches it (SECURITY.md case 69,
// TestTemplateForkIsConfined); opening its own /proc/1/mem or sending
// itself SIGINT would only be the code hurting itself.
const forgeryScript = fdViewPy + `import os, signal, sys, time
fds, image = view
forged = []
zygote = os.getpid() != 1
for fd in range(3, 65):
    for report in (b"0\n", b"1\n", b"9\n", b"R"):
        try:
            os.write(fd, report)
            forged.append(fd)
        except OSError:
            pass
    try:
        if zygote:
            with open("/proc/1/fd/%d" % fd, "wb", buffering=0) as f:
                f.write(b"0\n")
                forged.append("/proc/1/fd/%d" % fd)
    except OSError:
        pass
try:
    if zygote:
        with open("/proc/1/mem", "r+b", buffering=0) as f:
            forged.append("/proc/1/mem")
except OSError:
    pass
print("fds", fds, "image", image, "forged", forged, flush=True)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD, signal.SIGSTOP, signal.SIGKILL):
    try:
        if zygote:
            os.kill(1, sig)
    except OSError:
        pass
MODE
`

// fdViewPy sets view to the code's open fds as ([numbers], [paths]): the
// numbers of all but the read-only files of the image (the listing's own
// fd, closed by then, left out), and the paths of those, sorted. It applies
// SECURITY.md case 56's rule itself, from inside, and further checks that
// opening the path gives the very same file: an fd it lists as a path
// gives the code nothing it could not open.
const fdViewPy = `def _fd_view():
    import fcntl, os, stat
    def mnt(fd):
        with open("/proc/self/fdinfo/%d" % fd) as f:
            return [l.split()[1] for l in f if l.startswith("mnt_id:")][0]
    def image_file(fd):
        try:
            st, fl = os.fstat(fd), fcntl.fcntl(fd, fcntl.F_GETFL)
            same = os.stat(os.readlink("/proc/self/fd/%d" % fd))
        except OSError:
            return False
        return (fl & 3 == os.O_RDONLY and not fl & os.O_PATH and stat.S_ISREG(st.st_mode)
            and mnt(fd) == root and (st.st_dev, st.st_ino) == (same.st_dev, same.st_ino))
    rfd = os.open("/", os.O_PATH)
    root = mnt(rfd)
    os.close(rfd)
    numbers, paths = [], []
    for n in sorted(os.listdir("/proc/self/fd"), key=int):
        fd = int(n)
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        if fd > 2 and image_file(fd):
            paths.append(os.readlink("/proc/self/fd/%d" % fd))
        else:
            numbers.append(n)
    return numbers, sorted(paths)
view = _fd_view()
`

var forgeryWant = regexp.MustCompile(`^fds \['0', '1', '2'\] image \[('/usr/[^']+'(, )?)*\] forged \[\]\n$`)

// SECURITY.md case 25 (forged exit report over an inherited fd, warm pool)
// and case 15 (only 0, 1, 2 open inside) on the warm path: the code sees
// only its standard fds, cannot reach the channel its exit is reported on,
// and the status is the kernel's: exit 7 stays 7, a process that keeps
// running times out.
func TestWarmExitReportCannotBeForged(t *testing.T) {
	rootfs, r, tpl, pool := numpyPool(t)
	defer pool.Close()
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	for _, tc := range []struct {
		name, mode string
		status     nsjail.Status
		exitCode   int
	}{
		{"then exits 7", "sys.exit(7)", nsjail.StatusFailed, 7},
		{"then keeps running", "time.sleep(60)", nsjail.StatusTimeout, -1},
		{"then exits 0", "sys.exit(0)", nsjail.StatusSucceeded, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waitReady(t, pool, 1)
			zygote := warmPid(t, pool, true)
			if maps := writableSharedMappings(t, zygote); len(maps) > 0 {
				t.Fatalf("the zygote shares writable memory with the code's process: %q", maps)
			}
			spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
				Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits, Logger: log}
			spec.Limits.Timeout = 3 * time.Second
			before := pool.Stats().Taken
			res, out, err := runPooled(context.Background(), pool, r, spec, strings.Replace(forgeryScript, "MODE", tc.mode, 1))
			if err != nil {
				t.Fatal(err)
			}
			defer workspace.Remove(out)
			if pool.Stats().Taken != before+1 {
				t.Fatal("the pool did not serve the run")
			}
			// image: whatever read-only files of the image the preload
			// left open (fdViewPy checked each; libffi's on forky).
			if !forgeryWant.Match(res.Stdout) {
				t.Errorf("stdout %q, want %s", res.Stdout, forgeryWant)
			}
			if res.Status != tc.status || (tc.exitCode >= 0 && res.ExitCode != tc.exitCode) {
				t.Fatalf("status %s exit %d, want %s exit %d (stderr: %.300s)", res.Status, res.ExitCode, tc.status, tc.exitCode, res.Stderr)
			}
		})
	}
	// The zygote exited with what it reported: the cross-check found nothing.
	r.WaitForCleanup()
	logMu.Lock()
	defer logMu.Unlock()
	if bytes.Contains(logs.Bytes(), []byte("does not match")) {
		t.Fatalf("exit report mismatch logged:\n%s", logs.String())
	}
}

// writableSharedMappings lists pid's mappings that are writable and shared:
// memory another process could change under it.
func writableSharedMappings(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.Contains(f[1], "w") && strings.HasSuffix(f[1], "s") {
			out = append(out, line)
		}
	}
	return out
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// startupEnvScript prints what Python makes of the variables it reads only at
// start-up (hash seed, stdio encoding, warning filters, locale and UTF-8 mode)
// and of TZ, without printing the variables themselves.
const startupEnvScript = `import locale, os, sys, time, warnings
print(hash("abc") if "PYTHONHASHSEED" in os.environ else "random hash")
print(sys.stdout.encoding, sys.stdout.errors, sys.flags.utf8_mode, sys.getfilesystemencoding(), sys.warnoptions)
print(locale.setlocale(locale.LC_CTYPE), locale.getpreferredencoding(False), os.environ.get("LC_CTYPE"))
print(time.tzname, time.timezone, time.localtime(0).tm_hour)
print("caf\u00e9 \u4e2d")
warnings.warn("a user warning")
print("after the warning")
`

// startupEnvValues has a telling value for every variable the default
// allowed_env admits.
var startupEnvValues = map[string]string{
	"LANG":             "C",
	"LC_ALL":           "C",
	"TZ":               "XYZ-3",
	"PYTHONHASHSEED":   "1",
	"PYTHONWARNINGS":   "error::UserWarning",
	"PYTHONIOENCODING": "latin-1:backslashreplace",
}

// Every variable a request may set gives the same answer warm and cold. Most
// are read by Python only at start-up, which a warm sandbox is long past: such
// a request runs cold, counted as sandboxd_pool_fallback_total{reason="env"}.
func TestWarmHonoursStartupEnv(t *testing.T) {
	rootfs, r, tpl, pool := numpyPool(t)
	defer pool.Close()
	// run runs the script cold, or through the pool when warm.
	run := func(warm bool, extra map[string]string) *nsjail.Result {
		t.Helper()
		spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
			Env: withEnv(tpl.Env, extra), Cwd: inside.Workspace, Limits: tpl.Limits}
		if !warm {
			spec.Workspace = poolWorkspace(t, r, startupEnvScript)
			res, err := r.Run(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		res, out, err := runPooled(context.Background(), pool, r, spec, startupEnvScript)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { workspace.Remove(out) })
		return res
	}
	baseline := run(false, nil)
	waitReady(t, pool, 1)
	if warm := run(true, nil); pool.Stats().Taken != 1 {
		t.Fatal("a request without variables was not served warm")
	} else {
		compareResults(t, baseline, warm)
	}
	for _, name := range config.Default().AllowedEnv {
		t.Run(name, func(t *testing.T) {
			value, ok := startupEnvValues[name]
			if !ok {
				t.Fatalf("allowed variable %s has no test value", name)
			}
			extra := map[string]string{name: value}
			cold := run(false, extra)
			if bytes.Equal(cold.Stdout, baseline.Stdout) && bytes.Equal(cold.Stderr, baseline.Stderr) {
				t.Fatalf("%s=%s changes nothing the script prints: the test proves nothing", name, value)
			}
			waitReady(t, pool, 1)
			before := pool.Stats()
			warm := run(true, extra)
			compareResults(t, cold, warm)
			after := pool.Stats()
			if after.Taken != before.Taken || after.FallbackEnv != before.FallbackEnv+1 {
				t.Errorf("%s: taken %d→%d, env fallbacks %d→%d; want a counted cold run", name,
					before.Taken, after.Taken, before.FallbackEnv, after.FallbackEnv)
			}
		})
	}
}

// withEnv is env with extra's variables set (replaced or appended), as
// Policy.Env builds a request's environment.
func withEnv(env []string, extra map[string]string) []string {
	var out []string
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); extra[k] == "" {
			out = append(out, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		out = append(out, k+"="+extra[k])
	}
	return out
}

// SECURITY.md case 34: a warm sandbox whose processes died (killed by the
// host, here by the test that started it) is never handed an execution: the
// request runs cold and is counted as sandboxd_pool_fallback_total{reason="dead"}.
// Each process is killed both long before the request and just before it;
// a stopped one is caught too.
func TestDeadWarmSandboxRunsCold(t *testing.T) {
	rootfs, r, tpl, pool := numpyPool(t)
	defer pool.Close()
	kill := func(pid int, sig syscall.Signal, settle bool) {
		t.Helper()
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatal(err)
		}
		if settle {
			waitDead(t, pid)
		}
	}
	for _, tc := range []struct {
		name string
		kill func(zygote, code int)
	}{
		{"zygote killed long before", func(z, _ int) { kill(z, syscall.SIGKILL, true) }},
		{"zygote killed just before", func(z, _ int) { kill(z, syscall.SIGKILL, false) }},
		{"code process killed long before", func(_, c int) { kill(c, syscall.SIGKILL, true) }},
		{"code process killed just before", func(_, c int) { kill(c, syscall.SIGKILL, false) }},
		// The zygote cannot report (stopped): the hand-off finds no reader.
		{"code process killed, zygote stopped", func(z, c int) { kill(z, syscall.SIGSTOP, false); kill(c, syscall.SIGKILL, true) }},
		// The code's process never reads its hand-off; the deadline ends it.
		{"code process stopped", func(_, c int) { kill(c, syscall.SIGSTOP, false) }},
	} {
		// Through a Claim, the server's path: the request written
		// straight into the dead sandbox's workspace; nothing runs there,
		// the pool removes that workspace, and the caller runs cold (the
		// server's TestPoolThroughAPI and its dead-sandbox cases check the
		// cold answer).
		t.Run(tc.name, func(t *testing.T) {
			waitReady(t, pool, 1)
			tc.kill(warmPid(t, pool, true), warmPid(t, pool, false))
			before := pool.Stats()
			spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
				Env: tpl.Env, Cwd: inside.Workspace, Limits: tpl.Limits}
			spec.Limits.Timeout = 2 * time.Second
			c := pool.Claim(context.Background(), spec, "")
			if c == nil {
				t.Fatal("no claim on a pool with a ready sandbox")
			}
			warm := c.Workspace()
			if err := workspace.Write(warm, workspace.Options{UID: r.HostUID(), GID: r.HostGID()},
				workspace.Request{Code: `print("ran")`}); err != nil {
				t.Fatal(err)
			}
			res, delivered, err := c.Run(context.Background(), spec)
			if err != nil || delivered || res != nil {
				t.Fatalf("delivered %v, result %v, error %v; want nothing delivered", delivered, res, err)
			}
			if after := pool.Stats(); after.Taken != before.Taken || after.FallbackDead != before.FallbackDead+1 {
				t.Fatalf("taken %d→%d, dead fallbacks %d→%d; want a counted fallback",
					before.Taken, after.Taken, before.FallbackDead, after.FallbackDead)
			}
			waitGone(t, warm)
		})
	}
}

// warmPid is the host pid of the ready warm sandbox's zygote (its first
// process), or of the process that waits for the code.
func warmPid(t *testing.T, p *warmpool.Pool, zygote bool) int {
	t.Helper()
	// A template fork has no zygote: T, outside the sandbox, reports the
	// exit of G, the code's process (TEMPLATE.md section 2). The zygote's
	// part in these tests, the reporter, is T's.
	if f, g, ok, err := warmpool.ReadyForkPids(p); err != nil {
		t.Fatal(err)
	} else if !ok && trustOnForks {
		t.Fatal("TestTrustOnForks: the ready warm sandbox is not a template fork")
	} else if ok {
		if zygote {
			return f
		}
		return g
	}
	pid, err := warmpool.ReadyPid(p)
	if err != nil {
		t.Fatal(err)
	}
	if zygote {
		return pid
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	children := strings.Fields(string(b))
	if len(children) != 1 {
		t.Fatalf("the zygote has children %q, want one", children)
	}
	child, err := strconv.Atoi(children[0])
	if err != nil {
		t.Fatal(err)
	}
	return child
}

// waitDead waits until pid has exited (gone, or a zombie nobody reaped yet).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
	}
}

// SECURITY.md case 35: no directory the sandbox can write is on the zygote's
// sys.path at start-up, so nothing planted there (its cwd, the workspace) is
// imported by the interpreter that later relays the code's exit status.
func TestZygoteSysPathHasNoWritableDirectory(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	ws := poolWorkspace(t, r, `print(1)`)
	if err := os.WriteFile(filepath.Join(ws, "planted.py"), []byte(`print("PLANTED")`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := warmpool.ZygoteArgs(nil)
	// The zygote's interpreter and flags, running this probe instead.
	i := slices.Index(args, "-c")
	probe := `import os, sys
print([p for p in sys.path if os.access(p or ".", os.W_OK)], flush=True)
import planted`
	args = append(args[:i+1:i+1], probe)
	tpl := poolTemplate(rootfs)
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: args, Env: tpl.Env,
		Cwd: inside.Workspace, Workspace: ws, Limits: tpl.Limits})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "[]\n" || !bytes.Contains(res.Stderr, []byte("No module named 'planted'")) {
		t.Fatalf("zygote flags %q: stdout %q stderr %.500s", args[:i], res.Stdout, res.Stderr)
	}
}

// SECURITY.md cases 15, 25 and 56: a preload that leaves an fd open would
// hand it to the code's process; unless the fd is a read-only file of the
// image, the zygote refuses to become warm instead (the pool then runs
// executions cold), naming the fd and why.
func TestZygoteRefusesStrayFds(t *testing.T) {
	// Run alone, the zygote has no protocol fds: the first three opens take
	// their numbers, the fourth is the stray one.
	res := runZygoteAlone(t, "import os\n_kept = [os.open('/dev/null', os.O_RDONLY) for _ in range(4)]\n")
	if res.ExitCode != 70 || !bytes.Contains(res.Stderr, []byte("the preload left fds open: 6 -> /dev/null (not a regular file)\n")) {
		t.Fatalf("exit %d, stderr %.2000s", res.ExitCode, res.Stderr)
	}
}

// SECURITY.md case 56: a read-only fd to a file of the image (what libffi
// keeps after `import ctypes` on forky) passes the check: the zygote goes
// on to fork the code's process, which, run alone, finds /dev/null where
// the hand-off socket would be and fails there.
func TestZygoteAdmitsReadOnlyImageFds(t *testing.T) {
	res := runZygoteAlone(t, "import os\n_kept = [os.open('/dev/null', os.O_WRONLY) for _ in range(3)]\n"+
		"_kept.append(os.open('/usr/lib/os-release', os.O_RDONLY))\n")
	if res.ExitCode == 70 || bytes.Contains(res.Stderr, []byte("left fds open")) || !bytes.Contains(res.Stderr, []byte("_receive")) {
		t.Fatalf("exit %d, stderr %.2000s", res.ExitCode, res.Stderr)
	}
}

// runZygoteAlone runs the zygote as the first process of a sandbox of the
// runtime image with preload as its only preloaded module, without the
// pool (so without the protocol's fds).
func runZygoteAlone(t *testing.T, preload string) *nsjail.Result {
	t.Helper()
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	ws := poolWorkspace(t, r, `print(1)`)
	if err := os.WriteFile(filepath.Join(ws, "leakfd.py"), []byte(preload), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl := poolTemplate(rootfs)
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: warmpool.ZygoteArgs([]string{"leakfd"}),
		Env: append(slices.Clone(tpl.Env), "PYTHONPATH="+inside.Workspace), Cwd: inside.Workspace, Workspace: ws, Limits: tpl.Limits})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// SECURITY.md case 56: the rule itself (zygote.py's _stray_fds), fd by
// fd, inside a sandbox of the runtime image with the production template,
// where the root is the image's read-only mount: only a read-only regular
// file of the image is admitted.
func TestZygoteFdRule(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	ws := poolWorkspace(t, r, `import os, socket
ns = {"__name__": "zygote_under_test"}
exec(compile(open("/workspace/code/zygote.py").read(), "zygote.py", "exec"), ns)
# Fds 3-5 are the protocol's, which the rule does not look at.
protocol = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
assert protocol == [3, 4, 5], protocol
cases = [
    ("image file", os.open("/usr/lib/os-release", os.O_RDONLY)),
    ("image file O_PATH", os.open("/usr/lib/os-release", os.O_PATH)),
    ("image directory", os.open("/usr/lib", os.O_RDONLY | os.O_DIRECTORY)),
    ("read-only input file", os.open("/workspace/input/data.csv", os.O_RDONLY)),
    ("workspace file", os.open("/workspace/code/zygote.py", os.O_RDONLY)),
    ("workspace file O_RDWR", os.open("/workspace/output/w", os.O_RDWR | os.O_CREAT)),
    ("/dev/null", os.open("/dev/null", os.O_RDONLY)),
    ("pipe", os.pipe()[0]),
    ("socket", socket.socketpair()[0].detach()),
    ("proc file", os.open("/proc/self/status", os.O_RDONLY)),
]
unlinked = os.open("/workspace/output/gone", os.O_RDWR | os.O_CREAT)
os.unlink("/workspace/output/gone")
cases.append(("unlinked workspace file", unlinked))
try:
    cases.append(("memfd", os.memfd_create("m")))
except OSError as e:
    print("memfd refused by the kernel:", e.strerror)
why = {fd: reason for fd, _, reason in ns["_stray_fds"]()}
for name, fd in cases:
    print("%s: %s" % (name, why.get(fd, "admitted")))
`)
	if err := os.WriteFile(filepath.Join(ws, "code/zygote.py"), []byte(warmpool.ZygoteSource), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl := poolTemplate(rootfs)
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "/workspace/code/main.py"},
		Env: tpl.Env, Cwd: inside.Workspace, Workspace: ws, Limits: tpl.Limits})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"image file":              "admitted",
		"image file O_PATH":       "O_PATH",
		"image directory":         "not a regular file",
		"read-only input file":    "not on the image's root mount",
		"workspace file":          "not on the image's root mount",
		"workspace file O_RDWR":   "not read-only",
		"/dev/null":               "not a regular file",
		"pipe":                    "not a regular file",
		"socket":                  "not read-only",
		"proc file":               "not on the image's root mount",
		"unlinked workspace file": "not read-only",
		"memfd":                   "not read-only",
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		if name, reason, ok := strings.Cut(l, ": "); ok {
			got[name] = reason
		}
	}
	for name, reason := range want {
		if got[name] != reason && !(name == "memfd" && got[name] == "") {
			t.Errorf("%s: %q, want %q", name, got[name], reason)
		}
	}
	if res.ExitCode != 0 || len(got) < len(want)-1 {
		t.Fatalf("exit %d, stdout %s, stderr %.2000s", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// A warm sandbox that fails before it is ready is a refill failure whose
// log line says why: what the zygote wrote to stderr (here a python3 that
// cannot start), which is kept until the sandbox is retired.
func TestFailedWarmStartLogsItsStderr(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs, err := nsjailtest.CopyRootfs(nsjailtest.BusyboxRootfs(t), "sandboxd-warmpool-broken-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(rootfs)
	broken := "#!/bin/sh\necho 'no interpreter here' >&2\nexit 3\n"
	if err := os.WriteFile(filepath.Join(rootfs, "usr/bin/python3"), []byte(broken), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newPoolRunner(t)
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	pool, err := warmpool.New(r, poolConfig(t, 1, t.TempDir(), 0), []warmpool.Template{poolTemplate(rootfs)}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		logMu.Lock()
		text := logs.String()
		logMu.Unlock()
		if line, ok := logLine(text, "unable to start a sandbox"); ok {
			if !strings.Contains(line, "no interpreter here") || !strings.Contains(line, "status failed") {
				t.Fatalf("the failure's log line lacks the zygote's stderr or status: %s", line)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refill failure logged: %s", text)
		}
	}
}

// logLine is the first line of text that contains s.
func logLine(text, s string) (string, bool) {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l, true
		}
	}
	return "", false
}

// numpyPoolConfig is a pool of one ready sandbox that preloads numpy only.
// numpyPool is a pool of one warm sandbox that preloaded numpy, on the
// runtime image with the production template, and the runner under it.
func numpyPool(t *testing.T) (rootfs string, r *nsjail.Runner, tpl warmpool.Template, pool *warmpool.Pool) {
	t.Helper()
	rootfs = nsjailtest.RuntimeRootfs(t)
	r = newPoolRunner(t)
	tpl = poolTemplate(rootfs)
	pool, err := warmpool.New(r, numpyPoolConfig(t), []warmpool.Template{tpl}, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	return rootfs, r, tpl, pool
}

func numpyPoolConfig(t *testing.T) warmpool.Config {
	cfg := poolConfig(t, 1, t.TempDir(), 0)
	cfg.Preload = []string{"numpy"}
	cfg.Forks = cfg.Forks || trustOnForks
	return cfg
}

// trustOnForks makes numpyPool's warm sandboxes template forks
// (TestTrustOnForks; the tests of this package run one at a time).
var trustOnForks bool

// TestTrustOnForks runs the hostile cases of the warm path whose
// sandboxes come from numpyPool with template forks as the pool's warm
// sandboxes (Config.Forks): SECURITY.md cases 25 and 15 (the exit report
// cannot be forged, only fds 0-2 are open) and 34 (a fork whose G or template
// died, or whose template is stopped, is never handed an execution).
func TestTrustOnForks(t *testing.T) {
	trustOnForks = true
	defer func() { trustOnForks = false }()
	t.Run("WarmExitReportCannotBeForged", TestWarmExitReportCannotBeForged)
	t.Run("DeadWarmSandboxRunsCold", TestDeadWarmSandboxRunsCold)
}

// waitGone waits until path no longer exists (the pool removes a dead or
// released sandbox's workspace in the background).
func waitGone(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists", path)
		}
	}
}
