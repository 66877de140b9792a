package nsjail_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// BenchmarkExecTrue is a cold /bin/true in a fresh sandbox with everything on
// (namespaces, mounts, cgroup limits, seccomp, rlimits), like runc's
// libcontainer/integration BenchmarkExecTrue. It reports the median and p90
// of whole Run calls next to the mean.
func BenchmarkExecTrue(b *testing.B) {
	r := newRunner(b)
	spec := nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(b), Args: []string{"/bin/true"}}
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := r.Run(context.Background(), spec)
		if err != nil || res.Status != nsjail.StatusSucceeded {
			b.Fatalf("run: %v %+v", err, res)
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(durations[len(durations)*9/10].Microseconds())/1000, "p90-ms")
}
