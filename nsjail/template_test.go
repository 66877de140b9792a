package nsjail_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/cgroup"
	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/inside"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
	"github.com/sandboxd/sandboxd/seccomp"
	"golang.org/x/sys/unix"
)

// The template forks of issue 17 (server/warmpool/TEMPLATE.md; experiment
// E4 on the production API). testdata/templatefork.py is the template's
// side: T clones G into a new user namespace U_F and pid namespace PID_F;
// the worker makes a
// shell for G (Runner.StartShell), moves G into its cgroup (Shell.MoveG)
// and hands G the shell's namespace fds and seccomp program; G joins,
// drops and prints what it sees, which must be what a cold sandbox's
// process sees. templatefork.py is these tests' stand-in for the template;
// the production program, server/warmpool/template.py, is tested the same
// way in server/warmpool (template_test.go).

// forkViewKeys are the fields of the inside view that a fork must share
// with a cold run, all of them but the template-only ones, apart from the
// one stated difference (nsjailtest.ForkViewDifference).
var forkViewKeys = []string{"seccomp_filters", "unshare_user", "mount_syscall", "uid", "gid", "groups", "caps",
	"no_new_privs", "seccomp", "uid_map", "gid_map", "cgroup", "oom_score_adj", "hostname", "mounts",
	"root_mount_options", "net", "cwd", "procs", "pid", "ppid", "fds", "rootfs_write", "oom_lower"}

// labT is what templateLab needs of a test: a *testing.T, or panicT in
// a crashy worker.
type labT interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
	Errorf(string, ...any)
	Cleanup(func())
}

// panicT is a labT outside a test: it panics on failure and cleans
// nothing up (the crashy worker is SIGKILLed).
type panicT struct{}

func (panicT) Helper()                   {}
func (panicT) Fatal(a ...any)            { panic(fmt.Sprint(a...)) }
func (panicT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (panicT) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (panicT) Cleanup(func())            {}

// templateLab is one running template of testdata/templatefork.py.
type templateLab struct {
	t     labT
	r     *nsjail.Runner
	tpl   *nsjail.Template
	ctl   *net.UnixConn
	lines chan string // the template's stdout (its forks' views), by line
	// preps are the prepared shells of the forks (by G's pidfd): their
	// ids, and on cgroup v2 the cgroups T cloned G into.
	preps map[*os.File]*nsjail.PreparedShell
	// prepareTime and moveTime are the last PrepareShell's and MoveG's
	// wall time (TEMPLATE.md M7, logged).
	prepareTime, moveTime time.Duration
	// forkTime is the last fork request's wall time to G's pidfd (T's
	// clone3 of G with its namespaces, G's maps).
	forkTime time.Duration
}

// specFor is spec for the shell of fork g: with its prepared shell's ID.
func (l *templateLab) specFor(g *os.File, spec nsjail.Spec) nsjail.Spec {
	if p := l.preps[g]; p != nil && l.v2() {
		spec.ID = p.ID()
	}
	return spec
}

// v2 tells whether the template is on cgroup v2 (G born in its shell's
// cgroup, TEMPLATE.md section 4).
func (l *templateLab) v2() bool {
	_, ok := l.tpl.CgroupPaths().V2()
	return ok
}

// shellsParent is where shells' cgroups are made: the template's cgroup
// directories on v1, tpl-<id> (the parent of its leaf) on v2.
func (l *templateLab) shellsParent() []string {
	if d, ok := l.tpl.CgroupPaths().V2(); ok {
		return []string{filepath.Dir(d)}
	}
	return slices.Collect(maps.Values(l.tpl.CgroupPaths()))
}

func startTemplateLab(t labT, r *nsjail.Runner, rootfs, src string, args ...string) *templateLab {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "ctl"), os.NewFile(uintptr(pair[1]), "ctl-peer")
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	lab := &templateLab{t: t, r: r, ctl: conn.(*net.UnixConn), lines: make(chan string, 64), preps: map[*os.File]*nsjail.PreparedShell{}}
	var mu sync.Mutex
	var pending, stderr bytes.Buffer
	out := func(stream string, chunk []byte) {
		mu.Lock()
		defer mu.Unlock()
		if stream != nsjail.StreamStdout {
			stderr.Write(chunk)
			return
		}
		pending.Write(chunk)
		for {
			line, err := pending.ReadString('\n')
			if err != nil {
				pending.WriteString(line)
				return
			}
			select {
			case lab.lines <- line:
			default: // the test reads every line it asks for; never block the capture
			}
		}
	}
	tpl, err := r.StartTemplate(nsjail.Spec{Rootfs: rootfs, Args: append([]string{"python3", "-B", "-P", "-c", src, "--template"}, args...),
		Env: []string{"HOME=/tmp"}, Output: out}, theirs)
	theirs.Close()
	if err != nil {
		lab.ctl.Close()
		t.Fatalf("StartTemplate: %v", err)
	}
	lab.tpl = tpl
	t.Cleanup(func() {
		_, _ = lab.ctl.Write([]byte("quit\n"))
		lab.ctl.Close()
		res := tpl.Stop(10 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		if res.Status != nsjail.StatusSucceeded {
			t.Errorf("template ended %s (exit %d): %s\nstderr: %s", res.Status, res.ExitCode, res.Error, stderr.String())
		}
	})
	// Nothing here may hang the test: a read past this is a failure.
	_ = lab.ctl.SetDeadline(time.Now().Add(5 * time.Minute))
	return lab
}

// line is the template's next line of stdout.
func (l *templateLab) line() map[string]any {
	l.t.Helper()
	select {
	case s := <-l.lines:
		var v map[string]any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			l.t.Fatalf("template output %q: %v", s, err)
		}
		return v
	case <-time.After(5 * time.Minute):
		l.t.Fatal("no output from the template")
		return nil
	}
}

// recv reads one line from the control socket with the fds sent with it.
func (l *templateLab) recv() (string, []int) {
	l.t.Helper()
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(8*4))
	var line []byte
	var fds []int
	for !bytes.HasSuffix(line, []byte("\n")) {
		n, oobn, _, _, err := l.ctl.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			l.t.Fatalf("control socket: %v (read %q)", err, line)
		}
		line = append(line, buf[:n]...)
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				l.t.Fatal(err)
			}
			for _, m := range msgs {
				got, err := unix.ParseUnixRights(&m)
				if err != nil {
					l.t.Fatal(err)
				}
				fds = append(fds, got...)
			}
		}
	}
	return string(line), fds
}

func (l *templateLab) send(msg string, files ...*os.File) {
	l.t.Helper()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := l.ctl.WriteMsgUnix([]byte(msg), oob, nil); err != nil {
		l.t.Fatal(err)
	}
}

// fork asks the template for a fork and returns G's pidfd.
func (l *templateLab) fork() *os.File { return l.forkWith(nil) }

// forkWith is fork with more keys for the fork request (templatefork.py).
func (l *templateLab) forkWith(extra map[string]any) *os.File {
	l.t.Helper()
	uidMap, gidMap := l.tpl.ForkIDMap()
	req := map[string]any{"uid_map": uidMap, "gid_map": gidMap}
	for k, v := range extra {
		req[k] = v
	}
	t0 := time.Now()
	prep, err := l.r.PrepareShell(l.tpl)
	if err != nil {
		l.t.Fatal(err)
	}
	l.prepareTime = time.Since(t0)
	l.t.Cleanup(func() { prep.Close() })
	if prep.CgroupFile() != nil {
		req["cgroup"] = true
	}
	maps, _ := json.Marshal(req)
	t1 := time.Now()
	l.send("fork " + string(maps) + "\n")
	if cg := prep.CgroupFile(); cg != nil {
		l.send("c", cg)
	}
	msg, fds := l.recv()
	if msg != "G\n" || len(fds) != 1 {
		l.t.Fatalf("want G's pidfd, got %q with %d fds", msg, len(fds))
	}
	l.forkTime = time.Since(t1)
	g := os.NewFile(uintptr(fds[0]), "pidfd-G")
	l.preps[g] = prep
	return g
}

// place joins G into shell sh, hands it the program and returns G's view
// and, once G ended, its wait status as T reported it.
func (l *templateLab) place(sh *nsjail.Shell, mode string) (view map[string]any, status string) {
	l.t.Helper()
	t0 := time.Now()
	if err := sh.MoveG(); err != nil {
		l.t.Fatalf("MoveG: %v", err)
	}
	l.moveTime = time.Since(t0)
	if err := sh.MoveG(); err != nil { // already there: nothing to do
		l.t.Fatalf("MoveG again: %v", err)
	}
	if tracer := nsjailtest.ProcStatus(l.t, sh.GPid(), "TracerPid"); tracer != "0" {
		l.t.Fatalf("G is traced by %s after MoveG", tracer)
	}
	l.send("join\n", sh.NamespaceFiles()...)
	if msg, _ := l.recv(); msg != "joined\n" {
		l.t.Fatalf("want joined, got %q", msg)
	}
	sh.CloseNamespaces()
	// The ids G drops to come from inside, as the real template's come
	// in its join: the lab names no uid of its own.
	l.send(fmt.Sprintf("%s %d %d %x\n", mode, inside.UID, inside.GID, []byte(sh.SeccompProgram())))
	view = l.line()
	status, _ = l.recv()
	if forked, _ := l.recv(); forked != "forked\n" {
		l.t.Fatalf("want forked, got %q", forked)
	}
	return view, strings.TrimSpace(status)
}

func templateSource(t labT) string {
	t.Helper()
	src, err := os.ReadFile("testdata/templatefork.py")
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// TestTemplateForkMatchesCold: a fork placed in a shell sees what a cold
// sandbox's process sees (ids, maps, capabilities, no_new_privs, seccomp
// mode, the answers of denied syscalls, cgroups, hostname, mounts and
// their options, interfaces, pids, cwd, fds), but for the one stated
// difference: two seccomp filters, the template's and the execution's,
// where a cold process has one (nsjailtest.ForkViewDifference); a
// memory bomb in a fork is OOM-killed in the shell's own cgroup, not the
// template's; the seccomp program a shell hands over is the one the kernel
// holds for a cold sandbox's process, the same for every shell; a pidfd
// of anything but a fork of the template is refused; and nothing is left
// (RunAndCheck). SANDBOXD_TEMPLATE_PRELOAD=numpy,pandas,matplotlib.pyplot
// makes the template import those first, as a real one would.
func TestTemplateForkMatchesCold(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	src := templateSource(t)
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	viewArgs := []string{"python3", "-B", "-P", "-c", src, "--view"}

	// The cold view, and the program the kernel holds for a cold
	// sandbox's process.
	cold := run(t, r, nsjail.Spec{Rootfs: rootfs, Args: viewArgs, Workspace: ws, WorkspaceReadOnly: true})
	wantStatus(t, cold, nsjail.StatusSucceeded)
	var coldView map[string]any
	if err := json.Unmarshal(cold.Stdout, &coldView); err != nil {
		t.Fatalf("cold view %q: %v", cold.Stdout, err)
	}
	coldProg := coldProgram(t, r, rootfs)

	var tplArgs []string
	if preload := os.Getenv("SANDBOXD_TEMPLATE_PRELOAD"); preload != "" {
		// e.g. numpy,pandas,matplotlib.pyplot: fork a real template (E4)
		tplArgs = append(tplArgs, "--preload="+preload)
	}
	lab := startTemplateLab(t, r, rootfs, src, tplArgs...)
	shellSpec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}, Workspace: ws, WorkspaceReadOnly: true,
		Limits: nsjail.Limits{MemoryBytes: 256 << 20}}

	// Refused: the template's own pidfd (G's parent): not a fork's pid 1
	// in namespaces that are children of the template's.
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	g := lab.fork()
	if p := nsjailtest.PPid(t, nsjailtest.PidfdPid(t, g)); p != tpid {
		t.Fatalf("G's parent is %d, want the template (%d)", p, tpid)
	}
	lab.refuse(t, shellSpec, "the template", pidfdOf(t, tpid), "not a fork")

	var firstProg seccomp.Program
	for i, mode := range []string{"go", "oom", "go"} {
		if i > 0 {
			g = lab.fork()
		}
		t0 := time.Now()
		sh, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, shellSpec), g)
		shellTime := time.Since(t0)
		g.Close()
		if err != nil {
			t.Fatalf("fork %d: StartShell: %v", i, err)
		}
		if d, ok := sh.CgroupPaths().V2(); ok {
			if filepath.Dir(d) != lab.shellsParent()[0] {
				t.Errorf("the shell's cgroup %s is not a child of the template's %s", d, lab.shellsParent()[0])
			}
		} else if got := sh.CgroupPaths()["memory"]; filepath.Dir(got) != lab.tpl.CgroupPaths()["memory"] {
			t.Errorf("the shell's memory cgroup %s is not a child of the template's %s", got, lab.tpl.CgroupPaths()["memory"])
		}
		// The shell's init is gone: nothing of the sandbox runs but G (on
		// v2 G itself, born there; on v1 not yet moved in).
		var want []string
		if lab.v2() {
			want = []string{strconv.Itoa(sh.GPid())}
		}
		if ps := nsjailtest.CgroupProcs(t, sh.CgroupPaths()); !slices.Equal(ps, want) {
			t.Errorf("fork %d: processes in the shell's cgroup before G's move (v1) or check (v2): %v, want %v", i, ps, want)
		}
		prog := sh.SeccompProgram()
		if i == 0 {
			firstProg = prog
			if !bytes.Equal(prog, coldProg) {
				t.Errorf("the shell's seccomp program (%d instructions) is not the cold sandbox's (%d)", prog.Len(), coldProg.Len())
			}
		} else if !bytes.Equal(prog, firstProg) {
			t.Errorf("fork %d: seccomp program differs from the first shell's", i)
		}
		view, status := lab.place(sh, mode)
		if ps := nsjailtest.CgroupProcs(t, sh.CgroupPaths()); len(ps) != 0 {
			t.Errorf("fork %d: processes left in the shell's cgroup after G ended: %v", i, ps)
		}
		shellStats, err := cgroup.ReadStats(sh.CgroupPaths())
		if err != nil {
			t.Fatal(err)
		}
		if err := sh.Destroy(); err != nil {
			t.Errorf("fork %d: Destroy: %v", i, err)
		}
		for _, d := range sh.CgroupPaths() {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("fork %d: shell cgroup %s still there after Destroy (%v)", i, d, err)
			}
		}
		t.Logf("fork %d (%s): PrepareShell %v, fork to G's pidfd %v, StartShell %v, MoveG %v; G's wait status %q, shell cgroup OOM kills %d, seccomp program %d instructions",
			i, mode, lab.prepareTime.Round(time.Microsecond), lab.forkTime.Round(time.Microsecond), shellTime.Round(time.Millisecond),
			lab.moveTime.Round(time.Microsecond),
			status, shellStats.OOMKills, prog.Len())
		for _, k := range forkViewKeys {
			a, _ := json.Marshal(coldView[k])
			b, _ := json.Marshal(view[k])
			if d, ok := nsjailtest.ForkViewDifference[k]; ok {
				if coldView[k] != d[0] || view[k] != d[1] {
					t.Errorf("fork %d: %s is %s cold and %s forked, want %q and %q", i, k, a, b, d[0], d[1])
				}
			} else if !bytes.Equal(a, b) {
				t.Errorf("fork %d: %s differs from a cold run's:\ncold %s\nfork %s", i, k, a, b)
			}
		}
		switch mode {
		case "oom":
			if status != fmt.Sprintf("status %d", unix.SIGKILL) {
				t.Errorf("the memory bomb was not killed: G's wait status %q", status)
			}
			if shellStats.OOMKills == 0 {
				t.Errorf("the memory bomb's OOM kill was not counted in the shell's cgroup")
			}
			tplStats, err := cgroup.ReadStats(lab.tpl.CgroupPaths())
			if err != nil {
				t.Fatal(err)
			}
			if tplStats.OOMKills != 0 {
				t.Errorf("the template's cgroup counted %d OOM kills", tplStats.OOMKills)
			}
		default:
			if status != "status 0" {
				t.Errorf("fork %d: G's wait status %q, want 0", i, status)
			}
		}
	}
}

// refuse checks that StartShell refuses pidfd f (of who) for the
// template, with an error that says want, and creates nothing: no state
// directory or owner marker, no cgroup under the template's
// (SECURITY.md case 65).
func (l *templateLab) refuse(t *testing.T, spec nsjail.Spec, who string, f *os.File, want string) {
	t.Helper()
	if l.v2() {
		// A shell's id with its cgroup, as the pool prepares before each
		// fork, and not f's (if f is a fork): StartShell must refuse the
		// pidfd, not the id.
		p, err := l.r.PrepareShell(l.tpl)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		spec.ID = p.ID()
	}
	before := l.shellLeftovers(t)
	sh, err := l.r.StartShell(context.Background(), l.tpl, spec, f)
	if err == nil {
		sh.Destroy()
		t.Errorf("StartShell accepted the pidfd of %s", who)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("StartShell with the pidfd of %s: %v, want a refusal saying %q", who, err, want)
	}
	for _, p := range l.shellLeftovers(t) {
		if !slices.Contains(before, p) {
			t.Errorf("StartShell with the pidfd of %s created %s", who, p)
		}
	}
}

// shellLeftovers lists what a shell's start creates: the state root's
// entries (state directories, owner markers) and the template's cgroup
// directories' children.
func (l *templateLab) shellLeftovers(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, d := range append([]string{l.r.StateRoot()}, l.shellsParent()...) {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if d == l.r.StateRoot() || e.IsDir() {
				out = append(out, filepath.Join(d, e.Name()))
			}
		}
	}
	return out
}

// pidfdOf is a pidfd of pid, closed at the test's end.
func pidfdOf(t *testing.T, pid int) *os.File {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	t.Cleanup(func() { f.Close() })
	return f
}

// SECURITY.md case 65: StartShell makes a shell only for a fork of its
// template that has none yet, whatever pidfd the template sends, and
// refuses anything else before it creates or changes anything: here a
// process unrelated to the template (whose oom_score_adj the worker must
// not reset either) and a fork whose id maps the template forged (U_F's
// root on the sandbox user's host id, the sandbox user on HostIDBase: a
// real fork otherwise, which only the map check tells apart). The
// template's pidfd is refused in TestTemplateForkMatchesCold, a
// G already in a shell's cgroup in TestShellMoveGOnlyFromTheTemplate, all
// through refuse.
func TestShellRefusesAForgedFork(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}

	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	adj := fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid)
	if err := os.WriteFile(adj, []byte("500"), 0); err != nil {
		t.Fatal(err)
	}
	lab.refuse(t, spec, "an unrelated process", pidfdOf(t, cmd.Process.Pid), "not a fork")
	if b, err := os.ReadFile(adj); err != nil || strings.TrimSpace(string(b)) != "500" {
		t.Errorf("the unrelated process's oom_score_adj is %q (%v), want its own 500", b, err)
	}

	base := r.HostUID() - 10001
	forged := fmt.Sprintf("0 %d 1\n10001 %d 1\n", base+10001, base)
	g := lab.forkWith(map[string]any{"uid_map": forged, "gid_map": forged})
	defer g.Close()
	lab.refuse(t, spec, "a fork with forged maps", g, "uid_map is")
	// G is still the template's, waiting for a join: end it (the template reports,
	// the template goes on).
	if err := unix.PidfdSendSignal(int(g.Fd()), unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	if status, _ := lab.recv(); status != fmt.Sprintf("status %d\n", unix.SIGKILL) {
		t.Errorf("the forged fork's wait status: %q", status)
	}
	if forked, _ := lab.recv(); forked != "forked\n" {
		t.Errorf("want forked, got %q", forked)
	}
}

// TestShellMoveGOnlyFromTheTemplate: one G gets one shell. StartShell
// refuses a G another shell has taken and not yet placed (Template.claimG:
// the pool makes forks side by side, so a template could answer one
// request with another's G), and a G that is already in a shell's cgroup.
// On v2, where G is born in its shell's cgroup, StartShell of another
// shell refuses it (not the cgroup prepared for that shell).
func TestShellMoveGOnlyFromTheTemplate(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}
	g := lab.fork()
	defer g.Close()
	a, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, spec), g)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	if lab.v2() {
		if err := a.MoveG(); err != nil {
			t.Fatal(err)
		}
		lab.refuse(t, spec, "a G already in another shell's cgroup", g, "not its shell's")
		if ps := nsjailtest.CgroupProcs(t, a.CgroupPaths()); len(ps) != 1 || ps[0] != strconv.Itoa(a.GPid()) {
			t.Errorf("shell a's cgroup holds %v, want G (%d) alone", ps, a.GPid())
		}
		lab.destroyKillsG(t, a)
		return
	}
	// Twice: a refused start leaves the first shell's claim as it was.
	lab.refuse(t, spec, "a G another shell has taken", g, "already another shell's")
	lab.refuse(t, spec, "a G another shell has taken, again", g, "already another shell's")
	if err := unix.PidfdSendSignal(int(g.Fd()), 0, nil, 0); err != nil {
		t.Errorf("G did not survive the refused shell: %v", err)
	}
	if err := a.MoveG(); err != nil {
		t.Fatal(err)
	}
	lab.refuse(t, spec, "a G already in another shell's cgroup", g, "not the template's own")
	if ps := nsjailtest.CgroupProcs(t, a.CgroupPaths()); len(ps) != 1 || ps[0] != strconv.Itoa(a.GPid()) {
		t.Errorf("shell a's cgroup holds %v, want G (%d) alone", ps, a.GPid())
	}
	// Destroying a kills G; the template reports it, then the template is done.
	lab.destroyKillsG(t, a)
}

// TestShellMoveGPinsG: MoveG holds G's pid with ptrace while it checks and
// writes, so that a G dying meanwhile cannot be reaped by the template and its pid
// reused by a host process the write would then move (and Destroy kill):
// a G it cannot attach, because something else traces it, is refused
// with nothing moved; once moved, G is traced by nobody.
func TestShellMoveGPinsG(t *testing.T) {
	skipMoveOnV2(t)
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	g := lab.fork()
	defer g.Close()
	sh, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), g)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Destroy()
	gpid := sh.GPid()
	func() {
		// ptrace requests come from the thread that attached.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := unix.PtraceSeize(gpid); err != nil {
			t.Fatalf("PTRACE_SEIZE of G: %v", err)
		}
		defer func() {
			if err := unix.PtraceInterrupt(gpid); err != nil {
				t.Fatalf("PTRACE_INTERRUPT of G: %v", err)
			}
			var ws unix.WaitStatus
			if _, err := unix.Wait4(gpid, &ws, unix.WALL, nil); err != nil || !ws.Stopped() {
				t.Fatalf("G's ptrace stop: %v (status %#x)", err, uint32(ws))
			}
			if err := unix.PtraceDetach(gpid); err != nil {
				t.Fatalf("PTRACE_DETACH of G: %v", err)
			}
		}()
		if err := sh.MoveG(); err == nil || !strings.Contains(err.Error(), "unable to pin G") {
			t.Errorf("MoveG of a G traced by another: %v, want a refusal", err)
		}
		if ps := nsjailtest.CgroupProcs(t, sh.CgroupPaths()); len(ps) != 0 {
			t.Errorf("processes in the shell's cgroup after a refused MoveG: %v", ps)
		}
	}()
	if err := sh.MoveG(); err != nil {
		t.Fatal(err)
	}
	if tracer := nsjailtest.ProcStatus(t, gpid, "TracerPid"); tracer != "0" {
		t.Errorf("G is traced by %s after MoveG", tracer)
	}
	if ps := nsjailtest.CgroupProcs(t, sh.CgroupPaths()); len(ps) != 1 || ps[0] != strconv.Itoa(gpid) {
		t.Errorf("the shell's cgroup holds %v, want G (%d) alone", ps, gpid)
	}
	lab.destroyKillsG(t, sh)
}

// TestShellStartDeadline: StartShell ends at its context's end, whatever G
// does to the shell's init: a G that SIGSTOPs the init (it holds CAP_KILL
// over it) cannot hang the worker, and a start past its deadline leaves
// nothing behind and G unharmed, still a fork a later shell can take.
func TestShellStartDeadline(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	spec := nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}
	// The cgroups a shell's start makes: sbx-<id> (v1), or on v2 the
	// init's sbx-<id>-init (sbx-<id> is G's, prepared before the fork).
	shells := func() []string {
		var out []string
		for _, d := range lab.shellsParent() {
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				if !e.IsDir() || !strings.HasPrefix(e.Name(), "sbx-") || slices.Contains(out, e.Name()) ||
					(lab.v2() && !strings.HasSuffix(e.Name(), "-init")) {
					continue
				}
				out = append(out, e.Name())
			}
		}
		return out
	}

	// G is still a fork a shell can take; it ends with its shell.
	finish := func(g *os.File) {
		t.Helper()
		sh, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, spec), g)
		if err != nil {
			t.Fatal(err)
		}
		if err := sh.MoveG(); err != nil {
			t.Fatal(err)
		}
		lab.destroyKillsG(t, sh)
	}

	// A context already ended: refused, whichever step its kill hits.
	g := lab.fork()
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sh, err := r.StartShell(ctx, lab.tpl, lab.specFor(g, spec), g); err == nil {
		sh.Destroy()
		t.Error("StartShell with an ended context succeeded")
	}
	if left := shells(); len(left) != 0 {
		t.Errorf("shell cgroups left after a start past its deadline: %v", left)
	}
	finish(g)

	// G, hostile, stops the init at once: the start would wait forever.
	h := lab.forkWith(map[string]any{"stop_init": true})
	defer h.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sh, err := r.StartShell(ctx, lab.tpl, lab.specFor(h, spec), h); err == nil {
		// The stop came after the start was done (a loaded machine): the
		// shell is whole, the init was killed and reaped all the same.
		t.Log("G's SIGSTOP reached the init only after its start")
		if err := sh.Destroy(); err != nil {
			t.Error(err)
		}
	} else if !strings.Contains(err.Error(), "deadline") {
		t.Errorf("StartShell with the init stopped: %v, want its deadline", err)
	}
	if left := shells(); len(left) != 0 {
		t.Errorf("shell cgroups left after a start past its deadline: %v", left)
	}
	finish(h)
}

// destroyKillsG destroys sh and checks that its G died of SIGKILL (the template's
// report) and that the template went on to its next fork.
func (l *templateLab) destroyKillsG(t *testing.T, sh *nsjail.Shell) {
	t.Helper()
	if err := sh.Destroy(); err != nil {
		t.Fatal(err)
	}
	if status, _ := l.recv(); status != fmt.Sprintf("status %d\n", unix.SIGKILL) {
		t.Errorf("G's wait status after its shell's Destroy: %q", status)
	}
	if forked, _ := l.recv(); forked != "forked\n" {
		t.Errorf("want forked, got %q", forked)
	}
}

// TestTemplateSandbox: the template's process has what TEMPLATE.md
// section 2 gives it and nothing more: CAP_SETUID and CAP_SETGID (all
// five sets), root of U_T = host HostIDBase+1 with the
// sandbox's two host ids mapped to themselves, no_new_privs, one seccomp
// filter, the template profile's (SECURITY.md case 63: the kernel's
// program ends with libseccomp's export of seccomp.Template(), after
// runc's stub, not with the execution profile's),
// oom_score_adj -1000, a read-only rootfs and no workspace; its cgroup is
// tpl-<id> under the Runner's parent, with no memory limit of its own.
// A Runner with an execution filter of its own and no template filter
// starts no template.
func TestTemplateSandbox(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	if _, err := r.StartTemplate(nsjail.Spec{Rootfs: rootfs, Args: []string{"true"}, Workspace: t.TempDir()}); err == nil {
		t.Fatal("StartTemplate accepted a workspace")
	}
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	lab.send("view\n")
	v := lab.line()
	base := r.HostUID() - 10001
	caps := fmt.Sprintf("%016x", 1<<unix.CAP_SETGID|1<<unix.CAP_SETUID)
	idMap := fmt.Sprintf("0 %d 1\n%d %d 1\n%d %d 1", base+1, base, base, base+10001, base+10001)
	want := map[string]any{
		"uid": []any{0.0, 0.0, 0.0}, "gid": []any{0.0, 0.0, 0.0},
		"caps":         map[string]any{"CapInh": "0000000000000000", "CapPrm": caps, "CapEff": caps, "CapBnd": caps, "CapAmb": "0000000000000000"},
		"no_new_privs": "1", "oom_score_adj": "-1000", "pid": 1.0,
		"rootfs_write": "EROFS", "seccomp": "2", "seccomp_filters": "1",
	}
	if !hasCap(t, unix.CAP_SYS_RESOURCE) {
		t.Log("no CAP_SYS_RESOURCE here: the template's oom_score_adj cannot be lowered, not checked")
		delete(want, "oom_score_adj")
	}
	for k, w := range want {
		a, _ := json.Marshal(w)
		b, _ := json.Marshal(v[k])
		if !bytes.Equal(a, b) {
			t.Errorf("template %s = %s, want %s", k, b, a)
		}
	}
	for _, k := range []string{"uid_map", "gid_map"} {
		if got, _ := v[k].(string); nsjail.NormalizeMap(got) != idMap {
			t.Errorf("template %s = %q, want %q", k, got, idMap)
		}
	}
	for _, m := range v["mounts"].([]any) {
		if m == "/workspace" {
			t.Error("the template sees a workspace")
		}
	}
	if opts := fmt.Sprint(v["root_mount_options"]); !strings.Contains(opts, "ro") {
		t.Errorf("the template's root is mounted %s, want ro", opts)
	}
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := seccomp.LoadedProgram(tpid)
	if err != nil {
		t.Fatalf("the template's seccomp program: %v", err)
	}
	native, err := seccomp.NativeArch()
	if err != nil {
		t.Fatal(err)
	}
	tplBPF, err := seccomp.Template().BPF(native)
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) <= len(tplBPF) || !bytes.HasSuffix(prog, tplBPF) {
		t.Errorf("the template's program (%d instructions) does not end with the template profile's (%d)", prog.Len(), len(tplBPF)/8)
	}
	if exec, err := seccomp.Default().BPF(native); err != nil || bytes.HasSuffix(prog, exec) {
		t.Errorf("the template runs under the execution filter, not the template's (%v)", err)
	}
	own := nsjailtest.NewRunner(t, nsjail.Options{StateRoot: testStateRoot, CgroupParent: testCgroupParent,
		Seccomp: nsjailtest.KeyctlProfile(t), Logger: quietLog})
	if tpl, err := own.StartTemplate(nsjail.Spec{Rootfs: rootfs, Args: []string{"true"}}); err == nil {
		tpl.Stop(0)
		t.Error("StartTemplate of a Runner with its own execution filter and no template filter succeeded")
	} else if !strings.Contains(err.Error(), "TemplateSeccomp") {
		t.Errorf("StartTemplate without a template filter: %v, want a refusal naming Options.TemplateSeccomp", err)
	}

	paths := lab.tpl.CgroupPaths()
	if d, ok := paths.V2(); ok {
		// v2: T in the leaf tpl-<id>/template, whose parent has no limit
		// either.
		if filepath.Base(d) != "template" || filepath.Base(filepath.Dir(d)) != lab.tpl.ID() || !strings.HasPrefix(lab.tpl.ID(), "tpl-") {
			t.Errorf("template cgroup %s, id %s: want tpl-<id>/template", d, lab.tpl.ID())
		}
		for _, dir := range []string{d, filepath.Dir(d)} {
			if b, err := os.ReadFile(filepath.Join(dir, "memory.max")); err != nil || strings.TrimSpace(string(b)) != "max" {
				t.Errorf("%s: memory.max %q (%v), want max", dir, b, err)
			}
		}
	} else if filepath.Base(paths["memory"]) != lab.tpl.ID() || !strings.HasPrefix(lab.tpl.ID(), "tpl-") {
		t.Errorf("template cgroup %s, id %s: want tpl-<id>", paths["memory"], lab.tpl.ID())
	}
	if b, err := os.ReadFile(filepath.Join(paths["memory"], "memory.limit_in_bytes")); err == nil {
		if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n < 1<<50 {
			t.Errorf("the template's cgroup has a memory limit of its own: %d", n)
		}
	}
}

// coldProgram is the seccomp program the kernel holds for a cold
// sandbox's process.
func coldProgram(t *testing.T, r *nsjail.Runner, rootfs string) seccomp.Program {
	t.Helper()
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	defer wr.Close()
	running, runningW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	defer runningW.Close()
	// The command says it runs on fd 4, then waits on fd 3 until wr is
	// closed. Its program is read only once it runs: a ptrace interrupt
	// sent while libcontainer's init was execing it was lost (the test
	// hung in LoadedProgram, before its wait had a deadline).
	p, err := r.Prestart(nsjail.Spec{Rootfs: rootfs, Args: []string{"python3", "-c", "import os; os.write(4, b'r'); os.read(3, 1)"}}, rd, runningW)
	if err != nil {
		t.Fatal(err)
	}
	runningW.Close()
	if n, err := running.Read(make([]byte, 1)); n != 1 {
		p.Retire(time.Second, nil)
		t.Fatalf("the cold sandbox's command did not start: %v", err)
	}
	pid, err := p.Pid()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := seccomp.LoadedProgram(pid)
	wr.Close()
	p.Retire(10*time.Second, nil)
	if err != nil {
		t.Fatalf("the cold sandbox's program: %v", err)
	}
	return prog
}

// hasCap tells whether this process has capability c in its effective set.
func hasCap(t *testing.T, c int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return mask&(1<<c) != 0
		}
	}
	return false
}

// crashyTemplateWorker is this test binary re-executed as a worker that
// starts a template and one shell with G joined, reports their ids and
// then waits to be SIGKILLed.
func crashyTemplateWorker() {
	r, err := nsjail.NewRunner(nsjail.Options{StateRoot: os.Getenv("CRASHY_STATE"), CgroupParent: os.Getenv("CRASHY_CGROUP")})
	if err != nil {
		panic(err)
	}
	rootfs := os.Getenv("CRASHY_ROOTFS")
	lab := startTemplateLab(panicT{}, r, rootfs, templateSource(panicT{}), os.Getenv("CRASHY_MARK"), "--linger")
	g := lab.fork()
	sh, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), g)
	if err != nil {
		panic(err)
	}
	if err := sh.MoveG(); err != nil {
		panic(err)
	}
	lab.send("join\n", sh.NamespaceFiles()...)
	if msg, _ := lab.recv(); msg != "joined\n" {
		panic(msg)
	}
	os.Stdout.WriteString("started " + lab.tpl.ID() + " " + sh.ID() + "\n")
	select {}
}

// SECURITY.md case 29 for template forks: a worker SIGKILLed while a
// template and a shell with its G exist leaves both marked, and Sweep on
// restart removes both (processes, the nested cgroups, state directories,
// markers), and nothing else.
func TestSweepAfterTemplateWorkerCrash(t *testing.T) {
	nsjailtest.RequireRoot(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	mark := fmt.Sprintf("crashy-template-%d", os.Getpid())
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CRASHY_WORKER=template", "CRASHY_STATE="+testStateRoot,
		"CRASHY_CGROUP="+testCgroupParent, "CRASHY_ROOTFS="+rootfs, "CRASHY_MARK="+mark)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "started" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("crashy worker: %q %v", line, err)
	}
	ids := f[1:]
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(testStateRoot, id)); err != nil {
			t.Fatalf("no state dir for %s: %v", id, err)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	// The template and G linger (the template's init gets no
	// parent-death signal, see testSweepAfterWorkerCrash).
	if pids := nsjailtest.ProcessesMatching(mark); len(pids) != 2 {
		t.Errorf("want the template and G alive before the sweep, found %v", pids)
	}

	r := newRunner(t)
	removed, err := r.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(ids)
	if !slices.Equal(removed, ids) {
		t.Fatalf("swept %v, want %v", removed, ids)
	}
	if pids := nsjailtest.ProcessesMatching(mark); len(pids) > 0 {
		t.Fatalf("the template's processes survived the sweep: %v", pids)
	}
	r.WaitForCleanup()
	if err := nsjailtest.CheckNoLeftovers(testStateRoot, testCgroupParent); err != nil {
		t.Fatal(err)
	}
}

// TestTemplateCgroupGoesLast: on cgroup v2 a template's tpl-<id>, which
// holds its leaf and its shells' cgroups, goes with the template's sandbox
// after the leaf and before the owner marker. Stopped while a shell's
// cgroup is still in it (a prepared one here), tpl-<id> stays and so does
// the marker, so that Sweep removes it once that cgroup is gone; Stop used
// to try once, after which the sandbox's removal dropped the marker and a
// tpl-<id> left behind was no sweep's.
func TestTemplateCgroupGoesLast(t *testing.T) {
	nsjailtest.RequireRoot(t)
	// Before anything is made: a template stopped at the end of a skipped
	// test is removed in the background, after newRunnerAt's removal of
	// its cgroup parent, which then stayed on every v1 run.
	if !cgroup.DetectMode().V2() {
		t.Skip("cgroup v1: a template's shells' cgroups are not in one of its own")
	}
	dir := t.TempDir()
	r := newRunnerAt(t, dir+"/state", testCgroupParent+"-tplcg")
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	if !lab.v2() {
		t.Fatal("cgroup v2 host, but the template has no cgroup of its own")
	}
	tplDir := lab.shellsParent()[0]
	marker := filepath.Join(dir, "state", lab.tpl.ID()+".sandboxd-owner")
	p, err := r.PrepareShell(lab.tpl)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = lab.ctl.Write([]byte("quit\n"))
	lab.ctl.Close()
	if res := lab.tpl.Stop(10 * time.Second); res.Status != nsjail.StatusSucceeded {
		t.Fatalf("the template ended %s: %s", res.Status, res.Error)
	}
	r.WaitForCleanup()
	if _, err := os.Stat(tplDir); err != nil {
		t.Fatalf("tpl-<id> with a shell's cgroup in it: %v, want it still there", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the template's owner marker with its tpl-<id> still there: %v, want it kept for Sweep", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sweep(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{tplDir, marker} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the sweep: %v, want it gone", f, err)
		}
	}
}

// TestTemplateStartFailureLeavesNothing: a template that cannot start (its
// command does not exist) leaves nothing behind: no state, no marker, no
// cgroup, on cgroup v2 not even tpl-<id>, the parent libcontainer makes
// with the template's leaf, which a failed start used to leave, unmarked,
// for good.
func TestTemplateStartFailureLeavesNothing(t *testing.T) {
	nsjailtest.RequireRoot(t)
	dir := t.TempDir()
	parent := testCgroupParent + "-tplfail"
	r := newRunnerAt(t, dir+"/state", parent)
	rootfs := nsjailtest.RuntimeRootfs(t)
	tpl, err := r.StartTemplate(nsjail.Spec{Rootfs: rootfs, Args: []string{"/no/such/command"}, Env: []string{"HOME=/tmp"}})
	if err == nil {
		tpl.Stop(0)
		t.Fatal("a template whose command does not exist started")
	}
	if !strings.Contains(err.Error(), "unable to start sandbox") {
		t.Fatalf("the start failed before its container ran (%v): nothing of its cgroup was made to leave", err)
	}
	r.WaitForCleanup()
	if err := nsjailtest.CheckNoLeftovers(dir+"/state", parent); err != nil {
		t.Fatalf("after a failed start: %v", err)
	}
}

// SECURITY.md case 70: on cgroup v2 the shell's cgroup goes to the
// template as a detached mount of its directory, whose ".." stays on it
// (a plain fd's would lead to tpl-<id> and on to the worker's whole
// filesystem: CVE-2024-21626's leaked cgroupfs fd), and only cgroup.procs
// of tpl-<id> and of the prepared cgroup belong to the template's host
// root (what the template's clone3 CLONE_INTO_CGROUP needs, E7), and only while the
// fork is in flight, until the shell holds G; a cgroup no shell took goes
// with Close.
func TestPreparedShellCgroupIsDetached(t *testing.T) {
	r := newRunner(t)
	rootfs := nsjailtest.RuntimeRootfs(t)
	lab := startTemplateLab(t, r, rootfs, templateSource(t))
	if !lab.v2() {
		p, err := r.PrepareShell(lab.tpl)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.CgroupFile() != nil {
			t.Error("a cgroup fd on v1")
		}
		t.Skip("cgroup v1: nothing is prepared (G is moved, Shell.MoveG)")
	}
	tpid, err := lab.tpl.Pid()
	if err != nil {
		t.Fatal(err)
	}
	root := strings.Fields(nsjailtest.ProcStatus(t, tpid, "Uid"))[0] // T's host uid: HostIDBase+1
	owner := func(file string) string {
		var st unix.Stat_t
		if err := unix.Stat(file, &st); err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(int(st.Uid))
	}
	ino := func(fd int, rel string) uint64 {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, rel, &st, 0); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	tplDir := lab.shellsParent()[0]
	tplProcs := filepath.Join(tplDir, "cgroup.procs")
	// tpl-<id>/cgroup.procs: the template root's only while a fork is in
	// flight (a kept fd of a shell's cgroup.procs then fails at every
	// later write: the kernel checks the common ancestor's at each write;
	// tools/v2vm TestKeptCgroupProcsFD).
	if got := owner(tplProcs); got != "0" {
		t.Errorf("tpl-<id>/cgroup.procs belongs to %s with no fork in flight, want root", got)
	}
	p, err := r.PrepareShell(lab.tpl)
	if err != nil {
		t.Fatal(err)
	}
	if got := owner(tplProcs); got != root {
		t.Errorf("tpl-<id>/cgroup.procs belongs to %s with a fork in flight, want the template root %s", got, root)
	}
	dir := filepath.Join(tplDir, p.ID())
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	fd := int(p.CgroupFile().Fd())
	for _, rel := range []string{".", "..", "../../../../../../../../.."} {
		if got := ino(fd, rel); got != st.Ino {
			t.Errorf("%q of the shell's cgroup fd is inode %d, want the shell's cgroup itself (%d)", rel, got, st.Ino)
		}
	}
	if got := owner(filepath.Join(dir, "cgroup.procs")); got != root {
		t.Errorf("the prepared cgroup.procs belongs to %s, want the template root %s", got, root)
	}
	// The mount is read-only: no cgroup file opens for writing through it
	// (a template keeping a writable cgroup.procs could move processes in
	// at a later fork; clone3 CLONE_INTO_CGROUP still works through it,
	// as every fork here shows).
	for _, f := range []string{"cgroup.procs", "memory.max", "cgroup.kill"} {
		if wfd, err := unix.Openat(fd, f, unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
			unix.Close(wfd)
			t.Errorf("%s opened for writing through the prepared cgroup's fd", f)
		} else if !errors.Is(err, unix.EROFS) {
			t.Errorf("%s opened for writing through the prepared cgroup's fd: %v, want EROFS", f, err)
		}
	}
	for _, f := range []string{"memory.max", "pids.max", "cgroup.subtree_control", "."} {
		if got := owner(filepath.Join(dir, f)); got != "0" {
			t.Errorf("%s of the prepared cgroup belongs to %s, want root", f, got)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a prepared cgroup no shell took is still there after Close (%v)", err)
	}
	if got := owner(tplProcs); got != "0" {
		t.Errorf("tpl-<id>/cgroup.procs belongs to %s after the prepared shell's Close, want root", got)
	}

	// A fork's: given back to root once G is found there.
	g := lab.fork()
	defer g.Close()
	sh, err := r.StartShell(context.Background(), lab.tpl, lab.specFor(g, nsjail.Spec{Rootfs: rootfs, Args: []string{"python3"}}), g)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := sh.CgroupPaths().V2()
	for _, f := range []string{filepath.Join(d, "cgroup.procs"), tplProcs} {
		if got := owner(f); got != "0" {
			t.Errorf("%s belongs to %s once the shell holds G, want root", f, got)
		}
	}
	lab.destroyKillsG(t, sh)
}

// skipMoveOnV2 skips the tests of v1's move of G (Shell.MoveG writing
// cgroup.procs under a ptrace pin): on cgroup v2 G is born in its shell's
// cgroup (CLONE_INTO_CGROUP) and MoveG only checks it is there; a G of
// another shell is refused by StartShell itself (isUnplacedFork: G's
// cgroup is not the prepared one), as TestShellRefusesAForgedFork's
// refusals are.
func skipMoveOnV2(t *testing.T) {
	t.Helper()
	if cgroup.DetectMode().V2() {
		t.Skip("v1's move of G; on v2 G is forked into its shell's cgroup (TEMPLATE.md section 4)")
	}
}

// tpl-<id>, which holds the template and its forks' cgroups, has the
// background CPU weight while nothing holds its foreground weight, and the
// foreground one while anything does (a request's fork, a fork handed
// off: Template.HoldForeground); a release counts once however often it
// is called.
func TestTemplateHoldForeground(t *testing.T) {
	r := newRunner(t)
	lab := startTemplateLab(t, r, nsjailtest.RuntimeRootfs(t), templateSource(t))
	paths := lab.tpl.CgroupPaths()
	if d, ok := paths.V2(); ok {
		paths = cgroup.Paths{"": filepath.Dir(d)}
	}
	want := func(when string, background bool) {
		t.Helper()
		if w, bg := nsjailtest.CPUWeight(t, paths); bg != background {
			t.Errorf("%s: tpl-<id>'s CPU weight %d, want background %v", when, w, background)
		}
	}
	want("started", true)
	a := lab.tpl.HoldForeground()
	b := lab.tpl.HoldForeground()
	want("two holds", false)
	a()
	a()
	want("one hold released twice", false)
	b()
	want("both released", true)
	c := lab.tpl.HoldForeground()
	want("held again", false)
	c()
	want("released again", true)
}
