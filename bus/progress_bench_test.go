package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// BenchmarkProgress measures a stream of b.N progress updates from the
// handler of a request to the requester following them, in the style of
// bench_test.go (the raw sub-benchmark first, the bus ones as ratios to it):
//
//	raw            raw nats.go doing the bus's hops: the worker reads the
//	               request with a durable pull consumer (the bus's consumer
//	               settings) and publishes each update to the requester's
//	               subject with a sync JetStream publish (the bus's subject
//	               shape and headers: the ce- attributes of an
//	               agentbus.progress event, its progress number, a unique
//	               Nats-Msg-Id), then the reply; the requester reads them
//	               in order with a durable pull consumer of its own and
//	               decodes each
//	bus            Delivery.Progress in the handler of a Request that
//	               follows the updates with OnProgress, both agents
//	               subscribed with defaults, then Delivery.Reply
//	bus-untracked  the same without lifecycle tracking on either side
//	               (bus.WithoutLifecycle)
//
// Each update carries the time of its send in Progress.Data. The figures:
// update throughput (updates/s, from the request to the reply and, for
// the bus, every lifecycle record stored), the latency of each update from
// the worker's send to the requester seeing it (p50-µs, p99-µs), the
// process's CPU time per update (cpu-µs/update: client and in-process
// server together) and, for the bus, the lifecycle records stored per
// update (records/update). The bus reports "bus/raw" for throughput,
// "p50-bus/raw" and "p99-bus/raw" for latency and "cpu-bus/raw".
//
//	go test -run '^$' -bench '^BenchmarkProgress$' -benchtime 2000x ./bus
func BenchmarkProgress(b *testing.B) {
	env := newBenchEnv(b)
	base := newBaselines()
	b.Run("raw", func(b *testing.B) { benchProgressRaw(b, env, base) })
	b.Run("bus", func(b *testing.B) { benchProgressBus(b, env, base) })
	b.Run("bus-untracked", func(b *testing.B) { benchProgressBus(b, env, base, bus.WithoutLifecycle()) })
}

// benchProgressRaw is BenchmarkProgress's raw sub-benchmark.
func benchProgressRaw(b *testing.B, env *benchEnv, base *baselines) {
	ctx := context.Background()
	requester, worker := env.name("raw-progress-requester"), env.name("raw-progress-worker")
	updateSubject := rawDirect(b, requester, worker, bus.TypeProgress)
	replySubject := rawDirect(b, requester, worker, "RESULT")
	n := b.N
	consumeRawAgent(b, env, worker, func(js jetstream.JetStream, req *codec.Message) {
		for i := 1; i <= n; i++ {
			data, err := json.Marshal(bus.Progress{Message: "step", Data: progressStamp()})
			if err != nil {
				b.Error(err)
				return
			}
			u := &codec.Message{From: worker, To: requester, Type: bus.TypeProgress, Priority: req.Priority,
				CorrelationID: req.CorrelationID, CausationID: req.ID, ContentType: "application/json", Data: data,
				Extensions: map[string]string{bus.ExtProgress: strconv.Itoa(i), bus.ExtReplyBy: req.Extensions[bus.ExtReplyBy]}}
			if err := publishEvent(ctx, js, updateSubject, u); err != nil {
				b.Error(err)
				return
			}
		}
		reply := &codec.Message{From: worker, To: requester, Type: "RESULT", Priority: req.Priority,
			CorrelationID: req.CorrelationID, CausationID: req.ID,
			Extensions: map[string]string{bus.ExtReplyBy: req.Extensions[bus.ExtReplyBy]}}
		if err := publishEvent(ctx, js, replySubject, reply); err != nil {
			b.Error(err)
		}
	})
	got := make(chan *codec.Message, n+1)
	consumeRawAgent(b, env, requester, func(_ jetstream.JetStream, m *codec.Message) { got <- m })
	req := &codec.Message{From: requester, To: worker, Type: "LONG", TTL: bus.DefaultRequestTimeout,
		Extensions: map[string]string{bus.ExtReplyBy: time.Now().Add(bus.DefaultRequestTimeout).UTC().Format(time.RFC3339Nano)}}
	reqMsg, err := encodeEvent(rawDirect(b, worker, requester, "LONG"), req)
	if err != nil {
		b.Fatal(err)
	}
	reqMsg.Header[jetstream.MsgTTLHeader] = []string{strconv.Itoa(int(bus.DefaultRequestTimeout / time.Second))}
	timeout := time.NewTimer(time.Hour)
	defer timeout.Stop()
	lat := make([]time.Duration, 0, n)
	next := 1
	b.ReportAllocs()
	cpu := processCPU()
	b.ResetTimer()
	if _, err := env.raw.PublishMsg(ctx, reqMsg); err != nil {
		b.Fatal(err)
	}
	for done := false; !done; {
		timeout.Reset(time.Minute)
		select {
		case m := <-got:
			if m.CausationID != req.ID {
				continue
			}
			if m.Type != bus.TypeProgress {
				done = true
				break
			}
			var p bus.Progress
			if err := json.Unmarshal(m.Data, &p); err != nil {
				b.Fatal(err)
			}
			if num, _ := strconv.Atoi(m.Extensions[bus.ExtProgress]); num != next {
				b.Fatalf("update %d arrived as number %d", next, num)
			}
			next++
			lat = append(lat, progressLatency(b, p.Data))
		case <-timeout.C:
			b.Fatalf("no update or reply for a minute after update %d of %d", next-1, n)
		}
	}
	b.StopTimer()
	cpuUsed := processCPU() - cpu
	if next-1 != n {
		b.Fatalf("%d updates before the reply, want %d", next-1, n)
	}
	base.set("", "raw", progressRate(b))
	base.set("cpu-", "raw", cpuPer(b, cpuUsed, n, time.Microsecond, "cpu-µs/update"))
	p50, p99 := latencyFigures(b, lat)
	base.set("p50-", "raw", p50)
	base.set("p99-", "raw", p99)
}

// benchProgressBus is BenchmarkProgress's bus sub-benchmark, both agents'
// buses made with opts.
func benchProgressBus(b *testing.B, env *benchEnv, base *baselines, opts ...bus.Option) {
	ctx := context.Background()
	requester, worker := env.name("progress-requester"), env.name("progress-worker")
	n := b.N
	wb := newBenchBus(b, env, worker, opts...)
	subscribeBench(b, wb, func(ctx context.Context, d *bus.Delivery) error {
		for range n {
			if err := d.Progress(ctx, bus.Progress{Message: "step", Data: progressStamp()}); err != nil {
				b.Error(err)
				return bus.Permanent(err)
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "RESULT"})
		return err
	})
	// The requester is an agent like any other, subscribed to its inbox;
	// the stored copy of each update reaches it too.
	qb := newBenchBus(b, env, requester, opts...)
	subscribeBench(b, qb, func(context.Context, *bus.Delivery) error { return nil })
	records := statusRecords(b, env)
	lat := make([]time.Duration, 0, n)
	next := 1
	var disorder error
	b.ReportAllocs()
	cpu := processCPU()
	b.ResetTimer()
	reply, err := qb.Request(ctx, bus.Message{To: worker, Type: "LONG"}, bus.OnProgress(func(u *bus.Delivery) {
		p, num, ok := u.ProgressUpdate()
		if !ok || num != next {
			if disorder == nil {
				disorder = fmt.Errorf("update %d arrived as number %d (%v)", next, num, ok)
			}
			return
		}
		next++
		lat = append(lat, progressLatency(b, p.Data))
	}))
	if err != nil {
		b.Fatal(err)
	}
	// Until every lifecycle record is stored: all the work the updates
	// gave the server.
	if err := wb.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err := qb.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpuUsed := processCPU() - cpu
	if disorder != nil {
		b.Fatal(disorder)
	}
	if reply.Type != "RESULT" || next-1 != n {
		b.Fatalf("reply %s after %d updates, want RESULT after %d", reply.Type, next-1, n)
	}
	base.report(b, "", progressRate(b))
	base.report(b, "cpu-", cpuPer(b, cpuUsed, n, time.Microsecond, "cpu-µs/update"))
	p50, p99 := latencyFigures(b, lat)
	base.report(b, "p50-", p50)
	base.report(b, "p99-", p99)
	b.ReportMetric(float64(statusRecords(b, env)-records)/float64(n), "records/update")
}

// progressRate reports the updates per second of a progress
// sub-benchmark that has stopped its timer, and returns them.
func progressRate(b *testing.B) float64 {
	r := rate(b)
	b.ReportMetric(r, "updates/s")
	return r
}

// progressStamp returns the time now as a JSON number of nanoseconds, for
// Progress.Data.
func progressStamp() json.RawMessage {
	return strconv.AppendInt(nil, time.Now().UnixNano(), 10)
}

// progressLatency returns the time since the stamp progressStamp wrote in
// data.
func progressLatency(b *testing.B, data json.RawMessage) time.Duration {
	ns, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		b.Fatalf("progress data %q: %v", data, err)
	}
	return time.Since(time.Unix(0, ns))
}

// newBenchBus returns a bus of agent on a connection of its own to env's
// server, closed when b ends.
func newBenchBus(b *testing.B, env *benchEnv, agent string, opts ...bus.Option) *bus.Bus {
	b.Helper()
	bb, err := bus.New(env.connect(b), agent, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.Close() })
	return bb
}

// subscribeBench subscribes bb with h and the default options, and stops
// the subscription when b ends.
func subscribeBench(b *testing.B, bb *bus.Bus, h bus.Handler) {
	b.Helper()
	sub, err := bb.Subscribe(context.Background(), h)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sub.Stop(); <-sub.Done() })
}

// consumeRawAgent consumes agent's direct messages at the default priority
// under rawRoot, on a connection of its own, with the bus's consumer
// settings, decoding each event and passing it to f before the ack, until
// b ends. f must not call b.Fatal: it runs on the consumer's goroutine.
func consumeRawAgent(b *testing.B, env *benchEnv, agent string, f func(js jetstream.JetStream, m *codec.Message)) {
	b.Helper()
	ctx := context.Background()
	js, err := jetstream.New(env.connect(b))
	if err != nil {
		b.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "RAW", rawDirectConsumer(b, agent))
	if err != nil {
		b.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		msg, err := codec.Decode(m.Headers(), m.Data())
		if err != nil {
			b.Error(err)
			m.Term()
			return
		}
		f(js, msg)
		m.Ack()
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Stop(); <-cc.Closed() })
}

// publishEvent encodes m as the bus does (encodeEvent) and publishes it
// to subject with a sync JetStream publish.
func publishEvent(ctx context.Context, js jetstream.JetStream, subject string, m *codec.Message) error {
	msg, err := encodeEvent(subject, m)
	if err != nil {
		return err
	}
	_, err = js.PublishMsg(ctx, msg)
	return err
}

// processCPU returns the CPU time this process (client and in-process
// server) has used so far, as BenchmarkIdleSubscriber reads it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru) //nolint:errcheck // cannot fail for RUSAGE_SELF
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPer reports cpu per op, in units of scale, as the metric unit and
// returns it.
func cpuPer(b *testing.B, cpu time.Duration, ops int, scale time.Duration, unit string) float64 {
	v := float64(cpu) / float64(scale) / float64(ops)
	b.ReportMetric(v, unit)
	return v
}

// statusRecords returns how many records the bus's lifecycle status bucket
// on env's server has stored so far: the last sequence of its stream.
func statusRecords(b *testing.B, env *benchEnv) uint64 {
	b.Helper()
	st, err := env.raw.Stream(context.Background(), "KV_"+subjects.Default().StatusBucket())
	if err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return info.State.LastSeq
}
