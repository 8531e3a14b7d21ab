package bus_test

// Benchmarks of the bus side by side with raw nats.go on the same server in
// the same run, file storage, 1 KiB payloads. Run:
//
//	go test -run '^$' -bench '^Benchmark(PublishAsync|PublishSync|Consume)$' -benchtime 20000x ./bus
//	go test -run '^$' -bench '^BenchmarkRequestReply$' -benchtime 2000x ./bus
//	go test -run '^$' -bench '^BenchmarkSetupAgents$' -benchtime 1x ./bus
//	go test -run '^$' -bench '^BenchmarkIndexBySubject$' -benchtime 200000x ./bus
//
// The publish and consume benchmarks run these sub-benchmarks, the raw
// ones first:
//
//	raw            raw nats.go with a bare 1 KiB payload (no headers), all
//	               on one subject: the plainest JetStream use
//	raw-headers    raw nats.go doing the bus's job: the subject the bus
//	               would use, which names each message's ID and
//	               conversation (indexed), the same headers as the bus (the
//	               CloudEvents ce- headers and a unique ID, also the
//	               Nats-Msg-Id), so the same bytes reach the server and it
//	               does the same dedup and subject-index work, and on
//	               consume the bus's consumer settings and codec.Decode of
//	               each event
//	raw-headers-unindexed
//	               (publish only) raw-headers on the plain direct subject,
//	               which names no message: the job of bus-untracked, which
//	               sends such subjects
//	raw-headers-record
//	               (publish only) raw-headers plus, for each message, the
//	               sender's pending status record as the bus writes it,
//	               asynchronously once the message is acknowledged: what
//	               any design that stores a record per message pays. It
//	               runs on a server of its own, so that its records' work
//	               does not spill into the sub-benchmark after it
//	bus-defaults   (Consume only) agentbus Subscribe with no options at all
//	bus            agentbus (Consume: with a prefetch of 500)
//	bus-untracked  agentbus without lifecycle tracking (bus.WithoutLifecycle;
//	               Consume: with a prefetch of 500), whose direct subjects
//	               name no message: compare it with raw-headers-unindexed
//
// The bus sub-benchmarks report their figure as a ratio to each raw one
// that ran before them in the same run: "bus/raw" and "bus/raw-headers" for
// throughput (msg/s of the bus divided by raw's: below 1 is slower), and
// "p50-bus/raw", "p99-bus/raw", ... for latency (above 1 is slower). Run a
// bus sub-benchmark alone and it reports no ratio. Latency benchmarks also
// report their own "p50-µs" and "p99-µs".
//
// The consume benchmark's rate runs from the first message handled to the
// last, as in agentbus bench: creating the consumers (six for the bus, one
// on the raw side) is what BenchmarkSetupAgents measures. It also reports
// the CPU time of the whole process (client and in-process server) per
// message from the first message on, "cpu-µs/msg", and the bus its ratio,
// "cpu-bus/raw...": a bus that uses as much CPU as raw nats.go but runs
// slower is waiting, one that uses more is working.
//
// bus/raw is what agentbus costs over the plainest JetStream use; bus/raw-
// headers is what the library itself costs. docs/performance.md records
// the ratios.
//
// The server is embedded in the benchmark's process and connected to in
// process. With -args -agentbus.server-process it is a nats-server process
// of its own, built from the version this module requires and connected to
// over TCP on loopback, as in production: the benchmark's CPU time
// (cpu-µs/msg) is then the client's alone, and its garbage collector no
// longer marks the server's heap.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

var payload = make([]byte, 1024)

// The agents and message type of the benchmarks.
const (
	senderAgent   = "bench-sender"
	receiverAgent = "bench-receiver"
	benchType     = "BENCH"
)

// rawRoot is the root of the raw side's subjects: raw messages have the
// bus's subject shape, <root>.agent.<to>.p<N>.<from>.<type>, under it.
const rawRoot = "raw"

// rawScheme returns the raw side's subject scheme.
func rawScheme(b *testing.B) subjects.Scheme {
	s, err := subjects.New(rawRoot)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// rawDirect returns the raw side's subject of a message from from to to at
// the default priority, the subject the bus would use under rawRoot.
func rawDirect(b *testing.B, to, from, typ string) string {
	s, err := rawScheme(b).Direct(to, from, typ, subjects.DefaultPriority)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// rawConsumerConfigs returns the configurations of the durable consumers
// the bus creates for agent, on the raw side: the names and filters
// package subjects gives agent under rawRoot, with the settings package
// consumers gives every bus consumer by default. Deriving them keeps the
// raw baselines "the same consumers" when the bus's change.
func rawConsumerConfigs(b *testing.B, agent string) []jetstream.ConsumerConfig {
	cs, err := rawScheme(b).Consumers(agent)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]jetstream.ConsumerConfig, len(cs))
	for i, c := range cs {
		out[i] = consumers.Settings{}.ConsumerConfig(consumers.Spec{Name: c.Name, FilterSubject: c.Filter, NewOnly: c.Broadcast})
	}
	return out
}

// rawDirectConsumer returns the configuration of the consumer of agent's
// direct messages at the default priority, among rawConsumerConfigs.
func rawDirectConsumer(b *testing.B, agent string) jetstream.ConsumerConfig {
	cs, err := rawScheme(b).Consumers(agent)
	if err != nil {
		b.Fatal(err)
	}
	cfgs := rawConsumerConfigs(b, agent)
	for i, c := range cs {
		if c.Priority == subjects.DefaultPriority && !c.Broadcast {
			return cfgs[i]
		}
	}
	b.Fatalf("no direct consumer of %s at priority %d", agent, subjects.DefaultPriority)
	return jetstream.ConsumerConfig{}
}

// busHeaders returns the headers the bus writes for a benchmark message,
// with a fresh Nats-Msg-Id, for the raw-headers baselines.
func busHeaders(b *testing.B) func() nats.Header {
	m := &codec.Message{From: senderAgent, To: receiverAgent, Type: benchType, Data: payload}
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
		id := codec.NewID()
		c["ce-id"] = []string{id}
		c[jetstream.MsgIDHeader] = []string{id}
		return c
	}
}

// busMessages returns a function that makes the next message of a raw
// side doing the bus's job for agent to: the bus's headers (busHeaders)
// on the subject the bus would publish it on under rawRoot, which names
// its ID and conversation (indexed).
func busMessages(b *testing.B, to string) func() *nats.Msg {
	headers, direct := busHeaders(b), rawDirect(b, to, senderAgent, benchType)
	return func() *nats.Msg {
		h := headers()
		id := h.Get(jetstream.MsgIDHeader)
		return &nats.Msg{Subject: indexed(direct, id, id), Header: h, Data: payload}
	}
}

// unindexedMessages returns a function that makes the next message of a
// raw side doing the job of a bus without lifecycle tracking: busMessages
// on the plain direct subject, which names no message.
func unindexedMessages(b *testing.B, to string) func() *nats.Msg {
	headers, direct := busHeaders(b), rawDirect(b, to, senderAgent, benchType)
	return func() *nats.Msg { return &nats.Msg{Subject: direct, Header: headers(), Data: payload} }
}

// bareMessages returns a function that makes the next message of the
// plainest JetStream use: a bare payload on one subject, the direct subject
// to agent to under rawRoot.
func bareMessages(b *testing.B, to string) func() *nats.Msg {
	subject := rawDirect(b, to, senderAgent, benchType)
	return func() *nats.Msg { return &nats.Msg{Subject: subject, Data: payload} }
}

// indexed returns the direct subject direct followed by the index of
// message id in the conversation correlationID names, as the bus publishes
// it (subjects.Scheme.IndexedDirect, without checking direct again).
func indexed(direct, id, correlationID string) string {
	return direct + "." + subjects.IndexToken(id) + "." + subjects.ConversationToken(correlationID)
}

// encodeEvent encodes m as the bus does, for a raw baseline: the
// CloudEvents headers, the message ID as the Nats-Msg-Id, and the subject
// direct followed by the message's index.
func encodeEvent(direct string, m *codec.Message) (*nats.Msg, error) {
	m.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		return nil, err
	}
	h[jetstream.MsgIDHeader] = []string{m.ID}
	conv := m.CorrelationID
	if conv == "" {
		conv = m.ID
	}
	return &nats.Msg{Subject: indexed(direct, m.ID, conv), Header: h, Data: data}, nil
}

// baselines carries the raw sub-benchmarks' figures of one benchmark to
// the bus sub-benchmarks that run after them in the same run, which report
// their own figure divided by each.
type baselines struct {
	names []string                      // raw sub-benchmarks in the order they ran
	v     map[string]map[string]float64 // figure -> raw sub-benchmark -> value
}

func newBaselines() *baselines { return &baselines{v: map[string]map[string]float64{}} }

// set records the value of figure ("" for throughput, "p50-", ...) of the
// raw sub-benchmark name.
func (bl *baselines) set(figure, name string, v float64) {
	if !slices.Contains(bl.names, name) {
		bl.names = append(bl.names, name)
	}
	if bl.v[figure] == nil {
		bl.v[figure] = map[string]float64{}
	}
	bl.v[figure][name] = v
}

// report reports v, the bus's value of figure, divided by the value of each
// raw sub-benchmark that recorded one, as the metric figure+"bus/"+name.
// A nil bl reports nothing.
func (bl *baselines) report(b *testing.B, figure string, v float64) {
	if bl == nil {
		return
	}
	for _, name := range bl.names {
		if raw, ok := bl.v[figure][name]; ok && raw > 0 {
			b.ReportMetric(v/raw, figure+"bus/"+name)
		}
	}
}

// rate returns the messages per second of a throughput sub-benchmark that
// has stopped its timer.
func rate(b *testing.B) float64 { return float64(b.N) / b.Elapsed().Seconds() }

// latencyFigures reports the p50 and p99 of lat in microseconds and
// returns them.
func latencyFigures(b *testing.B, lat []time.Duration) (p50, p99 float64) {
	p50, p99 = percentiles(lat)
	b.ReportMetric(p50, "p50-µs")
	b.ReportMetric(p99, "p99-µs")
	return p50, p99
}

// percentiles sorts lat and returns its p50 and p99 in microseconds.
func percentiles(lat []time.Duration) (p50, p99 float64) {
	slices.Sort(lat)
	at := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		rank := int(math.Ceil(p / 100 * float64(len(lat))))
		return float64(lat[min(max(rank, 1), len(lat))-1]) / float64(time.Microsecond)
	}
	return at(50), at(99)
}

// benchEnv is one server with the bus stream and a raw stream configured
// alike (file storage, same duplicate window) under rawRoot, and a
// connection for each side.
type benchEnv struct {
	connect func(b *testing.B) *nats.Conn // a new connection to the server, closed when b ends
	// serverCPU returns the CPU time the server has used so far, when it
	// runs in a process of its own (-agentbus.server-process); else nil.
	serverCPU func() time.Duration
	bus       *bus.Bus
	// alone is a bus WithoutLifecycle under a root of its own, whose
	// stream nobody else fills: the publish benchmarks' bus-untracked,
	// which would otherwise meet the duplicate window bus filled.
	alone   *bus.Bus
	raw     jetstream.JetStream
	rawConn *nats.Conn
	seq     atomic.Int64 // makes agent and consumer names unique
}

// name returns prefix with a number no other call of the env returned.
func (env *benchEnv) name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, env.seq.Add(1))
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	env := &benchEnv{}
	if *benchServerProcess {
		p := startServerProcess(b, buildNATSServer(b))
		env.serverCPU = p.cpu
		env.connect = func(b *testing.B) *nats.Conn {
			b.Helper()
			nc, err := nats.Connect(p.url)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(nc.Close)
			return nc
		}
	} else {
		s := embeddedtest.RunServer(b)
		env.connect = func(b *testing.B) *nats.Conn { return embeddedtest.Connect(b, s) }
	}
	ctx := context.Background()
	nc := env.connect(b)
	if _, err := newAdmin(b, nc).Provision(ctx, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	rawConn := env.connect(b)
	raw, err := jetstream.New(rawConn)
	if err != nil {
		b.Fatal(err)
	}
	createRawStream(b, raw)
	bb, err := bus.New(env.connect(b), senderAgent)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.Close() })
	if _, err := newAdmin(b, nc, bus.WithRoot(aloneRoot)).Provision(ctx, bus.StreamConfig{Root: aloneRoot}); err != nil {
		b.Fatal(err)
	}
	ab, err := bus.New(env.connect(b), senderAgent, bus.WithRoot(aloneRoot), bus.WithoutLifecycle())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ab.Close() })
	env.bus, env.alone, env.raw, env.rawConn = bb, ab, raw, rawConn
	return env
}

// benchServerProcess runs the benchmarks that use benchEnv against a
// nats-server in a process of its own, over TCP on loopback, as in
// production, instead of an embedded server in the benchmark's process
// (in-process connections). Its own process keeps the server's heap, the
// stream's subject index with it, out of what the benchmark's garbage
// collector marks.
var benchServerProcess = flag.Bool("agentbus.server-process", false, "run the benchEnv benchmarks against a nats-server process of their own")

// benchConsumeProfile names the CPU profiles of the consume benchmarks:
// each sub-benchmark writes one, path-<name>, covering only what its clock
// times (from the first message handled to the last), not the backlog's
// publishing before it.
var benchConsumeProfile = flag.String("agentbus.consume-cpuprofile", "", "write a CPU profile of each consume benchmark's timed part to `path`-<sub-benchmark>")

// aloneRoot is the root of benchEnv.alone.
const aloneRoot = "alone"

// runBuses runs f as the two publishing bus sub-benchmarks: "bus" with
// lifecycle tracking and "bus-untracked" without, on a stream of its own
// (env.alone), each after reset.
func (env *benchEnv) runBuses(b *testing.B, f func(b *testing.B, bb *bus.Bus)) {
	b.Run("bus", func(b *testing.B) { env.reset(b); f(b, env.bus) })
	b.Run("bus-untracked", func(b *testing.B) { env.reset(b); f(b, env.alone) })
}

// reset purges the streams the publish sub-benchmarks fill, and collects
// garbage, so that each starts from the state the one before it started
// from: every message the bus and raw-headers send has a subject of its
// own, which the stream indexes in memory, and a later sub-benchmark would
// otherwise meet a larger index and a larger heap for the collector to
// mark, all in this process. A purge leaves the duplicate window's IDs,
// which is why bus-untracked publishes to a stream of its own.
func (env *benchEnv) reset(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	s := subjects.Default()
	alone, _ := subjects.New(aloneRoot)
	for _, name := range []string{"RAW", s.Stream(), "KV_" + s.StatusBucket(), alone.Stream()} {
		st, err := env.raw.Stream(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Purge(ctx); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
}

// waitAcked waits until every asynchronous publish js made is acknowledged,
// and stops b with what is missing after a minute.
func waitAcked(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatalf("%d publishes still unacknowledged after a minute", js.PublishAsyncPending())
	}
}

// createRawStream creates the raw side's stream, configured as the bus's
// under rawRoot.
func createRawStream(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	cfg, err := bus.StreamConfig{Root: rawRoot}.JetStream()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
}

// publishRaw publishes b.N messages that next makes asynchronously with
// raw nats.go.
func (env *benchEnv) publishRaw(b *testing.B, next func() *nats.Msg) {
	for range b.N {
		if _, err := env.raw.PublishMsgAsync(next()); err != nil {
			b.Fatal(err)
		}
	}
}

// recordServer starts a server of its own for a raw-headers-record
// sub-benchmark, stopped when it ends, with the raw side's stream and
// status bucket, and returns a JetStream context on it and the subject
// prefix of the bucket's keys. The status records it writes would
// otherwise leave the shared server busy (compacting, flushing) into the
// sub-benchmark that follows.
func recordServer(b *testing.B) (jetstream.JetStream, string) {
	js, err := jetstream.New(embeddedtest.Connect(b, embeddedtest.RunServer(b)))
	if err != nil {
		b.Fatal(err)
	}
	createRawStream(b, js)
	_, prefix := rawStatusBucket(b, js)
	return js, prefix
}

// rawStatusBucket creates the raw side's status bucket with js, configured
// as the bus's, and returns it and the subject prefix of its keys.
func rawStatusBucket(b *testing.B, js jetstream.JetStream) (jetstream.KeyValue, string) {
	cfg, err := bus.StreamConfig{Root: rawRoot}.StatusBucketConfig()
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return kv, rawScheme(b).StatusSubjectPrefix()
}

// publishPendingRecord publishes the pending record of m asynchronously
// with js, as the bus writes it (rawPendingRecord).
func publishPendingRecord(b *testing.B, js jetstream.JetStream, prefix string, m *nats.Msg) {
	rec, err := rawPendingRecord(prefix, m)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.PublishMsgAsync(rec); err != nil {
		b.Fatal(err)
	}
}

// rawPendingRecord returns the sender's pending record of m, a message
// with the bus's headers that starts a conversation of its own, as the bus
// writes it: JSON under the message's status key (prefix and
// subjects.StatusKey), created only if absent.
func rawPendingRecord(prefix string, m *nats.Msg) (*nats.Msg, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	return rawPendingRecordIn(prefix, id, m)
}

// rawPendingRecordIn is rawPendingRecord of m in the conversation
// correlationID names.
func rawPendingRecordIn(prefix, correlationID string, m *nats.Msg) (*nats.Msg, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	key, err := subjects.StatusKey(correlationID, id, senderAgent, receiverAgent)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	data, err := json.Marshal(bus.Status{ID: id, From: senderAgent, To: receiverAgent, Type: benchType,
		Priority: subjects.DefaultPriority, CorrelationID: correlationID, State: bus.StatePending, Time: now,
		Updated: now, By: senderAgent, Stream: "RAW", Sequence: 1})
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: prefix + key, Data: data,
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}}, nil
}

// BenchmarkPublishAsync measures async publish throughput: b.N publishes
// and the wait until every one is acknowledged, and for the bus every
// lifecycle record it wrote stored (Flush), all inside the timed region.
func BenchmarkPublishAsync(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	base := newBaselines()
	rawPublish := func(name string, next func() *nats.Msg) {
		b.Run(name, func(b *testing.B) {
			env.reset(b)
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			env.publishRaw(b, next)
			waitAcked(b, env.raw)
			b.StopTimer()
			base.set("", name, rate(b))
		})
	}
	rawPublish("raw", bareMessages(b, receiverAgent))
	rawPublish("raw-headers", busMessages(b, receiverAgent))
	rawPublish("raw-headers-unindexed", unindexedMessages(b, receiverAgent))
	b.Run("raw-headers-record", func(b *testing.B) {
		// What any design that writes a record per message pays: raw
		// nats.go publishing each message as raw-headers does, plus the
		// sender's pending record (the same key, JSON and create-only
		// header as the bus's) to a status bucket configured alike.
		js, prefix := recordServer(b)
		next := busMessages(b, receiverAgent)
		b.ReportAllocs()
		b.SetBytes(int64(len(payload)))
		b.ResetTimer()
		for range b.N {
			m := next()
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
			publishPendingRecord(b, js, prefix, m)
		}
		waitAcked(b, js)
		b.StopTimer()
		base.set("", "raw-headers-record", rate(b))
	})
	env.runBuses(b, func(b *testing.B, bb *bus.Bus) {
		b.ReportAllocs()
		b.SetBytes(int64(len(payload)))
		b.ResetTimer()
		for range b.N {
			if _, err := bb.PublishAsync(ctx, bus.Message{To: receiverAgent, Type: benchType, Data: payload}); err != nil {
				b.Fatal(err)
			}
		}
		// Until every publish and lifecycle record is stored: all the work
		// the publishes gave the server.
		if err := bb.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		base.report(b, "", rate(b))
	})
}

// BenchmarkPublishSync measures the latency of sync publishes, one after
// another, and reports its p50 and p99. Each publish is timed from making
// the message to its ack, on the raw side as on the bus's: the raw side's
// headers are copied from a prepared set, the cheapest way to the same
// message, and the bus encodes its own.
func BenchmarkPublishSync(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	base := newBaselines()
	rawPublish := func(name string, next func() *nats.Msg) {
		b.Run(name, func(b *testing.B) {
			env.reset(b)
			b.ReportAllocs()
			var lat []time.Duration
			for b.Loop() {
				start := time.Now() // making the message is part of the job, as for the bus
				m := next()
				if _, err := env.raw.PublishMsg(ctx, m); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			p50, p99 := latencyFigures(b, lat)
			base.set("p50-", name, p50)
			base.set("p99-", name, p99)
		})
	}
	rawPublish("raw", bareMessages(b, receiverAgent))
	rawPublish("raw-headers", busMessages(b, receiverAgent))
	rawPublish("raw-headers-unindexed", unindexedMessages(b, receiverAgent))
	b.Run("raw-headers-record", func(b *testing.B) {
		// The ceiling of a record per message: each message published as
		// raw-headers does and, once acknowledged, its pending record
		// written asynchronously, untimed, as the bus does.
		js, prefix := recordServer(b)
		next := busMessages(b, receiverAgent)
		b.ReportAllocs()
		var lat []time.Duration
		for b.Loop() {
			start := time.Now()
			m := next()
			if _, err := js.PublishMsg(ctx, m); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
			publishPendingRecord(b, js, prefix, m)
		}
		<-js.PublishAsyncComplete()
		p50, p99 := latencyFigures(b, lat)
		base.set("p50-", "raw-headers-record", p50)
		base.set("p99-", "raw-headers-record", p99)
	})
	env.runBuses(b, func(b *testing.B, bb *bus.Bus) {
		b.ReportAllocs()
		var lat []time.Duration
		for b.Loop() {
			start := time.Now()
			if _, err := bb.Publish(ctx, bus.Message{To: receiverAgent, Type: benchType, Data: payload}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		p50, p99 := latencyFigures(b, lat)
		base.report(b, "p50-", p50)
		base.report(b, "p99-", p99)
	})
	// The rows above run one after another, so a ratio between them also
	// measures whatever changed on the machine in between; on two shared
	// cores that moves p50 by a third from run to run. The paired rows
	// take turns instead: each iteration publishes one raw message and one
	// bus message, the order alternating, so both sides meet the same
	// moment of the machine, the same stream sizes and the same collector.
	pair := func(name string, bb *bus.Bus, next func() *nats.Msg) {
		b.Run(name, func(b *testing.B) {
			env.reset(b)
			b.ReportAllocs()
			var rawLat, busLat []time.Duration
			raw := func() {
				start := time.Now()
				m := next()
				if _, err := env.raw.PublishMsg(ctx, m); err != nil {
					b.Fatal(err)
				}
				rawLat = append(rawLat, time.Since(start))
			}
			viaBus := func() {
				start := time.Now()
				if _, err := bb.Publish(ctx, bus.Message{To: receiverAgent, Type: benchType, Data: payload}); err != nil {
					b.Fatal(err)
				}
				busLat = append(busLat, time.Since(start))
			}
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					raw()
					viaBus()
				} else {
					viaBus()
					raw()
				}
				i++
			}
			rawP50, rawP99 := percentiles(rawLat)
			busP50, busP99 := percentiles(busLat)
			b.ReportMetric(rawP50, "raw-p50-µs")
			b.ReportMetric(busP50, "bus-p50-µs")
			b.ReportMetric(busP50/rawP50, "p50-bus/raw")
			b.ReportMetric(busP99/rawP99, "p99-bus/raw")
		})
	}
	// The bus with its defaults beside raw-headers (both on indexed
	// subjects), and without lifecycle beside raw-headers-unindexed.
	pair("paired", env.bus, busMessages(b, receiverAgent))
	pair("paired-untracked", env.alone, unindexedMessages(b, receiverAgent))
}

// BenchmarkConsume measures subscribe+ack throughput of a backlog of b.N
// messages, from the start of the subscription until the last message is
// acknowledged (for the bus: and its lifecycle record stored). "raw" is a
// raw Consume with its default 500-message pull and explicit acks;
// "raw-headers" the same of messages with the bus's headers on a consumer
// with the bus's settings, decoding each event. "bus-defaults" subscribes
// with no options; "bus" and "bus-untracked" with a prefetch of 500.
// "dispatcher" is the bus's consumers and dispatcher doing raw-headers'
// job, without the bus's handler path (benchConsumeDispatcher).
func BenchmarkConsume(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	base := newBaselines()
	rawConsume := func(name string, sameJob bool) {
		b.Run(name, func(b *testing.B) {
			agent := env.name("raw-" + name)
			next := bareMessages(b, agent)
			cfg := jetstream.ConsumerConfig{
				Durable: agent, FilterSubject: rawDirect(b, agent, senderAgent, benchType), AckPolicy: jetstream.AckExplicitPolicy,
			}
			if sameJob {
				next = busMessages(b, agent)
				cfg = rawDirectConsumer(b, agent)
			}
			env.publishRaw(b, next)
			<-env.raw.PublishAsyncComplete()
			rc := env.connect(b)
			js, err := jetstream.New(rc)
			if err != nil {
				b.Fatal(err)
			}
			clock := env.consumeClock(b)
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			cons, err := js.CreateOrUpdateConsumer(ctx, "RAW", cfg)
			if err != nil {
				b.Fatal(err)
			}
			cc, err := cons.Consume(func(m jetstream.Msg) {
				if sameJob {
					if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
						b.Error(err)
					}
				}
				m.Ack()
				clock.handled()
			})
			if err != nil {
				b.Fatal(err)
			}
			<-clock.done
			b.StopTimer()
			msgs, cpu := clock.report(b)
			base.set("", name, msgs)
			base.set("cpu-", name, cpu)
			cc.Stop()
			<-cc.Closed()
		})
	}
	rawConsume("raw", false)
	rawConsume("raw-headers", true)
	b.Run("bus-defaults", func(b *testing.B) {
		benchConsumeBus(b, env, base, env.name("defaults"), nil)
	})
	b.Run("bus", func(b *testing.B) {
		benchConsumeBus(b, env, base, env.name("consumer"), []bus.SubscribeOption{bus.WithPrefetch(500)})
	})
	b.Run("bus-untracked", func(b *testing.B) {
		benchConsumeBus(b, env, base, env.name("untracked"), []bus.SubscribeOption{bus.WithPrefetch(500)}, bus.WithoutLifecycle())
	})
	b.Run("dispatcher", func(b *testing.B) {
		benchConsumeDispatcher(b, env, base, env.name("dispatcher"))
	})
}

// benchConsumeDispatcher is benchConsumeBus with the bus's handler path
// taken out: the backlog of agent, read through the consumers the bus
// creates for agent by the dispatcher the bus runs (package consumers, a
// prefetch of 500), each message decoded and acked as raw-headers does.
// Beside raw-headers it shows what the bus's delivery machinery costs
// (pull requests, lanes, priority pick); beside bus-untracked, what its
// handler path does.
func benchConsumeDispatcher(b *testing.B, env *benchEnv, base *baselines, agent string) {
	env.publishBacklog(b, agent)
	s := subjects.Default()
	cs, err := s.Consumers(agent)
	if err != nil {
		b.Fatal(err)
	}
	var (
		specs []consumers.Spec
		lanes []consumers.Lane
	)
	for _, c := range cs {
		specs = append(specs, consumers.Spec{Name: c.Name, FilterSubject: c.Filter, NewOnly: c.Broadcast})
		level := c.Priority - 1
		if c.Broadcast {
			level = consumers.AnyLevel
		}
		lanes = append(lanes, consumers.Lane{Consumer: c.Name, Level: level})
	}
	nc := env.connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := consumers.Ensure(context.Background(), js, s.Stream(), specs, consumers.Settings{}); err != nil {
		b.Fatal(err)
	}
	clock := env.consumeClock(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	d, err := consumers.Start(nc, s.Stream(), subjects.LowestPriority, lanes, func(_ context.Context, m *consumers.Msg) {
		if _, err := codec.Decode(m.Header, m.Data); err != nil {
			b.Error(err)
		}
		if err := m.Ack(); err != nil {
			b.Error(err)
		}
		clock.handled()
	}, consumers.Options{Prefetch: 500, LevelOf: func(string) int { return subjects.DefaultPriority - 1 }})
	if err != nil {
		b.Fatal(err)
	}
	<-clock.done
	b.StopTimer()
	clock.reportTo(b, base)
	d.Stop()
	<-d.Done()
}

// publishBacklog publishes b.N messages to agent as a bus with its
// defaults sends them, on indexed subjects, and waits until they are
// stored. The publisher writes no status for these messages (no TTL), so
// none of its work overlaps a consume measured after.
func (env *benchEnv) publishBacklog(b *testing.B, agent string) {
	b.Helper()
	for range b.N {
		if _, err := env.bus.PublishAsync(context.Background(), bus.Message{To: agent, Type: benchType, Data: payload}); err != nil {
			b.Fatal(err)
		}
	}
	if err := env.bus.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// benchConsumeBus publishes a backlog of b.N messages to agent and times
// how long a subscription of agent (a bus with opts, subscribed with
// subOpts) takes to handle and ack them, and reports the rate against the
// raw baselines in base, if any.
func benchConsumeBus(b *testing.B, env *benchEnv, base *baselines, agent string, subOpts []bus.SubscribeOption, opts ...bus.Option) {
	env.publishBacklog(b, agent)
	rb, err := bus.New(env.connect(b), agent, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Close()
	clock := env.consumeClock(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	sub, err := rb.Subscribe(context.Background(), func(context.Context, *bus.Delivery) error {
		clock.handled()
		return nil
	}, subOpts...)
	if err != nil {
		b.Fatal(err)
	}
	<-clock.done
	if err := rb.Flush(context.Background()); err != nil { // the lifecycle records too
		b.Fatal(err)
	}
	b.StopTimer()
	clock.reportTo(b, base)
	sub.Stop()
	<-sub.Done()
}

// consumeClock times a consume benchmark from the first message handled to
// the end, as agentbus bench does: creating the consumers, six for the bus
// and one on the raw side, is what BenchmarkSetupAgents measures. (ns/op,
// from the testing package, still includes it.)
type consumeClock struct {
	total          int64
	n              atomic.Int64
	first          atomic.Int64 // unix nanos of the first message handled
	firstCPU       atomic.Int64 // processCPU then
	serverCPU      func() time.Duration
	firstServerCPU atomic.Int64 // serverCPU then
	done           chan struct{}
	profile        *os.File // -agentbus.consume-cpuprofile
	profileErr     error    // starting it failed (another profile running)
}

// consumeClock returns a clock for b.N messages; against a server process
// it also reports the server's CPU per message.
func (env *benchEnv) consumeClock(b *testing.B) *consumeClock {
	c := &consumeClock{total: int64(b.N), serverCPU: env.serverCPU, done: make(chan struct{})}
	if *benchConsumeProfile != "" {
		name := *benchConsumeProfile + "-" + strings.ReplaceAll(b.Name(), "/", "-")
		f, err := os.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		c.profile = f
	}
	return c
}

// handled counts a message handled, and closes done at the last.
func (c *consumeClock) handled() {
	n := c.n.Add(1)
	if n == 1 {
		if c.serverCPU != nil {
			c.firstServerCPU.Store(int64(c.serverCPU()))
		}
		c.firstCPU.Store(int64(processCPU()))
		c.first.Store(time.Now().UnixNano())
		if c.profile != nil {
			if err := pprof.StartCPUProfile(c.profile); err != nil {
				c.profileErr, c.profile = err, nil
			}
		}
	}
	if n == c.total {
		if c.profile != nil {
			pprof.StopCPUProfile()
		}
		close(c.done)
	}
}

// report reports and returns the rate after the first message (msg/s) and
// the process's CPU time per message from the first message on
// (cpu-µs/msg): call it once done is closed and the work is finished.
func (c *consumeClock) report(b *testing.B) (msgs, cpu float64) {
	if c.profileErr != nil {
		b.Errorf("-agentbus.consume-cpuprofile: %v", c.profileErr)
	}
	if c.total < 2 {
		return 0, 0
	}
	elapsed := time.Since(time.Unix(0, c.first.Load()))
	msgs = float64(c.total-1) / elapsed.Seconds()
	b.ReportMetric(msgs, "msg/s")
	cpu = cpuPer(b, processCPU()-time.Duration(c.firstCPU.Load()), int(c.total-1), time.Microsecond, "cpu-µs/msg")
	if c.serverCPU != nil {
		cpuPer(b, c.serverCPU()-time.Duration(c.firstServerCPU.Load()), int(c.total-1), time.Microsecond, "server-cpu-µs/msg")
	}
	return msgs, cpu
}

// reportTo reports a bus row's rate and CPU per message, with its ratios
// to the raw rows in base.
func (c *consumeClock) reportTo(b *testing.B, base *baselines) {
	msgs, cpu := c.report(b)
	base.report(b, "", msgs)
	base.report(b, "cpu-", cpu)
}

// BenchmarkRequestReply measures the round trip of a request and its reply
// and reports its p50 and p99:
//
//	raw-core       core NATS nc.Request to a responder that echoes the payload
//	raw-jetstream  raw nats.go doing the bus's hops: the requester publishes
//	               the request (the bus's headers, a unique Nats-Msg-Id) to
//	               the stream; the responder reads it with a durable pull
//	               consumer, decodes it, publishes the reply to the stream
//	               and acks; the requester reads the reply from a durable
//	               pull consumer of its own, decodes and acks it
//	raw-jetstream-read
//	               the same with the responder reading the request's
//	               record before it handles it, as any design that keeps
//	               Cancel's promise must (recordRead): the floor of a
//	               tracked round trip of the bus
//	bus            Bus.Request to an agent whose handler answers with
//	               Bus.Reply, both agents subscribed with defaults
//	bus-queue-if-offline
//	               the same with QueueIfOffline: no presence read first
//	bus-untracked  the same with WithoutLifecycle on both sides: no records
//	               and no record read before the handler
//
// The floor reports its own ratio to raw-jetstream (p50-floor/...); the
// bus rows report theirs to raw-jetstream and to the floor. Every row but
// raw-core also splits the round trip where the responder's handler starts
// (legClock): to-handler-p50-µs and back-p50-µs.
func BenchmarkRequestReply(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	base := newBaselines()
	record := func(b *testing.B, name string, lat []time.Duration) {
		p50, p99 := latencyFigures(b, lat)
		base.set("p50-", name, p50)
		base.set("p99-", name, p99)
	}

	b.Run("raw-core", func(b *testing.B) {
		subject := env.name("raw.core.request")
		resp := env.connect(b)
		sub, err := resp.Subscribe(subject, func(m *nats.Msg) { m.Respond(m.Data) })
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := resp.Flush(); err != nil {
			b.Fatal(err)
		}
		req := env.connect(b)
		b.ReportAllocs()
		var lat []time.Duration
		for b.Loop() {
			start := time.Now()
			if _, err := req.Request(subject, payload, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		record(b, "raw-core", lat)
	})

	// rawRoundTrips is raw nats.go doing the bus's hops: the request stored
	// in the stream and consumed by the responder's durable consumer, the
	// reply stored and consumed by the requester's; with read, also the
	// responder's read of the request's record (recordRead).
	rawRoundTrips := func(b *testing.B, name string, read *recordRead) {
		requester, responder := env.name("raw-requester"), env.name("raw-responder")
		consume := func(agent string, f func(js jetstream.JetStream, m *codec.Message)) {
			consumeRawAgent(b, env, agent, f)
		}
		replySubject := rawDirect(b, requester, responder, "RESULT")
		legs := newLegClock()
		consume(responder, func(js jetstream.JetStream, req *codec.Message) {
			if read != nil {
				read.read(b, req)
			}
			legs.handlerStarted()
			reply := &codec.Message{From: responder, To: req.From, Type: "RESULT", CausationID: req.ID, CorrelationID: req.CorrelationID, Data: req.Data}
			m, err := encodeEvent(replySubject, reply)
			if err == nil {
				_, err = js.PublishMsg(ctx, m)
			}
			if err != nil {
				b.Error(err)
			}
		})
		replies := make(chan *codec.Message, 16)
		consume(requester, func(_ jetstream.JetStream, m *codec.Message) { replies <- m })
		subject := rawDirect(b, responder, requester, "REQUEST")
		timeout := time.NewTimer(time.Hour)
		defer timeout.Stop()
		b.ReportAllocs()
		var lat []time.Duration
		for b.Loop() {
			legs.sending()
			start := time.Now()
			req := &codec.Message{From: requester, To: responder, Type: "REQUEST", Data: payload}
			m, err := encodeEvent(subject, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := env.raw.PublishMsg(ctx, m); err != nil {
				b.Fatal(err)
			}
			timeout.Reset(10 * time.Second)
		wait:
			for {
				select {
				case reply := <-replies:
					if reply.CausationID == req.ID {
						break wait
					}
				case <-timeout.C:
					b.Fatalf("no reply to request %s in 10 s", req.ID)
				}
			}
			end := time.Now()
			lat = append(lat, end.Sub(start))
			legs.roundTrip(start, end)
		}
		record(b, name, lat)
		if raw := base.v["p50-"]["raw-jetstream"]; read != nil && raw > 0 {
			// What the lifecycle I/O alone costs: the floor's ratio to raw.
			b.ReportMetric(base.v["p50-"][name]/raw, "p50-floor/raw-jetstream")
		}
		legs.report(b)
	}
	b.Run("raw-jetstream", func(b *testing.B) { rawRoundTrips(b, "raw-jetstream", nil) })
	// The floor of a tracked round trip on this server: raw JetStream
	// with the lifecycle I/O any design of the bus's promises needs.
	b.Run("raw-jetstream-read", func(b *testing.B) {
		rawRoundTrips(b, "raw-jetstream-read", newRecordRead(b, env))
	})

	busRoundTrips := func(b *testing.B, opts []bus.Option, ropts ...bus.RequestOption) {
		requester, responder := env.name("requester"), env.name("responder")
		rb, err := bus.New(env.connect(b), responder, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer rb.Close()
		legs := newLegClock()
		rsub, err := rb.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
			legs.handlerStarted()
			_, err := d.Reply(ctx, bus.Message{Type: "RESULT", Data: d.Data})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { rsub.Stop(); <-rsub.Done() }()
		qb, err := bus.New(env.connect(b), requester, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer qb.Close()
		// The requester is an agent like any other, subscribed to its
		// inbox; the stored copy of each reply reaches it too.
		qsub, err := qb.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		defer func() { qsub.Stop(); <-qsub.Done() }()
		b.ReportAllocs()
		var lat []time.Duration
		for b.Loop() {
			legs.sending()
			start := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := qb.Request(rctx, bus.Message{To: responder, Type: "REQUEST", Data: payload}, ropts...)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			end := time.Now()
			lat = append(lat, end.Sub(start))
			legs.roundTrip(start, end)
		}
		p50, p99 := latencyFigures(b, lat)
		legs.report(b)
		base.report(b, "p50-", p50)
		base.report(b, "p99-", p99)
		b.StopTimer()
		if err := qb.Flush(ctx); err != nil {
			b.Error(err)
		}
		if err := rb.Flush(ctx); err != nil {
			b.Error(err)
		}
	}
	b.Run("bus", func(b *testing.B) { busRoundTrips(b, nil) })
	// What the recipient's presence read costs: QueueIfOffline skips it.
	b.Run("bus-queue-if-offline", func(b *testing.B) { busRoundTrips(b, nil, bus.QueueIfOffline()) })
	// What lifecycle tracking costs: no records, no record read before
	// the handler, plain subjects.
	b.Run("bus-untracked", func(b *testing.B) { busRoundTrips(b, []bus.Option{bus.WithoutLifecycle()}) })
}

// recordRead is the lifecycle I/O of a request that a tracked round trip
// of the bus cannot do without, done with raw nats.go on a bucket
// configured as the bus's status bucket, for the floor: the responder's
// read of the request's record before it handles the request. Every design
// keeping Cancel's promise needs it: a request canceled while queued never
// reaches a handler, and what says it was canceled when the request is
// delivered is its record, which Cancel writes.
//
// The bus writes no other record of a round trip but the requester's of
// the reply it took, which lets another process of the requester skip the
// reply's stored copy. A request has no pending record: it stays in the
// stream past its expiry, its own index (expiresAtRecipient). Its replied
// state is derived: the reply's ID is derived from the request's, and a
// lookup finds it by its indexed subject (docs/performance.md).
type recordRead struct {
	nc        *nats.Conn // the responder's, which reads
	directGet string     // of a direct get of one key
}

func newRecordRead(b *testing.B, env *benchEnv) *recordRead {
	b.Helper()
	cfg, err := bus.StreamConfig{Root: rawRoot}.StatusBucketConfig()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.raw.CreateOrUpdateKeyValue(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	return &recordRead{nc: env.connect(b), directGet: rawScheme(b).StatusDirectGetPrefix()}
}

// key returns the key of request m's record.
func (r *recordRead) key(b *testing.B, m *codec.Message) string {
	k, err := subjects.StatusKey(m.ID, m.ID, m.From, m.To)
	if err != nil {
		b.Fatal(err)
	}
	return k
}

// read reads request m's record, as the responder's bus does before its
// handler runs, and decodes it.
func (r *recordRead) read(b *testing.B, m *codec.Message) {
	resp, err := r.nc.Request(r.directGet+r.key(b, m), nil, 10*time.Second)
	if err != nil {
		b.Error(err)
		return
	}
	if code := resp.Header.Get("Status"); code != "" && code != "404" {
		b.Errorf("read record of %s: %s %s", m.ID, code, resp.Header.Get("Description"))
		return
	}
	if len(resp.Data) > 0 {
		var st bus.Status
		if err := json.Unmarshal(resp.Data, &st); err != nil {
			b.Error(err)
		}
	}
}

// legClock splits request round trips where the responder's handler
// starts: "to-handler" runs from the request's send to that moment, "back"
// from there until the requester has the reply. Their p50s say on which
// side of the handler a variant's time goes.
type legClock struct {
	started  chan time.Time // the handler's start of the current request
	to, back []time.Duration
}

func newLegClock() *legClock { return &legClock{started: make(chan time.Time, 1)} }

// handlerStarted is called by the responder's handler, first thing.
func (c *legClock) handlerStarted() {
	select {
	case c.started <- time.Now():
	default: // a second delivery of the same request: the first start counts
	}
}

// sending forgets a start left over from the last request (a redelivery of
// it), before the next is sent.
func (c *legClock) sending() {
	select {
	case <-c.started:
	default:
	}
}

// roundTrip records the legs of a round trip from start to end.
func (c *legClock) roundTrip(start, end time.Time) {
	select {
	case h := <-c.started:
		c.to, c.back = append(c.to, h.Sub(start)), append(c.back, end.Sub(h))
	default: // the handler's start is not in yet: the round trip is not split
	}
}

// report reports the p50 of each leg, in microseconds.
func (c *legClock) report(b *testing.B) {
	p50 := func(d []time.Duration) float64 {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return float64(d[len(d)/2]) / float64(time.Microsecond)
	}
	b.ReportMetric(p50(c.to), "to-handler-p50-µs")
	b.ReportMetric(p50(c.back), "back-p50-µs")
}

// BenchmarkIdleSubscriber reports the CPU time the whole process (client
// and in-process server) spends in 10 s with no traffic: "server" with no
// subscriber as the baseline, "subscribed" with one agent's subscription
// waiting on empty queues, "registered" with its card and presence too
// (a heartbeat every 10 s). Run with -benchtime 1x.
func BenchmarkIdleSubscriber(b *testing.B) {
	for _, name := range []string{"server", "subscribed", "registered"} {
		subscribed := name != "server"
		b.Run(name, func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			nc := embeddedtest.Connect(b, s)
			if _, err := newAdmin(b, nc).Provision(context.Background(), bus.StreamConfig{}); err != nil {
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
			if name == "registered" {
				if err := ab.Register(context.Background(), bus.AgentCard{}); err != nil {
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
