package benchmark_test

import (
	"fmt"
	"os"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/benchmark"
)

// Count the priority inversions of two ways to drain the same backlog: in
// priority order, and in stream order as one raw consumer takes it.
func ExampleCountInversions() {
	byPriority := []int{1, 1, 2, 3, 4, 5, 5}
	byStream := []int{5, 4, 3, 2, 1, 5, 1}
	fmt.Println(benchmark.CountInversions(byPriority), benchmark.CountInversions(byStream))
	// Output: 0 5
}

// Print the table of a report, here with made-up figures for two
// scenarios. Each ratio is the bus's figure divided by raw's.
func ExampleReport_WriteTable() {
	rep := &benchmark.Report{
		Settings: benchmark.Settings{Server: "embedded", ServerVersion: "2.15.2", GoVersion: "go1.26.0",
			CPUs: 2, Messages: 1000, SizeBytes: 1024, RunID: "0123abcd"},
		Sync: &benchmark.Latency{Messages: 1000,
			BusP50Micros: 210, BusP99Micros: 480, RawP50Micros: 180, RawP99Micros: 400,
			RatioBusRawP50: benchmark.Ratio(210, 180), RatioBusRawP99: benchmark.Ratio(480, 400)},
		Priority: &benchmark.Inversions{Messages: 1000, BusInversions: 0, RawInversions: 796,
			RatioBusRaw: benchmark.Ratio(0, 796)},
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		fmt.Println(err)
	}
	// Output:
	// agentbus bench: server embedded (nats-server 2.15.2), go1.26.0, 2 CPUs, 1000 messages of 1024 bytes, run 0123abcd
	//
	// scenario  figure                       unit      bus    raw  raw+headers  bus/raw  bus/raw+headers
	// sync      publish latency p50          µs      210.0  180.0            -     1.17                -
	// sync      publish latency p99          µs      480.0  400.0            -     1.20                -
	// priority  inversions, backlog of 1000  starts      0    796            -     0.00                -
	//
	// bus/raw is the bus's figure divided by raw nats.go's: for throughput below 1 means the bus is slower;
	// for latency, time, CPU, memory and inversions above 1 means the bus takes longer, uses more or inverts more.
	// raw+headers is raw nats.go sending the bus's headers and, consuming, decoding each event.
}
