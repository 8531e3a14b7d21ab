package benchmark

import (
	"slices"
)

// MaxRounds bounds Config.Rounds.
const MaxRounds = 100

// Spread is how a scenario's headline ratio varied over the rounds of a
// run (Config.Rounds): its median, which the round reported is the round
// of, and its least and greatest. A single run of a scenario on a busy
// machine cannot tell a ratio at a target from one below it; the spread
// says how far apart its rounds were.
type Spread struct {
	// Rounds is how many rounds the scenario ran.
	Rounds int `json:"rounds"`
	// Ratio names the headline ratio: "bus/raw+headers" where the
	// scenario has a raw+headers side, else "bus/raw"; for latency, of
	// the p50.
	Ratio  string  `json:"ratio"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// headline returns the headline ratio of scenario name in r and its name,
// nil when the scenario did not run or the ratio is undefined.
func (r *Report) headline(name string) (*float64, string) {
	throughput := func(t *Throughput) (*float64, string) {
		if t == nil {
			return nil, ""
		}
		if t.RatioBusRawHeaders != nil {
			return t.RatioBusRawHeaders, "bus/raw+headers"
		}
		return t.RatioBusRaw, "bus/raw"
	}
	latency := func(l *Latency) (*float64, string) {
		if l == nil {
			return nil, ""
		}
		if l.RatioBusRawHeadersP50 != nil {
			return l.RatioBusRawHeadersP50, "bus/raw+headers p50"
		}
		return l.RatioBusRawP50, "bus/raw p50"
	}
	switch name {
	case "async":
		return throughput(r.Async)
	case "async-untracked":
		return throughput(r.AsyncUntracked)
	case "sync":
		return latency(r.Sync)
	case "consume":
		return throughput(r.Consume)
	case "consume-defaults":
		return throughput(r.ConsumeDefaults)
	case "consume-untracked":
		return throughput(r.ConsumeUntracked)
	case "request":
		return latency(r.Request)
	case "e2e":
		return latency(r.E2E)
	case "priority":
		if r.Priority != nil {
			return r.Priority.RatioBusRaw, "bus/raw"
		}
	case "setup":
		if r.Setup != nil {
			return r.Setup.RatioBusRaw, "bus/raw"
		}
	}
	return nil, ""
}

// take sets the figures of scenario name in r to those in from.
func (r *Report) take(name string, from *Report) {
	switch name {
	case "async":
		r.Async = from.Async
	case "async-untracked":
		r.AsyncUntracked = from.AsyncUntracked
	case "sync":
		r.Sync = from.Sync
	case "consume":
		r.Consume = from.Consume
	case "consume-defaults":
		r.ConsumeDefaults = from.ConsumeDefaults
	case "consume-untracked":
		r.ConsumeUntracked = from.ConsumeUntracked
	case "request":
		r.Request = from.Request
	case "e2e":
		r.E2E = from.E2E
	case "priority":
		r.Priority = from.Priority
	case "setup":
		r.Setup = from.Setup
	}
}

// medianRound returns the round among rounds, each a report of scenario
// name, whose headline ratio is the median (the lower middle one of an
// even number), and the spread of that ratio; rounds whose ratio is
// undefined are passed over, and with none defined the last round is
// returned with a nil spread.
func medianRound(name string, rounds []*Report) (*Report, *Spread) {
	type round struct {
		r     *Report
		ratio float64
	}
	var defined []round
	var ratioName string
	for _, r := range rounds {
		if v, n := r.headline(name); v != nil {
			defined = append(defined, round{r, *v})
			ratioName = n
		}
	}
	if len(defined) == 0 {
		return rounds[len(rounds)-1], nil
	}
	slices.SortStableFunc(defined, func(a, b round) int {
		switch {
		case a.ratio < b.ratio:
			return -1
		case a.ratio > b.ratio:
			return 1
		}
		return 0
	})
	mid := defined[(len(defined)-1)/2]
	return mid.r, &Spread{Rounds: len(rounds), Ratio: ratioName,
		Median: mid.ratio, Min: defined[0].ratio, Max: defined[len(defined)-1].ratio}
}
