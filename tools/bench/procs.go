package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sandboxMemory is what one sandbox below the server holds while idle.
type sandboxMemory struct {
	Cgroup string `json:"cgroup"` // memory cgroup path (v1 memory controller, or v2)
	Procs  int    `json:"procs"`
	PIDs   []int  `json:"pids,omitempty"`
	// CgroupBytes is the cgroup's charge (v1 memory.usage_in_bytes, v2
	// memory.current): anonymous memory plus the page cache this sandbox
	// touched first (shared rootfs pages are charged to whoever read them first).
	CgroupBytes int64 `json:"cgroup_bytes"`
	// RSSBytes and PSSBytes sum /proc/PID/smaps_rollup over its processes;
	// PSS splits shared pages (the rootfs's libraries) fairly among sharers,
	// so it is the per-sandbox cost.
	RSSBytes int64 `json:"rss_bytes"`
	PSSBytes int64 `json:"pss_bytes"`
	// USSBytes sums Private_Clean and Private_Dirty: the pages only this
	// sandbox's processes map, what ending it would give back.
	USSBytes int64 `json:"uss_bytes"`
	Python   bool  `json:"python"` // a python process is among them
	// Frozen: the sandbox's freezer cgroup is FROZEN (v1 freezer.state,
	// v2 cgroup.events "frozen 1"). A session kernel idles frozen between
	// its executions; warm and spare sandboxes are never frozen.
	Frozen bool `json:"frozen,omitempty"`
	// ForkParent is, for a template fork, the parent of the sandbox's top
	// process, which sits in the template's cgroup (an ancestor of the
	// sandbox's): the template T itself, shared by every fork of it and
	// counted in the template's group, not in this sandbox's cost; 0 for a
	// sandbox that is not a template fork.
	ForkParent int `json:"fork_parent,omitempty"`
	// PrivateBytes, when read (groupPrivateBytes, of the sandbox's
	// processes), is what they map that no other process does.
	PrivateBytes int64 `json:"private_bytes,omitempty"`
}

// TotalPSS is the sandbox's PSS. (Until 2026-12-04 a template fork had a
// process F of its own outside its cgroup, whose PSS was added here.)
func (m sandboxMemory) TotalPSS() int64 { return m.PSSBytes }

// TotalUSS is the sandbox's USS: its PrivateBytes when read, else the sum
// of each process's USS (which leaves out the pages its processes share
// only with each other).
func (m sandboxMemory) TotalUSS() int64 {
	if m.PrivateBytes > 0 {
		return m.PrivateBytes
	}
	return m.USSBytes
}

// readPrivate sets PrivateBytes (groupPrivateBytes of the sandbox's
// processes).
func (m *sandboxMemory) readPrivate() error {
	b, err := groupPrivateBytes(m.PIDs)
	m.PrivateBytes = b
	return err
}

// descendants returns every process below pid (not pid itself), from /proc.
func descendants(pid int) []int {
	out, _ := processTree(pid)
	return out
}

// processTree returns every process below pid (not pid itself), from
// /proc, and each one's parent.
func processTree(pid int) ([]int, map[int]int) {
	children := map[int][]int{}
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// comm may hold spaces and parentheses: fields start after the last ')'.
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], p)
		parent[p] = ppid
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	slices.Sort(out)
	return out, parent
}

// memoryCgroup returns the path of pid's memory cgroup: the v1 memory
// controller's line of /proc/PID/cgroup, else the v2 line.
func memoryCgroup(pid int) (string, bool) {
	return controllerCgroup(pid, "memory")
}

// controllerCgroup returns the path of pid's cgroup of the v1 controller
// ctl, else its v2 cgroup, as memoryCgroup does.
func controllerCgroup(pid int, ctl string) (string, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", false
	}
	var v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), ctl) {
			return "v1:" + parts[2], true
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = "v2:" + parts[2]
		}
	}
	return v2, v2 != ""
}

// cgroupCharge reads the memory charge of a cgroup named by memoryCgroup.
func cgroupCharge(cg string) int64 {
	for _, dir := range cgroupDirs(cg) {
		file := "memory.current"
		if strings.HasPrefix(cg, "v1:") {
			file = "memory.usage_in_bytes"
		}
		if data, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

// cgroupFrozen says whether the freezer cgroup pid is in is frozen (v1
// freezer.state FROZEN, v2 cgroup.events "frozen 1").
func cgroupFrozen(pid int) bool {
	cg, ok := controllerCgroup(pid, "freezer")
	if !ok {
		return false
	}
	if p, ok := strings.CutPrefix(cg, "v1:"); ok {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/freezer", p, "freezer.state"))
		return err == nil && strings.TrimSpace(string(data)) == "FROZEN"
	}
	for _, dir := range cgroupDirs(cg) {
		if data, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil {
			return slices.Contains(strings.Split(string(data), "\n"), "frozen 1")
		}
	}
	return false
}

// rollup is what smapsRollup reads, in bytes.
type rollup struct{ RSS, PSS, USS int64 }

// smapsRollup returns Rss, Pss and USS (Private_Clean + Private_Dirty) of
// pid.
func smapsRollup(pid int) rollup {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return rollup{}
	}
	defer f.Close()
	return parseRollup(f)
}

func parseRollup(r io.Reader) rollup {
	var out rollup
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			out.RSS = kb << 10
		case "Pss:":
			out.PSS = kb << 10
		case "Private_Clean:", "Private_Dirty:":
			out.USS += kb << 10
		}
	}
	return out
}

// sandboxesBelow groups the processes below serverPid by memory cgroup,
// keeping those in cgroups nested below the server's own (leaving out, for
// instance, libcontainer's init helpers before they join the sandbox's
// cgroup). At idle these are the pool, and the session kernels (Frozen).
// A template fork is told by its ForkParent: the parent of a sandbox's
// top process when that parent sits in a cgroup between the server's and
// the sandbox's (the template's, tpl-<id>).
func sandboxesBelow(serverPid int) []sandboxMemory {
	own, _ := memoryCgroup(serverPid)
	below := func(cg string) bool { return strings.HasPrefix(cg, strings.TrimSuffix(own, "/")+"/") }
	pids, parent := processTree(serverPid)
	cgOf := map[int]string{}
	byCg := map[string]*sandboxMemory{}
	var order []string
	for _, p := range pids {
		cg, ok := memoryCgroup(p)
		// Sandboxes nest below the server's own cgroup; anything else (a
		// process caught between cgroups while it starts) is not one.
		if !ok || !below(cg) {
			continue
		}
		cgOf[p] = cg
		m := byCg[cg]
		if m == nil {
			m = &sandboxMemory{Cgroup: cg, Frozen: cgroupFrozen(p)}
			byCg[cg] = m
			order = append(order, cg)
		}
		m.Procs++
		m.PIDs = append(m.PIDs, p)
		r := smapsRollup(p)
		m.RSSBytes += r.RSS
		m.PSSBytes += r.PSS
		m.USSBytes += r.USS
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(comm), "python") {
			m.Python = true
		}
	}
	for _, p := range pids {
		cg, ok := cgOf[p]
		if !ok {
			continue
		}
		pp := parent[p]
		pcg, ok := cgOf[pp]
		if !ok || pcg == cg || !strings.HasPrefix(cg, pcg+"/") {
			continue
		}
		if m := byCg[cg]; m.ForkParent == 0 {
			m.ForkParent = pp
		}
	}
	out := make([]sandboxMemory, 0, len(order))
	for _, cg := range order {
		m := byCg[cg]
		m.CgroupBytes = cgroupCharge(cg)
		out = append(out, *m)
	}
	return out
}

// idlePythonSandboxes counts the sandboxes below serverPid with a python
// process in them: with no request in flight, the ready pool.
func idlePythonSandboxes(serverPid int) int {
	n := 0
	for _, s := range sandboxesBelow(serverPid) {
		if s.Python {
			n++
		}
	}
	return n
}

// poolState is what /metrics says about the warm pool.
type poolState struct {
	Lines    []string // every sample whose name mentions the pool
	Ready    float64  // sandboxes ready for an execution
	Starting float64  // sandboxes importing their preload
	HasReady bool     // a ready series exists
}

// poolMetrics extracts the pool's state from a Prometheus text exposition:
// Ready sums the series named *pool*ready* or labelled state="ready",
// Starting those named *pool*starting* or labelled state="starting".
// Series labelled with the skill policy are left out: the bench sends only
// dynamic-policy executions.
func poolMetrics(text string) poolState {
	var st poolState
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !strings.Contains(name, "pool") {
			continue
		}
		st.Lines = append(st.Lines, line)
		if strings.HasSuffix(name, "_total") || strings.Contains(line, `="skill"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(name, "ready") || strings.Contains(line, `state="ready"`):
			st.Ready += v
			st.HasReady = true
		case strings.Contains(name, "starting") || strings.Contains(line, `state="starting"`):
			st.Starting += v
		}
	}
	return st
}

// cpuTicksByCgroup sums utime+stime of the processes of every python
// sandbox below pid, by memory cgroup.
func cpuTicksByCgroup(pid int) map[string]int64 {
	own, _ := memoryCgroup(pid)
	ticks := map[string]int64{}
	python := map[string]bool{}
	for _, p := range descendants(pid) {
		cg, ok := memoryCgroup(p)
		if !ok || !strings.HasPrefix(cg, strings.TrimSuffix(own, "/")+"/") {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(data)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			f := strings.Fields(s[i+1:])
			// After ")": state(0) ppid(1) … utime(11) stime(12).
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				ticks[cg] += u + st
			}
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(comm), "python") {
			python[cg] = true
		}
	}
	for cg := range ticks {
		if !python[cg] {
			delete(ticks, cg)
		}
	}
	return ticks
}

// leftoverCgroups returns the memory cgroups of sandboxes that still exist
// (their directory is there) a moment after the server exited.
func leftoverCgroups(sandboxes []sandboxMemory) []string {
	var left []string
	time.Sleep(200 * time.Millisecond)
	for _, s := range sandboxes {
		for _, dir := range cgroupDirs(s.Cgroup) {
			if _, err := os.Stat(dir); err == nil {
				left = append(left, dir)
				break
			}
		}
	}
	return left
}

// cgroupDirs are the directories a cgroup named by memoryCgroup may be at.
func cgroupDirs(cg string) []string {
	if p, ok := strings.CutPrefix(cg, "v1:"); ok {
		return []string{filepath.Join("/sys/fs/cgroup/memory", p)}
	}
	if p, ok := strings.CutPrefix(cg, "v2:"); ok {
		return []string{filepath.Join("/sys/fs/cgroup", p), filepath.Join("/sys/fs/cgroup/unified", p)}
	}
	return nil
}

// removeLeftoverCgroups removes (rmdir: only empty ones go) the cgroups the
// exited server left, in every hierarchy. The server ran in this process's
// cgroups, so each one is <mount>/<our own path>/<relative path>, and
// nothing outside our own cgroups is touched.
func removeLeftoverCgroups(left []string) int {
	own, err := ownCgroups()
	if err != nil {
		return 0
	}
	ownMem, _ := memoryCgroup(os.Getpid())
	memRoot := cgroupDirs(ownMem)
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	n := 0
	for _, dir := range left {
		var rel string
		for _, root := range memRoot {
			if r, err := filepath.Rel(root, dir); err == nil && !strings.HasPrefix(r, "..") && r != "." {
				rel = r
			}
		}
		if rel == "" {
			continue
		}
		for _, m := range mounts {
			seen := map[string]bool{}
			for _, p := range own {
				c := filepath.Join(m, p, rel)
				if seen[c] {
					continue
				}
				seen[c] = true
				if _, err := os.Stat(c); err != nil {
					continue
				}
				// The sandbox's last processes may still be exiting.
				for try := 0; try < 30; try++ {
					if os.Remove(c) == nil {
						n++
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}
	return n
}

// removeOwnCgroupDir removes the (empty) cgroup rel below our own cgroup in
// every hierarchy: the parent a started server created for its sandboxes.
func removeOwnCgroupDir(rel string) {
	own, err := ownCgroups()
	if err != nil || rel == "" || strings.Contains(rel, "..") {
		return
	}
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, m := range mounts {
		for _, p := range own {
			_ = os.Remove(filepath.Join(m, p, rel))
		}
	}
}

// groupPrivateBytes is the memory mapped by the processes pids and by no
// other process: every present page of theirs (/proc/PID/pagemap) whose
// system-wide map count (/proc/kpagecount) equals its mappings among them.
// Unlike a sum of each process's USS (smaps Private_*), it counts a page
// the group's processes share with each other and nobody else (a zygote
// and the kernel it forked; a template fork's F and G) as the group's.
// Needs root (the page frame numbers). Pages of a transparent huge page
// count as the kernel reports each one's map count.
func groupPrivateBytes(pids []int) (int64, error) {
	mapped := map[uint64]int64{} // pfn -> mappings among pids
	for _, pid := range pids {
		if err := countPresentPages(pid, mapped); err != nil {
			return 0, err
		}
	}
	pfns := make([]uint64, 0, len(mapped))
	for pfn := range mapped {
		pfns = append(pfns, pfn)
	}
	slices.Sort(pfns)
	kc, err := os.Open("/proc/kpagecount")
	if err != nil {
		return 0, err
	}
	defer kc.Close()
	const block = 512 // entries read at once
	buf := make([]byte, block*8)
	var start uint64 = ^uint64(0)
	var n int
	private := int64(0)
	for _, pfn := range pfns {
		if start == ^uint64(0) || pfn < start || pfn >= start+uint64(n) {
			start = pfn
			got, err := kc.ReadAt(buf, int64(pfn*8))
			if got < 8 && err != nil {
				return 0, fmt.Errorf("kpagecount at pfn %d: %w", pfn, err)
			}
			n = got / 8
		}
		count := int64(binary.LittleEndian.Uint64(buf[(pfn-start)*8:]))
		if count == mapped[pfn] {
			private += int64(os.Getpagesize())
		}
	}
	return private, nil
}

// countPresentPages adds the page frames pid maps (present in memory, not
// swapped) to mapped, one per mapping.
func countPresentPages(pid int, mapped map[uint64]int64) error {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer pm.Close()
	page := uint64(os.Getpagesize())
	buf := make([]byte, 8*4096)
	for _, line := range strings.Split(string(maps), "\n") {
		lo, hi, ok := parseMapsRange(line)
		if !ok || strings.HasSuffix(line, "[vsyscall]") {
			continue
		}
		for addr := lo; addr < hi; {
			pages := min((hi-addr)/page, uint64(len(buf)/8))
			got, err := pm.ReadAt(buf[:pages*8], int64(addr/page*8))
			if got == 0 {
				if err != nil {
					break // the mapping went away
				}
			}
			for i := 0; i+8 <= got; i += 8 {
				e := binary.LittleEndian.Uint64(buf[i:])
				// Bit 63 present, bit 62 swapped, bits 0-54 the pfn.
				if e&(1<<63) != 0 && e&(1<<62) == 0 {
					if pfn := e & (1<<55 - 1); pfn != 0 {
						mapped[pfn]++
					}
				}
			}
			addr += pages * page
		}
	}
	return nil
}

// parseMapsRange reads the address range of a /proc/PID/maps line.
func parseMapsRange(line string) (lo, hi uint64, ok bool) {
	r, _, _ := strings.Cut(line, " ")
	a, b, found := strings.Cut(r, "-")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(a, 16, 64)
	hi, err2 := strconv.ParseUint(b, 16, 64)
	return lo, hi, err1 == nil && err2 == nil && hi > lo
}
