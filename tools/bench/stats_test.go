package main

import (
	"math"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {0, 1}, {10, 1}, {11, 2}} {
		if got := Percentile(s, c.p); got != c.want {
			t.Errorf("p%g = %g, want %g", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Errorf("empty sample: want NaN")
	}
}

func TestSummarize(t *testing.T) {
	d := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 1500 * time.Microsecond}
	s := Summarize(d, 2, 2*time.Second)
	if s.N != 4 || s.Failures != 2 {
		t.Fatalf("n/failures = %d/%d", s.N, s.Failures)
	}
	if s.MinMS != 1 || s.MaxMS != 3 || s.P50MS != 1.5 || s.P99MS != 3 || s.MeanMS != 1.875 {
		t.Errorf("got %+v", s)
	}
	if s.PerSec != 2 {
		t.Errorf("per_sec = %g, want 2 (4 successes in 2 s)", s.PerSec)
	}
	// Samples keep completion order for the chart.
	if s.Samples[0] != 3 || s.Samples[1] != 1 {
		t.Errorf("samples reordered: %v", s.Samples)
	}
	if z := Summarize(nil, 3, time.Second); z.N != 0 || z.Failures != 3 || z.PerSec != 0 {
		t.Errorf("all failed: %+v", z)
	}
}
