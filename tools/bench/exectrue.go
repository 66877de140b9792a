package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
)

// ExecTrueResult is nsjail's BenchmarkExecTrue: a cold /bin/true in a fresh
// sandbox, measured in-process (no CLI start-up), on the busybox rootfs.
type ExecTrueResult struct {
	Runs     int     `json:"runs"`
	MedianMS float64 `json:"median_ms"`
	P90MS    float64 `json:"p90_ms"`
	Output   string  `json:"output"`
	Skipped  string  `json:"skipped,omitempty"`
}

var (
	medianRe = regexp.MustCompile(`([0-9.]+) median-ms`)
	p90Re    = regexp.MustCompile(`([0-9.]+) p90-ms`)
)

// runExecTrue runs `go test -bench ExecTrue` in the nsjail package of the
// repository at repoRoot and parses its custom metrics.
func runExecTrue(ctx context.Context, repoRoot string, runs int) ExecTrueResult {
	res := ExecTrueResult{Runs: runs}
	cmd := exec.CommandContext(ctx, "go", "test", "-tags", "seccomp", "-run", "^$", "-bench", "^BenchmarkExecTrue$",
		"-benchtime", fmt.Sprintf("%dx", runs), "-count", "1", "./nsjail/")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	res.Output = tail(string(out), 2000)
	if err != nil {
		res.Skipped = fmt.Sprintf("go test -bench ExecTrue failed: %v: %s", err, tail(string(out), 300))
		return res
	}
	m, p := medianRe.FindSubmatch(out), p90Re.FindSubmatch(out)
	if m == nil || p == nil {
		res.Skipped = "BenchmarkExecTrue printed no median-ms/p90-ms metric"
		return res
	}
	res.MedianMS, _ = strconv.ParseFloat(string(m[1]), 64)
	res.P90MS, _ = strconv.ParseFloat(string(p[1]), 64)
	return res
}
