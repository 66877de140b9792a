// Package v2vm holds the cgroup v2 VM harness (see README.md) and a kernel
// check that runs inside the VM: it proves, straight from cgroup v2's own
// files, that the v2 features sandboxd relies on work on the kernel the VM
// boots (when a raw check fails, the kernel or the VM's setup is at fault,
// not nsjail/ or cgroup/); then it holds the cgroup package's live readers
// (ReadStats, KillAll) to the same raw files, which nothing else does on v2.
//
// The tests run only inside the VM (V2VM=1, set by its init) and skip
// elsewhere.
package v2vm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/cgroup"
)

const cgroupRoot = "/sys/fs/cgroup"

// The test binary re-executes itself as a child with one of these roles, so
// the child's behaviour is ours and needs nothing from the VM but a kernel.
const childRoleEnv = "V2VM_CHILD_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(childRoleEnv) {
	case "":
		os.Exit(m.Run())
	case "memhog":
		memhog()
	case "spin":
		spin()
	case "watch":
		watch(os.Args[1:])
	case "tplchain":
		cloneIntoChain()
	case "tplf":
		cloneIntoF()
	case "tplg":
		cloneIntoG()
	case "tplkeep":
		keptProcsFD()
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childRoleEnv, os.Getenv(childRoleEnv))
		os.Exit(2)
	}
}

// memhog touches 512 MiB page by page; inside a 32 MiB memory.max the kernel
// must OOM-kill it long before it finishes.
func memhog() {
	var chunks [][]byte
	for i := 0; i < 512; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		chunks = append(chunks, b)
	}
	fmt.Println("memhog survived with", len(chunks), "MiB")
	os.Exit(0)
}

// spin burns CPU for one second of wall time.
func spin() {
	end := time.Now().Add(time.Second)
	x := 0
	for time.Now().Before(end) {
		for i := 0; i < 100000; i++ {
			x += i
		}
	}
	os.Exit(x & 0)
}

// watch is the VM's escape detector (init2 runs it around every test
// binary): it prints "created <path>" for each directory created directly in
// one of dirs, after "ready" once the watches are in place, until killed.
func watch(dirs []string) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inotify_init1:", err)
		os.Exit(1)
	}
	names := map[int32]string{}
	for _, d := range dirs {
		wd, err := unix.InotifyAddWatch(fd, d, unix.IN_CREATE|unix.IN_ONLYDIR)
		if err != nil {
			fmt.Fprintf(os.Stderr, "inotify_add_watch %s: %v\n", d, err)
			os.Exit(1)
		}
		names[int32(wd)] = d
	}
	fmt.Println("ready")
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "read inotify:", err)
			os.Exit(1)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			if ev.Mask&unix.IN_ISDIR != 0 {
				fmt.Println("created", filepath.Join(names[ev.Wd], name))
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// requireV2 skips outside the VM, and fails inside it unless we are root on
// a cgroup2 /sys/fs/cgroup. Outside the VM the tests never run, even on a v2
// host: they reshape their own cgroup (move themselves into a leaf, enable
// controllers for its children), which only the VM's init hands them to do.
func requireV2(t *testing.T) {
	t.Helper()
	if os.Getenv("V2VM") != "1" {
		t.Skip("runs only inside the VM (make test-v2vm), where init gives it a delegated cgroup of its own")
	}
	if os.Geteuid() != 0 {
		t.Fatal("V2VM=1 but not root")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Fatalf("V2VM=1 but %s is not a cgroup2 mount (statfs type %#x, err %v)", cgroupRoot, st.Type, err)
	}
}

// ownCgroup returns the absolute directory of this process's v2 cgroup.
func ownCgroup(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(cgroupRoot, rest)
		}
	}
	t.Fatalf("no cgroup v2 entry (0::) in /proc/self/cgroup:\n%s", data)
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func writeFile(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		t.Fatalf("write %q to %s: %v", value, path, err)
	}
}

// keyed parses a flat-keyed cgroup file ("key value" per line).
func keyed(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	m := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(readFile(t, path)))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", path, sc.Text(), err)
		}
		m[k] = n
	}
	return m
}

var (
	delegateOnce sync.Once
	delegated    string
	delegateErr  error
)

// delegatedCgroup returns the cgroup whose children may use cpu, memory and
// pids: the process's own cgroup, as the worker prepares it under systemd's
// Delegate=yes. v2's "no internal processes" rule forbids enabling
// controllers for the children of a cgroup that holds processes (other than
// the root), so the process first moves itself into the leaf
// <own>/supervisor (a child of its own cgroup: nothing above own is touched),
// then enables the controllers in <own>/cgroup.subtree_control.
func delegatedCgroup(t *testing.T) string {
	t.Helper()
	delegateOnce.Do(func() { delegated, delegateErr = delegate(ownCgroup(t)) })
	if delegateErr != nil {
		t.Fatal(delegateErr)
	}
	return delegated
}

func delegate(own string) (string, error) {
	b, err := os.ReadFile(filepath.Join(own, "cgroup.controllers"))
	if err != nil {
		return "", err
	}
	avail := strings.Fields(string(b))
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !contains(avail, c) {
			return "", fmt.Errorf("controller %s not available in %s (cgroup.controllers: %v): the parent did not delegate it", c, own, avail)
		}
	}
	if own != cgroupRoot {
		sup := filepath.Join(own, "supervisor")
		if err := os.Mkdir(sup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(sup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return "", fmt.Errorf("move self into %s: %w", sup, err)
		}
	}
	if err := os.WriteFile(filepath.Join(own, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0); err != nil {
		return "", fmt.Errorf("enable +cpu +memory +pids in %s: %w", own, err)
	}
	return own, nil
}

// testParent creates <delegated>/v2vm-test-N with cpu, memory and pids handed
// down to its children, and removes the whole subtree (killing what is left
// in it) at the end of the test.
func testParent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(delegatedCgroup(t), "v2vm-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(t, dir) })
	writeFile(t, filepath.Join(dir, "cgroup.subtree_control"), "+cpu +memory +pids")
	return dir
}

// leaf creates a child cgroup of parent.
func leaf(t *testing.T, parent, name string) string {
	t.Helper()
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// removeTree kills everything under dir with cgroup.kill, waits until it is
// unpopulated and removes the directories bottom-up; any failure is an error,
// since a cgroup left behind is exactly the leak the harness looks for.
func removeTree(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup.kill %s: %v", dir, err)
	}
	if err := waitUnpopulated(dir, 10*time.Second); err != nil {
		t.Error(err)
	}
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i]); err != nil {
			t.Errorf("rmdir %s: %v", dirs[i], err)
		}
	}
}

func waitUnpopulated(dir string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "populated 0") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still populated after %v: %s", dir, d, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// startIn starts cmd directly inside the cgroup dir with clone3's
// CLONE_INTO_CGROUP (Linux 5.7+, v2 only), so it never runs a single
// instruction outside its limits.
func startIn(t *testing.T, dir string, cmd *exec.Cmd) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in %s: %v", cmd.Args, dir, err)
	}
}

func selfAs(role string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role)
	return cmd
}

func TestUnifiedHierarchy(t *testing.T) {
	requireV2(t)
	// Production hosts boot with systemd.unified_cgroup_hierarchy=1: no v1
	// hierarchy may be mounted beside the unified one.
	mounts := readFile(t, "/proc/self/mounts")
	for _, line := range strings.Split(mounts, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup" {
			t.Errorf("a cgroup v1 hierarchy is mounted: %s", line)
		}
	}
	root := strings.Fields(readFile(t, filepath.Join(cgroupRoot, "cgroup.controllers")))
	for _, c := range []string{"cpu", "memory", "pids", "io", "cpuset"} {
		if !contains(root, c) {
			t.Errorf("root cgroup.controllers %v lacks %s", root, c)
		}
	}
	// The kernel features sandboxd's v2 path uses.
	parent := leaf(t, testParent(t), "features")
	for _, f := range []string{"cgroup.kill", "memory.peak", "memory.events", "pids.events", "cpu.stat", "cpu.max", "memory.swap.max"} {
		p := filepath.Join(parent, f)
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestMemoryMaxOOMKill(t *testing.T) {
	requireV2(t)
	dir := leaf(t, testParent(t), "mem")
	writeFile(t, filepath.Join(dir, "memory.max"), strconv.Itoa(32<<20))
	writeFile(t, filepath.Join(dir, "memory.swap.max"), "0")

	cmd := selfAs("memhog")
	startIn(t, dir, cmd)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("memhog in 32 MiB: want killed, got err=%v", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("memhog: want SIGKILL, got %v", ws)
	}
	ev := keyed(t, filepath.Join(dir, "memory.events"))
	if ev["oom_kill"] < 1 {
		t.Errorf("memory.events oom_kill = %d, want >= 1 (%v)", ev["oom_kill"], ev)
	}
	if ev["max"] < 1 {
		t.Errorf("memory.events max = %d, want >= 1", ev["max"])
	}
	peak, err := strconv.ParseUint(readFile(t, filepath.Join(dir, "memory.peak")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// The peak is charged up to the limit (page cache and kernel memory count too).
	if peak < 16<<20 || peak > 33<<20 {
		t.Errorf("memory.peak = %d, want between 16 MiB and the 32 MiB limit", peak)
	}
	t.Logf("memory.events %v, memory.peak %d", ev, peak)

	st := readStats(t, dir)
	if st.OOMKills != ev["oom_kill"] || st.MemoryPeakBytes != int64(peak) {
		t.Errorf("cgroup.ReadStats: OOMKills=%d MemoryPeakBytes=%d, the files say oom_kill=%d memory.peak=%d",
			st.OOMKills, st.MemoryPeakBytes, ev["oom_kill"], peak)
	}
}

// readStats is cgroup.ReadStats on dir, given as libcontainer's v2
// GetPaths() gives it.
func readStats(t *testing.T, dir string) cgroup.Stats {
	t.Helper()
	st, err := cgroup.ReadStats(map[string]string{"": dir})
	if err != nil {
		t.Fatalf("cgroup.ReadStats(%s): %v", dir, err)
	}
	return st
}

func TestPidsMaxAndTreeKill(t *testing.T) {
	requireV2(t)
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox not on PATH: %v", err)
	}
	dir := leaf(t, testParent(t), "pids")
	writeFile(t, filepath.Join(dir, "pids.max"), "8")

	// A shell forks 20 background sleepers; from the 8th task on, fork must
	// fail with EAGAIN. The shell may give up; the sleepers it did start
	// are orphans that only the cgroup still knows about.
	script := fmt.Sprintf(`for i in $(%[1]s seq 20); do %[1]s sleep 300 & done; echo started`, busybox)
	cmd := exec.Command(busybox, "sh", "-c", script)
	// A file, not a pipe: the orphaned sleepers keep their stdout open, and
	// Wait on a pipe would block until they die.
	outPath := filepath.Join(t.TempDir(), "out")
	outFile, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd.Stdout, cmd.Stderr = outFile, outFile
	startIn(t, dir, cmd)
	cmd.Wait()
	out, _ := os.ReadFile(outPath)

	ev := keyed(t, filepath.Join(dir, "pids.events"))
	if ev["max"] < 1 {
		t.Errorf("pids.events max = %d, want >= 1; shell said: %s", ev["max"], out)
	}
	cur, _ := strconv.Atoi(readFile(t, filepath.Join(dir, "pids.current")))
	if cur < 1 || cur > 8 {
		t.Errorf("pids.current = %d after the shell, want 1..8 orphaned sleepers", cur)
	}

	// cgroup.kill (Linux 5.14+) takes the whole tree down in one write,
	// orphans included; nothing is left to race with.
	writeFile(t, filepath.Join(dir, "cgroup.kill"), "1")
	if err := waitUnpopulated(dir, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if procs := readFile(t, filepath.Join(dir, "cgroup.procs")); procs != "" {
		t.Errorf("cgroup.procs after cgroup.kill: %q", procs)
	}
	t.Logf("pids.events %v, %d sleepers killed by cgroup.kill", ev, cur)
}

func TestCPUMaxThrottles(t *testing.T) {
	requireV2(t)
	dir := leaf(t, testParent(t), "cpu")
	// 1 ms every 10 ms: a one-second spin must be throttled in most periods.
	writeFile(t, filepath.Join(dir, "cpu.max"), "1000 10000")
	cmd := selfAs("spin")
	startIn(t, dir, cmd)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("spin: %v", err)
	}
	st := keyed(t, filepath.Join(dir, "cpu.stat"))
	if st["nr_throttled"] < 10 || st["throttled_usec"] == 0 {
		t.Errorf("cpu.stat after a 1 s spin at 10%%: nr_throttled=%d throttled_usec=%d, want >= 10 and > 0 (%v)",
			st["nr_throttled"], st["throttled_usec"], st)
	}
	// 10% of ~1 s wall, with slack for the Go runtime's start and the
	// emulator's jitter: far below an unthrottled second.
	if st["usage_usec"] > 500_000 {
		t.Errorf("cpu.stat usage_usec = %d at 10%% for ~1 s, want well below 500000", st["usage_usec"])
	}
	t.Logf("cpu.stat %v", st)

	// The bandwidth timer may account one more throttled period after the
	// process exited: ReadStats must fall between two raw reads.
	cs := readStats(t, dir)
	st2 := keyed(t, filepath.Join(dir, "cpu.stat"))
	between := func(got, lo, hi uint64) bool { return lo <= got && got <= hi }
	if !between(cs.CPUThrottledPeriods, st["nr_throttled"], st2["nr_throttled"]) ||
		!between(cs.CPUThrottledNS, st["throttled_usec"]*1000, st2["throttled_usec"]*1000) ||
		!between(cs.CPUUsageNS, st["usage_usec"]*1000, st2["usage_usec"]*1000) {
		t.Errorf("cgroup.ReadStats: %+v, cpu.stat says %v before and %v after", cs, st, st2)
	}
}

// TestKillAllOrphansV2 is TestPidsMaxAndTreeKill through the cgroup package:
// pids.max hits land in Stats.PidsLimitHits, and KillAll takes the orphaned
// sleepers down and returns only once the cgroup is empty.
func TestKillAllOrphansV2(t *testing.T) {
	requireV2(t)
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox not on PATH: %v", err)
	}
	dir := leaf(t, testParent(t), "killall")
	writeFile(t, filepath.Join(dir, "pids.max"), "8")
	cmd := exec.Command(busybox, "sh", "-c", fmt.Sprintf(`for i in $(%[1]s seq 20); do %[1]s sleep 300 & done`, busybox))
	startIn(t, dir, cmd) // stdout/stderr are /dev/null: nothing to hold open
	cmd.Wait()

	st := readStats(t, dir)
	if want := keyed(t, filepath.Join(dir, "pids.events"))["max"]; st.PidsLimitHits != want || want < 1 {
		t.Errorf("cgroup.ReadStats: PidsLimitHits=%d, pids.events max=%d (want >= 1)", st.PidsLimitHits, want)
	}
	if st.PidsCurrent < 1 {
		t.Fatalf("no orphaned sleepers to kill (PidsCurrent=%d)", st.PidsCurrent)
	}
	if err := cgroup.KillAll(map[string]string{"": dir}); err != nil {
		t.Fatalf("cgroup.KillAll: %v", err)
	}
	if procs := readFile(t, filepath.Join(dir, "cgroup.procs")); procs != "" {
		t.Errorf("cgroup.procs after KillAll returned: %q", procs)
	}
	if err := unix.Rmdir(dir); err != nil {
		t.Errorf("rmdir right after KillAll: %v", err)
	}
}

// TestNoLeftovers runs last (go test runs tests in source order) and checks
// that no test cgroup survived.
func TestNoLeftovers(t *testing.T) {
	requireV2(t)
	matches, err := filepath.Glob(filepath.Join(delegatedCgroup(t), "v2vm-test-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(matches) > 0 {
		t.Errorf("cgroups left behind: %v", matches)
	}
}

// BenchmarkForkExecTrue is the floor the sandbox benchmark is compared with:
// a plain fork+exec+wait of busybox true, in the same machine.
func BenchmarkForkExecTrue(b *testing.B) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		b.Fatalf("busybox not on PATH: %v", err)
	}
	for b.Loop() {
		if err := exec.Command(busybox, "true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
