package main

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

const mib = 1 << 20

// forkSandboxes is what sandboxesBelow finds with template forks: one
// template cgroup (T, each fork's parent), two warm forks, two frozen
// session kernels, and a non-python sandbox being made.
func forkSandboxes() []sandboxMemory {
	tpl := "v1:/own/p/tpl-1"
	return []sandboxMemory{
		// T 40 MiB PSS; charge 30 MiB of its own plus its nested
		// sandboxes' 4+4+3+3.
		{Cgroup: tpl, Python: true, PSSBytes: 40 * mib, USSBytes: 20 * mib, CgroupBytes: 44 * mib},
		{Cgroup: tpl + "/sbx-a", Python: true, PSSBytes: 10 * mib, USSBytes: 3.5 * mib, CgroupBytes: 3 * mib, ForkParent: 11},
		{Cgroup: tpl + "/sbx-b", Python: true, PSSBytes: 10 * mib, USSBytes: 3.5 * mib, CgroupBytes: 3 * mib, ForkParent: 11},
		{Cgroup: tpl + "/sbx-c", Python: true, Frozen: true, PSSBytes: 11 * mib, USSBytes: 4.5 * mib, CgroupBytes: 4 * mib, ForkParent: 11},
		{Cgroup: tpl + "/sbx-d", Python: true, Frozen: true, PSSBytes: 13 * mib, USSBytes: 6.5 * mib, CgroupBytes: 4 * mib, ForkParent: 11},
		{Cgroup: "v1:/own/p/sbx-e", PSSBytes: 5 * mib},
	}
}

func TestIdleKernelCostsForks(t *testing.T) {
	before := map[string]int64{"MemAvailable": 1000 * mib, "Slab": 100 * mib, "PageTables": 10 * mib}
	after := map[string]int64{"MemAvailable": 970 * mib, "Slab": 104 * mib, "PageTables": 12 * mib}
	r := idleKernelCosts(forkSandboxes(), 2, before, after, nil, 24<<30)
	if r.Templates != 1 || r.Measured != 2 || r.NotForks != 0 || r.PoolSandboxes != 2 {
		t.Fatalf("templates %d, measured %d, not forks %d, pool %d; want 1, 2, 0, 2", r.Templates, r.Measured, r.NotForks, r.PoolSandboxes)
	}
	// Medians (nearest rank, the lower of two) of 11 and 13 MiB PSS, 4.5 and 6.5 USS:
	// the parent, T, is the template's cost, not the session's.
	if r.PSSMiB != 11 || r.USSMiB != 4.5 || r.CgroupMiB != 4 {
		t.Errorf("per session PSS %v USS %v cgroup %v; want 11, 4.5, 4 (nearest rank)", r.PSSMiB, r.USSMiB, r.CgroupMiB)
	}
	// T; its own charge: 44 - 14 nested.
	if r.TemplatesPSSMiB != 40 || r.TemplatesUSSMiB != 20 || r.TemplatesCgroupMiB != 30 {
		t.Errorf("templates PSS %v USS %v cgroup %v; want 40, 20, 30", r.TemplatesPSSMiB, r.TemplatesUSSMiB, r.TemplatesCgroupMiB)
	}
	if r.PoolPSSMiB != 20 || r.FixedMiB != 60 {
		t.Errorf("pool %v, fixed %v; want 20, 60", r.PoolPSSMiB, r.FixedMiB)
	}
	if r.MemAvailableDropMiB != 15 || r.MeminfoGrowthMiB["Slab"] != 2 || r.MeminfoGrowthMiB["PageTables"] != 1 {
		t.Errorf("MemAvailable drop %v, growth %v; want 15, Slab 2, PageTables 1", r.MemAvailableDropMiB, r.MeminfoGrowthMiB)
	}
	if r.KernelMiB != 3 || r.USSKernelMiB != 7.5 || r.FitBy["USS + kernel memory"] != 3268 {
		t.Errorf("kernel %v, USS+kernel %v (fit %d); want 3, 7.5 (3268)", r.KernelMiB, r.USSKernelMiB, r.FitBy["USS + kernel memory"])
	}
	if _, ok := r.MeminfoGrowthMiB["Shmem"]; ok {
		t.Errorf("growth of a field not read: %v", r.MeminfoGrowthMiB)
	}
	// The worst is the MemAvailable drop: (24576 - 60) / 15.
	if r.WorstBasis != "MemAvailable drop" || r.WorstMiB != 15 || r.Fit != 1634 || r.FitBy["PSS"] != 2228 || r.FitBy["USS"] != 5448 {
		t.Errorf("worst %s %v, fit %d, by %v; want MemAvailable drop 15, 1634, PSS 2228, USS 5448", r.WorstBasis, r.WorstMiB, r.Fit, r.FitBy)
	}
	// The worker's view, set later, can become the worst.
	r.ServerMeanMiB = 20
	r.setFit(24 << 30)
	if r.WorstBasis != "worker's view" || r.Fit != 1225 {
		t.Errorf("with the worker's view: worst %s, fit %d; want worker's view, 1225", r.WorstBasis, r.Fit)
	}
}

// With the reading after the removal, the per-session cost is the mean of
// the creation's and the removal's: a steady drift of the host cancels.
func TestIdleKernelCostsRemoval(t *testing.T) {
	before := map[string]int64{"MemAvailable": 1000 * mib, "Slab": 100 * mib}
	with := map[string]int64{"MemAvailable": 970 * mib, "Slab": 104 * mib}
	after := map[string]int64{"MemAvailable": 990 * mib, "Slab": 101 * mib}
	before[workerPSSKey], with[workerPSSKey], after[workerPSSKey] = 50*mib, 52*mib, 51*mib
	r := idleKernelCosts(forkSandboxes(), 2, before, with, after, 24<<30)
	if r.WorkerGrowthMiB != 0.75 {
		t.Errorf("worker growth %v, want 0.75", r.WorkerGrowthMiB)
	}
	if r.MemAvailableCreateMiB != 15 || r.MemAvailableRemoveMiB != 10 || r.MemAvailableDropMiB != 12.5 || r.MeminfoGrowthMiB["Slab"] != 1.75 {
		t.Errorf("create %v, remove %v, drop %v, Slab %v; want 15, 10, 12.5, 1.75", r.MemAvailableCreateMiB, r.MemAvailableRemoveMiB, r.MemAvailableDropMiB, r.MeminfoGrowthMiB["Slab"])
	}
	// 15 and 10 differ by more than a quarter: the drop is noisy, left
	// out of the worst, which is then PSS (11 against USS 4.5 + Slab
	// 1.75 + the worker's 0.75).
	if !r.MemAvailableNoisy || r.USSKernelMiB != 7 || r.WorstBasis != "PSS" || r.Fit != 2228 || r.FitBy["MemAvailable drop"] != 1961 {
		t.Errorf("noisy %v, USS+kernel %v, worst %s, fit %d, by %v; want noisy, 7, PSS, 2228, MemAvailable drop 1961", r.MemAvailableNoisy, r.USSKernelMiB, r.WorstBasis, r.Fit, r.FitBy)
	}
	// Readings that agree count.
	after["MemAvailable"] = 998 * mib
	if r := idleKernelCosts(forkSandboxes(), 2, before, with, after, 24<<30); r.MemAvailableNoisy || r.WorstBasis != "MemAvailable drop" || r.MemAvailableDropMiB != 14.5 {
		t.Errorf("noisy %v, worst %s, drop %v; want not noisy, MemAvailable drop, 14.5", r.MemAvailableNoisy, r.WorstBasis, r.MemAvailableDropMiB)
	}
}

func TestIdleKernelCostsZygotes(t *testing.T) {
	sbs := []sandboxMemory{
		{Cgroup: "v1:/own/p/a", Python: true, PSSBytes: 60 * mib, USSBytes: 50 * mib, CgroupBytes: 58 * mib},
		{Cgroup: "v1:/own/p/b", Python: true, Frozen: true, PSSBytes: 62 * mib, USSBytes: 52 * mib, CgroupBytes: 64 * mib},
	}
	r := idleKernelCosts(sbs, 1, nil, nil, nil, 24<<30)
	if r.Templates != 0 || r.NotForks != 0 || r.Measured != 1 || r.FixedMiB != 60 {
		t.Errorf("templates %d, not forks %d, measured %d, fixed %v; want 0, 0, 1, 60", r.Templates, r.NotForks, r.Measured, r.FixedMiB)
	}
	if r.MemAvailableDropMiB != 0 || r.MeminfoGrowthMiB != nil {
		t.Errorf("no meminfo read, yet drop %v, growth %v", r.MemAvailableDropMiB, r.MeminfoGrowthMiB)
	}
	if r.WorstBasis != "cgroup charge" || r.Fit != (24576-60)/64 {
		t.Errorf("worst %s, fit %d; want cgroup charge, %d", r.WorstBasis, r.Fit, (24576-60)/64)
	}
}

func TestIdleKernelCostsNotForks(t *testing.T) {
	sbs := forkSandboxes()
	sbs = append(sbs, sandboxMemory{Cgroup: "v1:/own/p/zyg", Python: true, Frozen: true, PSSBytes: 60 * mib})
	if r := idleKernelCosts(sbs, 3, nil, nil, nil, 24<<30); r.NotForks != 1 || r.Measured != 3 {
		t.Errorf("not forks %d of %d, want 1 of 3", r.NotForks, r.Measured)
	}
}

func TestTotalUSS(t *testing.T) {
	m := sandboxMemory{USSBytes: 3, ForkParent: 1}
	if m.TotalUSS() != 3 {
		t.Errorf("without PrivateBytes: %d, want 3", m.TotalUSS())
	}
	m.PrivateBytes = 9 // the pages the processes share only with each other too
	if m.TotalUSS() != 9 {
		t.Errorf("with PrivateBytes: %d, want 9", m.TotalUSS())
	}
}

func TestIdleSessionKernels(t *testing.T) {
	got := idleSessionKernels(forkSandboxes())
	if len(got) != 2 || got[0].Cgroup != "v1:/own/p/tpl-1/sbx-c" || got[1].Cgroup != "v1:/own/p/tpl-1/sbx-d" {
		t.Errorf("session kernels %v, want sbx-c and sbx-d", got)
	}
}

func TestParseMeminfo(t *testing.T) {
	m := parseMeminfo(strings.NewReader("MemTotal:       24576000 kB\nMemAvailable:    1000 kB\nHugePages_Total:       0\nbroken line\nSlab: x kB\n"))
	if m["MemTotal"] != 24576000<<10 || m["MemAvailable"] != 1000<<10 || m["HugePages_Total"] != 0 || len(m) != 3 {
		t.Errorf("parsed %v", m)
	}
}

func TestParseRollup(t *testing.T) {
	r := parseRollup(strings.NewReader(`55eb9293e000-7fff4cc28000 ---p 00000000 00:00 0                          [rollup]
Rss:                1752 kB
Pss:                 245 kB
Pss_Dirty:           112 kB
Shared_Clean:       1600 kB
Private_Clean:        40 kB
Private_Dirty:       112 kB
Private_Hugetlb:       0 kB
`))
	if r.RSS != 1752<<10 || r.PSS != 245<<10 || r.USS != 152<<10 {
		t.Errorf("rollup %+v, want Rss 1752, Pss 245, USS 152 kB", r)
	}
}

func TestIdleKernelsMarkdown(t *testing.T) {
	r := idleKernelCosts(forkSandboxes(), 2, map[string]int64{"MemAvailable": 1000 * mib, "Slab": 100 * mib}, map[string]int64{"MemAvailable": 970 * mib, "Slab": 104 * mib}, nil, 24<<30)
	rep := &Report{Sessions: &SessionsResult{PoolSize: 4, IdleKernels: r}}
	md := rep.Markdown("")
	for _, want := range []string{
		"no latencies measured",
		"template forks (1 templates)",
		"| PSS | **11.0** |",
		"| /proc/meminfo growth per session | Slab +2.00 |",
		"**1634 sessions fit in 24 GiB** less the fixed cost, at the worst per-session cost (MemAvailable drop, 15.0 MiB)",
		"PSS 2228",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q\n%s", want, md)
		}
	}
}

func TestParseMapsRange(t *testing.T) {
	lo, hi, ok := parseMapsRange("7f0000001000-7f0000003000 r-xp 00000000 fd:01 123  /usr/lib/x.so")
	if !ok || lo != 0x7f0000001000 || hi != 0x7f0000003000 {
		t.Errorf("range %x-%x %v", lo, hi, ok)
	}
	if _, _, ok := parseMapsRange(""); ok {
		t.Error("empty line parsed")
	}
}

// TestGroupPrivate reads this process's private memory with a touched
// buffer, alone and with a child that shares none of it.
func TestGroupPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("pagemap's page frame numbers need root")
	}
	buf := make([]byte, 16<<20)
	for i := range buf {
		buf[i] = 1
	}
	self, err := groupPrivateBytes([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	r := smapsRollup(os.Getpid())
	if self < 16<<20 || self > r.RSS {
		t.Errorf("private %d bytes, want ≥ 16 MiB and ≤ RSS %d", self, r.RSS)
	}
	// A page shared with another process (the read-only text of a
	// library both map) is the pair's, not either's alone.
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(200 * time.Millisecond)
	child, err := groupPrivateBytes([]int{cmd.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	both, err := groupPrivateBytes([]int{os.Getpid(), cmd.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	if both < self+child {
		t.Errorf("private of both %d < self %d + child %d", both, self, child)
	}
	runtime.KeepAlive(buf)
}
