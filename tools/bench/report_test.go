package main

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
	"time"
)

func ms2d(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

// sampleReport is a report as a full run fills it.
func sampleReport() *Report {
	r := &Report{Meta: Meta{Time: "2026-01-01T00:00:00Z", CPUs: 2, Commit: "abc"}}
	r.addCell("print", "pool on (4)", 4, "warm", 1, loadResult{Latencies: ms2d(1, 1.5, 2, 8), Wall: time.Second})
	r.addCell("pandas", "pool on (4)", 4, "warm", 1, loadResult{Latencies: ms2d(14, 15, 16)})
	r.addCell("print", "pool on (4)", 4, "closed-loop", 4, loadResult{Latencies: ms2d(20, 30, 40), Wall: 100 * time.Millisecond})
	r.addCell("print", "pool off", 0, "closed-loop", 1, loadResult{Latencies: ms2d(60, 70), Failures: 1, Errors: []string{"status \"failed\""}, Wall: time.Second})
	r.Peers = []PeerResult{
		{Name: "sandboxd run (cold)", Ours: true, Kinds: map[string]Summary{kindPandas: Summarize(ms2d(900), 0, 0)}},
		{Name: "bubblewrap", Kinds: map[string]Summary{kindTrue: Summarize(ms2d(8, 9, 10), 0, 0), kindPandas: Summarize(ms2d(850, 860, 870), 0, 0)}},
		{Name: "runc", Kinds: map[string]Summary{kindTrue: Summarize(ms2d(60), 0, 0), kindPandas: Summarize(ms2d(700), 1, 0)}},
		{Name: "crun", Skipped: "refuses hybrid cgroups"},
	}
	r.Warm = &WarmResult{Launcher: "x",
		First:  map[string]Summary{"print": Summarize(ms2d(0.01), 0, 0), "pandas": Summarize(ms2d(13, 14, 15), 0, 0)},
		Steady: map[string]Summary{"print": Summarize(ms2d(0.005), 0, 0), "pandas": Summarize(ms2d(9), 0, 0)}}
	r.ExecTrue = &ExecTrueResult{Runs: 10, MedianMS: 14, P90MS: 16}
	r.PoolMemory = &PoolMemory{Sandboxes: []sandboxMemory{{Python: true}}, MedianPSSMiB: 80, MedianRSSMiB: 120, MedianCgroupMiB: 150}
	r.Targets = evaluateTargets(r)
	return r
}

func TestTargets(t *testing.T) {
	r := sampleReport()
	got := map[string]Target{}
	for _, tg := range r.Targets {
		got[tg.Name] = tg
	}
	check := func(prefix, met, contains string) {
		t.Helper()
		for name, tg := range got {
			if strings.HasPrefix(name, prefix) {
				if tg.Met != met || !strings.Contains(tg.Measured, contains) {
					t.Errorf("%s: met=%s measured=%q; want met=%s containing %q", name, tg.Met, tg.Measured, met, contains)
				}
				return
			}
		}
		t.Errorf("no target %q", prefix)
	}
	check("warm print(1)", "yes", "p50 1.50 ms, p99 8.00 ms")
	// runc had a failure, so the best cold peer is bubblewrap at 860 ms:
	// 860 / 15 = 57×.
	check("pandas script ≥ 50×", "yes", "57.3× (bubblewrap")
	check("pandas script ≤ 1.15×", "yes", "1.07×")
	check("cold sandbox overhead", "yes", "BenchmarkExecTrue median 14.0 ms")
	// 30/s is met by a cell, but another cell failed: zero failures is part of the target.
	check("≥ 30 executions/s", "no", "pool on: best 30.0/s")
	check("memory per idle", "yes", "PSS 80.0 MiB")
}

func TestMarkdown(t *testing.T) {
	md := sampleReport().Markdown("latency.png")
	for _, want := range []string{
		"| print | pool on (4) | warm | 1 | 4 | 0 | 1.50 | 8.00 | 8.00 | – | – |",
		"| print | pool off | closed-loop | 1 | 2 | 1 | 60.0 | 70.0 | 70.0 | – | 2.0 |",
		// Ratios against the fastest peer that ran without failure (bubblewrap).
		"| bubblewrap |  | 9.00 [10.0] (1.00×) | failed | 860 [870] (1.00×) |",
		"| **sandboxd run (cold)** |  | failed | failed | 900 [900] (1.05×) |",
		"**sandboxd warm pool (HTTP API, warm, c=1)**",
		"15.0 [16.0] (0.017×)",
		"- **crun** skipped: refuses hybrid cgroups",
		"![latency distribution](latency.png)",
		"`status \"failed\"`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q\n%s", want, md)
		}
	}
}

func TestChart(t *testing.T) {
	data, err := renderChart(sampleReport())
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	rows := len(chartSeriesOf(sampleReport()))
	if rows != 4+5+4 {
		t.Errorf("rows = %d, want 13 (4 API cells, 5 peer kinds that ran, 4 warm)", rows)
	}
	if b := img.Bounds(); b.Dx() != chartWidth || b.Dy() < rows*chartRowH {
		t.Errorf("size %v too small for %d rows", b, rows)
	}
	empty, err := renderChart(&Report{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(empty)); err != nil {
		t.Errorf("empty report: %v", err)
	}
}

// TestForkTargets: issue 17's targets compare the forks setting with the
// zygotes and off settings of the same run, at each concurrency both ran.
func TestForkTargets(t *testing.T) {
	r := &Report{}
	add := func(setting, workload, mode string, conc int, lr loadResult) {
		size := 4
		if setting == "off" {
			size = 0
		}
		r.addCell(workload, poolLabel(setting, size), size, mode, conc, lr)
		r.API[len(r.API)-1].Setting = setting
	}
	// 10 requests in 1 s (forks) against 2 in 1 s (zygotes): 5×; at c=4, 4×.
	lat := ms2d(1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	add("zygotes", "pandas", "closed-loop", 2, loadResult{Latencies: lat[:2], Wall: time.Second})
	add("forks", "pandas", "closed-loop", 2, loadResult{Latencies: lat, Wall: time.Second})
	add("zygotes", "pandas", "closed-loop", 4, loadResult{Latencies: lat[:2], Wall: time.Second})
	add("forks", "pandas", "closed-loop", 4, loadResult{Latencies: lat[:8], Wall: time.Second})
	add("off", "print", "closed-loop", 2, loadResult{Latencies: lat[:5], Wall: time.Second})
	add("forks", "print", "closed-loop", 2, loadResult{Latencies: lat[:6], Wall: time.Second})
	add("forks", "print", "warm", 1, loadResult{Latencies: ms2d(1.5, 1.8, 9)})
	r.ForksPoolMemory = &PoolMemory{Pool: "pool on (4, forks)", Sandboxes: []sandboxMemory{{Python: true}}, MedianPSSMiB: 9.5}
	got := map[string]Target{}
	for _, tg := range evaluateTargets(r) {
		got[tg.Name] = tg
	}
	for name, want := range map[string]struct{ met, contains string }{
		"template forks: sustained pandas ≥ 5× today's pool (zygotes), zero failures": {"no", "c=4: 8.0 against 2.0 exec/s (4.00×)"},
		"template forks: sustained print(1), pool on ≥ pool off":                      {"yes", "c=2: 6.0 against 5.0 exec/s (1.20×)"},
		"template forks: PSS per idle warm sandbox ≤ 10 MiB":                          {"yes", "PSS 9.5 MiB"},
		"template forks: warm print(1) HTTP round trip p50 ≤ 2 ms, p99 ≤ 10 ms":       {"yes", "p50 1.80 ms"},
	} {
		if tg, ok := got[name]; !ok || tg.Met != want.met || !strings.Contains(tg.Measured, want.contains) {
			t.Errorf("%s: got %+v; want met=%s containing %q", name, tg, want.met, want.contains)
		}
	}
	// Without a forks run, none of them is listed.
	if tg := sampleReport().forkTargets(); tg != nil {
		t.Errorf("forkTargets without a forks run: %v", tg)
	}
}
