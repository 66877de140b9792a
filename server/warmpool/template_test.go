package warmpool_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/server/config"
	"github.com/sandboxd/sandboxd/server/runner"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

// template.py (TEMPLATE.md plan step 4) on the real kernel: T started by
// nsjail.Runner.StartTemplate; each fork is given a shell (StartShell,
// MoveG), the go-ahead, the join and a hand-off, as the pool will do it
// (step 5), and its code's view is compared with a cold run's.
// testdata/insideview.py is the code.

// tplViewKeys are the fields of insideview.py's view a fork must share
// with a cold run, apart from the one stated difference
// (nsjailtest.ForkViewDifference).
var tplViewKeys = []string{"pid", "ppid", "uid", "gid", "groups", "caps", "no_new_privs", "seccomp", "seccomp_filters",
	"dumpable", "uid_map", "gid_map", "cgroup", "oom_score_adj", "hostname", "procs", "mounts", "root_mount_options",
	"net", "fds", "cwd", "rlimits", "keyring", "rootfs_write", "unshare_user", "mount_syscall", "oom_lower"}

// tplLab is one running template.py.
type tplLab struct {
	t   testing.TB
	r   *nsjail.Runner
	tpl *nsjail.Template
	ctl *net.UnixConn
	mu  sync.Mutex
	log bytes.Buffer // T's stdout and stderr
}

// startTplLab starts template.py with preload; prelude, if any, is Python
// run in T before template.py's own code (what a preload could leave).
func startTplLab(t testing.TB, r *nsjail.Runner, rootfs string, preload []string, prelude string) *tplLab {
	t.Helper()
	return startTplLabEnv(t, r, rootfs, preload, prelude, []string{"HOME=/tmp"})
}

// startTplLabEnv is startTplLab with T's environment.
func startTplLabEnv(t testing.TB, r *nsjail.Runner, rootfs string, preload []string, prelude string, env []string) *tplLab {
	t.Helper()
	ours, theirs := socketpair(t)
	lab := &tplLab{t: t, r: r, ctl: ours}
	args := warmpool.TemplateArgs(preload)
	if prelude != "" {
		args[3] = prelude + "\n" + args[3]
	}
	out := func(_ string, chunk []byte) {
		lab.mu.Lock()
		defer lab.mu.Unlock()
		lab.log.Write(chunk)
	}
	tpl, err := r.StartTemplate(nsjail.Spec{Rootfs: rootfs, Args: args, Env: env, Output: out}, theirs)
	theirs.Close()
	if err != nil {
		ours.Close()
		t.Fatalf("StartTemplate: %v", err)
	}
	lab.tpl = tpl
	t.Cleanup(func() {
		// EOF on TEMPLATE_FD: T exits 0.
		lab.ctl.Close()
		res := tpl.Stop(10 * time.Second)
		if res.Status != nsjail.StatusSucceeded {
			t.Errorf("template ended %s (exit %d): %s\nlog: %s", res.Status, res.ExitCode, res.Error, lab.logText())
		}
		// A warm-up that fails only logs it (its forks then pay that first
		// use themselves): a silent regression of the CPU it saves, unless
		// a test says so.
		if log := lab.logText(); strings.Contains(log, "template: warm-up failed") {
			t.Errorf("the template's warm-up failed:\n%s", log)
		}
	})
	_ = lab.ctl.SetDeadline(time.Now().Add(5 * time.Minute))
	return lab
}

func (l *tplLab) logText() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.log.String()
}

// logSays waits for the template's log to contain want (a goroutine copies
// T's stderr into it: a line T or G wrote before an exit the test already
// saw may still be in the pipe) and returns the log, which lacks want only
// after ten seconds.
func (l *tplLab) logSays(want string) string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		log := l.logText()
		if strings.Contains(log, want) || time.Now().After(deadline) {
			return log
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func socketpair(t testing.TB) (*net.UnixConn, *os.File) {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(pair[0]), "pool")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(pair[1]), "sandbox")
}

func pipe(t testing.TB) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	return r, w
}

// recvLine reads one line from c with the fds sent with it.
func recvLine(t testing.TB, c *net.UnixConn) (string, []int) {
	t.Helper()
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(8*4))
	var line []byte
	var fds []int
	for !bytes.HasSuffix(line, []byte("\n")) {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			t.Fatalf("socket: %v (read %q)", err, line)
		}
		line = append(line, buf[:n]...)
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				got, err := unix.ParseUnixRights(&m)
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, got...)
			}
		}
	}
	return string(line), fds
}

func sendLine(t testing.TB, c *net.UnixConn, line []byte, files ...*os.File) {
	t.Helper()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(line, oob, nil); err != nil {
		t.Fatal(err)
	}
}

// tplFork is the pool's side of one fork.
type tplFork struct {
	ctl     *net.UnixConn
	ready   *os.File
	report  *os.File
	goAhead *os.File // the write end: closed, it is the go-ahead
	stdout  *os.File // nil: no output fds were sent
	stderr  *os.File
	g       *os.File // G's pidfd
	// prep is the shell's id and, on cgroup v2, its cgroup, which T clones
	// G into: StartShell's spec must carry its ID (shellSpec).
	prep *nsjail.PreparedShell
}

// shellSpec is spec for f's shell: with the prepared shell's ID.
func (f *tplFork) shellSpec(spec nsjail.Spec) nsjail.Spec {
	spec.ID = f.prep.ID()
	return spec
}

// request sends a fork request with the fork's channels (and output fds
// with output) and returns T's reply and, when it forked, the fork with
// G's pidfd.
func (l *tplLab) request(output bool) (*tplFork, warmpool.ForkReply) {
	f, reply := l.requestOnly(output)
	if !reply.Forked {
		return f, reply
	}
	t := l.t
	t.Helper()
	msg, fds := recvLine(t, f.ctl)
	if msg != warmpool.PidfdMessage || len(fds) != 1 {
		t.Fatalf("want G's pidfd, got %q with %d fds\nlog: %s", msg, len(fds), l.logText())
	}
	f.g = os.NewFile(uintptr(fds[0]), "pidfd-G")
	return f, reply
}

// requestOnly is request without waiting for G's pidfd.
func (l *tplLab) requestOnly(output bool) (*tplFork, warmpool.ForkReply) {
	t := l.t
	t.Helper()
	f := &tplFork{}
	ctl, ctlSandbox := socketpair(t)
	f.ctl = ctl
	_ = f.ctl.SetDeadline(time.Now().Add(5 * time.Minute))
	var readyW, reportW, goR, outW, errW *os.File
	f.ready, readyW = pipe(t)
	f.report, reportW = pipe(t)
	goR, f.goAhead = pipe(t)
	files := []*os.File{ctlSandbox, readyW, reportW, goR}
	prep, err := l.r.PrepareShell(l.tpl)
	if err != nil {
		t.Fatal(err)
	}
	f.prep = prep
	t.Cleanup(func() { prep.Close() })
	if cg := prep.CgroupFile(); cg != nil {
		files = append(files, cg)
	}
	if output {
		f.stdout, outW = pipe(t)
		f.stderr, errW = pipe(t)
		files = append(files, outW, errW)
	}
	t.Cleanup(func() {
		for _, c := range []io.Closer{f.ctl, f.ready, f.report, f.goAhead, f.stdout, f.stderr, f.g} {
			if c != nil && !isNilFile(c) {
				c.Close()
			}
		}
	})
	uidMap, gidMap := l.tpl.ForkIDMap()
	line, err := warmpool.EncodeForkRequest(warmpool.ForkRequest{UIDMap: uidMap, GIDMap: gidMap, Cgroup: prep.CgroupFile() != nil})
	if err != nil {
		t.Fatal(err)
	}
	sendLine(t, l.ctl, line, files...)
	for _, x := range files {
		if x != prep.CgroupFile() {
			x.Close() // the sandbox's ends: T and the fork hold them now
		}
	}
	msg, _ := recvLine(t, l.ctl)
	reply, err := warmpool.DecodeForkReply([]byte(msg))
	if err != nil {
		t.Fatalf("T's reply: %v\nlog: %s", err, l.logText())
	}
	return f, reply
}

func isNilFile(c io.Closer) bool {
	f, ok := c.(*os.File)
	return ok && f == nil
}

// fork is request that must fork.
func (l *tplLab) fork(output bool) *tplFork {
	l.t.Helper()
	f, reply := l.request(output)
	if !reply.Forked {
		l.t.Fatalf("T refused to fork: %s", reply.Refused)
	}
	return f
}

// place does what the pool does once G has its shell: MoveG, the go-ahead,
// the join; then waits for G's READY.
func (l *tplLab) place(f *tplFork, sh *nsjail.Shell) {
	l.t.Helper()
	if err := sh.MoveG(); err != nil {
		l.t.Fatalf("MoveG: %v", err)
	}
	l.join(f, sh)
}

// join is place after MoveG: the go-ahead, the join, G's READY.
func (l *tplLab) join(f *tplFork, sh *nsjail.Shell) {
	l.t.Helper()
	l.joinWith(f, sh, warmpool.JoinOf(sh))
}

// joinWith is join with the join message j (what a broken or compromised
// template could give its G).
func (l *tplLab) joinWith(f *tplFork, sh *nsjail.Shell, j warmpool.Join) {
	t := l.t
	t.Helper()
	f.goAhead.Close()
	line, err := warmpool.EncodeJoin(j)
	if err != nil {
		t.Fatal(err)
	}
	sendLine(t, f.ctl, line, sh.NamespaceFiles()...)
	sh.CloseNamespaces()
	b := make([]byte, 1)
	if n, err := f.ready.Read(b); n != 1 || b[0] != warmpool.ReadyByte {
		t.Fatalf("G not ready: %q, %v\nlog: %s", b[:n], err, l.logText())
	}
}

// exitReport reads T's report of G's wait status.
func (l *tplLab) exitReport(f *tplFork) syscall.WaitStatus {
	t := l.t
	t.Helper()
	line := make([]byte, 0, 16)
	b := make([]byte, 1)
	for !bytes.HasSuffix(line, []byte{warmpool.MessageEnd}) {
		n, err := f.report.Read(b)
		if n == 0 || err != nil {
			t.Fatalf("exit report: %v (read %q)\nlog: %s", err, line, l.logText())
		}
		line = append(line, b[0])
	}
	ws, err := warmpool.DecodeExitReport(line)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// forkAndRun forks, places the fork in a shell of spec, hands it path and
// returns what it printed (JSON), once G exited 0, T reaped it and the shell is
// destroyed; f is the fork, for what the caller checks beyond.
func (l *tplLab) forkAndRun(r *nsjail.Runner, spec nsjail.Spec, path, who string) (map[string]any, *tplFork) {
	t := l.t
	t.Helper()
	f := l.fork(true)
	sh, err := r.StartShell(context.Background(), l.tpl, f.shellSpec(spec), f.g)
	if err != nil {
		t.Fatalf("%s: StartShell: %v", who, err)
	}
	l.place(f, sh)
	v, st := l.runView(f, path)
	if !st.Exited() || st.ExitStatus() != 0 {
		t.Errorf("%s: G's wait status %#x, want exit 0", who, uint32(st))
	}
	if !reaped(t, f, time.Minute) {
		t.Errorf("%s: T did not reap G", who)
	}
	if err := sh.Destroy(); err != nil {
		t.Errorf("%s: Destroy: %v", who, err)
	}
	return v, f
}

// reaped waits until T has reaped G: EOF on the report pipe, whose write
// end only T holds, and closes then (after the go-ahead).
func reaped(t testing.TB, f *tplFork, within time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, f.report)
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(within):
		return false
	}
}

// runView hands G the view script and returns what it printed on its own
// stdout and G's wait status.
func (l *tplLab) runView(f *tplFork, path string) (map[string]any, syscall.WaitStatus) {
	var v map[string]any
	ws := l.runHandoff(f, warmpool.Handoff{Path: path, Argv: []string{path}}, &v)
	return v, ws
}

// runHandoff hands G h with files (SCM_RIGHTS), decodes what the code
// printed on the fork's own stdout (one JSON value) into v, and returns
// G's wait status.
func (l *tplLab) runHandoff(f *tplFork, h warmpool.Handoff, v any, files ...*os.File) syscall.WaitStatus {
	t := l.t
	t.Helper()
	line, err := warmpool.EncodeHandoff(h)
	if err != nil {
		t.Fatal(err)
	}
	sendLine(t, f.ctl, line, files...)
	var stderr []byte
	done := make(chan struct{})
	go func() {
		stderr, _ = io.ReadAll(f.stderr)
		close(done)
	}()
	out, err := io.ReadAll(f.stdout)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	ws := l.exitReport(f)
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("fork's output %q: %v\nstderr: %s\nlog: %s", out, err, stderr, l.logText())
	}
	return ws
}

func tplShellSpec(rootfs, ws string, lim nsjail.Limits) nsjail.Spec {
	return nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}, Workspace: ws, WorkspaceReadOnly: true, Limits: lim}
}

// lowLimits are rlimits below a template's (the defaults): a fork has them
// only if G sets them itself.
var lowLimits = nsjail.Limits{OpenFiles: 256, FileSizeBytes: 64 << 20}

// viewWorkspace is a workspace holding the code these tests hand off:
// insideview.py (viewPath) and forkprobe.py (probePath).
func viewWorkspace(t *testing.T) string {
	t.Helper()
	return testdataWorkspace(t, map[string]string{"insideview.py": viewPath, "forkprobe.py": probePath})
}

const (
	viewPath  = "/workspace/view.py"
	probePath = "/workspace/probe.py"
)

// testdataWorkspace is a workspace holding each testdata file src (a key
// of files) at its path in /workspace (the value).
func testdataWorkspace(t *testing.T, files map[string]string) string {
	t.Helper()
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range files {
		b, err := os.ReadFile(filepath.Join("testdata", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, filepath.Base(dst)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// coldView runs insideview.py as a cold execution runs a file.
func coldView(t *testing.T, r *nsjail.Runner, rootfs, ws string, lim nsjail.Limits) (map[string]any, string) {
	t.Helper()
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: runner.Args("python3", runner.Job{Path: viewPath}),
		Workspace: ws, WorkspaceReadOnly: true, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nsjail.StatusSucceeded {
		t.Fatalf("cold view: %s %s\n%s", res.Status, res.Error, res.Stderr)
	}
	var v map[string]any
	if err := json.Unmarshal(res.Stdout, &v); err != nil {
		t.Fatalf("cold view %q: %v", res.Stdout, err)
	}
	return v, res.ID
}

func compareViews(t *testing.T, who string, cold, fork map[string]any) {
	t.Helper()
	for _, k := range tplViewKeys {
		a, _ := json.Marshal(cold[k])
		b, _ := json.Marshal(fork[k])
		if d, ok := nsjailtest.ForkViewDifference[k]; ok {
			if cold[k] != d[0] || fork[k] != d[1] {
				t.Errorf("%s: %s is %s cold and %s forked, want %q and %q", who, k, a, b, d[0], d[1])
			}
		} else if !bytes.Equal(a, b) {
			t.Errorf("%s: %s differs from a cold run's:\ncold %s\nfork %s", who, k, a, b)
		}
	}
}

// TestTemplateWarmUp starts T as the server does (its default preload, the
// default policy's environment), so that _warm_up runs whole: the pandas
// group-by, the figure rendered to PNG, matplotlib's font cache emptied
// again. Both only log a failure (the forks then pay that first use), a
// silent CPU regression: startTplLab's cleanup fails on a failed warm-up,
// this test on a failed preload too, which would skip the warm-up's parts.
func TestTemplateWarmUp(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTplLabEnv(t, r, rootfs, config.DefaultPreload, "", poolTemplate(rootfs).Env)
	t.Cleanup(func() {
		// Cleanups run last registered first: this one runs before
		// startTplLab's, so it ends T itself (Stop acts once), as T's log
		// is whole only then. T reads the EOF only once its preload and
		// warm-up are done: under CI's load (packages tested in parallel)
		// that took longer than startTplLab's 10 s of grace.
		lab.ctl.Close()
		lab.tpl.Stop(2 * time.Minute)
		if log := lab.logText(); strings.Contains(log, "zygote: preload") {
			t.Errorf("a preload failed:\n%s", log)
		}
	})
}

// TestTemplateForkMatchesCold: a fork of template.py, given its shell and
// a hand-off of a file, runs it seeing what a cold execution of the file
// sees (ids, capabilities, no_new_privs, seccomp, dumpable, maps, cgroups,
// hostname, pids, mounts, interfaces, fds, cwd, the answers of denied
// syscalls and writes, rlimits below the template's, which G sets), but
// for the one stated difference, two seccomp filters where a cold process
// has one (nsjailtest.ForkViewDifference: T's template filter under G's);
// its fds 0-2 are its own (the output fds of
// its fork request: the view arrives on them, and none of them is one of
// T's fds 0-2, the template's log); two forks of a template that imported
// numpy and multiprocessing have different random, numpy.random and
// multiprocessing authkey values (reseeded: E1 found numpy's and the
// authkey equal in every fork without it); T reports G's exit and reaps it.
func TestTemplateForkMatchesCold(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := viewWorkspace(t)
	cold, _ := coldView(t, r, rootfs, ws, lowLimits)
	// numpy.random itself: `import numpy` (2.x) leaves it to its first use.
	preload := []string{"numpy.random", "multiprocessing"}
	if p := os.Getenv("SANDBOXD_TEMPLATE_PRELOAD"); p != "" {
		// e.g. numpy,pandas,matplotlib.pyplot: fork a real template
		preload = append(preload, strings.Split(p, ",")...)
	}
	lab := startTplLab(t, r, rootfs, preload, "")
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	// T's fds 0-2 that are channels (its log's pipes; a /dev/null is the
	// same inode whoever opens it).
	tplStdio := map[[2]uint64]int{}
	for fd := range 3 {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", tpid, fd), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			tplStdio[[2]uint64{st.Dev, st.Ino}] = fd
		}
	}
	if len(tplStdio) == 0 {
		t.Fatal("T's fds 0-2 are all devices: the test would compare nothing")
	}
	var randoms []map[string]any
	for i := range 2 {
		view, f := lab.forkAndRun(r, tplShellSpec(rootfs, ws, lowLimits), viewPath, fmt.Sprintf("fork %d", i))
		compareViews(t, fmt.Sprintf("fork %d", i), cold, view)
		var outSt unix.Stat_t
		if err := unix.Fstat(int(f.stdout.Fd()), &outSt); err != nil {
			t.Fatal(err)
		}
		stdio, _ := view["stdio"].([]any)
		for fd, v := range stdio {
			pair, _ := v.([]any)
			if len(pair) != 2 {
				t.Fatalf("fork %d: stdio %v", i, stdio)
			}
			key := [2]uint64{uint64(pair[0].(float64)), uint64(pair[1].(float64))}
			if tfd, ok := tplStdio[key]; ok {
				t.Errorf("fork %d: G's fd %d is T's fd %d", i, fd, tfd)
			}
			if fd == 1 && key[1] != outSt.Ino {
				t.Errorf("fork %d: G's stdout is not the fork's own output pipe", i)
			}
		}
		randoms = append(randoms, view["randoms"].(map[string]any))
	}
	for _, k := range []string{"random", "numpy", "authkey"} {
		if randoms[0][k] == randoms[1][k] {
			t.Errorf("two forks share %s: %v", k, randoms[0][k])
		}
	}
	if log := lab.logText(); log != "" {
		t.Errorf("the template logged: %s", log)
	}
}

const seedProbePath = "/workspace/seedprobe.py"

// TestTemplateForkSecretsDiffer (SECURITY.md case 64, TEMPLATE.md section
// 7): the code of two forks of one template draws from every
// pseudo-random source it can reach (testdata/seedprobe.py: each
// generator object the collector lists, random.Random but SystemRandom and
// NumPy's RandomState, Generator, BitGenerator and SeedSequence, keyed by
// where it is reachable from; and the per-process sources: the
// multiprocessing authkey, tempfile's names, OpenSSL's DRBG, uuid1's
// clock sequence, Arrow's seeds, arc4random), and no draw is the same in
// both: G reseeds what T seeded at import (template.py _reseed). Two
// templates: the pool's, with the production preload and environment
// (SANDBOXD_TEMPLATE_PRELOAD replaces the preload: the audit a change of
// pool_preload needs), and one whose T made the state a check by pid
// would leave shared, G being pid 1 as T is (OpenSSL drawn from, a
// temporary file named; and multiprocessing imported). Each must find the
// sources it names, so that it cannot pass comparing nothing, and its two
// forks must share the str hash secret and layout, which only forks of
// one template do.
func TestTemplateForkSecretsDiffer(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := testdataWorkspace(t, map[string]string{"seedprobe.py": "/workspace/seedprobe.py"})
	const randomInst = "random._inst (random.Random)"
	preload := config.Default().PoolPreload
	// NumPy's global generator, its bit generator and that one's seed
	// sequence (a fresh one, as a cold import makes), and the
	// per-process sources the default stack imports (pyarrow's only where
	// the image has pyarrow: not required).
	must := []string{randomInst, "numpy.random.mtrand._rand (numpy.random.RandomState)",
		"numpy.random.mtrand._rand._bit_generator (numpy.random.BitGenerator)",
		"numpy.random.mtrand._rand._bit_generator._seed_seq (numpy.random.SeedSequence)",
		"tempfile names", "OpenSSL RAND_bytes", "uuid1 clock_seq"}
	if p := os.Getenv("SANDBOXD_TEMPLATE_PRELOAD"); p != "" {
		preload, must = strings.Split(p, ","), []string{randomInst}
	}
	for _, c := range []struct {
		name    string
		preload []string
		prelude string
		must    []string
	}{
		{"pool template", preload, "", must},
		{"pid-keyed state", nil, "import ssl as _s, tempfile as _t, multiprocessing as _m\n_s.RAND_bytes(1)\nnext(_t._get_candidate_names())",
			[]string{randomInst, "OpenSSL RAND_bytes", "tempfile names", "multiprocessing authkey"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lab := startTplLabEnv(t, r, rootfs, c.preload, c.prelude, poolTemplate(rootfs).Env)
			var draws [2]map[string]any
			for i := range draws {
				draws[i], _ = lab.forkAndRun(r, tplShellSpec(rootfs, ws, nsjail.Limits{}), seedProbePath, fmt.Sprintf("fork %d", i))
			}
			var found, same []string
			for _, part := range []string{"generators", "process"} {
				a, _ := draws[0][part].(map[string]any)
				b, _ := draws[1][part].(map[string]any)
				for k, v := range a {
					found = append(found, k)
					if w, ok := b[k]; !ok {
						t.Errorf("%s: fork 0 drew from %s, fork 1 did not find it", part, k)
					} else if v == w {
						same = append(same, fmt.Sprintf("%s: %v", k, v))
					}
				}
				for k := range b {
					if _, ok := a[k]; !ok {
						t.Errorf("%s: fork 1 drew from %s, fork 0 did not find it", part, k)
					}
				}
			}
			slices.Sort(found)
			slices.Sort(same)
			if len(same) > 0 {
				t.Errorf("the two forks drew the same from:\n%s", strings.Join(same, "\n"))
			}
			for _, k := range c.must {
				if !slices.Contains(found, k) {
					t.Errorf("the probe did not find %s; it found:\n%s", k, strings.Join(found, "\n"))
				}
			}
			a, _ := json.Marshal(draws[0]["shared"])
			b, _ := json.Marshal(draws[1]["shared"])
			if draws[0]["shared"] == nil || !bytes.Equal(a, b) {
				t.Errorf("the forks' hash secret and layout differ (%s, %s): not forks of one template", a, b)
			}
			if log := lab.logText(); log != "" {
				t.Errorf("the template logged: %s", log)
			}
			t.Logf("compared %d sources:\n%s", len(found), strings.Join(found, "\n"))
		})
	}
}

// TestTemplateForkKeyring: G joins a session keyring of its own before its
// drop, named as runc names a cold sandbox's (_ses.<id>) and described as
// a cold sandbox's (type, owner, permissions): not T's, whose name would be
// _ses.<template id>, and not another fork's (SECURITY.md case 28). The
// probe needs keyctl, which the production profile denies: this runner's
// profile allows it, so the shells' program does too, and its template
// profile is the template profile over it.
func TestTemplateForkKeyring(t *testing.T) {
	requireTemplates(t)
	r := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: nsjailtest.StateRoot, CgroupParent: nsjailtest.CgroupParent,
		Seccomp: nsjailtest.KeyctlProfile(t), TemplateSeccomp: nsjailtest.KeyctlTemplateProfile(t), Logger: poolQuietLog})
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := viewWorkspace(t)
	cold, coldID := coldView(t, r, rootfs, ws, nsjail.Limits{})
	if cold["keyring_name"] != warmpool.SessionKeyringPrefix+coldID {
		t.Fatalf("cold keyring %v %v: the probe does not work", cold["keyring_name"], cold["keyring"])
	}
	lab := startTplLab(t, r, rootfs, nil, "")
	serials := map[float64]bool{cold["keyring_serial"].(float64): true}
	for i := range 2 {
		f := lab.fork(true)
		sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(tplShellSpec(rootfs, ws, nsjail.Limits{})), f.g)
		if err != nil {
			t.Fatal(err)
		}
		lab.place(f, sh)
		view, _ := lab.runView(f, viewPath)
		sh.Destroy()
		if view["keyring"] != cold["keyring"] {
			t.Errorf("fork %d: keyring %v, cold %v", i, view["keyring"], cold["keyring"])
		}
		if want := warmpool.SessionKeyringPrefix + sh.ID(); view["keyring_name"] != want {
			t.Errorf("fork %d: keyring named %v, want %s (T's is %s%s)", i, view["keyring_name"], want,
				warmpool.SessionKeyringPrefix, lab.tpl.ID())
		}
		serial, _ := view["keyring_serial"].(float64)
		if serials[serial] {
			t.Errorf("fork %d: keyring %v is another's", i, serial)
		}
		serials[serial] = true
	}
}

// TestTemplateRefusesToFork: T checks itself before every fork and refuses
// (forking nothing, closing the fork's channels) while it holds a shared
// mapping (a fork would share its pages with T and every other execution)
// or an fd the code may not inherit (here: /dev/null, not a file of the
// image), or while it has a thread besides its own (its clone of G skips
// glibc's fork handling, safe only with one); it keeps refusing while they
// last, and ends at EOF as usual.
func TestTemplateRefusesToFork(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	for _, c := range []struct{ name, prelude, want, log string }{
		{"writable shared mapping", "import mmap as _m\n_sandboxd_shared = _m.mmap(-1, 4096)", "rw-s", ""},
		{"read-only shared mapping", "import mmap as _m\n_sandboxd_shared = _m.mmap(-1, 4096, prot=_m.PROT_READ)", "r--s", ""},
		{"stray fd", "import os as _o\n_sandboxd_fd = _o.open('/dev/null', _o.O_RDONLY)\n_o.dup2(_sandboxd_fd, 9)\n_o.close(_sandboxd_fd)", "9 -> /dev/null", ""},
		// A library that keeps a thread across os.fork (T's _quiesce
		// cannot stop it).
		{"thread", "import threading as _th, time as _ti\n_th.Thread(target=_ti.sleep, args=(600,), daemon=True).start()",
			"the template has 2 threads", "every fork is refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lab := startTplLab(t, r, rootfs, nil, c.prelude)
			for range 2 {
				f, reply := lab.request(false)
				if reply.Forked || !strings.Contains(reply.Refused, c.want) {
					t.Fatalf("T's reply %+v, want a refusal naming %q", reply, c.want)
				}
				b := make([]byte, 1)
				if n, err := f.ready.Read(b); n != 0 || err != io.EOF {
					t.Errorf("the ready pipe of a refused fork: %q, %v, want EOF", b[:n], err)
				}
			}
			if log := lab.logSays(c.log); !strings.Contains(log, c.log) {
				t.Errorf("T's log does not say %q:\n%s", c.log, log)
			}
			if ps := nsjailtest.CgroupProcs(t, lab.tpl.CgroupPaths()); len(ps) != 1 {
				t.Errorf("the template's cgroup holds %v, want T alone", ps)
			}
		})
	}
}

// TestTemplateQuiescesItsThreads: a preload whose library keeps a thread
// that its at-fork handler stops (OpenBLAS's pool, in its pthreads build)
// leaves T with one thread after _quiesce, and T forks; the thread's
// library gets no chance to start it again in T.
func TestTemplateQuiescesItsThreads(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	prelude := "import os as _o, threading as _th\n_sandboxd_stop = _th.Event()\n" +
		"_sandboxd_pool = _th.Thread(target=_sandboxd_stop.wait, daemon=True)\n_sandboxd_pool.start()\n" +
		"_o.register_at_fork(before=lambda: (_sandboxd_stop.set(), _sandboxd_pool.join()))"
	lab := startTplLab(t, r, rootfs, nil, prelude)
	f := lab.fork(false)
	f.ctl.Close() // EOF before a hand-off: it retires
	if ws := lab.exitReport(f); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("retired G's wait status %#x, want exit 0", uint32(ws))
	}
	f.goAhead.Close()
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	if n := nsjailtest.ProcStatus(t, tpid, "Threads"); n != "1" {
		t.Errorf("T has %s threads after its quiesce, want 1", n)
	}
}

// TestTemplateGRefusesWhatAtForkHandlersMade: T checks itself before the
// fork, but at-fork handlers (a library's pthread_atfork, the preload's
// os.register_at_fork) run after that check, in G. An fd, a shared mapping
// or a thread one of them made is refused by G itself: it never
// becomes ready (the ready pipe reads EOF), T reports exit 71, and the log
// names what was refused; the fd is never closed behind its library's
// back, the mapping never left to the code.
func TestTemplateGRefusesWhatAtForkHandlersMade(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	for _, c := range []struct{ name, prelude, log string }{
		{"fd", atForkFDPrelude, "stray fds in G: 29 -> /dev/null"},
		{"shared mapping", "import os as _o, mmap as _m\n_sandboxd_maps = []\n_o.register_at_fork(after_in_child=lambda: _sandboxd_maps.append(_m.mmap(-1, 4096)))",
			"shared mappings in G"},
		{"thread", "import os as _o, threading as _th, time as _ti\n_o.register_at_fork(after_in_child=lambda: _th.Thread(target=_ti.sleep, args=(60,), daemon=True).start())",
			"G has 2 threads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lab := startTplLab(t, r, rootfs, nil, c.prelude)
			f, reply := lab.requestOnly(false)
			if !reply.Forked {
				t.Fatalf("T refused (%+v): its own check must pass, the handler runs only after the fork", reply)
			}
			b := make([]byte, 1)
			if n, err := f.ready.Read(b); n != 0 || err != io.EOF {
				t.Errorf("the ready pipe of a refusing G: %q, %v, want EOF", b[:n], err)
			}
			if ws := lab.exitReport(f); !ws.Exited() || ws.ExitStatus() != 71 {
				t.Errorf("T reported %#x, want G's exit 71", uint32(ws))
			}
			f.goAhead.Close()
			if log := lab.logSays(c.log); !strings.Contains(log, c.log) {
				t.Errorf("the template's log does not say %q:\n%s", c.log, log)
			}
		})
	}
}

// atForkFDPrelude, run in T before template.py, leaves every fork child an
// fd 29 (above the fork's channels) that T's own check never saw: G refuses it and ends before it sends
// its pidfd.
const atForkFDPrelude = "import os as _o\ndef _sandboxd_h():\n    fd = _o.open('/dev/null', _o.O_RDONLY | _o.O_CLOEXEC)\n    _o.dup2(fd, 29)\n    _o.close(fd)\n_o.register_at_fork(after_in_child=_sandboxd_h)"

// TestPoolForkEndsWhenGRefuses: the pool's own fork of such a template
// fails as soon as T reports that G ended, and says so. It used to wait
// out forkTimeout (30 s) for G's pidfd, the template's fork lock held:
// the pool keeps its own copy of the sandbox's end of G's control socket,
// so that socket never reads EOF.
func TestPoolForkEndsWhenGRefuses(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	pool, err := warmpool.New(r, poolConfig(t, 0, t.TempDir(), 0), nil, poolQuietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = warmpool.ForkFromPrelude(pool, poolTemplate(rootfs), atForkFDPrelude)
	if err == nil || !strings.Contains(err.Error(), "G ended before it sent its pidfd") {
		t.Fatalf("the fork of a template whose G refuses: %v, want G's end reported", err)
	}
}

// TestTemplateServesPastATracedG: a G that dies while another process
// traces it (Shell.MoveG's and CheckConfined's ptrace pins) stays a zombie
// only its tracer can wait for, until the tracer lets it go. T, which
// relays every fork's end from one loop, must not wait for it meanwhile:
// the next fork is made while the tracer still holds the dead G, and the
// dead G's report comes once the tracer let it go.
func TestTemplateServesPastATracedG(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTplLab(t, r, rootfs, nil, "")
	a := lab.fork(false)
	gpid := nsjailtest.PidfdPid(t, a.g)

	attached, tracerDone := make(chan error, 1), make(chan error, 1)
	release := make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let()
	go func() {
		// ptrace requests come from the tracer's thread: this goroutine
		// keeps it (and the thread ends with it, never reused).
		runtime.LockOSThread()
		if err := unix.PtraceSeize(gpid); err != nil {
			attached <- err
			return
		}
		attached <- nil
		<-release
		// As the tracer, not the parent: this hands the zombie back to T.
		var ws unix.WaitStatus
		_, err := unix.Wait4(gpid, &ws, unix.WALL, nil)
		tracerDone <- err
	}()
	if err := <-attached; err != nil {
		t.Fatalf("PTRACE_SEIZE G: %v", err)
	}
	if err := unix.PidfdSendSignal(int(a.g.Fd()), unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	// G's pidfd is readable once it is a zombie, tracer or not.
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(a.g.Fd()), Events: unix.POLLIN}}, -1)
		if err == nil && n > 0 {
			break
		}
		if err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
	}
	watchdog := time.AfterFunc(2*time.Minute, let) // a T stuck in waitid gets G back, and the test ends
	defer watchdog.Stop()
	b := lab.fork(false)
	select {
	case <-release:
		t.Fatal("T made the next fork only once the tracer let the dead G go")
	default:
	}
	let()
	if err := <-tracerDone; err != nil {
		t.Fatalf("the tracer's wait: %v", err)
	}
	if ws := lab.exitReport(a); !ws.Signaled() || ws.Signal() != unix.SIGKILL {
		t.Errorf("T reported %#x for the traced G, want SIGKILL", uint32(ws))
	}
	a.goAhead.Close()
	if !reaped(t, a, time.Minute) {
		t.Error("T did not reap the traced G after the go-ahead")
	}
	b.ctl.Close() // EOF before a hand-off: b retires
	if ws := lab.exitReport(b); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("retired G's wait status %#x, want exit 0", uint32(ws))
	}
	b.goAhead.Close()
}

// TestTemplateReapsGOnlyAfterGoAhead: T reports G's exit at once but
// leaves G a zombie (its pid still G's, never free for a host process that
// Shell.MoveG's write would then move) until the worker's go-ahead; then it
// reaps G. And a fork without output fds gets /dev/null as fds
// 0-2, never T's; the image files it keeps (libffi's) are opened again on
// the shell's root mount, not held through T's mount namespace; closing
// its control socket retires it (exit 0).
func TestTemplateReapsGOnlyAfterGoAhead(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTplLab(t, r, rootfs, nil, "")

	f := lab.fork(false)
	gpid := nsjailtest.PidfdPid(t, f.g)
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.PidfdSendSignal(int(f.g.Fd()), unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	if ws := lab.exitReport(f); !ws.Signaled() || ws.Signal() != unix.SIGKILL {
		t.Errorf("T reported %#x, want SIGKILL", uint32(ws))
	}
	for range 5 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", gpid)); err != nil {
			t.Fatalf("G (pid %d) was reaped before the go-ahead: %v", gpid, err)
		}
		if st := nsjailtest.ProcStatus(t, gpid, "State"); !strings.HasPrefix(st, "Z") {
			t.Fatalf("G (pid %d) is %q before the go-ahead, want a zombie", gpid, st)
		}
		if p := nsjailtest.PPid(t, gpid); p != tpid {
			t.Fatalf("pid %d's parent is %d, want T (%d)", gpid, p, tpid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if reaped(t, f, 0) {
		t.Fatal("T closed the report before the go-ahead")
	}
	f.goAhead.Close()
	if !reaped(t, f, time.Minute) {
		t.Fatal("T did not reap G after the go-ahead")
	}
	if err := unix.PidfdSendSignal(int(f.g.Fd()), 0, nil, 0); err != unix.ESRCH {
		t.Errorf("G after the go-ahead: %v, want reaped (ESRCH)", err)
	}

	// A fork without output fds, placed: fds 0-2 are /dev/null.
	f = lab.fork(false)
	sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), f.g)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Destroy()
	lab.place(f, sh)
	for fd := range 3 {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", sh.GPid(), fd), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
			t.Errorf("G's fd %d is not /dev/null (mode %o, rdev %#x)", fd, st.Mode, st.Rdev)
		}
	}
	// The image files G kept (libffi's) are opened on the shell's root
	// mount, not through T's mount namespace.
	rootID, fileFds := "", 0
	mountinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", sh.GPid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/" {
			rootID = f[0]
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", sh.GPid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fds {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%s", sh.GPid(), e.Name()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		fileFds++
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", sh.GPid(), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(info), "\nmnt_id:\t"+rootID+"\n") {
			t.Errorf("G's fd %s is not on the shell's root mount %s:\n%s", e.Name(), rootID, info)
		}
	}
	if fileFds == 0 || rootID == "" {
		t.Errorf("G holds no image file (libffi's) to check (root mount %q)", rootID)
	}
	f.ctl.Close() // EOF before a hand-off: the pool retires the fork
	if ws := lab.exitReport(f); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("retired G's wait status %#x, want exit 0", uint32(ws))
	}
	if !reaped(t, f, time.Minute) {
		t.Error("T did not reap G")
	}
	if ps := nsjailtest.CgroupProcs(t, sh.CgroupPaths()); len(ps) != 0 {
		t.Errorf("processes left in the shell's cgroup: %v", ps)
	}
}

// requireTemplates skips without root (template forks run on cgroup v1
// and v2 alike).
func requireTemplates(t testing.TB) {
	t.Helper()
	nsjailtest.RequireRoot(t)
}

// TestTemplateForkServesAKernel: a fork handed off with Kernel set is a
// session's kernel, run by zygote.py's own _kernel: it answers the
// hand-off, runs a cell with the request's own stdout, as the sandbox user
// and pid 1, keeps its namespace for the next cell, and exits 0 at EOF.
// T's user namespace is still U_T after its forks (T never unshares one).
func TestTemplateForkServesAKernel(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTplLab(t, r, rootfs, nil, "")
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	userNS := func() uint64 {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", tpid), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	before := userNS()
	f := lab.fork(false)
	sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), f.g)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Destroy()
	lab.place(f, sh)
	line, err := warmpool.EncodeHandoff(warmpool.Handoff{Kernel: true, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	sendLine(t, f.ctl, line)
	reply := func(seq uint64) {
		t.Helper()
		msg, _ := recvLine(t, f.ctl)
		if rep, err := warmpool.DecodeKernelReply([]byte(msg)); err != nil || rep.Seq != seq || rep.ExitCode != 0 {
			t.Fatalf("kernel reply %q (%+v, %v), want seq %d exit 0\nlog: %s", msg, rep, err, seq, lab.logText())
		}
	}
	reply(warmpool.KernelReadySeq)
	for seq, c := range []struct{ code, want string }{
		{"import os\nx = 41\nprint(os.getuid(), os.getpid())", "10001 1\n"},
		{"print(x + 1)", "42\n"},
	} {
		outR, outW := pipe(t)
		errR, errW := pipe(t)
		evR, evW := pipe(t)
		req, err := warmpool.EncodeKernelRequest(warmpool.KernelRequest{Seq: uint64(seq + 1), Code: c.code})
		if err != nil {
			t.Fatal(err)
		}
		sendLine(t, f.ctl, req, outW, errW, evW)
		outW.Close()
		errW.Close()
		evW.Close()
		out, _ := io.ReadAll(outR)
		stderr, _ := io.ReadAll(errR)
		_, _ = io.ReadAll(evR)
		outR.Close()
		errR.Close()
		evR.Close()
		if string(out) != c.want {
			t.Errorf("cell %d printed %q, want %q (stderr %q)", seq+1, out, c.want, stderr)
		}
		reply(uint64(seq + 1))
	}
	f.ctl.Close() // EOF: the session is over
	if ws := lab.exitReport(f); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("the kernel's wait status %#x, want exit 0", uint32(ws))
	}
	if after := userNS(); after != before {
		t.Errorf("T's user namespace changed from %d to %d", before, after)
	}
}

// forkProbe is what testdata/forkprobe.py prints.
type forkProbe struct {
	Self  int `json:"self"`
	Child int `json:"child"`
	// Procs are /proc's processes by pid: Name, State, PPid, NSpid.
	Procs map[string]map[string]string `json:"procs"`
	// Signalable are the pids kill(pid, 0) did not answer ESRCH, with
	// its answer.
	Signalable map[string]string `json:"signalable"`
	RootMnt    string            `json:"root_mnt"`
	FDs        map[string]struct {
		Target string `json:"target"`
		Mode   uint32 `json:"mode"`
		Ino    uint64 `json:"ino"`
		Rdev   uint64 `json:"rdev"`
		Flags  int    `json:"flags"`
		MntID  string `json:"mnt_id"`
	} `json:"fds"`
}

// TestTemplateForkIsConfined: the template-fork defences of SECURITY.md
// cases 66-69 on one fork of template.py, each case a subtest checked at
// its moment: after StartShell, the shell's init is gone (reaped: no
// process but G in G's pid namespace) without ever having been exec'd
// (66); after READY and before the hand-off, G's status as the host reads
// it shows it confined (67); the code, handed off with an events pipe,
// sees only its own processes (66), only its own pid namespace, and
// signals nothing else among pids 1-32768 (69), and holds no fd but 0-2,
// the hand-off's channels and read-only image files (68).
func TestTemplateForkIsConfined(t *testing.T) {
	requireTemplates(t)
	r := newPoolRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	ws := viewWorkspace(t)
	lab := startTplLab(t, r, rootfs, nil, "")
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	tplSocket, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", tpid, warmpool.TemplateFD))
	if err != nil || !strings.HasPrefix(tplSocket, "socket:") {
		t.Fatalf("T's control socket: %q, %v", tplSocket, err)
	}
	// A live fork beside the probed one: T holds its pidfd, exit report
	// and go-ahead, which the probed G's clone copies and must close
	// (case 68).
	other := lab.fork(false)
	defer func() {
		other.ctl.Close() // EOF before a hand-off: it retires
		lab.exitReport(other)
		other.goAhead.Close()
	}()
	f := lab.fork(true)
	sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(tplShellSpec(rootfs, ws, nsjail.Limits{})), f.g)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Destroy()
	gpid := sh.GPid()

	t.Run("66 the shell's init is gone before G moves in", func(t *testing.T) {
		if got := pidNamespaceMembers(t, gpid); len(got) != 1 || got[0] != gpid {
			t.Errorf("processes in G's pid namespace after StartShell: %v, want G (%d) alone", got, gpid)
		}
		// libcontainer removes its exec fifo when the init is let exec
		// (Container.Exec; its own Created-or-Running test): still there,
		// the init died without running the shell's command.
		if _, err := os.Stat(filepath.Join(r.StateRoot(), sh.ID(), "exec.fifo")); err != nil {
			t.Errorf("the shell's exec fifo: %v (was its init exec'd?)", err)
		}
	})

	lab.place(f, sh)
	t.Run("67 G is confined before its hand-off", func(t *testing.T) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", gpid))
		if err != nil {
			t.Fatal(err)
		}
		// G's pidfd still names an unreaped process after the read: its
		// pid was not reused, the status read was G's.
		if err := unix.PidfdSendSignal(int(f.g.Fd()), 0, nil, 0); err != nil {
			t.Fatalf("G is gone: %v", err)
		}
		got := map[string]string{}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				got[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		ids := func(id int) string { return strings.TrimSpace(strings.Repeat(strconv.Itoa(id)+" ", 4)) }
		none := "0000000000000000"
		want := map[string]string{"CapInh": none, "CapPrm": none, "CapEff": none, "CapBnd": none, "CapAmb": none,
			// As the host sees them: the sandbox user's (inside.UID and
			// inside.GID in U_F).
			"Uid": ids(r.HostUID()), "Gid": ids(r.HostGID()), "Groups": "",
			"NoNewPrivs": "1", "Seccomp": "2", "Threads": "1"}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("G's %s before its hand-off is %q, want %q", k, got[k], w)
			}
		}
	})

	// The hand-off, with an events pipe: a channel of the hand-off's own.
	evR, evW := pipe(t)
	defer evR.Close()
	go func() { _, _ = io.Copy(io.Discard, evR) }()
	var probe forkProbe
	st := lab.runHandoff(f, warmpool.Handoff{Path: probePath, Argv: []string{probePath}, Events: true}, &probe, evW)
	evW.Close()
	if !st.Exited() || st.ExitStatus() != 0 {
		t.Errorf("G's wait status %#x, want exit 0", uint32(st))
	}
	own := []string{strconv.Itoa(probe.Self), strconv.Itoa(probe.Child)}
	slices.Sort(own)
	if probe.Self != 1 || probe.Child <= 1 {
		t.Fatalf("the code is pid %d, its child %d: want pid 1 and another", probe.Self, probe.Child)
	}

	t.Run("66 the code sees only its own processes", func(t *testing.T) {
		var pids []string
		for p := range probe.Procs {
			pids = append(pids, p)
		}
		slices.Sort(pids)
		if !slices.Equal(pids, own) {
			t.Errorf("the code's /proc lists %v, want only the code and its child %v: %v", pids, own, probe.Procs)
		}
	})

	t.Run("68 the code holds no namespace fd and nothing of T's", func(t *testing.T) {
		ino := func(f *os.File) uint64 {
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			return st.Ino
		}
		// nsfs links read TYPE:[INODE].
		nsTypes := append(nsjail.ShellNamespaces(), "user", "pid", "pid_for_children", "time", "time_for_children")
		// Pipes: one inode for both ends.
		channels := map[int]uint64{1: ino(f.stdout), 2: ino(f.stderr), runner.EventsFD: ino(evR)}
		for name, fd := range probe.FDs {
			n, _ := strconv.Atoi(name)
			switch {
			case fd.Target == tplSocket:
				t.Errorf("fd %d is T's control socket", n)
			case slices.Contains(nsTypes, strings.SplitN(fd.Target, ":[", 2)[0]):
				t.Errorf("fd %d is a namespace (%s)", n, fd.Target)
			case n == 0:
				if fd.Mode&unix.S_IFMT != unix.S_IFCHR || fd.Rdev != unix.Mkdev(1, 3) {
					t.Errorf("fd 0 is %s, want /dev/null", fd.Target)
				}
			case channels[n] != 0:
				if !strings.HasPrefix(fd.Target, "pipe:") || fd.Ino != channels[n] {
					t.Errorf("fd %d is %s (inode %d), not the hand-off's own pipe (inode %d)", n, fd.Target, fd.Ino, channels[n])
				}
			default:
				// An image file T's check admits: read-only, a regular
				// file, on the shell's read-only root mount.
				if fd.Mode&unix.S_IFMT != unix.S_IFREG || fd.Flags&(unix.O_ACCMODE|unix.O_PATH) != unix.O_RDONLY ||
					fd.MntID != probe.RootMnt {
					t.Errorf("fd %d is %s (mode %o, flags %o, mount %s; root %s): neither 0-2, a channel of the hand-off nor a read-only image file",
						n, fd.Target, fd.Mode, fd.Flags, fd.MntID, probe.RootMnt)
				}
			}
		}
		for n := range channels {
			if _, ok := probe.FDs[strconv.Itoa(n)]; !ok {
				t.Errorf("the code has no fd %d: the listing missed a channel of the hand-off", n)
			}
		}
	})

	t.Run("69 the code cannot see or signal T", func(t *testing.T) {
		// /proc is the code's own pid namespace's: an ancestor's procfs
		// would list each process's pid in both (NSpid).
		for p, s := range probe.Procs {
			if len(strings.Fields(s["NSpid"])) != 1 {
				t.Errorf("pid %s's NSpid in the code's /proc is %q: not its own pid namespace's", p, s["NSpid"])
			}
		}
		var reached []string
		for p, answer := range probe.Signalable {
			if answer != "ok" || !slices.Contains(own, p) {
				reached = append(reached, p+" "+answer)
			}
		}
		if len(reached) > 0 {
			t.Errorf("kill(pid, 0) from the code found processes not its own: %v", reached)
		}
		for _, p := range own {
			if probe.Signalable[p] != "ok" {
				t.Errorf("kill(%s, 0) of the code's own process: %q, want ok (the sweep sees nothing)", p, probe.Signalable[p])
			}
		}
	})

	if !reaped(t, f, time.Minute) {
		t.Error("T did not reap G")
	}
}

// pidNamespaceMembers are the host pids of the processes in pid's pid
// namespace, sorted.
func pidNamespaceMembers(t *testing.T, pid int) []int {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &want); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", p), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// BenchmarkTemplateForkMemory: what an idle fork costs (issue 17: private
// memory per idle warm sandbox, target ≤ 10 MiB; TEMPLATE.md §12 M2). A
// template preloads the pool's default stack; b.N forks are made ready
// (shell, MoveG, join, READY) and left idle; then, per fork, the private
// memory (USS: Private_Clean + Private_Dirty of smaps_rollup) of G, and
// G's PSS, which shares the template's pages among T and every
// fork alive. Run with a fixed count, e.g. -benchtime 20x: the forks stay
// alive together until the end.
func BenchmarkTemplateForkMemory(b *testing.B) {
	requireTemplates(b)
	r := newPoolRunner(b)
	rootfs := nsjailtest.RuntimeRootfs(b)
	lab := startTplLab(b, r, rootfs, config.DefaultPreload, "")
	var gs []int
	for range b.N {
		f := lab.fork(false)
		sh, err := r.StartShell(context.Background(), lab.tpl, f.shellSpec(nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), f.g)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sh.Destroy() })
		lab.place(f, sh)
		gs = append(gs, nsjailtest.PidfdPid(b, f.g))
	}
	b.StopTimer()
	var gUSS, gPSS float64
	for _, g := range gs {
		u, p := smapsRollup(b, g)
		gUSS, gPSS = gUSS+u, gPSS+p
	}
	tpid, err := lab.tpl.Pid()
	if err != nil {
		b.Fatal(err)
	}
	_, tPSS := smapsRollup(b, tpid)
	n := float64(len(gs))
	b.ReportMetric(gUSS/n/(1<<20), "G-USS-MiB/fork")
	b.ReportMetric(gPSS/n/(1<<20), "G-PSS-MiB/fork")
	b.ReportMetric(tPSS/(1<<20), "T-PSS-MiB")
}

// smapsRollup is pid's private memory (Private_Clean + Private_Dirty) and
// PSS, in bytes.
func smapsRollup(t testing.TB, pid int) (private, pss float64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Private_Clean:", "Private_Dirty:":
			private += kb * 1024
		case "Pss:":
			pss = kb * 1024
		}
	}
	return private, pss
}

// sharedVMAsProbe loads template.py as a module and prints, as JSON, what
// its _shared_vmas finds (through PROCMAP_QUERY where the kernel has it,
// "ioctl"), what the /proc/self/maps fallback finds for the same mappings
// ("maps": start and end of each), and what each finds once the probe
// added a writable shared mapping ("ioctl_after", "maps_after").
const sharedVMAsProbe = `import json, mmap, sys
tpl = {"__name__": "template"}
exec(compile(sys.argv[1], "template.py", "exec"), tpl)
def spans(vmas):
    if tpl["_procmap_query"]:
        return [[v[0], v[1]] for v in vmas]
    return [[int(x, 16) for x in line.split()[0].split("-")] for line in vmas]
def both():
    got = tpl["_shared_vmas"]()
    ioctl = tpl["_procmap_query"]
    tpl["_procmap_query"] = False
    fallback = tpl["_shared_vmas"]()
    maps = spans(fallback)
    tpl["_procmap_query"] = ioctl
    return got, ioctl, maps
first, ioctl, maps = both()
keep = mmap.mmap(-1, 4096)
after, _, maps_after = both()
print(json.dumps({"procmap_query": ioctl, "ioctl": spans(first), "maps": maps,
    "ioctl_after": spans(after), "maps_after": maps_after, "changed": first != after}))
`

// TestTemplateSharedVMAs: T's check for shared mappings before each fork
// (SECURITY.md case 63's "no shared mapping") asks the kernel for the
// shared ones through PROCMAP_QUERY (Linux 6.11+) instead of reading all
// of /proc/self/maps (~2.7 ms of T's CPU per fork), and must find exactly
// the mappings the maps fallback finds, and see a new one appear.
func TestTemplateSharedVMAs(t *testing.T) {
	rootfs := nsjailtest.RuntimeRootfs(t)
	r := newPoolRunner(t)
	tpl := poolTemplate(rootfs)
	res, err := r.Run(context.Background(), nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "-P", "-c", sharedVMAsProbe, warmpool.TemplateSource},
		Env: tpl.Env, Limits: tpl.Limits})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != nsjail.StatusSucceeded {
		t.Fatalf("status %s: %s", res.Status, res.Stderr)
	}
	var got struct {
		ProcmapQuery bool        `json:"procmap_query"`
		IOCtl        [][2]uint64 `json:"ioctl"`
		Maps         [][2]uint64 `json:"maps"`
		IOCtlAfter   [][2]uint64 `json:"ioctl_after"`
		MapsAfter    [][2]uint64 `json:"maps_after"`
		Changed      bool        `json:"changed"`
	}
	if err := json.Unmarshal(res.Stdout, &got); err != nil {
		t.Fatalf("%v: %s", err, res.Stdout)
	}
	t.Logf("PROCMAP_QUERY %v; shared mappings %v, then %v", got.ProcmapQuery, got.IOCtl, got.IOCtlAfter)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor)
	if has := major > 6 || major == 6 && minor >= 11; has != got.ProcmapQuery {
		t.Errorf("kernel %d.%d: PROCMAP_QUERY used %v, want %v", major, minor, got.ProcmapQuery, has)
	}
	if !slices.Equal(got.IOCtl, got.Maps) || !slices.Equal(got.IOCtlAfter, got.MapsAfter) {
		t.Errorf("_shared_vmas finds %v then %v; /proc/self/maps lists %v then %v", got.IOCtl, got.IOCtlAfter, got.Maps, got.MapsAfter)
	}
	if !got.Changed || len(got.IOCtlAfter) != len(got.IOCtl)+1 {
		t.Errorf("a new writable shared mapping: %v → %v (changed %v), want one more", got.IOCtl, got.IOCtlAfter, got.Changed)
	}
}
