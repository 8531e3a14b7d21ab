package cli

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// benchTiny are bench flags small enough for a test under -race; the
// figures they give mean nothing and no test looks at them.
var benchTiny = []string{"bench", "--messages", "200", "--agents", "3", "--rate", "2000/s"}

func TestBenchTable(t *testing.T) {
	tmp := embeddedtest.TempDir(t)
	r := runIn(t, "", benchTiny...)
	embeddedtest.CheckEmpty(t, tmp)
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q", r.code, r.stderr)
	}
	if r.stderr != "" {
		t.Errorf("stderr %q, want nothing when it is not a terminal", r.stderr)
	}
	lines := strings.Split(r.stdout, "\n")
	if !strings.HasPrefix(lines[0], "agentbus bench: server embedded") {
		t.Fatalf("first line %q, want the run's description", lines[0])
	}
	header := strings.Fields(lines[2])
	if !slices.Equal(header, []string{"scenario", "figure", "unit", "bus", "raw", "raw+headers", "bus/raw", "bus/raw+headers"}) {
		t.Fatalf("header %q", lines[2])
	}
	rows := map[string]int{}
	for _, l := range lines[3:] {
		if l == "" {
			break
		}
		f := strings.Fields(l)
		rows[f[0]]++
		// bus, raw, raw+headers, bus/raw, bus/raw+headers from the right;
		// the figure has spaces in it.
		cells := f[len(f)-5:]
		for i, c := range []string{cells[0], cells[1], cells[3]} {
			if _, err := strconv.ParseFloat(c, 64); err != nil {
				t.Errorf("row %q: cell %d %q is not a number", l, i, c)
			}
		}
		withHeaders := strings.HasPrefix(f[0], "async") || strings.HasPrefix(f[0], "consume") || f[0] == "sync"
		if _, err := strconv.ParseFloat(cells[4], 64); (err == nil) != withHeaders {
			t.Errorf("row %q: bus/raw+headers %q, want a number for async, sync and consume only", l, cells[4])
		}
	}
	want := map[string]int{
		// async and consume: throughput and CPU per message
		"async": 2, "async-untracked": 2, "sync": 2, "consume": 2, "consume-defaults": 2, "consume-untracked": 2,
		"request": 3, "e2e": 2, "priority": 1, "setup": 1, // time; no memory with the embedded server
	}
	for _, name := range scenarioNames() {
		if rows[name] != want[name] {
			t.Errorf("%d rows for %s, want %d; output:\n%s", rows[name], name, want[name], r.stdout)
		}
	}
}

// TestBenchRounds: with --rounds the table ends with each scenario's
// spread over its rounds, and the JSON has it too.
func TestBenchRounds(t *testing.T) {
	r := runIn(t, "", "bench", "--messages", "40", "--rounds", "3", "--only", "consume-defaults,sync")
	if r.code != 0 {
		t.Fatalf("bench: exit %d, stderr %q", r.code, r.stderr)
	}
	_, spread, ok := strings.Cut(r.stdout, "Each scenario ran 3 rounds")
	if !ok {
		t.Fatalf("no spread in the output:\n%s", r.stdout)
	}
	for _, want := range []string{"consume-defaults  bus/raw+headers      3", "sync              bus/raw+headers p50  3"} {
		if !strings.Contains(spread, want) {
			t.Errorf("spread %q, want a line starting %q", spread, want)
		}
	}
	r = runIn(t, "", "bench", "--messages", "40", "--rounds", "2", "--only", "consume-defaults", "--json")
	if r.code != 0 {
		t.Fatalf("bench --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var rep struct {
		Settings struct {
			Rounds int `json:"rounds"`
		} `json:"settings"`
		Spread map[string]struct {
			Rounds           int
			Min, Median, Max float64
		} `json:"spread"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	sp, ok := rep.Spread["consume-defaults"]
	if rep.Settings.Rounds != 2 || !ok || sp.Rounds != 2 || !(sp.Min <= sp.Median && sp.Median <= sp.Max) || sp.Min <= 0 {
		t.Errorf("settings.rounds %d, spread %+v", rep.Settings.Rounds, rep.Spread)
	}
}

func TestBenchJSON(t *testing.T) {
	tmp := embeddedtest.TempDir(t)
	out := mustRun(t, append(benchTiny, "--json")...)
	embeddedtest.CheckEmpty(t, tmp)
	var rep map[string]map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output is not one JSON object of objects: %v\n%s", err, out)
	}
	settings := rep["settings"]
	if settings["server"] != "embedded, file storage, in process" || settings["messages"] != 200.0 || settings["agents"] != 3.0 ||
		settings["size_bytes"] != 1024.0 || settings["rate_msgs_per_s"] != 2000.0 {
		t.Errorf("settings %v", settings)
	}
	throughput := []string{"ratio_bus_raw", "ratio_bus_raw_headers"}
	latency := []string{"ratio_bus_raw_p50", "ratio_bus_raw_p99"}
	ratios := map[string][]string{
		"async":             throughput,
		"async-untracked":   throughput,
		"sync":              latency,
		"consume":           throughput,
		"consume-defaults":  throughput,
		"consume-untracked": throughput,
		"request":           append(latency, "ratio_bus_floor_p50", "ratio_bus_floor_p99"),
		"e2e":               latency,
		"priority":          {"ratio_bus_raw"},
		"setup":             {"ratio_bus_raw"},
	}
	for _, name := range scenarioNames() {
		s, ok := rep[name]
		if !ok {
			t.Errorf("no member %q in %s", name, out)
			continue
		}
		for _, k := range ratios[name] {
			if _, ok := s[k].(float64); !ok {
				t.Errorf("%s.%s = %v, want a number", name, k, s[k])
			}
		}
	}
	if got := rep["priority"]["raw_inversions"]; got == 0.0 {
		// A backlog of 5, 4, 3, 2, 1, ... drained in stream order inverts.
		t.Errorf("priority.raw_inversions = %v, want more than 0", got)
	}
	if got := rep["setup"]; got["bus_consumers"] != got["raw_consumers"] {
		t.Errorf("setup made %v bus and %v raw consumers, want the same", got["bus_consumers"], got["raw_consumers"])
	}
	if got, ok := rep["setup"]["memory"]; ok && got != "" {
		t.Errorf("setup.memory = %v, want none for the embedded server, which shares the process", got)
	}
}

// TestBenchServer runs a subset of bench against a server given with
// --server and checks that it leaves no stream behind.
func TestBenchServer(t *testing.T) {
	s := embeddedtest.RunServer(t)
	out := mustRun(t, "--server", s.ClientURL(), "bench", "--messages", "50", "--agents", "2", "--only", "sync,priority,request,setup", "--json")
	var rep map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	var got []string
	for k := range rep {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := []string{"priority", "request", "settings", "setup", "sync"}; !slices.Equal(got, want) {
		t.Errorf("members %v, want %v", got, want)
	}
	// A server given with --server is not measured: no memory figures.
	if strings.Contains(string(rep["setup"]), "kib_per_agent") {
		t.Errorf("setup %s has memory figures for a server bench cannot measure", rep["setup"])
	}
	if !strings.Contains(string(rep["settings"]), s.ClientURL()) {
		t.Errorf("settings %s do not name the server %s", rep["settings"], s.ClientURL())
	}

	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	names := js.StreamNames(context.Background())
	var left []string
	for n := range names.Name() {
		left = append(left, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("bench left streams %v on the server", left)
	}
}

// TestBenchTCP: with --tcp both sides reach the embedded server over
// loopback TCP, and the settings say so.
func TestBenchTCP(t *testing.T) {
	out := mustRun(t, "bench", "--tcp", "--messages", "40", "--only", "sync", "--json")
	var rep struct {
		Settings struct {
			Server string `json:"server"`
		} `json:"settings"`
		Sync json.RawMessage `json:"sync"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if rep.Settings.Server != "embedded, file storage, loopback TCP" || len(rep.Sync) == 0 {
		t.Errorf("settings.server %q, sync %s", rep.Settings.Server, rep.Sync)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in the error line
	}{
		{name: "unknown scenario", args: []string{"--only", "async,bogus"}, want: `"bogus"`},
		{name: "bad rate", args: []string{"--rate", "fast"}, want: "--rate"},
		{name: "zero rate", args: []string{"--rate", "0/s"}, want: "--rate"},
		{name: "small payload", args: []string{"--size", "4"}, want: "size 4"},
		{name: "one message", args: []string{"--messages", "1"}, want: "messages 1"},
		{name: "no agents", args: []string{"--agents", "0"}, want: "--agents 0"},
		{name: "no rounds", args: []string{"--rounds", "0"}, want: "--rounds 0"},
		{name: "too many rounds", args: []string{"--rounds", "101"}, want: "rounds 101"},
		{name: "argument", args: []string{"extra"}, want: "extra"},
		{name: "tcp with a server", args: []string{"--tcp", "--server", "nats://127.0.0.1:4222"}, want: "--tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runIn(t, "", append([]string{"bench"}, tt.args...)...)
			checkOneErrorLine(t, r)
			if r.code != exitUsage {
				t.Errorf("exit %d, want %d", r.code, exitUsage)
			}
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr %q, want it to mention %s", r.stderr, tt.want)
			}
		})
	}
}

// TestBenchUnreachable: bench with a --server it cannot reach says so as
// every command does.
func TestBenchUnreachable(t *testing.T) {
	t.Parallel()
	r := runIn(t, "", "--server", "nats://127.0.0.1:1", "bench", "--only", "sync")
	checkOneErrorLine(t, r)
	if r.code != exitError || !strings.HasPrefix(r.stderr, "agentbus: connect nats://127.0.0.1:1: ") {
		t.Errorf("exit %d, stderr %q; want exit %d, connect nats://127.0.0.1:1", r.code, r.stderr, exitError)
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{in: "1000/s", want: 1000},
		{in: "250", want: 250},
		{in: "0.5/s", want: 0.5},
		{in: "", wantErr: true},
		{in: "/s", wantErr: true},
		{in: "-1/s", wantErr: true},
		{in: "1000/m", wantErr: true},
		{in: "Inf", wantErr: true},
		{in: "NaN", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseRate(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseRate(%q) = %v, %v, want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestBenchOnlyNamingNothing: --only "" (an unset shell variable) or ","
// names no scenario: a usage error, not a run of every scenario as if
// --only were left out (found by a helper session).
func TestBenchOnlyNamingNothing(t *testing.T) {
	for _, only := range []string{"", ",", " "} {
		if r := runIn(t, "", "bench", "--only", only, "--messages", "4", "--agents", "1"); r.code != exitUsage || r.stdout != "" {
			t.Errorf("bench --only %q: exit %d, %d bytes of output; want a usage error and no run", only, r.code, len(r.stdout))
		}
	}
}
