package benchmark

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Report holds every figure of one run. Its JSON form is one object with a
// member per scenario that ran, named as the scenario, and units in the
// member names (msgs_per_s, us, ms). A scenario that did not run is nil and
// left out. Every ratio is the bus's figure divided by raw nats.go's, and
// null when raw's is zero.
type Report struct {
	Settings         Settings    `json:"settings"`
	Async            *Throughput `json:"async,omitempty"`
	AsyncUntracked   *Throughput `json:"async-untracked,omitempty"`
	Sync             *Latency    `json:"sync,omitempty"`
	Consume          *Throughput `json:"consume,omitempty"`
	ConsumeDefaults  *Throughput `json:"consume-defaults,omitempty"`
	ConsumeUntracked *Throughput `json:"consume-untracked,omitempty"`
	Request          *Latency    `json:"request,omitempty"`
	E2E              *Latency    `json:"e2e,omitempty"`
	Priority         *Inversions `json:"priority,omitempty"`
	Setup            *SetupTime  `json:"setup,omitempty"`
	// Spread says, by scenario name, how its headline ratio varied over
	// the rounds of a run of more than one (Config.Rounds); the figures
	// above are each scenario's median round. Nil for one round.
	Spread map[string]*Spread `json:"spread,omitempty"`
}

// Settings describe the run.
type Settings struct {
	// Server is Config.Server.
	Server string `json:"server"`
	// ServerVersion is the nats-server version the server reported.
	ServerVersion string `json:"server_version"`
	// GoVersion and CPUs describe the client: runtime.Version and
	// runtime.NumCPU.
	GoVersion string `json:"go_version"`
	CPUs      int    `json:"cpus"`
	// Messages, SizeBytes, Agents and RateMsgsPerSec are the Config's,
	// defaults applied.
	Messages       int     `json:"messages"`
	SizeBytes      int     `json:"size_bytes"`
	Agents         int     `json:"agents"`
	RateMsgsPerSec float64 `json:"rate_msgs_per_s"`
	// Rounds is Config.Rounds, the default applied.
	Rounds int `json:"rounds"`
	// RunID is part of every stream name of the run.
	RunID string `json:"run_id"`
}

// Throughput compares messages per second: async publish and consume.
type Throughput struct {
	// Messages is how many messages each side sent or handled.
	Messages      int     `json:"messages"`
	BusMsgsPerSec float64 `json:"bus_msgs_per_s"`
	RawMsgsPerSec float64 `json:"raw_msgs_per_s"`
	// RawHeadersMsgsPerSec is raw nats.go sending the bus's headers (and,
	// consuming, decoding each event); nil where the scenario does not
	// measure it.
	RawHeadersMsgsPerSec *float64 `json:"raw_headers_msgs_per_s,omitempty"`
	RatioBusRaw          *float64 `json:"ratio_bus_raw"`
	RatioBusRawHeaders   *float64 `json:"ratio_bus_raw_headers,omitempty"`
	// CPU is the process's CPU time per message of each side, where it is
	// measured (the publish and consume scenarios, on a system whose CPU
	// time is read; consuming, between the first message handled and the
	// last); with an embedded server it includes the server's work.
	CPU *CPUPerMessage `json:"cpu_per_msg,omitempty"`
}

// CPUPerMessage is the CPU time per message of each side of a throughput
// scenario, in microseconds, with the bus's ratios to raw's: above 1 the
// bus uses more.
type CPUPerMessage struct {
	BusMicros          float64  `json:"bus_us"`
	RawMicros          float64  `json:"raw_us"`
	RawHeadersMicros   float64  `json:"raw_headers_us"`
	RatioBusRaw        *float64 `json:"ratio_bus_raw"`
	RatioBusRawHeaders *float64 `json:"ratio_bus_raw_headers"`
}

// Latency compares latency percentiles in microseconds: sync publish, the
// request round trip and e2e.
type Latency struct {
	// Messages is how many messages (round trips, for request) each side
	// sent.
	Messages int `json:"messages"`
	// RateMsgsPerSec is the publish rate, for e2e; 0 (left out) means as
	// fast as each publish returns.
	RateMsgsPerSec float64  `json:"rate_msgs_per_s,omitempty"`
	BusP50Micros   float64  `json:"bus_p50_us"`
	BusP99Micros   float64  `json:"bus_p99_us"`
	RawP50Micros   float64  `json:"raw_p50_us"`
	RawP99Micros   float64  `json:"raw_p99_us"`
	RatioBusRawP50 *float64 `json:"ratio_bus_raw_p50"`
	RatioBusRawP99 *float64 `json:"ratio_bus_raw_p99"`
	// RawHeadersP50Micros and RawHeadersP99Micros are raw nats.go doing
	// the bus's job (its headers, its subjects; sync only), with the bus's
	// ratios to them; nil where the scenario has no such side.
	RawHeadersP50Micros   *float64 `json:"raw_headers_p50_us,omitempty"`
	RawHeadersP99Micros   *float64 `json:"raw_headers_p99_us,omitempty"`
	RatioBusRawHeadersP50 *float64 `json:"ratio_bus_raw_headers_p50,omitempty"`
	RatioBusRawHeadersP99 *float64 `json:"ratio_bus_raw_headers_p99,omitempty"`
	// FloorP50Micros and FloorP99Micros are, for request, the raw side's
	// round trips with the lifecycle I/O a tracked round trip of the bus
	// cannot do without (the responder's read of the request's record,
	// docs/performance.md), with the bus's ratios to them; nil elsewhere.
	FloorP50Micros   *float64 `json:"floor_p50_us,omitempty"`
	FloorP99Micros   *float64 `json:"floor_p99_us,omitempty"`
	RatioBusFloorP50 *float64 `json:"ratio_bus_floor_p50,omitempty"`
	RatioBusFloorP99 *float64 `json:"ratio_bus_floor_p99,omitempty"`
}

// withRawHeaders adds the raw+headers side's latencies to l.
func (l *Latency) withRawHeaders(lat []time.Duration) *Latency {
	l.RawHeadersP50Micros, l.RawHeadersP99Micros, l.RatioBusRawHeadersP50, l.RatioBusRawHeadersP99 = l.against(lat)
	return l
}

// withFloor adds the floor's latencies to l.
func (l *Latency) withFloor(lat []time.Duration) *Latency {
	l.FloorP50Micros, l.FloorP99Micros, l.RatioBusFloorP50, l.RatioBusFloorP99 = l.against(lat)
	return l
}

// against returns the p50 and p99 of another side's latencies lat, in
// microseconds, and the bus's ratios to them.
func (l *Latency) against(lat []time.Duration) (p50, p99, ratioP50, ratioP99 *float64) {
	h := Percentiles(lat, 50, 99)
	v50, v99 := micros(h[0]), micros(h[1])
	return &v50, &v99, Ratio(l.BusP50Micros, v50), Ratio(l.BusP99Micros, v99)
}

// newLatency summarises the latencies of both sides.
func newLatency(n int, rate float64, bus, raw []time.Duration) *Latency {
	b, r := Percentiles(bus, 50, 99), Percentiles(raw, 50, 99)
	l := &Latency{
		Messages: n, RateMsgsPerSec: rate,
		BusP50Micros: micros(b[0]), BusP99Micros: micros(b[1]),
		RawP50Micros: micros(r[0]), RawP99Micros: micros(r[1]),
	}
	l.RatioBusRawP50 = Ratio(l.BusP50Micros, l.RawP50Micros)
	l.RatioBusRawP99 = Ratio(l.BusP99Micros, l.RawP99Micros)
	return l
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Inversions compares priority inversions draining a backlog.
type Inversions struct {
	// Messages is the size of each side's backlog.
	Messages      int      `json:"messages"`
	BusInversions int      `json:"bus_inversions"`
	RawInversions int      `json:"raw_inversions"`
	RatioBusRaw   *float64 `json:"ratio_bus_raw"`
}

// SetupTime compares the time to set up the consumers of many agents, in
// milliseconds.
type SetupTime struct {
	Agents int `json:"agents"`
	// BusConsumers and RawConsumers count the consumers on each side's
	// stream afterwards; they are equal when the raw side mirrors the bus.
	BusConsumers int      `json:"bus_consumers"`
	RawConsumers int      `json:"raw_consumers"`
	BusMillis    float64  `json:"bus_ms"`
	RawMillis    float64  `json:"raw_ms"`
	RatioBusRaw  *float64 `json:"ratio_bus_raw"`
	// Memory names what BusKiBPerAgent and RawKiBPerAgent measure (see
	// Config.MemoryName); empty, and the figures nil, when the server was
	// not measurable. The figures are the growth per agent with every
	// agent set up.
	Memory            string   `json:"memory,omitempty"`
	BusKiBPerAgent    *float64 `json:"bus_kib_per_agent,omitempty"`
	RawKiBPerAgent    *float64 `json:"raw_kib_per_agent,omitempty"`
	RatioMemoryBusRaw *float64 `json:"ratio_memory_bus_raw,omitempty"`
}

// Columns of the table WriteTable prints.
var columns = []string{"scenario", "figure", "unit", "bus", "raw", "raw+headers", "bus/raw", "bus/raw+headers"}

// textColumns is how many columns, from the left, are text; the others
// are numbers and are aligned right.
const textColumns = 3

// WriteTable writes r as a table for people: a line describing the run, a
// blank line, a header and one row per figure, each column aligned, then
// a blank line and how to read the ratios. A figure that was not measured
// or a ratio that is undefined is "-".
func (r *Report) WriteTable(w io.Writer) error {
	s := r.Settings
	var b strings.Builder
	fmt.Fprintf(&b, "agentbus bench: server %s (nats-server %s), %s, %d CPUs, %d messages of %d bytes, run %s\n\n",
		orDash(s.Server), orDash(s.ServerVersion), s.GoVersion, s.CPUs, s.Messages, s.SizeBytes, s.RunID)
	writeAligned(&b, append([][]string{columns}, r.rows()...))
	b.WriteString("\nbus/raw is the bus's figure divided by raw nats.go's: for throughput below 1 means the bus is slower;\n" +
		"for latency, time, CPU, memory and inversions above 1 means the bus takes longer, uses more or inverts more.\n" +
		"raw+headers is raw nats.go sending the bus's headers and, consuming, decoding each event.\n")
	if r.Request != nil && r.Request.FloorP50Micros != nil {
		b.WriteString("The request floor is raw JetStream's round trip with the request's record read before it is\n" +
			"handled, the lifecycle I/O the bus's promises need (docs/performance.md).\n")
	}
	if len(r.Spread) > 0 {
		fmt.Fprintf(&b, "\nEach scenario ran %d rounds; its figures are those of its median round by the ratio below:\n\n", s.Rounds)
		spread := [][]string{{"scenario", "ratio", "rounds", "min", "median", "max"}}
		for _, sc := range scenarios {
			if sp := r.Spread[sc.Name]; sp != nil {
				spread = append(spread, []string{sc.Name, sp.Ratio, strconv.Itoa(sp.Rounds),
					formatRatio(sp.Min), formatRatio(sp.Median), formatRatio(sp.Max)})
			}
		}
		writeAligned(&b, spread)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// rows returns the table's rows, in the order of the scenarios.
func (r *Report) rows() [][]string {
	var rows [][]string
	if t := r.Async; t != nil {
		rows = append(rows, throughputRows("async", "publish throughput", t)...)
	}
	if t := r.AsyncUntracked; t != nil {
		rows = append(rows, throughputRows("async-untracked", "publish throughput, lifecycle off", t)...)
	}
	if l := r.Sync; l != nil {
		rows = append(rows, latencyRows("sync", "publish latency", l)...)
	}
	if t := r.Consume; t != nil {
		rows = append(rows, throughputRows("consume", fmt.Sprintf("subscribe+ack throughput, prefetch %d", ConsumePrefetch), t)...)
	}
	if t := r.ConsumeDefaults; t != nil {
		rows = append(rows, throughputRows("consume-defaults", "subscribe+ack throughput, no options", t)...)
	}
	if t := r.ConsumeUntracked; t != nil {
		rows = append(rows, throughputRows("consume-untracked", fmt.Sprintf("subscribe+ack throughput, lifecycle off, prefetch %d", ConsumePrefetch), t)...)
	}
	if l := r.Request; l != nil {
		rows = append(rows, latencyRows("request", "round trip vs raw JetStream", l)...)
		if l.FloorP50Micros != nil {
			rows = append(rows, []string{"request", "round trip vs the floor p50", "µs",
				formatTenths(l.BusP50Micros), formatTenths(*l.FloorP50Micros), "-", optional(formatRatio, l.RatioBusFloorP50), "-"})
		}
	}
	if l := r.E2E; l != nil {
		rows = append(rows, latencyRows("e2e", fmt.Sprintf("latency at %s msg/s", strconv.FormatFloat(l.RateMsgsPerSec, 'f', -1, 64)), l)...)
	}
	if p := r.Priority; p != nil {
		rows = append(rows, []string{"priority", fmt.Sprintf("inversions, backlog of %d", p.Messages), "starts",
			strconv.Itoa(p.BusInversions), strconv.Itoa(p.RawInversions), "-", optional(formatRatio, p.RatioBusRaw), "-"})
	}
	if t := r.Setup; t != nil {
		rows = append(rows, []string{"setup", setupFigure(t), "ms",
			formatTenths(t.BusMillis), formatTenths(t.RawMillis), "-", optional(formatRatio, t.RatioBusRaw), "-"})
		if t.Memory != "" {
			rows = append(rows, []string{"setup", "memory per agent, " + t.Memory, "KiB",
				optional(formatTenths, t.BusKiBPerAgent), optional(formatTenths, t.RawKiBPerAgent), "-", optional(formatRatio, t.RatioMemoryBusRaw), "-"})
		}
	}
	return rows
}

// throughputRows returns the rate row of t and, where it was measured, its
// CPU per message row.
func throughputRows(scenario, figure string, t *Throughput) [][]string {
	rows := [][]string{{scenario, figure, "msg/s",
		formatWhole(t.BusMsgsPerSec), formatWhole(t.RawMsgsPerSec), optional(formatWhole, t.RawHeadersMsgsPerSec),
		optional(formatRatio, t.RatioBusRaw), optional(formatRatio, t.RatioBusRawHeaders)}}
	if c := t.CPU; c != nil {
		rows = append(rows, []string{scenario, "process CPU per message", "µs",
			formatTenths(c.BusMicros), formatTenths(c.RawMicros), formatTenths(c.RawHeadersMicros),
			optional(formatRatio, c.RatioBusRaw), optional(formatRatio, c.RatioBusRawHeaders)})
	}
	return rows
}

// latencyRows returns the p50 and p99 rows of l.
func latencyRows(scenario, figure string, l *Latency) [][]string {
	return [][]string{
		{scenario, figure + " p50", "µs", formatTenths(l.BusP50Micros), formatTenths(l.RawP50Micros),
			optional(formatTenths, l.RawHeadersP50Micros), optional(formatRatio, l.RatioBusRawP50), optional(formatRatio, l.RatioBusRawHeadersP50)},
		{scenario, figure + " p99", "µs", formatTenths(l.BusP99Micros), formatTenths(l.RawP99Micros),
			optional(formatTenths, l.RawHeadersP99Micros), optional(formatRatio, l.RatioBusRawP99), optional(formatRatio, l.RatioBusRawHeadersP99)},
	}
}

// setupFigure names the setup row, with the consumer counts of both sides
// when they differ.
func setupFigure(t *SetupTime) string {
	if t.BusConsumers == t.RawConsumers {
		return fmt.Sprintf("set up %d agents, %d consumers", t.Agents, t.BusConsumers)
	}
	return fmt.Sprintf("set up %d agents, %d bus / %d raw consumers", t.Agents, t.BusConsumers, t.RawConsumers)
}

// The number formats of the table: throughput in whole messages per
// second, latency and time to a tenth, ratios to a hundredth.
func formatWhole(v float64) string  { return strconv.FormatFloat(v, 'f', 0, 64) }
func formatTenths(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func formatRatio(v float64) string  { return strconv.FormatFloat(v, 'f', 2, 64) }

// optional formats *v with format, or "-" for nil.
func optional(format func(float64) string, v *float64) string {
	if v == nil {
		return "-"
	}
	return format(*v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeAligned writes rows as columns two spaces apart, the first
// textColumns aligned left and the rest right, without trailing blanks.
func writeAligned(b *strings.Builder, rows [][]string) {
	widths := make([]int, len(columns))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				line.WriteString("  ")
			}
			if i < textColumns {
				line.WriteString(cell + pad)
			} else {
				line.WriteString(pad + cell)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}
