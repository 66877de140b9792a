package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Idle session kernels before they load data (issue 17, TEMPLATE.md §12
// M2): the memory of a pandas-ready session that ran one small cell and
// holds nothing else, and how many such sessions a 24 GiB host holds.

// IdleKernels is that measurement.
type IdleKernels struct {
	// Sessions were created (each ran idleKernelCell); Measured of them
	// were found idling frozen when their memory was read.
	Sessions int    `json:"sessions"`
	Measured int    `json:"measured"`
	Cell     string `json:"cell"`
	// Templates counts the template processes' cgroups found (0: the pool
	// is zygotes, pool_template_forks off). NotForks counts, when there
	// are templates, the measured kernels that are not template forks (no
	// parent in the template's cgroup): they would be zygotes or cold starts.
	Templates int `json:"templates"`
	NotForks  int `json:"not_forks"`

	// Per session, medians over the measured kernels. PSS is the
	// sandbox's processes' (smaps_rollup); USS is what they map and no
	// other process does (pagemap and kpagecount: sandboxMemory.TotalUSS);
	// the cgroup charge is the session cgroup's alone.
	PSSMiB    float64 `json:"median_pss_mib"`
	USSMiB    float64 `json:"median_uss_mib"`
	CgroupMiB float64 `json:"median_cgroup_mib"`
	// ServerMeanMiB is the worker's view (sandboxd_session_idle_kernel_
	// memory_bytes over sandboxd_session_idle_kernels).
	ServerMeanMiB float64 `json:"server_mean_mib"`
	// MemAvailableDropMiB is what the host gave each session, from
	// /proc/meminfo MemAvailable: read before the K sessions (the pool and
	// spare kernels full), with the K idle (the same, refilled), and after
	// their removal (the same again); the mean of the drop at their
	// creation and the rise at their removal, over K (a steady drift of
	// the rest of the host cancels out). MemAvailableCreateMiB and
	// MemAvailableRemoveMiB are the two. It is everything the sessions
	// cost the host, kernel memory included (page tables, slab:
	// namespaces, mounts, cgroups; tmpfs and the session volumes), and
	// whatever else moved on the host meanwhile.
	MemAvailableDropMiB   float64 `json:"mem_available_drop_mib"`
	MemAvailableCreateMiB float64 `json:"mem_available_create_mib"`
	MemAvailableRemoveMiB float64 `json:"mem_available_remove_mib,omitempty"`
	// MeminfoGrowthMiB is, the same way, the growth of other /proc/meminfo
	// fields (Slab, SUnreclaim, PageTables, KernelStack, Shmem,
	// AnonPages) per session.
	MeminfoGrowthMiB map[string]float64 `json:"meminfo_growth_mib"`
	// WorkerGrowthMiB is the worker process's own PSS growth per session,
	// the same way (its bookkeeping; in AnonPages and the MemAvailable
	// drop, in none of the per-sandbox numbers).
	WorkerGrowthMiB float64 `json:"worker_growth_mib"`
	// KernelMiB is the kernel memory per session: the growth of Slab,
	// PageTables and KernelStack (namespaces, mounts, cgroups, the
	// processes' page tables and stacks); USSKernelMiB is USSMiB plus it
	// plus WorkerGrowthMiB: what a session takes from the host by parts,
	// steadier than the MemAvailable drop on a shared host.
	KernelMiB    float64 `json:"kernel_mib"`
	USSKernelMiB float64 `json:"uss_kernel_mib"`
	// MemAvailableNoisy: the creation's and the removal's MemAvailable
	// readings differ by more than a quarter of the larger (the rest of
	// the host moved meanwhile); the drop is then left out of the worst.
	MemAvailableNoisy bool `json:"mem_available_noisy,omitempty"`

	// The fixed cost, not per session: the templates' own memory (T: the
	// template cgroup's processes) and the warm pool's
	// and spare kernels' idle sandboxes, PSS.
	TemplatesPSSMiB    float64 `json:"templates_pss_mib"`
	TemplatesUSSMiB    float64 `json:"templates_uss_mib"`
	TemplatesCgroupMiB float64 `json:"templates_cgroup_mib"` // the template cgroups less their nested sandboxes'
	PoolSandboxes      int     `json:"pool_sandboxes"`
	PoolPSSMiB         float64 `json:"pool_pss_mib"`
	FixedMiB           float64 `json:"fixed_mib"` // templates + pool, PSS

	// Fit is how many sessions fit in BudgetGiB less the fixed cost, at
	// the worst (largest) of the per-session costs, WorstBasis; FitBy
	// gives it at each.
	BudgetGiB  float64        `json:"budget_gib"`
	HostMemGiB float64        `json:"host_mem_gib"`
	WorstBasis string         `json:"worst_basis"`
	WorstMiB   float64        `json:"worst_mib"`
	Fit        int            `json:"fit"`
	FitBy      map[string]int `json:"fit_by"`
	// Kernels are the measured kernels' sandboxes.
	Kernels []sandboxMemory `json:"kernels"`
}

// idleKernelCell is what each session runs once: pandas imported (from the
// preload, in a warm kernel), nothing loaded.
const idleKernelCell = "import pandas as pd\nprint(1)\n"

// idleKernelBudget is the host memory issue 17 asks about.
const idleKernelBudget = 24 << 30

// meminfoGrowthKeys are the /proc/meminfo fields whose growth is reported.
var meminfoGrowthKeys = []string{"Slab", "SUnreclaim", "PageTables", "KernelStack", "Shmem", "AnonPages"}

// workerPSSKey carries the worker's PSS among the /proc/meminfo readings.
const workerPSSKey = "worker Pss"

// idleSessionKernels are the session kernels among sandboxes: the python
// sandboxes idling frozen (a session kernel is frozen between executions;
// warm sandboxes, spare kernels and templates never are).
func idleSessionKernels(sandboxes []sandboxMemory) []sandboxMemory {
	var out []sandboxMemory
	for _, s := range sandboxes {
		if s.Python && s.Frozen {
			out = append(out, s)
		}
	}
	return out
}

// nestedBelow returns the sandboxes whose cgroup is nested below s's.
func nestedBelow(s sandboxMemory, sandboxes []sandboxMemory) []sandboxMemory {
	var out []sandboxMemory
	for _, o := range sandboxes {
		if strings.HasPrefix(o.Cgroup, s.Cgroup+"/") {
			out = append(out, o)
		}
	}
	return out
}

// idleKernelCosts computes everything but the worker's view from what was
// read: the sandboxes below the server with the k sessions idle, and
// /proc/meminfo (bytes) before the sessions, with them, and after their
// removal (nil: not read).
func idleKernelCosts(sandboxes []sandboxMemory, k int, before, with, after map[string]int64, budget int64) *IdleKernels {
	r := &IdleKernels{Sessions: k, Cell: idleKernelCell, BudgetGiB: round3(float64(budget) / (1 << 30)), FitBy: map[string]int{}}
	var pss, uss, cg []float64
	var fixed int64
	for _, s := range sandboxes {
		if nested := nestedBelow(s, sandboxes); len(nested) > 0 {
			// A template: T (its cgroup's charge includes its forks').
			r.Templates++
			p, u, c := s.PSSBytes, s.USSBytes, s.CgroupBytes
			for _, n := range nested {
				c -= n.CgroupBytes
			}
			r.TemplatesPSSMiB += float64(p) / (1 << 20)
			r.TemplatesUSSMiB += float64(u) / (1 << 20)
			r.TemplatesCgroupMiB += float64(c) / (1 << 20)
			fixed += p
			continue
		}
		if !s.Python {
			continue
		}
		if !s.Frozen {
			r.PoolSandboxes++
			r.PoolPSSMiB += float64(s.TotalPSS()) / (1 << 20)
			fixed += s.TotalPSS()
			continue
		}
		r.Measured++
		r.Kernels = append(r.Kernels, s)
		pss = append(pss, float64(s.TotalPSS()))
		uss = append(uss, float64(s.TotalUSS()))
		cg = append(cg, float64(s.CgroupBytes))
		if s.ForkParent == 0 {
			r.NotForks++
		}
	}
	if r.Templates == 0 {
		r.NotForks = 0
	}
	r.TemplatesPSSMiB, r.TemplatesUSSMiB, r.TemplatesCgroupMiB = round3(r.TemplatesPSSMiB), round3(r.TemplatesUSSMiB), round3(r.TemplatesCgroupMiB)
	r.PoolPSSMiB = round3(r.PoolPSSMiB)
	r.FixedMiB = round3(float64(fixed) / (1 << 20))
	r.PSSMiB, r.USSMiB, r.CgroupMiB = medianMiB(pss), medianMiB(uss), medianMiB(cg)
	if k > 0 && before["MemAvailable"] > 0 && with["MemAvailable"] > 0 {
		// growth is the growth of key per session: at the creation, and
		// the mean with the fall at the removal when that was read.
		growth := func(key string) (create, remove, mean float64) {
			create = float64(with[key]-before[key]) / float64(k) / (1 << 20)
			if after[key] == 0 && after["MemAvailable"] == 0 {
				return create, 0, create
			}
			remove = float64(with[key]-after[key]) / float64(k) / (1 << 20)
			return create, remove, (create + remove) / 2
		}
		c, rm, mean := growth("MemAvailable")
		r.MemAvailableCreateMiB, r.MemAvailableRemoveMiB, r.MemAvailableDropMiB = round3(-c), round3(-rm), round3(-mean)
		if _, ok := before[workerPSSKey]; ok {
			_, _, mean := growth(workerPSSKey)
			r.WorkerGrowthMiB = round3(mean)
		}
		if rm != 0 && math.Abs(c-rm) > 0.25*max(math.Abs(c), math.Abs(rm)) {
			r.MemAvailableNoisy = true
		}
		r.MeminfoGrowthMiB = map[string]float64{}
		for _, key := range meminfoGrowthKeys {
			if _, ok := before[key]; ok {
				_, _, mean := growth(key)
				r.MeminfoGrowthMiB[key] = round3(mean)
			}
		}
		g := r.MeminfoGrowthMiB
		r.KernelMiB = round3(g["Slab"] + g["PageTables"] + g["KernelStack"])
	}
	if r.USSMiB > 0 {
		r.USSKernelMiB = round3(r.USSMiB + max(0, r.KernelMiB) + max(0, r.WorkerGrowthMiB))
	}
	r.setFit(budget)
	return r
}

// setFit fills Worst* and Fit* from the per-session costs and FixedMiB
// (and ServerMeanMiB, when set); a noisy MemAvailable drop is in FitBy but
// not a candidate for the worst.
func (r *IdleKernels) setFit(budget int64) {
	costs := []struct {
		basis string
		mib   float64
	}{
		{"PSS", r.PSSMiB}, {"USS", r.USSMiB}, {"USS + kernel memory", r.USSKernelMiB}, {"cgroup charge", r.CgroupMiB},
		{"worker's view", r.ServerMeanMiB}, {"MemAvailable drop", r.MemAvailableDropMiB},
	}
	room := float64(budget)/(1<<20) - r.FixedMiB
	r.FitBy = map[string]int{}
	r.WorstBasis, r.WorstMiB, r.Fit = "", 0, 0
	for _, c := range costs {
		if c.mib <= 0 {
			continue
		}
		r.FitBy[c.basis] = max(0, int(room/c.mib))
		if c.basis == "MemAvailable drop" && r.MemAvailableNoisy {
			continue
		}
		if c.mib > r.WorstMiB {
			r.WorstBasis, r.WorstMiB = c.basis, c.mib
		}
	}
	if r.WorstMiB > 0 {
		r.Fit = r.FitBy[r.WorstBasis]
	}
}

// parseMeminfo reads /proc/meminfo's "Key: N kB" lines, in bytes.
func parseMeminfo(r io.Reader) map[string]int64 {
	data, _ := io.ReadAll(r)
	out := map[string]int64{}
	for _, line := range strings.Split(string(data), "\n") {
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		out[key] = n
	}
	return out
}

// readMeminfo is /proc/meminfo, the median of three reads 0.5 s apart per
// field (a moment's spike of another process's is left out).
func readMeminfo() map[string]int64 {
	var reads []map[string]int64
	for i := 0; i < 3; i++ {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		f, err := os.Open("/proc/meminfo")
		if err != nil {
			return map[string]int64{}
		}
		reads = append(reads, parseMeminfo(f))
		f.Close()
	}
	out := map[string]int64{}
	for key := range reads[0] {
		v := []int64{reads[0][key], reads[1][key], reads[2][key]}
		slices.Sort(v)
		out[key] = v[1]
	}
	return out
}

// waitFrozenKernels waits until at least n python sandboxes below the
// server idle frozen (a session kernel freezes in the background after its
// execution's answer).
func waitFrozenKernels(ctx context.Context, srv *serverProc, n int, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		got := len(idleSessionKernels(sandboxesBelow(srv.pid())))
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d session kernels frozen after %s", got, n, timeout)
		}
	}
	return ctx.Err()
}

// idleKernels creates k sessions, runs idleKernelCell in each, lets the
// pool and the spare kernels refill, and measures the idle kernels; wait
// refills the pool and spare kernels.
func idleKernels(ctx context.Context, srv *serverProc, c sessionClient, k int, wait func(), fail func(string, ...any), logf func(string, ...any)) *IdleKernels {
	var ids []string
	defer func() {
		for _, id := range ids {
			c.remove(ctx, id)
		}
	}()
	wait()
	if n := len(idleSessionKernels(sandboxesBelow(srv.pid()))); n > 0 {
		fail("idle kernels: %d session kernels idle before the measurement", n)
		return nil
	}
	time.Sleep(2 * time.Second)
	before := readMeminfo()
	before[workerPSSKey] = smapsRollup(srv.pid()).PSS
	for i := 0; i < k; i++ {
		// The pool full before each: every kernel a warm one (with the
		// pool empty, a session's kernel is started cold, a zygote even
		// with template forks on).
		if i > 0 {
			wait()
		}
		id, err := c.create(ctx)
		if err != nil {
			fail("idle kernels: create: %v", err)
			return nil
		}
		ids = append(ids, id)
		if _, err := c.exec(ctx, id, idleKernelCell, "1\n"); err != nil {
			fail("idle kernels: %v", err)
			return nil
		}
	}
	wait()
	if err := waitFrozenKernels(ctx, srv, k, 30*time.Second); err != nil {
		fail("idle kernels: %v", err)
	}
	time.Sleep(2 * time.Second) // the pool's last refill's exit, freed arenas
	with := readMeminfo()
	with[workerPSSKey] = smapsRollup(srv.pid()).PSS
	sandboxes := sandboxesBelow(srv.pid())
	for i := range sandboxes {
		if s := &sandboxes[i]; s.Python && s.Frozen {
			if err := s.readPrivate(); err != nil {
				fail("idle kernels: private memory of %s: %v", s.Cgroup, err)
			}
		}
	}
	var serverMean float64
	if _, text, err := srv.client.getText(ctx, "/metrics"); err == nil {
		bytes, n := metricValue(text, "sandboxd_session_idle_kernel_memory_bytes"), metricValue(text, "sandboxd_session_idle_kernels")
		if n > 0 {
			serverMean = round3(bytes / n / (1 << 20))
		}
	}
	// Their removal, for the second reading of the host's memory.
	var after map[string]int64
	removed := true
	for _, id := range ids {
		if err := c.remove(ctx, id); err != nil {
			fail("idle kernels: remove: %v", err)
			removed = false
		}
	}
	ids = nil
	if removed {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && len(idleSessionKernels(sandboxesBelow(srv.pid()))) > 0; {
			time.Sleep(100 * time.Millisecond)
		}
		wait()
		time.Sleep(2 * time.Second)
		after = readMeminfo()
		after[workerPSSKey] = smapsRollup(srv.pid()).PSS
	}
	r := idleKernelCosts(sandboxes, k, before, with, after, idleKernelBudget)
	if serverMean > 0 {
		r.ServerMeanMiB = serverMean
		r.setFit(idleKernelBudget)
	}
	if total := hostMemBytes(); total > 0 {
		r.HostMemGiB = round3(float64(total) / (1 << 30))
	}
	if r.Measured != k {
		fail("idle kernels: %d of %d session kernels found idle", r.Measured, k)
	}
	if r.NotForks > 0 {
		fail("idle kernels: %d of %d session kernels are not template forks (started cold?)", r.NotForks, r.Measured)
	}
	logf("sessions: %d idle kernels before data: PSS %.1f MiB, USS %.1f MiB, cgroup %.1f MiB, worker's view %.1f MiB, MemAvailable drop %.1f MiB per session (%.1f at the creation, %.1f at the removal), the worker's own growth %.2f MiB; fixed %.1f MiB (templates %.1f, pool %d: %.1f); %d fit in %.0f GiB at the %s",
		r.Measured, r.PSSMiB, r.USSMiB, r.CgroupMiB, r.ServerMeanMiB, r.MemAvailableDropMiB, r.MemAvailableCreateMiB, r.MemAvailableRemoveMiB, r.WorkerGrowthMiB, r.FixedMiB, r.TemplatesPSSMiB, r.PoolSandboxes, r.PoolPSSMiB, r.Fit, r.BudgetGiB, r.WorstBasis)
	return r
}
