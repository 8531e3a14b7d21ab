package benchmark

import (
	"reflect"
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

// member returns a pointer to r's figures of scenario name: a
// **Throughput, **Latency, **Inversions or **SetupTime; nil for a name
// that is not a scenario's.
func (r *Report) member(name string) any {
	switch name {
	case "async":
		return &r.Async
	case "async-untracked":
		return &r.AsyncUntracked
	case "sync":
		return &r.Sync
	case "consume":
		return &r.Consume
	case "consume-defaults":
		return &r.ConsumeDefaults
	case "consume-untracked":
		return &r.ConsumeUntracked
	case "request":
		return &r.Request
	case "e2e":
		return &r.E2E
	case "priority":
		return &r.Priority
	case "setup":
		return &r.Setup
	}
	return nil
}

// headline returns the headline ratio of scenario name in r and its name:
// bus/raw+headers where the scenario has that side, else bus/raw, of the
// p50 for latency; nil when the scenario did not run or the ratio is
// undefined.
func (r *Report) headline(name string) (*float64, string) {
	switch p := r.member(name).(type) {
	case **Throughput:
		if t := *p; t != nil && t.RatioBusRawHeaders != nil {
			return t.RatioBusRawHeaders, "bus/raw+headers"
		} else if t != nil {
			return t.RatioBusRaw, "bus/raw"
		}
	case **Latency:
		if l := *p; l != nil && l.RatioBusRawHeadersP50 != nil {
			return l.RatioBusRawHeadersP50, "bus/raw+headers p50"
		} else if l != nil {
			return l.RatioBusRawP50, "bus/raw p50"
		}
	case **Inversions:
		if *p != nil {
			return (*p).RatioBusRaw, "bus/raw"
		}
	case **SetupTime:
		if *p != nil {
			return (*p).RatioBusRaw, "bus/raw"
		}
	}
	return nil, ""
}

// take sets the figures of scenario name in r to those in from.
func (r *Report) take(name string, from *Report) {
	if dst := r.member(name); dst != nil {
		reflect.ValueOf(dst).Elem().Set(reflect.ValueOf(from.member(name)).Elem())
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
