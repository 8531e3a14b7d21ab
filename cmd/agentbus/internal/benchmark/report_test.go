package benchmark

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func ptr(v float64) *float64 { return &v }

// fullReport is a report of every scenario, with round figures.
func fullReport() *Report {
	return &Report{
		Settings: Settings{Server: "embedded", ServerVersion: "2.15.2", GoVersion: "go1.26", CPUs: 2,
			Messages: 100, SizeBytes: 1024, Agents: 3, RateMsgsPerSec: 1000, RunID: "0123abcd"},
		Async: &Throughput{Messages: 100, BusMsgsPerSec: 50, RawMsgsPerSec: 100, RawHeadersMsgsPerSec: ptr(80),
			RatioBusRaw: ptr(0.5), RatioBusRawHeaders: ptr(0.625),
			CPU: &CPUPerMessage{BusMicros: 20, RawMicros: 10, RawHeadersMicros: 16, RatioBusRaw: ptr(2), RatioBusRawHeaders: ptr(1.25)}},
		AsyncUntracked: &Throughput{Messages: 100, BusMsgsPerSec: 80, RawMsgsPerSec: 100, RawHeadersMsgsPerSec: ptr(80),
			RatioBusRaw: ptr(0.8), RatioBusRawHeaders: ptr(1)},
		Sync: &Latency{Messages: 100, BusP50Micros: 30, BusP99Micros: 90, RawP50Micros: 20, RawP99Micros: 60,
			RatioBusRawP50: ptr(1.5), RatioBusRawP99: ptr(1.5), RawHeadersP50Micros: ptr(25), RawHeadersP99Micros: ptr(75),
			RatioBusRawHeadersP50: ptr(1.2), RatioBusRawHeadersP99: ptr(1.2)},
		Consume: &Throughput{Messages: 100, BusMsgsPerSec: 60, RawMsgsPerSec: 120, RatioBusRaw: ptr(0.5)},
		ConsumeDefaults: &Throughput{Messages: 100, BusMsgsPerSec: 30, RawMsgsPerSec: 120, RawHeadersMsgsPerSec: ptr(60),
			RatioBusRaw: ptr(0.25), RatioBusRawHeaders: ptr(0.5)},
		ConsumeUntracked: &Throughput{Messages: 100, BusMsgsPerSec: 90, RawMsgsPerSec: 120, RawHeadersMsgsPerSec: ptr(60),
			RatioBusRaw: ptr(0.75), RatioBusRawHeaders: ptr(1.5),
			CPU: &CPUPerMessage{BusMicros: 12, RawMicros: 8, RawHeadersMicros: 10, RatioBusRaw: ptr(1.5), RatioBusRawHeaders: ptr(1.2)}},
		Request: &Latency{Messages: 100, BusP50Micros: 400, BusP99Micros: 1200, RawP50Micros: 200, RawP99Micros: 600,
			RatioBusRawP50: ptr(2), RatioBusRawP99: ptr(2),
			FloorP50Micros: ptr(320), FloorP99Micros: ptr(1000), RatioBusFloorP50: ptr(1.25), RatioBusFloorP99: ptr(1.2)},
		E2E: &Latency{Messages: 100, RateMsgsPerSec: 1000, BusP50Micros: 300, BusP99Micros: 900, RawP50Micros: 200,
			RawP99Micros: 600, RatioBusRawP50: ptr(1.5), RatioBusRawP99: ptr(1.5)},
		Priority: &Inversions{Messages: 100, BusInversions: 0, RawInversions: 80, RatioBusRaw: ptr(0)},
		Setup: &SetupTime{Agents: 3, BusConsumers: 30, RawConsumers: 30, BusMillis: 12, RawMillis: 10, RatioBusRaw: ptr(1.2),
			Memory: "server RSS", BusKiBPerAgent: ptr(300), RawKiBPerAgent: ptr(200), RatioMemoryBusRaw: ptr(1.5)},
	}
}

// TestReportJSONNamesTheScenarios checks that the report's JSON has one
// member per scenario, named as the scenario, besides the settings.
func TestReportJSONNamesTheScenarios(t *testing.T) {
	b, err := json.Marshal(fullReport())
	if err != nil {
		t.Fatal(err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range members {
		if k != "settings" {
			got = append(got, k)
		}
	}
	want := names()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("JSON members %v, want the scenario names %v", got, want)
	}

	b, err = json.Marshal(&Report{Sync: fullReport().Sync})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, `"async"`) || !strings.Contains(s, `"sync"`) {
		t.Errorf("JSON of a sync-only report %s, want sync and no other scenario", s)
	}
}

func TestWriteTable(t *testing.T) {
	rep := fullReport()
	rep.Setup.RatioBusRaw = nil // undefined ratios print as "-"
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.HasPrefix(lines[0], "agentbus bench: server embedded (nats-server 2.15.2)") || lines[1] != "" {
		t.Fatalf("table starts %q, want the run's description and a blank line", lines[:2])
	}
	if got := strings.Fields(lines[2]); !slices.Equal(got, columns) {
		t.Errorf("header %q, want %q", got, columns)
	}
	byScenario := map[string][][]string{}
	for _, l := range lines[3:] {
		if l == "" {
			break
		}
		if strings.HasSuffix(l, " ") {
			t.Errorf("row %q ends in a blank", l)
		}
		// The figure has spaces in it: take the numbers from the right.
		f := strings.Fields(l)
		byScenario[f[0]] = append(byScenario[f[0]], f[len(f)-5:])
	}
	for _, s := range Scenarios() {
		if len(byScenario[s.Name]) == 0 {
			t.Errorf("no row for scenario %s in\n%s", s.Name, b.String())
		}
	}
	want := map[string][][]string{
		"async":             {{"50", "100", "80", "0.50", "0.62"}, {"20.0", "10.0", "16.0", "2.00", "1.25"}},
		"async-untracked":   {{"80", "100", "80", "0.80", "1.00"}},
		"consume":           {{"60", "120", "-", "0.50", "-"}},
		"consume-defaults":  {{"30", "120", "60", "0.25", "0.50"}},
		"consume-untracked": {{"90", "120", "60", "0.75", "1.50"}, {"12.0", "8.0", "10.0", "1.50", "1.20"}},
		"sync":              {{"30.0", "20.0", "25.0", "1.50", "1.20"}, {"90.0", "60.0", "75.0", "1.50", "1.20"}},
		"request":           {{"400.0", "200.0", "-", "2.00", "-"}, {"1200.0", "600.0", "-", "2.00", "-"}, {"400.0", "320.0", "-", "1.25", "-"}},
		"priority":          {{"0", "80", "-", "0.00", "-"}},
		"setup":             {{"12.0", "10.0", "-", "-", "-"}, {"300.0", "200.0", "-", "1.50", "-"}},
	}
	for name, rows := range want {
		if got := byScenario[name]; !slices.EqualFunc(got, rows, slices.Equal) {
			t.Errorf("%s rows end %q, want %q", name, got, rows)
		}
	}
	if got := len(byScenario["sync"]) + len(byScenario["e2e"]); got != 4 {
		t.Errorf("%d latency rows, want p50 and p99 for sync and e2e", got)
	}
	if !strings.Contains(b.String(), "memory per agent, server RSS") {
		t.Errorf("table does not name what the setup memory measures:\n%s", b.String())
	}

	// Without a measurable server setup has its time row only.
	rep.Setup.Memory, rep.Setup.BusKiBPerAgent, rep.Setup.RawKiBPerAgent, rep.Setup.RatioMemoryBusRaw = "", nil, nil, nil
	b.Reset()
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\nsetup "); n != 1 {
		t.Errorf("%d setup rows without memory figures, want 1:\n%s", n, b.String())
	}
	if !strings.Contains(b.String(), "bus/raw is the bus's figure divided by raw nats.go's") {
		t.Errorf("table does not say how to read the ratios:\n%s", b.String())
	}
}
