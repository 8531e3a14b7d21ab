//go:build unix

package bus_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// setupAgents is how many agents BenchmarkSetupAgents sets up: 1,000
// unless -agentbus.setup-agents says otherwise (10,000 agents on one
// server: -agentbus.setup-agents 10000 -bench 'SetupAgents/bus').
var setupAgents = 1000

func init() {
	flag.IntVar(&setupAgents, "agentbus.setup-agents", setupAgents, "agents BenchmarkSetupAgents sets up")
}

// BenchmarkSetupAgents sets up 1,000 agents on one connection to a
// nats-server in a process of its own, started afresh for each
// sub-benchmark; run with -benchtime 1x:
//
//	raw          raw nats.go creates the durable consumers the bus creates
//	             for each agent (rawConsumerConfigs: package subjects' names
//	             and filters, package consumers' settings), each agent's at
//	             once, one agent after another
//	raw-consume  the same, and Consume on each consumer with its defaults,
//	             as a raw user who wants the messages does
//	bus          bus.New and Subscribe with defaults, one agent after another:
//	             a new agent's broadcast consumer (its direct consumers
//	             come with their first messages)
//	bus-16-at-once
//	             the same, 16 agents at a time, as agents starting together
//	             in processes of their own would
//	bus-sent-one the same as bus, then one message sent to the agent at the
//	             default priority and handled: an agent at work, with its
//	             broadcast consumer and one direct consumer
//	interleaved  raw-consume and bus alternately on one server, for the
//	             time alone (benchSetupInterleaved)
//
// Each reports the time per agent (µs/agent), the growth per agent of the
// server process's resident memory (/varz "mem", server-rss-KiB/agent),
// of its heap after a GC (HeapAlloc from /debug/pprof/heap,
// server-heap-KiB/agent) and of its goroutines (server-goroutines/agent),
// and the same of this client process (client-heap-KiB/agent,
// client-goroutines/agent), measured while every agent is set up. The bus
// reports each server figure and the time as a ratio to each raw
// sub-benchmark: time-bus/raw, server-rss-bus/raw, ...
func BenchmarkSetupAgents(b *testing.B) {
	natsServer := buildNATSServer(b)
	base := newBaselines()
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) { benchSetup(b, natsServer, base, "raw", 1, setupRaw(ctx, false)) })
	b.Run("raw-consume", func(b *testing.B) { benchSetup(b, natsServer, base, "raw-consume", 1, setupRaw(ctx, true)) })
	setupBus := func(sendOne bool) func(b *testing.B, nc *nats.Conn, agent string) func() {
		return func(b *testing.B, nc *nats.Conn, agent string) func() {
			ab, err := bus.New(nc, agent)
			if err != nil {
				b.Error(err)
				return func() {}
			}
			handled := make(chan struct{}, 1)
			sub, err := ab.Subscribe(ctx, func(context.Context, *bus.Delivery) error {
				select {
				case handled <- struct{}{}:
				default: // a redelivery, handled already
				}
				return nil
			})
			if err != nil {
				b.Error(err)
				return func() { ab.Close() }
			}
			if sendOne {
				if _, err := ab.Publish(ctx, bus.Message{To: agent, Type: "hello"}); err != nil {
					b.Error(err)
				}
				<-handled
			}
			return func() { sub.Stop(); <-sub.Done(); ab.Close() }
		}
	}
	b.Run("bus", func(b *testing.B) { benchSetup(b, natsServer, base, "", 1, setupBus(false)) })
	b.Run("bus-16-at-once", func(b *testing.B) { benchSetup(b, natsServer, base, "", 16, setupBus(false)) })
	b.Run("bus-sent-one", func(b *testing.B) { benchSetup(b, natsServer, base, "", 1, setupBus(true)) })
	b.Run("interleaved", func(b *testing.B) { benchSetupInterleaved(b, natsServer, setupRaw(ctx, true), setupBus(false)) })
}

// benchSetupInterleaved sets up setupAgents agents with raw and as many
// with bus on one server, alternately, each side first every other time,
// and reports each side's time per agent (raw-consume-µs/agent,
// bus-µs/agent) and their ratio (time-bus/raw-consume): the same server,
// the same number of consumers and the same state of the disk for both,
// which the sub-benchmarks above, each on a fresh server one after
// another, cannot promise.
func benchSetupInterleaved(b *testing.B, natsServer string, raw, bb func(b *testing.B, nc *nats.Conn, agent string) func()) {
	_, nc := startProvisioned(b, natsServer)
	iteration := 0
	for b.Loop() {
		iteration++
		var rawTime, busTime time.Duration
		stops := make([]func(), 0, 2*setupAgents)
		timed := func(setup func(*testing.B, *nats.Conn, string) func(), agent string) time.Duration {
			start := time.Now()
			stops = append(stops, setup(b, nc, agent))
			if b.Failed() {
				b.FailNow()
			}
			return time.Since(start)
		}
		for i := range setupAgents {
			agent := fmt.Sprintf("agent-%d-%d", iteration, i)
			if i%2 == 0 {
				rawTime += timed(raw, agent+"-raw")
				busTime += timed(bb, agent+"-bus")
			} else {
				busTime += timed(bb, agent+"-bus")
				rawTime += timed(raw, agent+"-raw")
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(rawTime.Microseconds())/float64(setupAgents), "raw-consume-µs/agent")
		b.ReportMetric(float64(busTime.Microseconds())/float64(setupAgents), "bus-µs/agent")
		b.ReportMetric(float64(busTime)/float64(rawTime), "time-bus/raw-consume")
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
		b.StartTimer()
	}
}

// setupRaw returns the set-up of one agent on the raw side: its consumers
// created at once and, with consume, consumed.
func setupRaw(ctx context.Context, consume bool) func(b *testing.B, nc *nats.Conn, agent string) func() {
	var (
		mu sync.Mutex
		js = map[*nats.Conn]jetstream.JetStream{}
	)
	return func(b *testing.B, nc *nats.Conn, agent string) func() {
		mu.Lock()
		if js[nc] == nil {
			j, err := jetstream.New(nc)
			if err != nil {
				mu.Unlock()
				b.Error(err)
				return func() {}
			}
			js[nc] = j
		}
		j := js[nc]
		mu.Unlock()
		cfgs := rawConsumerConfigs(b, agent)
		ccs := make([]jetstream.ConsumeContext, len(cfgs))
		errs := make([]error, len(cfgs))
		var wg sync.WaitGroup
		for i, cfg := range cfgs {
			wg.Go(func() {
				c, err := j.CreateOrUpdateConsumer(ctx, "RAW", cfg)
				if err == nil && consume {
					ccs[i], err = c.Consume(func(m jetstream.Msg) { m.Ack() })
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Error(err) // called off the benchmark's goroutine: benchSetup stops
		}
		return func() {
			for _, cc := range ccs {
				if cc != nil {
					cc.Stop()
					<-cc.Closed()
				}
			}
		}
	}
}

// startProvisioned starts natsServer as a process of its own, provisions
// the bus's streams and the raw one on it and returns it and a connection
// to it, closed when b ends.
func startProvisioned(b *testing.B, natsServer string) (*serverProcess, *nats.Conn) {
	srv := startServerProcess(b, natsServer)
	nc, err := nats.Connect(srv.url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	if _, err := newAdmin(b, nc).Provision(context.Background(), bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	createRawStream(b, js)
	return srv, nc
}

// benchSetup starts a server process, provisions the bus's and the raw
// stream, sets up setupAgents agents with setup and reports the figures
// BenchmarkSetupAgents describes: into base for a raw sub-benchmark name,
// against base for the bus (name "").
func benchSetup(b *testing.B, natsServer string, base *baselines, name string, atOnce int, setup func(b *testing.B, nc *nats.Conn, agent string) (stop func())) {
	srv, nc := startProvisioned(b, natsServer)
	iteration := 0
	for b.Loop() {
		b.StopTimer()
		iteration++
		serverBefore := srv.stats(b)
		clientBefore := clientStats()
		stops := make([]func(), setupAgents)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		slots := make(chan struct{}, atOnce)
		for i := range setupAgents {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				stops[i] = setup(b, nc, fmt.Sprintf("agent-%d-%d", iteration, i))
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		if b.Failed() {
			b.FailNow()
		}
		b.StopTimer()
		serverAfter, clientAfter := srv.stats(b), clientStats()
		perAgent := func(after, before float64) float64 { return (after - before) / float64(setupAgents) }
		figures := []struct {
			figure, unit string
			v            float64
		}{
			{"time-", "µs/agent", float64(elapsed.Microseconds()) / float64(setupAgents)},
			{"server-rss-", "server-rss-KiB/agent", perAgent(serverAfter.rss, serverBefore.rss) / 1024},
			{"server-heap-", "server-heap-KiB/agent", perAgent(serverAfter.heap, serverBefore.heap) / 1024},
			{"server-goroutines-", "server-goroutines/agent", perAgent(serverAfter.goroutines, serverBefore.goroutines)},
			{"", "client-heap-KiB/agent", perAgent(clientAfter.heap, clientBefore.heap) / 1024},
			{"", "client-goroutines/agent", perAgent(clientAfter.goroutines, clientBefore.goroutines)},
		}
		for _, f := range figures {
			b.ReportMetric(f.v, f.unit)
			switch {
			case f.figure == "":
			case name != "":
				base.set(f.figure, name, f.v)
			default:
				base.report(b, f.figure, f.v)
			}
		}
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
		b.StartTimer()
	}
}

// processStats are the memory and goroutines of a process.
type processStats struct {
	rss        float64 // resident memory, bytes (server only)
	heap       float64 // bytes of live heap after a GC
	goroutines float64
}

// clientStats returns the stats of this process.
func clientStats() processStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return processStats{heap: float64(m.HeapAlloc), goroutines: float64(runtime.NumGoroutine())}
}

// buildNATSServer builds nats-server, of the version this module requires,
// into a temporary directory of b and returns its path.
func buildNATSServer(b *testing.B) string {
	dir := b.TempDir()
	if err := embeddedtest.GoBuild(dir, "..", "github.com/nats-io/nats-server/v2"); err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "nats-server")
}

// serverProcess is a nats-server with JetStream in a process of its own,
// on loopback ports, with its monitoring and profiling ports open.
type serverProcess struct {
	url        string
	http, prof int
	log        string
	pid        int
}

// cpu returns the CPU time the server process has used so far, user and
// system, from /proc (Linux); 0 where it cannot be read.
func (p *serverProcess) cpu() time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return 0
	}
	// The fields after the command, which is in parentheses and may hold
	// blanks: utime and stime are the 12th and 13th of them, in ticks.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// monitorClient reads the monitoring endpoints; it keeps no idle
// connections, so no goroutine outlives the benchmark.
var monitorClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// startServerProcess starts natsServer with file storage in a temporary
// directory of b, waits until JetStream is up and stops the process when b
// ends.
func startServerProcess(b *testing.B, natsServer string) *serverProcess {
	dir := b.TempDir()
	ports := embeddedtest.FreePorts(b, 3)
	p := &serverProcess{url: fmt.Sprintf("nats://127.0.0.1:%d", ports[0]), http: ports[1], prof: ports[2], log: filepath.Join(dir, "nats-server.log")}
	logFile, err := os.Create(p.log)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(natsServer, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-m", strconv.Itoa(p.http),
		"--profile", strconv.Itoa(p.prof), "-js", "-sd", filepath.Join(dir, "jetstream"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		b.Fatal(err)
	}
	p.pid = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := monitorClient.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", p.http))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-exited:
			b.Fatalf("nats-server exited at start:\n%s", readLog(p.log))
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("nats-server not healthy after 30 s (last: %v):\n%s", err, readLog(p.log))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readLog(path string) string {
	out, _ := os.ReadFile(path)
	return string(out)
}

// stats returns the server's resident memory from /varz, its heap after a
// GC and its goroutine count from the profiling port.
func (p *serverProcess) stats(b *testing.B) processStats {
	var varz struct {
		Mem int64 `json:"mem"`
	}
	if err := json.Unmarshal(p.get(b, fmt.Sprintf("http://127.0.0.1:%d/varz", p.http)), &varz); err != nil {
		b.Fatalf("/varz: %v", err)
	}
	st := processStats{rss: float64(varz.Mem)}
	// debug=1 ends the heap profile with the runtime.MemStats, gc=1 runs
	// a GC first; the goroutine profile starts with the total.
	heap := p.get(b, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?debug=1&gc=1", p.prof))
	st.heap = profileValue(b, heap, "# HeapAlloc = ")
	goroutines := p.get(b, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", p.prof))
	st.goroutines = profileValue(b, goroutines, "goroutine profile: total ")
	return st
}

// get returns the body of url, which must answer 200.
func (p *serverProcess) get(b *testing.B, url string) []byte {
	resp, err := monitorClient.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&body); err != nil {
		b.Fatalf("%s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %s", url, resp.Status)
	}
	return []byte(body.String())
}

// profileValue returns the number after prefix at the start of a line of
// text.
func profileValue(b *testing.B, text []byte, prefix string) float64 {
	for line := range strings.SplitSeq(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatalf("%q: %v", line, err)
			}
			return n
		}
	}
	b.Fatalf("no line starting %q in the profile", prefix)
	return 0
}
