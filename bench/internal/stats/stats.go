// Package stats holds the few figures the benchmark programs print:
// percentiles of durations, and medians with their spread over rounds.
package stats

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Pct is the p-th percentile of ds (nearest rank over len-1), 0 if empty.
func Pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Round(float64(len(s)-1)*p/100))]
}

// Mean is the mean of ds, 0 if empty.
func Mean(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t / time.Duration(max(len(ds), 1))
}

// Median is the median of xs (the mean of the middle two for an even
// count), 0 if empty.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// Spread is xs's median, least and greatest: what a benchmark reports of
// a figure over its rounds ("3.20 [3.17..3.37]").
func Spread(xs []float64) (median, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	return Median(xs), slices.Min(xs), slices.Max(xs)
}
