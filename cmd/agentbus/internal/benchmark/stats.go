package benchmark

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Percentiles returns the ps-th percentiles of samples, in the order of ps,
// by the nearest-rank method: the p-th percentile is the smallest sample
// that at least p percent of the samples do not exceed. A p at or below 0
// gives the smallest sample and one above 100 the largest. With no samples
// every percentile is 0. samples is not modified.
func Percentiles(samples []time.Duration, ps ...float64) []time.Duration {
	out := make([]time.Duration, len(ps))
	if len(samples) == 0 {
		return out
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	n := len(sorted)
	for i, p := range ps {
		rank := int(math.Ceil(p / 100 * float64(n)))
		out[i] = sorted[min(max(rank, 1), n)-1]
	}
	return out
}

// Ratio returns bus/raw, or nil when the ratio is undefined: raw is zero,
// or either figure or the result is not a finite number. Every ratio in a
// Report is bus divided by raw, whatever the unit.
func Ratio(bus, raw float64) *float64 {
	r := bus / raw
	if raw == 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return nil
	}
	return &r
}

// CountInversions counts the priority inversions of a backlog drained by a
// handler: starts holds the priorities of the backlog's messages (1 the
// highest, so a smaller value is more urgent) in the order their handlers
// started, every message of the backlog once. A start is an inversion when
// a message of a higher priority was still waiting, that is, started later.
// starts is not modified.
func CountInversions[P cmp.Ordered](starts []P) int {
	if len(starts) == 0 {
		return 0
	}
	n := 0
	lowest := starts[len(starts)-1] // the most urgent priority started after i
	for i := len(starts) - 2; i >= 0; i-- {
		if lowest < starts[i] {
			n++
		}
		lowest = min(lowest, starts[i])
	}
	return n
}
