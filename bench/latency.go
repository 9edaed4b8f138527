package bench

import (
	"slices"
	"time"
)

// Summary describes a set of latency samples in milliseconds.
type Summary struct {
	// N is the number of samples.
	N int `json:"n"`
	// Min, P50, P90, P99 and Max are nearest-rank percentiles, in ms. A
	// negative value means before the due time.
	Min float64 `json:"min_ms"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Summarize returns the percentiles of samples. It sorts samples in place.
// An empty slice gives a zero Summary.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	return Summary{
		N:   len(samples),
		Min: ms(samples[0]),
		P50: ms(Percentile(samples, 50)),
		P90: ms(Percentile(samples, 90)),
		P99: ms(Percentile(samples, 99)),
		Max: ms(samples[len(samples)-1]),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted: the smallest sample such that at least p% of the samples are <= it.
// sorted must be in ascending order and non-empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if p <= 0 {
		return sorted[0]
	}
	// rank = ceil(p/100 * n), computed in integers to avoid float error at
	// exact boundaries (p=50, n=100 must give rank 50).
	n := len(sorted)
	num := int64(p*1000) * int64(n)
	rank := int((num + 100000 - 1) / 100000)
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	return sorted[rank-1]
}

// ms converts d to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
