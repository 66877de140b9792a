package server

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sandboxd/sandboxd/server/warmpool"
)

func TestPoolCollectorExportsFallbacks(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&poolCollector{size: 2, stats: func() warmpool.Stats {
		return warmpool.Stats{FallbackDead: 3, FallbackEnv: 5, FallbackFork: 7, FallbackWrite: 17, KernelForks: 11, ExecForks: 13}
	}})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	forked, execForked := -1.0, -1.0
	for _, f := range families {
		switch f.GetName() {
		case "sandboxd_pool_kernel_forks_total":
			forked = f.GetMetric()[0].GetCounter().GetValue()
		case "sandboxd_pool_execution_forks_total":
			execForked = f.GetMetric()[0].GetCounter().GetValue()
		}
		if f.GetName() != "sandboxd_pool_fallback_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[strings.Join(labels, ",")] = m.GetCounter().GetValue()
		}
	}
	if got["reason=dead"] != 3 || got["reason=env"] != 5 || got["reason=fork"] != 7 || got["reason=write"] != 17 || len(got) != 4 {
		t.Fatalf("sandboxd_pool_fallback_total = %v", got)
	}
	if forked != 11 || execForked != 13 {
		t.Fatalf("sandboxd_pool_kernel_forks_total = %v, sandboxd_pool_execution_forks_total = %v", forked, execForked)
	}
}
