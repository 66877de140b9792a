package nsjail_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/nsjail"
	"github.com/sandboxd/sandboxd/nsjail/nsjailtest"
)

// BenchmarkExecTrue is a cold /bin/true in a fresh sandbox with everything on
// (namespaces, mounts, cgroup limits, seccomp, rlimits), like runc's
// libcontainer/integration BenchmarkExecTrue. It reports the median and p90
// of whole Run calls next to the mean, and the CPU time of a start on both
// sides. sandbox-cpu-ms is the sandbox cgroup's: its init's Go start-up, the
// namespace, mount and seccomp set-up, /bin/true (the mean of the results'
// cpu_ms, each cut to whole ms). worker-cpu-ms is this process's own and its
// waited-for children's: libcontainer's side, and runc init's first stages
// (the sandbox's init itself is reparented, so it counts only in the
// cgroup; the first stage joins the cgroup early, so the two overlap a
// little).
func BenchmarkExecTrue(b *testing.B) {
	r := newRunner(b)
	b.Setenv("GOMAXPROCS", "1") // as sandboxd does: nsjail.SetInitGOMAXPROCS
	spec := nsjail.Spec{Rootfs: nsjailtest.BusyboxRootfs(b), Args: []string{"/bin/true"}}
	durations := make([]time.Duration, 0, b.N)
	var sandboxCPUMS int64
	before := workerCPU(b)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := r.Run(context.Background(), spec)
		if err != nil || res.Status != nsjail.StatusSucceeded {
			b.Fatalf("run: %v %+v", err, res)
		}
		durations = append(durations, time.Since(start))
		sandboxCPUMS += res.Usage.CPUMS
	}
	b.StopTimer()
	worker := workerCPU(b) - before
	n := float64(len(durations))
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(durations[len(durations)*9/10].Microseconds())/1000, "p90-ms")
	b.ReportMetric(float64(sandboxCPUMS)/n, "sandbox-cpu-ms")
	b.ReportMetric(float64(worker.Microseconds())/1000/n, "worker-cpu-ms")
}

// workerCPU is the user and system time of this process and of its children
// that were waited for.
func workerCPU(b *testing.B) time.Duration {
	var sum time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if err := unix.Getrusage(who, &ru); err != nil {
			b.Fatalf("getrusage: %v", err)
		}
		sum += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return sum
}
