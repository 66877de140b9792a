//go:build templatelab

// Experiment E4 of server/warmpool/TEMPLATE.md (issue 17), kept so the
// next session can rerun it; not part of `make test`:
//
//	SANDBOXD_RUNTIME_ROOTFS=$(cat build/runtime-rootfs.path) \
//	  go test -tags 'seccomp templatelab' -run TestTemplateLab -v ./nsjail/
//
// It checks that a copy-on-write fork of a template process can be placed
// in a sandbox that libcontainer made, with nothing but setns(2): the
// template (testdata/templatelab.py) runs in a libcontainer sandbox of its
// own (user namespace U_T whose root is host uid HostIDBase+1, CAP_SETUID,
// CAP_SETGID and CAP_SETFCAP only, no seccomp filter in the lab); its fork
// F unshares a nested user namespace U_F (the template writes its maps)
// and a pid namespace PID_F, and forks G, PID_F's pid 1. libcontainer then
// creates the execution's sandbox (the "shell": nsjail's own buildConfig,
// joining U_F and PID_F by path, creating the mount, net, ipc, uts and
// cgroup namespaces, the mounts and a cgroup nested in the template's)
// with `runc create`; the worker takes its init's namespace fds and
// seccomp program (PTRACE_SECCOMP_GET_FILTER), kills the init before it
// execs, moves G into the shell's cgroup (cgroup v1: no CLONE_INTO_CGROUP)
// and hands G the fds; G joins, drops to uid 10001, loads the program and
// reports what it sees: every field must equal a cold run's. One of the
// forks is a memory bomb, which must die in its own cgroup. The rejected
// variants (TEMPLATE.md section 9) failed with EINVAL, ENOENT and EPERM.
package nsjail

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/sandboxd/sandboxd/cgroup"
	"golang.org/x/sys/unix"
)

func TestTemplateLab(t *testing.T) {
	rootfs := os.Getenv("SANDBOXD_RUNTIME_ROOTFS")
	if os.Geteuid() != 0 || rootfs == "" {
		t.Skip("needs root and SANDBOXD_RUNTIME_ROOTFS")
	}
	state := t.TempDir()
	parent := fmt.Sprintf("sandboxd-templatelab-%d", os.Getpid())
	r, err := NewRunner(Options{StateRoot: state, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// The parent cgroup NewRunner made, once every sandbox is gone.
		r.WaitForCleanup()
		h, err := cgroup.Host()
		if err != nil {
			t.Error(err)
			return
		}
		dirs, _ := h.ParentDirs(parent)
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("leftover cgroup: %v", err)
			}
		}
	}()
	ws := t.TempDir()
	src, err := os.ReadFile("testdata/templatelab.py")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "templatelab.py"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(ws, 0o755)
	env := []string{"HOME=/tmp", "MPLCONFIGDIR=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin"}
	preload := os.Getenv("TEMPLATELAB_PRELOAD") // e.g. numpy,pandas,matplotlib.pyplot

	// The cold view, for comparison.
	cold, err := r.Run(t.Context(), Spec{Rootfs: rootfs, Args: []string{"python3", "-B", "-P", "/workspace/templatelab.py", "--view"},
		Env: env, Workspace: ws, WorkspaceReadOnly: true})
	if err != nil || cold.Status != StatusSucceeded {
		t.Fatalf("cold: %v %+v %s", err, cold, cold.Stderr)
	}
	var coldView map[string]any
	if err := json.Unmarshal(cold.Stdout, &coldView); err != nil {
		t.Fatal(err)
	}

	// The template's sandbox: sandboxd's config, but root of U_T with
	// CAP_SETUID and CAP_SETGID (to write its forks' id maps), no seccomp
	// (the lab's simplification: the design gives it a filter).
	tid := "tpl-" + newID()[4:]
	lim := Limits{MemoryBytes: 2 << 30, Pids: 512}.withDefaults()
	tspec := Spec{Rootfs: rootfs, Args: []string{"python3", "-B", "-P", "/workspace/templatelab.py"}, Env: env, Workspace: ws, WorkspaceReadOnly: true}
	if preload != "" {
		tspec.Args = append(tspec.Args, preload)
	}
	tcfg, err := r.buildConfig(tid, &tspec, lim)
	if err != nil {
		t.Fatal(err)
	}
	// CAP_SETFCAP: mapping uid 0 of a child user namespace needs it in the
	// parent (Linux 5.12+, verify_root_map).
	caps := []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETFCAP"}
	tcfg.Capabilities = &configs.Capabilities{Bounding: caps, Effective: caps, Permitted: caps}
	tcfg.Seccomp = nil
	// U_T: the template's root is a host uid of its own (HostIDBase+1, no
	// sandbox's), and the sandbox's two host ids map to themselves, so that
	// U_F can map 0 and 10001 onto them: a fork's /proc/self/uid_map then
	// reads as a cold sandbox's.
	base := int64(r.opts.HostIDBase)
	ids := []configs.IDMap{{ContainerID: 0, HostID: base + 1, Size: 1}, {ContainerID: base, HostID: base, Size: 1},
		{ContainerID: base + 10001, HostID: base + 10001, Size: 1}}
	tcfg.UIDMappings, tcfg.GIDMappings = ids, ids
	env = append(env, fmt.Sprintf("TEMPLATELAB_MAP=0 %d 1\n10001 %d 1\n", base, base+10001))
	tc, err := libcontainer.Create(state, tid, tcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Destroy()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "ctl"), os.NewFile(uintptr(pair[1]), "ctl-peer")
	ctl, err := net.FileConn(ours)
	if err != nil {
		t.Fatal(err)
	}
	ours.Close()
	uc := ctl.(*net.UnixConn)
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	go func() {
		b := make([]byte, 1<<16)
		for {
			n, err := errR.Read(b)
			if n > 0 {
				fmt.Fprintf(os.Stderr, "template stderr: %s", b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	tproc := &libcontainer.Process{Args: tspec.Args, Env: env, Cwd: "/", UID: 0, GID: 0,
		Stdout: outW, Stderr: errW, ExtraFiles: []*os.File{theirs}, Init: true}
	if err := tc.Run(tproc); err != nil {
		t.Fatal(err)
	}
	outW.Close()
	errW.Close()
	theirs.Close()
	defer func() { tc.Signal(unix.SIGKILL); tproc.Wait() }()
	// Nothing here may hang the lab: every read has a deadline.
	outR.SetReadDeadline(time.Now().Add(90 * time.Second))
	uc.SetDeadline(time.Now().Add(90 * time.Second))
	lines := bufio.NewReader(outR)
	tst, _ := tc.State()
	tpid, _ := tproc.Pid()
	if preload != "" {
		// The template is ready when it reads its socket; ask for its view.
		uc.Write([]byte("view\n"))
		v, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("template ready (%d bytes of view); template rollup: %s", len(v), rollup(tpid))
	}

	for i, mode := range []string{"go", "oom", "go", "go", "go"} {
		if _, err := uc.Write([]byte("fork\n")); err != nil {
			t.Fatal(err)
		}
		// G's pidfd: its host pid is in the fd's fdinfo.
		fds, msg := recvFDs(t, uc)
		if msg != "G\n" || len(fds) != 1 {
			t.Fatalf("want G's pidfd, got %q %v", msg, fds)
		}
		fpid := fdinfoPid(t, fds[0])
		unix.Close(fds[0])

		// The shell: libcontainer, sandboxd's config, joining U_F.
		sid := "shl-" + newID()[4:]
		slim := Limits{MemoryBytes: 256 << 20}.withDefaults()
		sspec := Spec{Rootfs: rootfs, Args: []string{"sleep", "infinity"}, Env: env, Workspace: ws, WorkspaceReadOnly: true}
		scfg, err := r.buildConfig(sid, &sspec, slim)
		if err != nil {
			t.Fatal(err)
		}
		scfg.Cgroups.Path = filepath.Join(tcfg.Cgroups.Path, sid) // nested in the template's
		for j := range scfg.Namespaces {
			switch scfg.Namespaces[j].Type {
			case configs.NEWUSER:
				scfg.Namespaces[j].Path = fmt.Sprintf("/proc/%d/ns/user", fpid)
			case configs.NEWPID:
				scfg.Namespaces[j].Path = fmt.Sprintf("/proc/%d/ns/pid", fpid)
			}
		}
		cpu0 := cpuNow()
		t0 := time.Now()
		sc, err := libcontainer.Create(state, sid, scfg)
		if err != nil {
			t.Fatal(err)
		}
		devnull, _ := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		sproc := &libcontainer.Process{Args: []string{"/usr/bin/true"} /* looked up, never execed */, Env: env, Cwd: "/", UID: 10001, GID: 10001,
			Stdout: devnull, Stderr: devnull, Init: true}
		t.Cleanup(func() { sc.Destroy() })
		// `runc create`: the init sets everything up and waits on its exec
		// fifo; it never execs anything.
		if err := sc.Start(sproc); err != nil {
			t.Fatalf("shell: %v", err)
		}
		devnull.Close()
		shellMS := time.Since(t0)
		sst, _ := sc.State()
		initPid, _ := sproc.Pid()
		shellCPU := cpuNow() - cpu0 + cgroupCPU(sst.CgroupPaths)
		// The namespaces, as fds: they outlive the init, and joining them
		// needs no ptrace access to it (a pidfd's setns does, and the init
		// is not dumpable).
		var nsFDs []int
		for _, n := range []string{"mnt", "net", "ipc", "uts", "cgroup"} {
			fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", initPid, n), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			nsFDs = append(nsFDs, fd)
		}
		// The seccomp program the kernel holds for the init (loaded by
		// libcontainer from the same config as a cold sandbox's), for G.
		bpf := loadedFilter(t, initPid)
		unix.Kill(initPid, unix.SIGKILL)
		sproc.Wait()

		// Move G into the shell's cgroup (v1), every hierarchy.
		t1 := time.Now()
		for _, dir := range sst.CgroupPaths {
			if dir == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(fpid)), 0); err != nil {
				t.Fatalf("move G into %s: %v", dir, err)
			}
		}
		moveMS := time.Since(t1)
		t2 := time.Now()
		if _, _, err := uc.WriteMsgUnix([]byte("join\n"), unix.UnixRights(nsFDs...), nil); err != nil {
			t.Fatal(err)
		}
		for _, fd := range nsFDs {
			unix.Close(fd)
		}
		if _, joined := recvFDs(t, uc); joined != "joined\n" {
			t.Fatalf("want joined, got %q", joined)
		}
		// What an idle fork costs, before its hand-off: G's and F's own
		// pages and what the shell's cgroup is charged (G's pages since
		// it moved in, and the kernel objects runc's init made there).
		time.Sleep(100 * time.Millisecond)
		idle := fmt.Sprintf("idle: G %s; F %s; shell cgroup charge %s", rollup(fpid), rollup(ppidOf(fpid)),
			readTrim(filepath.Join(sst.CgroupPaths["memory"], "memory.usage_in_bytes")))
		if _, err := uc.Write([]byte(mode + " " + fmt.Sprintf("%x", bpf) + "\n")); err != nil {
			t.Fatal(err)
		}
		view, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		joinMS := time.Since(t2)
		if mode == "oom" {
			// The first line was the view; the second comes if the bomb
			// survived, else EOF-free silence: wait for the status.
		}
		// G is pid 1 of PID_F: its exit waits until every process of the
		// namespace is reaped, the shell's init (our child) included, so
		// the worker kills and reaps the shell before G's status comes.
		time.Sleep(200 * time.Millisecond)
		_, st := recvFDs(t, uc)
		var oomKills string
		if mode == "oom" {
			// Read once G is gone: the kill is the shell cgroup's.
			b, _ := os.ReadFile(filepath.Join(sst.CgroupPaths["memory"], "memory.oom_control"))
			oomKills = "shell cgroup: " + strings.ReplaceAll(string(b), "\n", " ")
			b, _ = os.ReadFile(filepath.Join(tst.CgroupPaths["memory"], "memory.oom_control"))
			oomKills += "; template cgroup: " + strings.ReplaceAll(string(b), "\n", " ")
		}
		_, forked := recvFDs(t, uc)
		if err := sc.Destroy(); err != nil {
			t.Error(err)
		}
		t.Logf("run %d (%s): shell by libcontainer %v (CPU %v), G moved into its cgroup in %v, G join+view %v; G's status %q; template says %q; %s; %s",
			i, mode, shellMS.Round(10*time.Microsecond), shellCPU.Round(10*time.Microsecond), moveMS.Round(10*time.Microsecond),
			joinMS.Round(10*time.Microsecond), strings.TrimSpace(st), strings.TrimSpace(forked), oomKills, idle)
		var g map[string]any
		if err := json.Unmarshal([]byte(view), &g); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			t.Logf("fork view: %s", view)
			t.Logf("cold view: %s", cold.Stdout)
			for _, k := range []string{"seccomp_filters", "unshare_user", "mount_syscall", "uid", "gid", "groups", "caps", "no_new_privs", "seccomp", "uid_map", "cgroup", "hostname", "mounts", "net", "cwd", "procs", "pid", "fds"} {
				a, _ := json.Marshal(coldView[k])
				b, _ := json.Marshal(g[k])
				same := "same"
				if string(a) != string(b) {
					same = "DIFFERENT"
					t.Errorf("the fork's %s differs from a cold run's", k)
				}
				t.Logf("  %-13s %s: cold %s fork %s", k, same, a, b)
			}
		}
		if mode == "oom" && !strings.Contains(st, "status 9") {
			t.Errorf("the memory bomb was not killed: %q", st)
		}
	}
	uc.Write([]byte("quit\n"))
}

func recvFDs(t *testing.T, uc *net.UnixConn) ([]int, string) {
	t.Helper()
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf[:1], oob)
	if err != nil {
		t.Fatal(err)
	}
	// The rest of the line, byte by byte (messages are lines).
	line := append([]byte(nil), buf[:n]...)
	for !strings.HasSuffix(string(line), "\n") {
		m, err := uc.Read(buf[:1])
		if err != nil {
			t.Fatal(err)
		}
		line = append(line, buf[:m]...)
	}
	var fds []int
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			got, _ := unix.ParseUnixRights(&m)
			fds = append(fds, got...)
		}
	}
	return fds, string(line)
}

func fdinfoPid(t *testing.T, fd int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			p, _ := strconv.Atoi(strings.TrimSpace(v))
			return p
		}
	}
	t.Fatalf("no Pid in fdinfo: %s", b)
	return 0
}

func cpuNow() time.Duration {
	var self, kids unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	tv := func(v unix.Timeval) time.Duration { return time.Duration(v.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

func cgroupCPU(paths map[string]string) time.Duration {
	b, err := os.ReadFile(filepath.Join(paths["cpuacct"], "cpuacct.usage"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(n)
}

func rollup(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && slices.Contains([]string{"Rss:", "Pss:", "Private_Dirty:", "Anonymous:"}, f[0]) {
			keep = append(keep, f[0]+f[1])
		}
	}
	return strings.Join(keep, " ")
}

var _ = syscall.SIGKILL

// loadedFilter reads the seccomp program the kernel holds for pid
// (PTRACE_SECCOMP_GET_FILTER, as seccomp/filter_test.go does), as the bytes
// of a struct sock_filter array.
func loadedFilter(t *testing.T, pid int) []byte {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pt := func(req, pid int, addr, data uintptr) (uintptr, error) {
		n, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(pid), addr, data, 0, 0)
		if e != 0 {
			return 0, e
		}
		return n, nil
	}
	if _, err := pt(unix.PTRACE_SEIZE, pid, 0, 0); err != nil {
		t.Fatalf("PTRACE_SEIZE: %v", err)
	}
	defer pt(unix.PTRACE_DETACH, pid, 0, 0)
	if _, err := pt(unix.PTRACE_INTERRUPT, pid, 0, 0); err != nil {
		t.Fatalf("PTRACE_INTERRUPT: %v", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		t.Fatalf("wait4: %v", err)
	}
	n, err := pt(unix.PTRACE_SECCOMP_GET_FILTER, pid, 0, 0)
	if err != nil {
		t.Fatalf("PTRACE_SECCOMP_GET_FILTER: %v", err)
	}
	prog := make([]unix.SockFilter, n)
	if _, err := pt(unix.PTRACE_SECCOMP_GET_FILTER, pid, 0, uintptr(unsafe.Pointer(&prog[0]))); err != nil {
		t.Fatalf("PTRACE_SECCOMP_GET_FILTER: %v", err)
	}
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.LittleEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.LittleEndian.AppendUint32(out, f.K)
	}
	return out
}

func ppidOf(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			p, _ := strconv.Atoi(strings.TrimSpace(v))
			return p
		}
	}
	return 0
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}
