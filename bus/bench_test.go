package bus_test

// Benchmarks of the bus side by side with raw nats.go on the same embedded
// server, file storage, 1 KiB payloads. Run:
//
//	go test -run '^$' -bench . -benchtime 20000x ./bus
//
// Each of the first three benchmarks has four sub-benchmarks:
//
//	bus            agentbus
//	bus-untracked  agentbus without lifecycle tracking (bus.WithoutLifecycle)
//	raw            raw nats.go with a bare 1 KiB payload (no headers)
//	raw-headers    raw nats.go sending the same headers as the bus (the
//	               CloudEvents ce- headers and a unique Nats-Msg-Id), so the
//	               same bytes reach the server and it does the same dedup work
//
// bus/raw is what agentbus costs over the plainest JetStream use; bus/raw-
// headers is what the library itself costs. docs/performance.md records
// the ratios.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

var payload = make([]byte, 1024)

// busHeaders returns the headers the bus writes for a benchmark message,
// with a fresh Nats-Msg-Id, for the raw-headers baselines.
func busHeaders(b *testing.B) func() nats.Header {
	m := &codec.Message{From: "bench-sender", To: "bench-receiver", Type: "BENCH", Data: payload}
	m.SetDefaults(time.Now())
	h, _, err := codec.Binary{}.Encode(m)
	if err != nil {
		b.Fatal(err)
	}
	return func() nats.Header {
		c := make(nats.Header, len(h)+1)
		for k, v := range h {
			c[k] = v
		}
		c[jetstream.MsgIDHeader] = []string{nuid.Next()}
		return c
	}
}

// benchEnv is one server with the bus stream and a raw stream configured
// alike (file storage, same duplicate window), and a connection for each
// side.
type benchEnv struct {
	srv       *embedded.Server
	bus       *bus.Bus
	untracked *bus.Bus // WithoutLifecycle
	raw       jetstream.JetStream
	rawConn   *nats.Conn
}

// runBuses runs f as the two bus sub-benchmarks: "bus" with lifecycle
// tracking and "bus-untracked" without.
func (env *benchEnv) runBuses(b *testing.B, f func(b *testing.B, bb *bus.Bus)) {
	b.Run("bus", func(b *testing.B) { f(b, env.bus) })
	b.Run("bus-untracked", func(b *testing.B) { f(b, env.untracked) })
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	s := embeddedtest.RunServer(b)
	ctx := context.Background()
	nc := embeddedtest.Connect(b, s)
	info, err := bus.Provision(ctx, nc, bus.StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	rawConn := embeddedtest.Connect(b, s)
	raw, err := jetstream.New(rawConn)
	if err != nil {
		b.Fatal(err)
	}
	cfg := info.Config
	cfg.Name, cfg.Subjects, cfg.Description = "RAW", []string{"raw.>"}, ""
	if _, err := raw.CreateStream(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	bb, err := bus.New(embeddedtest.Connect(b, s), "bench-sender")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.Close() })
	ub, err := bus.New(embeddedtest.Connect(b, s), "bench-sender", bus.WithoutLifecycle())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ub.Close() })
	return &benchEnv{srv: s, bus: bb, untracked: ub, raw: raw, rawConn: rawConn}
}

func BenchmarkPublishAsync(b *testing.B) {
	env := newBenchEnv(b)
	env.runBuses(b, func(b *testing.B, bb *bus.Bus) {
		b.ReportAllocs()
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := bb.PublishAsync(context.Background(), bus.Message{To: "bench-receiver", Type: "BENCH", Data: payload}); err != nil {
				b.Fatal(err)
			}
		}
		// Until every publish and lifecycle record is stored: all the work
		// the publishes gave the server.
		if err := bb.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := env.raw.PublishAsync("raw.bench", payload); err != nil {
				b.Fatal(err)
			}
		}
		<-env.raw.PublishAsyncComplete()
	})
	b.Run("raw-headers", func(b *testing.B) {
		headers := busHeaders(b)
		b.ReportAllocs()
		b.SetBytes(int64(len(payload)))
		for b.Loop() {
			if _, err := env.raw.PublishMsgAsync(&nats.Msg{Subject: "raw.bench", Header: headers(), Data: payload}); err != nil {
				b.Fatal(err)
			}
		}
		<-env.raw.PublishAsyncComplete()
	})
}

func BenchmarkPublishSync(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	env.runBuses(b, func(b *testing.B, bb *bus.Bus) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bb.Publish(ctx, bus.Message{To: "bench-receiver", Type: "BENCH", Data: payload}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := env.raw.Publish(ctx, "raw.bench", payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-headers", func(b *testing.B) {
		headers := busHeaders(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := env.raw.PublishMsg(ctx, &nats.Msg{Subject: "raw.bench", Header: headers(), Data: payload}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkConsume measures subscribe+ack throughput of a backlog of b.N
// messages: the bus with a prefetch of 500 against a raw Consume with its
// default 500-message pull and explicit acks.
func BenchmarkConsume(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	b.Run("bus", func(b *testing.B) { benchConsumeBus(b, env, fmt.Sprintf("consumer-%d", b.N)) })
	b.Run("bus-untracked", func(b *testing.B) {
		benchConsumeBus(b, env, fmt.Sprintf("untracked-%d", b.N), bus.WithoutLifecycle())
	})
	rawConsume := func(name string, headers func() nats.Header) {
		b.Run(name, func(b *testing.B) {
			subject := fmt.Sprintf("raw.consume.%s.%d", name, b.N)
			for range b.N {
				m := &nats.Msg{Subject: subject, Data: payload}
				if headers != nil {
					m.Header = headers()
				}
				if _, err := env.raw.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			<-env.raw.PublishAsyncComplete()
			rc := embeddedtest.Connect(b, env.srv)
			js, _ := jetstream.New(rc)
			cons, err := js.CreateOrUpdateConsumer(ctx, "RAW", jetstream.ConsumerConfig{
				Durable: fmt.Sprintf("%s-%d", name, b.N), FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy,
			})
			if err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			done := make(chan struct{})
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			cc, err := cons.Consume(func(m jetstream.Msg) {
				m.Ack()
				if n.Add(1) == int64(b.N) {
					close(done)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			<-done
			b.StopTimer()
			cc.Stop()
		})
	}
	rawConsume("raw", nil)
	rawConsume("raw-headers", busHeaders(b))
}

// benchConsumeBus publishes a backlog of b.N messages to agent and times
// how long a subscription of agent (a bus with opts) takes to handle and
// ack them, with a prefetch of 500.
func benchConsumeBus(b *testing.B, env *benchEnv, agent string, opts ...bus.Option) {
	// The backlog is published untracked: only the consuming side is
	// measured, and no status writes of the publisher overlap it.
	for range b.N {
		if _, err := env.untracked.PublishAsync(context.Background(), bus.Message{To: agent, Type: "BENCH", Data: payload}); err != nil {
			b.Fatal(err)
		}
	}
	<-env.untracked.PublishAsyncComplete()
	rb, err := bus.New(embeddedtest.Connect(b, env.srv), agent, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Close()
	var n atomic.Int64
	done := make(chan struct{})
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	sub, err := rb.Subscribe(context.Background(), func(context.Context, *bus.Delivery) error {
		if n.Add(1) == int64(b.N) {
			close(done)
		}
		return nil
	}, bus.WithPrefetch(500))
	if err != nil {
		b.Fatal(err)
	}
	<-done
	if err := rb.Flush(context.Background()); err != nil { // the lifecycle records too
		b.Fatal(err)
	}
	b.StopTimer()
	sub.Stop()
	<-sub.Done()
}

// BenchmarkSetupAgents measures creating the six consumers and starting the
// subscription of many agents on one connection; run with -benchtime 1x.
// It reports setup time per agent and the heap growth per agent (client and
// in-process server together).
func BenchmarkSetupAgents(b *testing.B) {
	const agents = 1000
	s := embeddedtest.RunServer(b)
	nc := embeddedtest.Connect(b, s)
	if _, err := bus.Provision(context.Background(), nc, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.StartTimer()
		start := time.Now()
		var subs []*bus.Subscription
		for i := range agents {
			ab, err := bus.New(nc, fmt.Sprintf("agent-%d-%d", b.N, i))
			if err != nil {
				b.Fatal(err)
			}
			sub, err := ab.Subscribe(context.Background(), func(context.Context, *bus.Delivery) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			subs = append(subs, sub)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(elapsed.Microseconds())/agents, "µs/agent")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/agents/1024, "KiB/agent")
		b.ReportMetric(float64(runtime.NumGoroutine())/agents, "goroutines/agent")
		var wg sync.WaitGroup
		for _, sub := range subs {
			wg.Go(func() { sub.Stop(); <-sub.Done() })
		}
		wg.Wait()
		b.StartTimer()
	}
}

// BenchmarkIdleSubscriber reports the CPU time the whole process (client
// and in-process server) spends in 10 s with no traffic: "server" with no
// subscriber as the baseline, "subscribed" with one agent's subscription
// waiting on empty queues. Run with -benchtime 1x.
func BenchmarkIdleSubscriber(b *testing.B) {
	for _, subscribed := range []bool{false, true} {
		name := "server"
		if subscribed {
			name = "subscribed"
		}
		b.Run(name, func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			nc := embeddedtest.Connect(b, s)
			if _, err := bus.Provision(context.Background(), nc, bus.StreamConfig{}); err != nil {
				b.Fatal(err)
			}
			ab, err := bus.New(nc, "idle")
			if err != nil {
				b.Fatal(err)
			}
			defer ab.Close()
			if subscribed {
				if _, err := ab.Subscribe(context.Background(), func(context.Context, *bus.Delivery) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				var before, after syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &before)
				time.Sleep(10 * time.Second)
				syscall.Getrusage(syscall.RUSAGE_SELF, &after)
				cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
				b.ReportMetric(float64(cpu.Milliseconds()), "cpu-ms/10s")
			}
		})
	}
}
