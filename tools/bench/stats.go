package main

import (
	"math"
	"slices"
	"time"
)

// Summary describes one sample of latencies. Durations are in milliseconds
// so the JSON reads directly.
type Summary struct {
	N        int     `json:"n"`
	Failures int     `json:"failures"`
	MinMS    float64 `json:"min_ms"`
	P50MS    float64 `json:"p50_ms"`
	P90MS    float64 `json:"p90_ms"`
	P99MS    float64 `json:"p99_ms"`
	MaxMS    float64 `json:"max_ms"`
	MeanMS   float64 `json:"mean_ms"`
	// PerSec is successful executions per second of wall time over the whole
	// cell (first request sent to last response received); 0 when the cell
	// was not a timed load run.
	PerSec float64 `json:"per_sec,omitempty"`
	// Samples are every successful latency, in the order they finished,
	// for the chart and for anyone who wants another statistic.
	Samples []float64 `json:"samples_ms"`
}

// Summarize computes order statistics of d (successful runs only), with
// failures counted beside them and throughput over wall when wall > 0.
func Summarize(d []time.Duration, failures int, wall time.Duration) Summary {
	s := Summary{N: len(d), Failures: failures, Samples: make([]float64, len(d))}
	for i, v := range d {
		s.Samples[i] = ms(v)
	}
	if wall > 0 {
		s.PerSec = float64(len(d)) / wall.Seconds()
	}
	if len(d) == 0 {
		return s
	}
	sorted := slices.Clone(s.Samples)
	slices.Sort(sorted)
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	s.MinMS = sorted[0]
	s.MaxMS = sorted[len(sorted)-1]
	s.MeanMS = round3(sum / float64(len(sorted)))
	s.P50MS = Percentile(sorted, 50)
	s.P90MS = Percentile(sorted, 90)
	s.P99MS = Percentile(sorted, 99)
	return s
}

// Percentile returns the p-th percentile of sorted (ascending) by the
// nearest-rank method: the smallest value with at least p% of the sample at
// or below it. With 30 samples p99 is therefore the maximum, which is the
// honest answer for so few samples (interpolating would invent a value).
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return round3(float64(d.Nanoseconds()) / 1e6) }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
