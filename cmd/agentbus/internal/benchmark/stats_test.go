package benchmark

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100-i) * time.Microsecond // 100µs .. 1µs, unsorted
	}
	tests := []struct {
		name    string
		samples []time.Duration
		ps      []float64
		want    []time.Duration
	}{
		{name: "none", samples: nil, ps: []float64{50, 99}, want: []time.Duration{0, 0}},
		{name: "one", samples: []time.Duration{7}, ps: []float64{0, 50, 99, 100}, want: []time.Duration{7, 7, 7, 7}},
		{name: "hundred", samples: hundred, ps: []float64{1, 50, 99, 100},
			want: []time.Duration{time.Microsecond, 50 * time.Microsecond, 99 * time.Microsecond, 100 * time.Microsecond}},
		{name: "nearest rank rounds up", samples: []time.Duration{1, 2, 3, 4}, ps: []float64{50, 51, 99}, want: []time.Duration{2, 3, 4}},
		{name: "out of range clamps", samples: []time.Duration{3, 1, 2}, ps: []float64{-5, 0, 150}, want: []time.Duration{1, 1, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.samples)
			got := Percentiles(tt.samples, tt.ps...)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Percentiles(%v, %v) = %v, want %v", tt.samples, tt.ps, got, tt.want)
			}
			if !slices.Equal(tt.samples, before) {
				t.Errorf("Percentiles modified its samples: %v, was %v", tt.samples, before)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		name     string
		bus, raw float64
		want     float64 // NaN means nil
	}{
		{name: "half", bus: 1, raw: 2, want: 0.5},
		{name: "twice", bus: 30, raw: 15, want: 2},
		{name: "zero bus", bus: 0, raw: 8000, want: 0},
		{name: "zero raw", bus: 5, raw: 0, want: math.NaN()},
		{name: "both zero", bus: 0, raw: 0, want: math.NaN()},
		{name: "NaN", bus: math.NaN(), raw: 1, want: math.NaN()},
		{name: "infinite", bus: math.Inf(1), raw: 1, want: math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Ratio(tt.bus, tt.raw)
			switch {
			case math.IsNaN(tt.want) && got != nil:
				t.Errorf("Ratio(%v, %v) = %v, want nil", tt.bus, tt.raw, *got)
			case !math.IsNaN(tt.want) && (got == nil || *got != tt.want):
				t.Errorf("Ratio(%v, %v) = %v, want %v", tt.bus, tt.raw, got, tt.want)
			}
		})
	}
}

func TestCountInversions(t *testing.T) {
	tests := []struct {
		name   string
		starts []int
		want   int
	}{
		{name: "empty", starts: nil, want: 0},
		{name: "one", starts: []int{3}, want: 0},
		{name: "priority order", starts: []int{1, 1, 2, 3, 3, 5}, want: 0},
		{name: "reverse", starts: []int{5, 4, 3, 2, 1}, want: 4},
		{name: "equal priorities never invert", starts: []int{3, 3, 3}, want: 0},
		// Each start counts once, however many more urgent messages wait.
		{name: "one late urgent", starts: []int{5, 5, 4, 1}, want: 3},
		{name: "stream order of the backlog", starts: []int{5, 4, 3, 2, 1, 5, 4, 3, 2, 1}, want: 8},
		{name: "tail of stream order", starts: []int{5, 4, 3, 2, 1, 5, 4, 3}, want: 6},
		{name: "inversion after the urgent one", starts: []int{1, 4, 2, 5, 3}, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(tt.starts)
			if got := CountInversions(tt.starts); got != tt.want {
				t.Errorf("CountInversions(%v) = %d, want %d", tt.starts, got, tt.want)
			}
			if !slices.Equal(tt.starts, before) {
				t.Errorf("CountInversions modified its input: %v, was %v", tt.starts, before)
			}
		})
	}
}

func TestBacklogPriorityInvertsInStreamOrder(t *testing.T) {
	// The raw side drains the backlog in stream order: every message but
	// the priority-1 ones and the last four has a more urgent one behind.
	const n = 23
	starts := make([]int, n)
	for i := range starts {
		starts[i] = backlogPriority(i)
	}
	if starts[0] != 5 || starts[4] != 1 || starts[5] != 5 {
		t.Fatalf("backlog starts %v, want 5, 4, 3, 2, 1, 5, ...", starts[:6])
	}
	// 23 messages: 4 full cycles (4 inversions each) and 5, 4, 3 (2 more).
	if got, want := CountInversions(starts), 4*4+2; got != want {
		t.Errorf("CountInversions(stream order of %d) = %d, want %d", n, got, want)
	}
}
