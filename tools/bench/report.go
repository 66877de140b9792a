package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Report is everything one bench run measured; results.json is this.
type Report struct {
	Meta          Meta        `json:"meta"`
	PoolSupported bool        `json:"pool_supported"`
	API           []APICell   `json:"api"`
	PoolMemory    *PoolMemory `json:"pool_memory,omitempty"`
	// ForksPoolMemory is the idle pool of the "forks" setting's run.
	ForksPoolMemory *PoolMemory     `json:"forks_pool_memory,omitempty"`
	Peers           []PeerResult    `json:"peers"`
	Warm            *WarmResult     `json:"warm_interpreter,omitempty"`
	ExecTrue        *ExecTrueResult `json:"exec_true,omitempty"`
	Sessions        *SessionsResult `json:"sessions,omitempty"`
	Targets         []Target        `json:"targets"`
	Notes           []string        `json:"notes"`
}

// Meta says where and how the numbers were taken.
type Meta struct {
	Time   string `json:"time"`
	Commit string `json:"commit"`
	// Sandboxd is the measured binary and the revision it was built from
	// (go version -m: vcs.revision, "+dirty" when vcs.modified).
	Sandboxd      string   `json:"sandboxd"`
	SandboxdRev   string   `json:"sandboxd_revision"`
	Kernel        string   `json:"kernel"`
	GoOS          string   `json:"goos"`
	CPUModel      string   `json:"cpu_model"`
	CPUs          int      `json:"cpus"`
	LoadAvgBefore string   `json:"loadavg_before"`
	LoadAvgAfter  string   `json:"loadavg_after"`
	Quick         bool     `json:"quick"`
	Rootfs        string   `json:"rootfs"`
	Args          []string `json:"args"`
	DurationS     float64  `json:"duration_s"`
}

// APICell is one workload × pool × concurrency measurement of the API.
type APICell struct {
	Workload string `json:"workload"`
	Pool     string `json:"pool"`
	PoolSize int    `json:"pool_size"`
	// Setting is the -pools setting the cell ran with: off, on, zygotes
	// or forks.
	Setting string `json:"setting,omitempty"`
	// Mode is "closed-loop" (each worker sends its next request when its
	// previous answer arrives; the pool refills in the background, as in
	// production) or "warm" (the bench waits for a full pool before each
	// request: the latency of a request that finds a ready sandbox).
	Mode        string `json:"mode"`
	Concurrency int    `json:"concurrency"`
	Summary
	Errors    []string `json:"errors,omitempty"`
	Truncated bool     `json:"truncated,omitempty"`
	// ServerP50MS is the median of the server's own duration_ms (whole
	// milliseconds): latency minus it is HTTP, admission and workspace.
	ServerP50MS *float64 `json:"server_duration_p50_ms,omitempty"`
}

func (r *Report) addCell(workload, pool string, size int, mode string, conc int, lr loadResult) {
	wall := lr.Wall
	if mode == "warm" {
		wall = 0 // the waits between requests make throughput meaningless
	}
	r.API = append(r.API, APICell{Workload: workload, Pool: pool, PoolSize: size, Mode: mode, Concurrency: conc,
		Summary: Summarize(lr.Latencies, lr.Failures, wall), Errors: lr.Errors, Truncated: lr.Truncated})
	if len(lr.Server) > 0 {
		v := Summarize(lr.Server, 0, 0).P50MS
		r.API[len(r.API)-1].ServerP50MS = &v
	}
}

// PoolMemory is the memory of the idle pool right after it filled.
type PoolMemory struct {
	Pool            string          `json:"pool,omitempty"`
	Sandboxes       []sandboxMemory `json:"sandboxes"`
	MedianPSSMiB    float64         `json:"median_pss_mib"`
	MedianRSSMiB    float64         `json:"median_rss_mib"`
	MedianCgroupMiB float64         `json:"median_cgroup_mib"`
	Metrics         []string        `json:"metrics,omitempty"`
}

// Target is one line of issue 5's targets, checked against this run.
type Target struct {
	Name     string `json:"name"`
	Measured string `json:"measured"`
	// Met is "yes", "no" or "n/a" (not measured in this run, with why).
	Met string `json:"met"`
}

// cell is a cell of issue 5's targets: with several pool-on settings in
// the run, the shipped one ("on", or an external server's) before zygotes
// before forks.
func (r *Report) cell(workload, mode string, poolOn bool, conc int) *APICell {
	var best *APICell
	rank := func(setting string) int { return slices.Index([]string{"on", "", "zygotes", "forks"}, setting) }
	for i := range r.API {
		c := &r.API[i]
		if c.Workload == workload && c.Mode == mode && (c.PoolSize > 0) == poolOn && c.Concurrency == conc && c.N > 0 {
			if best == nil || rank(c.Setting) < rank(best.Setting) {
				best = c
			}
		}
	}
	return best
}

// settingCell is the cell of one -pools setting.
func (r *Report) settingCell(setting, workload, mode string, conc int) *APICell {
	for i := range r.API {
		c := &r.API[i]
		if c.Setting == setting && c.Workload == workload && c.Mode == mode && c.Concurrency == conc && c.N > 0 {
			return c
		}
	}
	return nil
}

// forkTargets are issue 17's targets that one bench run can judge: the
// "forks" setting's cells against the "zygotes" (today's pool) and "off"
// cells of the same run, at each concurrency both ran.
func (r *Report) forkTargets() []Target {
	var t []Target
	ran := false
	for _, c := range r.API {
		ran = ran || c.Setting == "forks"
	}
	if !ran {
		return nil
	}
	na := func(name, why string) { t = append(t, Target{Name: name, Measured: why, Met: "n/a"}) }
	// ratios compares closed-loop throughput of setting a against b.
	ratios := func(workload, a, b string) (parts []string, minRatio float64, fails int) {
		minRatio = math.Inf(1)
		for _, c := range r.API {
			if c.Setting != a || c.Workload != workload || c.Mode != "closed-loop" {
				continue
			}
			base := r.settingCell(b, workload, "closed-loop", c.Concurrency)
			if base == nil || base.PerSec <= 0 {
				continue
			}
			ratio := c.PerSec / base.PerSec
			minRatio = min(minRatio, ratio)
			fails += c.Failures + base.Failures
			parts = append(parts, fmt.Sprintf("c=%d: %.1f against %.1f exec/s (%.2f×)", c.Concurrency, c.PerSec, base.PerSec, ratio))
		}
		return parts, minRatio, fails
	}

	name := "template forks: sustained pandas ≥ 5× today's pool (zygotes), zero failures"
	if parts, m, fails := ratios("pandas", "forks", "zygotes"); len(parts) == 0 {
		na(name, "no closed-loop pandas cells of both forks and zygotes")
	} else {
		t = append(t, Target{name, fmt.Sprintf("%s; failures %d", strings.Join(parts, "; "), fails), yesNo(m >= 5 && fails == 0)})
	}
	name = "template forks: sustained print(1), pool on ≥ pool off"
	if parts, m, fails := ratios("print", "forks", "off"); len(parts) == 0 {
		na(name, "no closed-loop print cells of both forks and pool off")
	} else {
		t = append(t, Target{name, fmt.Sprintf("%s; failures %d", strings.Join(parts, "; "), fails), yesNo(m >= 1 && fails == 0)})
	}
	name = "template forks: PSS per idle warm sandbox ≤ 10 MiB"
	if pm := r.ForksPoolMemory; pm == nil || len(pm.Sandboxes) == 0 {
		na(name, "no idle fork found")
	} else {
		m := fmt.Sprintf("PSS %.1f MiB, cgroup charge %.1f MiB (median of %d idle forks, the template's pages split among them)",
			pm.MedianPSSMiB, pm.MedianCgroupMiB, len(pm.Sandboxes))
		if z := r.PoolMemory; z != nil && len(z.Sandboxes) > 0 {
			m += fmt.Sprintf("; %s: PSS %.1f MiB", z.Pool, z.MedianPSSMiB)
		}
		t = append(t, Target{name, m, yesNo(pm.MedianPSSMiB <= 10)})
	}
	name = "template forks: warm print(1) HTTP round trip p50 ≤ 2 ms, p99 ≤ 10 ms"
	if c := r.settingCell("forks", "print", "warm", 1); c == nil {
		na(name, "no warm print cell with forks")
	} else {
		m := fmt.Sprintf("p50 %s ms, p99 %s ms (n=%d)", fmtMS(c.P50MS), fmtMS(c.P99MS), c.N)
		if z := r.settingCell("zygotes", "print", "warm", 1); z != nil {
			m += fmt.Sprintf("; zygotes p50 %s ms, p99 %s ms", fmtMS(z.P50MS), fmtMS(z.P99MS))
		}
		t = append(t, Target{name, m, yesNo(c.P50MS <= 2 && c.P99MS <= 10 && c.Failures == 0)})
	}
	return t
}

// bestColdPeer is the fastest peer (not ours) at kind by p50, among those
// that ran with no failure.
func (r *Report) bestColdPeer(kind string) (string, float64) {
	name, best := "", math.Inf(1)
	for _, p := range r.Peers {
		if p.Ours || p.Skipped != "" {
			continue
		}
		s, ok := p.Kinds[kind]
		if !ok || s.N == 0 || s.Failures > 0 {
			continue
		}
		if s.P50MS < best {
			name, best = p.Name, s.P50MS
		}
	}
	return name, best
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func evaluateTargets(r *Report) []Target {
	var t []Target
	na := func(name, why string) { t = append(t, Target{Name: name, Measured: why, Met: "n/a"}) }

	name := "warm print(1) HTTP round trip: p50 ≤ 2 ms, p99 ≤ 10 ms"
	if c := r.cell("print", "warm", true, 1); c != nil {
		t = append(t, Target{name, fmt.Sprintf("p50 %s ms, p99 %s ms (n=%d)", fmtMS(c.P50MS), fmtMS(c.P99MS), c.N), yesNo(c.P50MS <= 2 && c.P99MS <= 10 && c.Failures == 0)})
	} else {
		na(name, "no pool-on run")
	}

	warmPandas := r.cell("pandas", "warm", true, 1)
	peer, best := r.bestColdPeer(kindPandas)
	name = "pandas script ≥ 50× faster than the best cold peer"
	switch {
	case warmPandas == nil:
		na(name, "no pool-on run")
	case peer == "":
		na(name, "no cold peer ran")
	default:
		ratio := best / warmPandas.P50MS
		m := fmt.Sprintf("%.1f× (%s p50 %s ms vs warm API p50 %s ms)", ratio, peer, fmtMS(best), fmtMS(warmPandas.P50MS))
		if r.Warm != nil && r.Warm.First["pandas"].N > 0 {
			// What bounds it: even a zero-overhead hand-off cannot beat the
			// work itself, done in an interpreter that already imported
			// the stack.
			w := r.Warm.First["pandas"].P50MS
			m += fmt.Sprintf("; ceiling with zero overhead: %.1f× (the script alone takes %s ms in a warm interpreter)", best/w, fmtMS(w))
		}
		t = append(t, Target{name, m, yesNo(ratio >= 50)})
	}

	name = "pandas script ≤ 1.15× the same work in an already-warm interpreter"
	switch {
	case warmPandas == nil:
		na(name, "no pool-on run")
	case r.Warm == nil || r.Warm.First["pandas"].N == 0:
		na(name, "warm-interpreter baseline not measured")
	default:
		base := r.Warm.First["pandas"].P50MS
		ratio := warmPandas.P50MS / base
		t = append(t, Target{name, fmt.Sprintf("%.2f× (warm API p50 %s ms vs first exec in a warm interpreter p50 %s ms; steady-state exec p50 %s ms)",
			ratio, fmtMS(warmPandas.P50MS), fmtMS(base), fmtMS(r.Warm.Steady["pandas"].P50MS)), yesNo(ratio <= 1.15)})
	}

	name = "cold sandbox overhead for /bin/true ≤ 25 ms"
	var parts []string
	met := "n/a"
	if r.ExecTrue != nil && r.ExecTrue.Skipped == "" {
		parts = append(parts, fmt.Sprintf("BenchmarkExecTrue median %s ms, p90 %s ms", fmtMS(r.ExecTrue.MedianMS), fmtMS(r.ExecTrue.P90MS)))
		met = yesNo(r.ExecTrue.MedianMS <= 25)
	}
	for _, p := range r.Peers {
		if s, ok := p.Kinds[kindTrue]; p.Ours && ok && s.N > 0 {
			parts = append(parts, fmt.Sprintf("`sandboxd run -- /bin/true` whole CLI process p50 %s ms", fmtMS(s.P50MS)))
			if met == "n/a" {
				met = yesNo(s.P50MS <= 25)
			}
		}
	}
	if len(parts) == 0 {
		na(name, "not measured")
	} else {
		t = append(t, Target{name, strings.Join(parts, "; "), met})
	}

	name = "≥ 30 executions/s sustained on 2 cores, zero failures"
	// Judged on the pool-on cells when the pool ran (the shipped
	// configuration), with the pool-off best shown beside them.
	fails := 0
	for _, c := range r.API {
		fails += c.Failures
	}
	bestRate := func(poolOn bool) (float64, string) {
		rate, desc := 0.0, ""
		for _, c := range r.API {
			if c.Mode != "closed-loop" || c.Failures > 0 || (c.PoolSize > 0) != poolOn || c.PerSec <= rate {
				continue
			}
			rate = c.PerSec
			desc = fmt.Sprintf("%.1f/s (%s, %s, concurrency %d, n=%d)", c.PerSec, c.Workload, c.Pool, c.Concurrency, c.N)
		}
		return rate, desc
	}
	onRate, onDesc := bestRate(true)
	offRate, offDesc := bestRate(false)
	switch {
	case onDesc == "" && offDesc == "":
		na(name, "no failure-free closed-loop cell")
	case onDesc != "":
		m := "pool on: best " + onDesc
		if offDesc != "" {
			m += "; pool off: best " + offDesc
		}
		t = append(t, Target{name, fmt.Sprintf("%s; failures over all cells: %d", m, fails), yesNo(onRate >= 30 && fails == 0)})
	default:
		t = append(t, Target{name, fmt.Sprintf("pool off (no pool-on run): best %s; failures over all cells: %d", offDesc, fails), yesNo(offRate >= 30 && fails == 0)})
	}

	name = "memory per idle warm sandbox ≤ 100 MiB"
	pm := r.PoolMemory
	if pm == nil {
		pm = r.ForksPoolMemory // a run of forks alone
	}
	if pm == nil || len(pm.Sandboxes) == 0 {
		na(name, "no idle pool sandbox found")
	} else {
		t = append(t, Target{name, fmt.Sprintf("PSS %.1f MiB, RSS %.1f MiB, cgroup charge %.1f MiB (median of %d idle sandboxes)",
			pm.MedianPSSMiB, pm.MedianRSSMiB, pm.MedianCgroupMiB, len(pm.Sandboxes)), yesNo(pm.MedianPSSMiB <= 100)})
	}

	// Issue 12's targets.
	for _, st := range []struct {
		name string
		s    func(*SessionsResult) Summary
		p50  float64
	}{
		{"session: create + first print(1), pool warm: p50 ≤ 5 ms", func(s *SessionsResult) Summary { return s.CreateFirst }, 5},
		{"session: print(1) in a live kernel: p50 ≤ 2 ms", func(s *SessionsResult) Summary { return s.LiveExec }, 2},
	} {
		if r.Sessions == nil || st.s(r.Sessions).N == 0 {
			na(st.name, "no sessions run")
			continue
		}
		sum := st.s(r.Sessions)
		t = append(t, Target{st.name, fmt.Sprintf("p50 %s ms, p99 %s ms (n=%d, failures %d)", fmtMS(sum.P50MS), fmtMS(sum.P99MS), sum.N, sum.Failures),
			yesNo(sum.P50MS <= st.p50 && sum.Failures == 0)})
	}
	return append(t, r.forkTargets()...)
}

// fmtMS prints a latency with precision that suits its size.
func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "–"
	case v < 1:
		return fmt.Sprintf("%.3f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func kindTitle(kind string) string {
	switch kind {
	case kindTrue:
		return "/bin/true"
	case kindPrint:
		return "python3 -c 'print(1)'"
	default:
		return "pandas groupby + PNG"
	}
}

// Markdown renders the report.
func (r *Report) Markdown(chart string) string {
	var b strings.Builder
	m := r.Meta
	fmt.Fprintf(&b, "# sandboxd benchmark\n\n")
	fmt.Fprintf(&b, "Measured %s on %s (%d CPUs), kernel %s; bench at commit `%s`, sandboxd built from `%s`; load average %s before, %s after; %.0f s in all.",
		m.Time, orDash(m.CPUModel), m.CPUs, m.Kernel, orDash(m.Commit), orDash(m.SandboxdRev), m.LoadAvgBefore, m.LoadAvgAfter, m.DurationS)
	if m.Quick {
		b.WriteString(" **Quick run (-quick): few samples, a smoke test, not numbers to quote.**")
	}
	fmt.Fprintf(&b, "\n\nReproduce (as root, from the repository root): `make bench-full` (everything, 3-5 min on 2 cores) or `make bench-quick`; "+
		"by hand: `make build runtime-rootfs && go run -tags seccomp ./tools/bench -rootfs $(cat build/runtime-rootfs.path)`. This run's flags: `%s`.\n",
		strings.Join(quoteArgs(m.Args), " "))
	b.WriteString("Workloads: (a) `print(1)`; (b) a pandas groupby over 100k rows plus one matplotlib PNG written to output/artifacts/ (see tools/bench/workloads.go). " +
		"Every run's stdout (and, through the API, status and the PNG artifact) is checked: a run with any other outcome is a failure.\n")

	b.WriteString("\n## Targets (issues 5, 12 and 17)\n\n| target | measured | met |\n|---|---|---|\n")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Name, t.Measured, t.Met)
	}

	if len(r.API) > 0 {
		b.WriteString("\n## HTTP API on loopback (`POST /v1/executions`, sandboxd serve)\n\n")
		b.WriteString("Latency is the whole HTTP round trip as the client sees it. *closed-loop*: each of *concurrency* clients sends its next request as soon as the previous answer arrives (with the pool on, it refills in the background meanwhile). " +
			"*warm*: the bench waits until the pool is full before each request, so every request finds a ready sandbox. exec/s is successful executions per second of wall time.\n\n")
		b.WriteString("*server p50* is the median of the response's own `duration_ms` (whole ms, the server's view of the execution).\n\n")
		b.WriteString("| workload | pool | mode | concurrency | requests | failures | p50 ms | p90 ms | p99 ms | server p50 ms | exec/s |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.API {
			rate := "–"
			if c.PerSec > 0 {
				rate = fmt.Sprintf("%.1f", c.PerSec)
			}
			server := "–"
			if c.ServerP50MS != nil {
				server = fmt.Sprintf("%.0f", *c.ServerP50MS)
			}
			trunc := ""
			if c.Truncated {
				trunc = " (time bound)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d%s | %d | %s | %s | %s | %s | %s |\n", c.Workload, c.Pool, c.Mode, c.Concurrency,
				c.N, trunc, c.Failures, fmtMS(c.P50MS), fmtMS(c.P90MS), fmtMS(c.P99MS), server, rate)
		}
		for _, c := range r.API {
			for _, e := range c.Errors {
				fmt.Fprintf(&b, "\n- failure (%s, %s, %s, c=%d): `%s`", c.Workload, c.Pool, c.Mode, c.Concurrency, strings.ReplaceAll(e, "`", "'"))
			}
		}
		b.WriteString("\n")
	}

	r.sessionsMarkdown(&b)
	if len(r.Peers) > 0 {
		b.WriteString("\n## Cold launchers on the same rootfs (whole-process wall time)\n\n")
		b.WriteString("Each cell: p50 ms [p90] over sequential cold runs, and the ratio to the fastest peer in that column (ours excluded from \"fastest\"). " +
			"All get the same limits where the launcher has them (1 GiB, 1 CPU, 128 tasks), uid 10001, a read-only root and a tmpfs /tmp as cwd.\n\n")
		b.WriteString("| launcher | isolation |")
		for _, k := range peerKinds {
			fmt.Fprintf(&b, " %s |", kindTitle(k))
		}
		b.WriteString("\n|---|---|---:|---:|---:|\n")
		best := map[string]float64{}
		for _, k := range peerKinds {
			_, best[k] = r.bestColdPeer(k)
		}
		for _, p := range r.Peers {
			if p.Skipped != "" {
				continue
			}
			name := p.Name
			if p.Ours {
				name = "**" + name + "**"
			}
			fmt.Fprintf(&b, "| %s | %s |", name, p.Isolation)
			for _, k := range peerKinds {
				s, ok := p.Kinds[k]
				if !ok || s.N == 0 {
					fmt.Fprintf(&b, " failed |")
					continue
				}
				fail := ""
				if s.Failures > 0 {
					fail = fmt.Sprintf(", %d failed", s.Failures)
				}
				fmt.Fprintf(&b, " %s [%s]%s%s |", fmtMS(s.P50MS), fmtMS(s.P90MS), ratioText(s.P50MS, best[k]), fail)
			}
			b.WriteString("\n")
		}
		// The warm pool through the API, as a row of the same table.
		wp, wd := r.cell("print", "warm", true, 1), r.cell("pandas", "warm", true, 1)
		if wp != nil || wd != nil {
			b.WriteString("| **sandboxd warm pool (HTTP API, warm, c=1)** | same sandbox, pre-started, stack imported | – |")
			for _, c := range []*APICell{wp, wd} {
				if c == nil {
					b.WriteString(" – |")
					continue
				}
				k := kindPrint
				if c.Workload == "pandas" {
					k = kindPandas
				}
				fmt.Fprintf(&b, " %s [%s]%s |", fmtMS(c.P50MS), fmtMS(c.P90MS), ratioText(c.P50MS, best[k]))
			}
			b.WriteString("\n")
		}
		for _, p := range r.Peers {
			for _, e := range p.Errors {
				fmt.Fprintf(&b, "\n- %s: `%s`", p.Name, strings.ReplaceAll(e, "`", "'"))
			}
		}
		var skipped []string
		for _, p := range r.Peers {
			if p.Skipped != "" {
				skipped = append(skipped, fmt.Sprintf("- **%s** skipped: %s", p.Name, p.Skipped))
			}
		}
		if len(skipped) > 0 {
			b.WriteString("\n" + strings.Join(skipped, "\n") + "\n")
		}
		b.WriteString("\n")
	}

	if r.ExecTrue != nil {
		b.WriteString("\n## Sandbox overhead: nsjail BenchmarkExecTrue\n\n")
		if r.ExecTrue.Skipped != "" {
			fmt.Fprintf(&b, "Not measured: %s\n", r.ExecTrue.Skipped)
		} else {
			fmt.Fprintf(&b, "A cold `/bin/true` in a fresh sandbox, everything on, measured in-process (no CLI start-up) on the busybox rootfs: median **%s ms**, p90 %s ms over %d runs.\n",
				fmtMS(r.ExecTrue.MedianMS), fmtMS(r.ExecTrue.P90MS), r.ExecTrue.Runs)
		}
	}

	if r.Warm != nil {
		b.WriteString("\n## The same work in an already-warm interpreter\n\n")
		fmt.Fprintf(&b, "A python that has imported numpy, pandas, matplotlib (Agg) and pyplot execs the script as `__main__` in a fresh cwd, stdout captured; only the exec is timed. Launched with %s. "+
			"*first*: the first exec in a fresh interpreter (what a single-use pool sandbox does); *steady*: later execs in the same interpreter (a reused interpreter, which sandboxd never does).\n\n", r.Warm.Launcher)
		b.WriteString("| workload | first exec p50 ms [p90] | steady exec p50 ms [p90] | sandboxd API, warm pool, p50 ms | API / first |\n|---|---:|---:|---:|---:|\n")
		for _, w := range workloads {
			f, s := r.Warm.First[w.Name], r.Warm.Steady[w.Name]
			api, ratio := "–", "–"
			if c := r.cell(w.Name, "warm", true, 1); c != nil {
				api = fmtMS(c.P50MS)
				// Below a millisecond the exec is noise next to the hand-off;
				// a ratio would say nothing.
				if f.N > 0 && f.P50MS >= 1 {
					ratio = fmt.Sprintf("%.2f×", c.P50MS/f.P50MS)
				}
			}
			fmt.Fprintf(&b, "| %s | %s [%s] (n=%d) | %s [%s] (n=%d) | %s | %s |\n", w.Name, fmtMS(f.P50MS), fmtMS(f.P90MS), f.N, fmtMS(s.P50MS), fmtMS(s.P90MS), s.N, api, ratio)
		}
		for _, e := range r.Warm.Errors {
			fmt.Fprintf(&b, "\n- error: `%s`", strings.ReplaceAll(e, "`", "'"))
		}
		b.WriteString("\n")
	}

	for _, pm := range []*PoolMemory{r.PoolMemory, r.ForksPoolMemory} {
		if pm == nil {
			continue
		}
		b.WriteString("\n## Memory per idle warm sandbox")
		if pm.Pool != "" {
			b.WriteString(", " + pm.Pool)
		}
		b.WriteString("\n\n")
		if len(pm.Sandboxes) == 0 {
			b.WriteString("No idle python sandbox was found below the server process.\n")
		} else {
			fmt.Fprintf(&b, "Right after the pool filled: %d idle sandboxes; median **PSS %.1f MiB** (shared rootfs pages split among sharers: the real per-sandbox cost), RSS %.1f MiB, cgroup charge %.1f MiB (anonymous memory plus page cache first touched by that sandbox).\n",
				len(pm.Sandboxes), pm.MedianPSSMiB, pm.MedianRSSMiB, pm.MedianCgroupMiB)
		}
		if len(pm.Metrics) > 0 {
			b.WriteString("\nPool metrics at that moment:\n\n```\n" + strings.Join(pm.Metrics, "\n") + "\n```\n")
		}
	}

	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	if chart != "" {
		fmt.Fprintf(&b, "\n## Latency distribution\n\n![latency distribution](%s)\n", chart)
	}
	return b.String()
}

func ratioText(v, best float64) string {
	if math.IsInf(best, 0) || best <= 0 || math.IsNaN(v) {
		return ""
	}
	return fmt.Sprintf(" (%s×)", trimRatio(v/best))
}

func trimRatio(x float64) string {
	switch {
	case x < 0.1:
		return fmt.Sprintf("%.3f", x)
	case x < 10:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.0f", x)
	}
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func quoteArgs(args []string) []string {
	var out []string
	skip := false
	for _, a := range args {
		if skip {
			skip = false
			continue
		}
		// The rootfs path is machine-specific: it is left out.
		if a == "-rootfs" || a == "--rootfs" {
			skip = true
			continue
		}
		if strings.HasPrefix(a, "-rootfs=") || strings.HasPrefix(a, "--rootfs=") {
			continue
		}
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return []string{"(defaults)"}
	}
	return out
}

// writeOutputs writes results.json, latency.png and report.md to cfg.Out,
// and copies the report (and the chart) next to cfg.Results.
func writeOutputs(cfg config, r *Report, logf func(string, ...any)) error {
	if r.Notes == nil {
		r.Notes = []string{}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	jsonPath := filepath.Join(cfg.Out, "results.json")
	if err := os.WriteFile(jsonPath, data, 0o644); err != nil {
		return err
	}
	png, err := renderChart(r)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	pngPath := filepath.Join(cfg.Out, "latency.png")
	if err := os.WriteFile(pngPath, png, 0o644); err != nil {
		return err
	}
	mdPath := filepath.Join(cfg.Out, "report.md")
	if err := os.WriteFile(mdPath, []byte(r.Markdown("latency.png")), 0o644); err != nil {
		return err
	}
	logf("wrote %s, %s, %s", mdPath, jsonPath, pngPath)
	if cfg.Results != "" {
		dir := filepath.Dir(cfg.Results)
		if err := os.WriteFile(filepath.Join(dir, "latency.png"), png, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(cfg.Results, []byte(r.Markdown("latency.png")), 0o644); err != nil {
			return err
		}
		logf("copied the report to %s (and the chart beside it)", cfg.Results)
	}
	fmt.Println(r.Markdown(""))
	return nil
}

// sessionsMarkdown renders the sessions section (issue 12).
func (r *Report) sessionsMarkdown(b *strings.Builder) {
	s := r.Sessions
	if s == nil {
		return
	}
	b.WriteString("\n## Sessions (issue 12)\n\n")
	if s.CreateFirst.N+s.CreateFirst.Failures+s.LiveExec.N+s.LiveExec.Failures == 0 {
		// -sessions-idle-only
		fmt.Fprintf(b, "One server, warm pool on (%d per policy); no latencies measured.\n", s.PoolSize)
	} else {
		fmt.Fprintf(b, "One server, warm pool on (%d per policy). *create + first*: `POST /v1/sessions` then `print(1)` in it, the pool full before each. "+
			"*live kernel*: `print(1)` in a session whose kernel is alive (state `preserved` checked on every answer). Whole HTTP round trips.\n\n", s.PoolSize)
		b.WriteString("| measurement | n | failures | p50 ms | p90 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|\n")
		for _, row := range []struct {
			name string
			s    Summary
		}{{"create session + first print(1)", s.CreateFirst}, {"print(1) in a live kernel", s.LiveExec}} {
			fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s |\n", row.name, row.s.N, row.s.Failures, fmtMS(row.s.P50MS), fmtMS(row.s.P90MS), fmtMS(row.s.P99MS))
		}
	}
	idleKernelsMarkdown(b, s.IdleKernels)
	if t := s.TenStep; t != nil {
		fmt.Fprintf(b, "\nTen-step analysis of a %.0f MB CSV (load, eight groupbys, a chart; tools/bench/sessions.go): "+
			"**session %.0f ms** (upload %.0f ms, then ten executions in one kernel) against **ten single-shot executions %.0f ms** "+
			"(each sends the CSV in `files[]` and loads it again): **%.1f×**.\n\n", float64(t.CSVBytes)/1e6, t.SessionMS, t.SessionUpload, t.SingleShotMS, t.Ratio)
		b.WriteString("| step | session ms | single-shot ms |\n|---:|---:|---:|\n")
		for i := range t.SessionSteps {
			single := "–"
			if i < len(t.SingleShotStep) {
				single = fmt.Sprintf("%.0f", t.SingleShotStep[i])
			}
			fmt.Fprintf(b, "| %d | %.0f | %s |\n", i+1, t.SessionSteps[i], single)
		}
	}
	if m := s.Memory; m != nil {
		fmt.Fprintf(b, "\nIdle sessions with pandas imported and the %.0f MB CSV loaded as a DataFrame (%d measured): median PSS %.1f MiB, "+
			"cgroup charge %.1f MiB, the worker's own view %.1f MiB per idle kernel: **%d such sessions fit in this host's %.1f GiB** "+
			"(at the larger charge, nothing else running).\n",
			float64(m.CSVBytes)/1e6, m.Sessions, m.MedianPSSMiB, m.MedianCgroupMiB, m.ServerMeanMiB, m.Fit, m.HostMemGiB)
	}
	for _, e := range s.Errors {
		fmt.Fprintf(b, "\n- failure: `%s`", strings.ReplaceAll(e, "`", "'"))
	}
	if len(s.Errors) > 0 {
		b.WriteString("\n")
	}
}

// idleKernelsMarkdown renders the idle kernels before data (issue 17, M2).
func idleKernelsMarkdown(b *strings.Builder, m *IdleKernels) {
	if m == nil {
		return
	}
	pool := "zygotes (no template found)"
	if m.Templates > 0 {
		pool = fmt.Sprintf("template forks (%d templates)", m.Templates)
	}
	fmt.Fprintf(b, "\nIdle session kernels before they load data (issue 17, M2): %d sessions, each ran `%s` once and idles frozen; "+
		"%d found idle; the pool is %s. Per session (medians; PSS and USS include the fork's F, charged to the template's cgroup; "+
		"USS is the pages the session's processes map and no other process does, from pagemap and kpagecount):\n\n",
		m.Sessions, strings.ReplaceAll(strings.TrimSpace(m.Cell), "\n", "; "), m.Measured, pool)
	b.WriteString("| per session | MiB |\n|---|---:|\n")
	fmt.Fprintf(b, "| PSS | **%.1f** |\n", m.PSSMiB)
	fmt.Fprintf(b, "| USS, private | %.1f |\n", m.USSMiB)
	fmt.Fprintf(b, "| session cgroup charge | %.1f |\n", m.CgroupMiB)
	fmt.Fprintf(b, "| the worker's view (idle kernel memory / idle kernels) | %.1f |\n", m.ServerMeanMiB)
	fmt.Fprintf(b, "| host MemAvailable drop over the %d, per session (kernel memory included: page tables, slab, tmpfs; and whatever else ran): mean of the creation's and the removal's | %.1f (%.1f, %.1f) |\n",
		m.Sessions, m.MemAvailableDropMiB, m.MemAvailableCreateMiB, m.MemAvailableRemoveMiB)
	if len(m.MeminfoGrowthMiB) > 0 {
		var parts []string
		for _, k := range meminfoGrowthKeys {
			if v, ok := m.MeminfoGrowthMiB[k]; ok {
				parts = append(parts, fmt.Sprintf("%s %+.2f", k, v))
			}
		}
		fmt.Fprintf(b, "| /proc/meminfo growth per session | %s |\n", strings.Join(parts, ", "))
		fmt.Fprintf(b, "| the worker process's own PSS growth per session | %.2f |\n", m.WorkerGrowthMiB)
		fmt.Fprintf(b, "| USS + kernel memory (Slab, PageTables, KernelStack growth: %.2f) + the worker's growth | %.1f |\n", m.KernelMiB, m.USSKernelMiB)
	}
	if m.MemAvailableNoisy {
		b.WriteString("\nThe MemAvailable readings at the creation and the removal differ by more than a quarter (the rest of the host moved): the drop is left out of the worst.\n")
	}
	fmt.Fprintf(b, "\nFixed cost, not per session (PSS): templates %.1f MiB (USS %.1f, own cgroup charge %.1f), "+
		"%d idle pool and spare sandboxes %.1f MiB: %.1f MiB. **%d sessions fit in %.0f GiB** less the fixed cost, at the worst per-session cost (%s, %.1f MiB)",
		m.TemplatesPSSMiB, m.TemplatesUSSMiB, m.TemplatesCgroupMiB, m.PoolSandboxes, m.PoolPSSMiB, m.FixedMiB, m.Fit, m.BudgetGiB, m.WorstBasis, m.WorstMiB)
	var by []string
	for _, k := range []string{"PSS", "USS", "USS + kernel memory", "cgroup charge", "worker's view", "MemAvailable drop"} {
		if v, ok := m.FitBy[k]; ok {
			by = append(by, fmt.Sprintf("%s %d", k, v))
		}
	}
	if len(by) > 0 {
		fmt.Fprintf(b, "; at each: %s", strings.Join(by, ", "))
	}
	b.WriteString(". PSS splits the template's pages among the sharers present, so with more sessions it falls toward USS; other limits (pids, keys, user namespaces, max_sessions) are not counted.\n")
}
