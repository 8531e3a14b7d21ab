package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// gatherAgents is how many agents each round of BenchmarkGather asks.
const gatherAgents = 100

// BenchmarkGather measures rounds of one request to gatherAgents agents
// and the wait for every reply, in the style of bench_test.go (the raw
// sub-benchmark first, the bus ones as ratios to it):
//
//	raw              raw nats.go doing the bus's hops: the requester
//	                 publishes one copy of the request per agent
//	                 (PublishMsgAsync, the bus's subject shape and headers:
//	                 ce- attributes, reply-by, expiry and Nats-TTL, a
//	                 unique Nats-Msg-Id); each agent reads its copy with a
//	                 durable pull consumer (the bus's settings), decodes
//	                 it, publishes its reply to the requester's subject
//	                 with a sync JetStream publish and acks; the requester
//	                 reads the replies with a durable pull consumer of its
//	                 own until it has all of them
//	bus              Bus.Gather to the agents, each subscribed with
//	                 defaults and answering with Delivery.Reply, the
//	                 requester subscribed with defaults too
//	bus-no-presence  the same with GatherOffline, which asks every agent
//	                 without reading its presence first
//	bus-untracked    the same as bus without lifecycle tracking on any
//	                 side (bus.WithoutLifecycle)
//
// Each agent is on a connection of its own, on both sides. The figures:
// the time per round (ms/round), the CPU time of the whole process per
// round (cpu-ms/round: the in-process server with both sides' clients,
// read with getrusage; for the bus with every lifecycle record stored) and,
// for the bus, the lifecycle records stored per round (records/round) and
// the time of the gatherAgents presence reads Gather makes before it
// publishes (presence-ms, measured after the rounds; GatherOffline skips
// them).
// The bus reports "time-bus/raw" and "cpu-bus/raw". Run (with 20 rounds
// the spread between runs on a shared machine is wider than the ratios):
//
//	go test -run '^$' -bench '^BenchmarkGather$' -benchtime 100x ./bus
func BenchmarkGather(b *testing.B) {
	env := newBenchEnv(b)
	base := newBaselines()
	b.Run("raw", func(b *testing.B) { benchGatherRaw(b, env, base) })
	b.Run("bus", func(b *testing.B) { benchGatherBus(b, env, base, nil) })
	b.Run("bus-no-presence", func(b *testing.B) {
		benchGatherBus(b, env, base, []bus.GatherOption{bus.GatherOffline()})
	})
	b.Run("bus-untracked", func(b *testing.B) { benchGatherBus(b, env, base, nil, bus.WithoutLifecycle()) })
}

// benchGatherRaw is BenchmarkGather's raw sub-benchmark.
func benchGatherRaw(b *testing.B, env *benchEnv, base *baselines) {
	ctx := context.Background()
	prefix := env.name("raw-gather")
	requester := prefix + "-requester"
	agents := make([]string, gatherAgents)
	requestSubjects := make([]string, gatherAgents)
	for i := range agents {
		agent := fmt.Sprintf("%s-agent-%03d", prefix, i)
		agents[i], requestSubjects[i] = agent, rawDirect(b, agent, requester, "REQUEST")
		replySubject := rawDirect(b, requester, agent, "RESULT")
		consumeRawAgent(b, env, agent, func(js jetstream.JetStream, req *codec.Message) {
			reply := &codec.Message{From: agent, To: req.From, Type: "RESULT", Priority: req.Priority,
				CorrelationID: req.CorrelationID, CausationID: req.ID, Data: req.Data,
				Extensions: map[string]string{bus.ExtReplyBy: req.Extensions[bus.ExtReplyBy]}}
			if err := publishEvent(ctx, js, replySubject, reply); err != nil {
				b.Error(err)
			}
		})
	}
	replies := make(chan *codec.Message, gatherAgents)
	consumeRawAgent(b, env, requester, func(_ jetstream.JetStream, m *codec.Message) { replies <- m })
	timeout := time.NewTimer(time.Hour)
	defer timeout.Stop()
	ttl := strconv.Itoa(int(bus.DefaultRequestTimeout / time.Second))
	b.ReportAllocs()
	cpu := processCPU()
	for b.Loop() {
		conversation := nuid.Next()
		replyBy := time.Now().Add(bus.DefaultRequestTimeout).UTC().Format(time.RFC3339Nano)
		asked := make(map[string]bool, gatherAgents)
		for i, agent := range agents {
			req := &codec.Message{From: requester, To: agent, Type: "REQUEST", CorrelationID: conversation,
				TTL: bus.DefaultRequestTimeout, Data: payload, Extensions: map[string]string{bus.ExtReplyBy: replyBy}}
			m, err := encodeEvent(requestSubjects[i], req)
			if err != nil {
				b.Fatal(err)
			}
			m.Header[jetstream.MsgTTLHeader] = []string{ttl}
			if _, err := env.raw.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
			asked[req.ID] = true
		}
		timeout.Reset(time.Minute)
		for got := 0; got < gatherAgents; {
			select {
			case m := <-replies:
				if asked[m.CausationID] {
					got++
				}
			case <-timeout.C:
				b.Fatalf("%d of %d replies after a minute", got, gatherAgents)
			}
		}
		<-env.raw.PublishAsyncComplete() // acknowledged long since: the replies came
	}
	reportRounds(b, base, "raw", processCPU()-cpu, 0)
}

// benchGatherBus is one of BenchmarkGather's bus sub-benchmarks: Gather
// with gopts, every agent's bus made with opts.
func benchGatherBus(b *testing.B, env *benchEnv, base *baselines, gopts []bus.GatherOption, opts ...bus.Option) {
	ctx := context.Background()
	prefix := env.name("gather")
	agents := make([]string, gatherAgents)
	buses := make([]*bus.Bus, 0, gatherAgents+1)
	for i := range agents {
		agents[i] = fmt.Sprintf("%s-agent-%03d", prefix, i)
		ab := newBenchBus(b, env, agents[i], opts...)
		subscribeBench(b, ab, func(ctx context.Context, d *bus.Delivery) error {
			_, err := d.Reply(ctx, bus.Message{Type: "RESULT", Data: d.Data})
			return err
		})
		buses = append(buses, ab)
	}
	qb := newBenchBus(b, env, prefix+"-requester", opts...)
	subscribeBench(b, qb, func(context.Context, *bus.Delivery) error { return nil })
	buses = append(buses, qb)
	records := statusRecords(b, env)
	b.ReportAllocs()
	cpu := processCPU()
	for b.Loop() {
		res, err := qb.Gather(ctx, bus.Message{Type: "REQUEST", Data: payload}, agents, gopts...)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Replies) != gatherAgents {
			b.Fatalf("%d replies, want %d", len(res.Replies), gatherAgents)
		}
	}
	// The CPU of every lifecycle record the rounds wrote too.
	for _, ab := range buses {
		if err := ab.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportRounds(b, base, "", processCPU()-cpu, statusRecords(b, env)-records)
	// The presence reads Gather makes before it publishes (unless
	// GatherOffline): one direct get of each agent's presence key, one
	// after another, as Bus.presenceOf makes it.
	start := time.Now()
	for _, agent := range agents {
		key, err := subjects.PresenceKey(agent)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := qb.Conn().Request(qb.Subjects().PresenceDirectGetPrefix()+key, nil, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start))/float64(time.Millisecond), "presence-ms")
}

// reportRounds reports the time and CPU per round of a benchmark whose
// loop (b.Loop) has ended: into base for the raw sub-benchmark name,
// against base for a bus one (name ""), which also reports the lifecycle
// records it stored.
func reportRounds(b *testing.B, base *baselines, name string, cpu time.Duration, records uint64) {
	ms := float64(b.Elapsed()) / float64(time.Millisecond) / float64(b.N)
	b.ReportMetric(ms, "ms/round")
	c := cpuPer(b, cpu, b.N, time.Millisecond, "cpu-ms/round")
	if name != "" {
		base.set("time-", name, ms)
		base.set("cpu-", name, c)
		return
	}
	base.report(b, "time-", ms)
	base.report(b, "cpu-", c)
	b.ReportMetric(float64(records)/float64(b.N), "records/round")
}

// groupMembers is the size of BenchmarkPublishGroup's group.
const groupMembers = 1000

// BenchmarkPublishGroup measures sending one message to a group of
// groupMembers agents, each of whose inboxes gets its own copy. The
// members are not running; their durable consumers exist (created once,
// outside the timer: several seconds), so that each copy is queued for
// them. In the style of bench_test.go:
//
//	raw            raw nats.go PublishMsgAsync of one copy per member (the
//	               bus's subject shape and headers: ce- attributes, the
//	               group extension, a unique Nats-Msg-Id) and the wait for
//	               every ack, to a stream with the same consumers as the
//	               bus's (rawConsumerConfigs of every member)
//	bus            Bus.PublishGroup, lifecycle on, then Bus.Flush (the
//	               pending record of each copy stored)
//	bus-untracked  the same without lifecycle tracking
//
// The figures: time per group message (ms/msg, for the bus with its Flush;
// call-ms/msg is PublishGroup's return alone), copies stored per second
// (copies/s), the process's CPU time per group message (cpu-ms/msg) and,
// for the bus, the lifecycle records stored per copy (records/copy) and
// the time of one GroupMembers read of the group (members-ms), which each
// PublishGroup makes first. The bus reports "bus/raw" for throughput and
// "cpu-bus/raw". Run:
//
//	go test -run '^$' -bench '^BenchmarkPublishGroup$' -benchtime 30x -timeout 30m ./bus
func BenchmarkPublishGroup(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	base := newBaselines()
	const group = "bench-group"
	sender := "group-sender"
	members := make([]string, groupMembers)
	rawSubjects := make([]string, groupMembers)
	var rawConsumers []jetstream.ConsumerConfig
	for i := range members {
		members[i] = fmt.Sprintf("member-%04d", i)
		rawSubjects[i] = rawDirect(b, members[i], sender, "NOTICE")
		rawConsumers = append(rawConsumers, rawConsumerConfigs(b, members[i])...)
	}
	setUpGroup(b, env, group, members, rawConsumers)

	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			conversation := nuid.Next()
			for i, member := range members {
				m, err := encodeEvent(rawSubjects[i], &codec.Message{From: sender, To: member, Type: "NOTICE",
					CorrelationID: conversation, Data: payload, Extensions: map[string]string{bus.ExtGroup: group}})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := env.raw.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			waitAcked(b, env.raw)
		}
		reportGroup(b, base, "raw", processCPU()-cpu)
	})
	busGroup := func(b *testing.B, opts ...bus.Option) {
		sb := newBenchBus(b, env, env.name(sender), opts...)
		records := statusRecords(b, env)
		var call time.Duration
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			start := time.Now()
			acks, err := sb.PublishGroup(ctx, group, bus.Message{Type: "NOTICE", Data: payload})
			if err != nil {
				b.Fatal(err)
			}
			if len(acks) != groupMembers {
				b.Fatalf("%d copies, want %d", len(acks), groupMembers)
			}
			call += time.Since(start)
			if err := sb.Flush(ctx); err != nil { // the records of the copies
				b.Fatal(err)
			}
		}
		reportGroup(b, base, "", processCPU()-cpu)
		b.ReportMetric(float64(call)/float64(time.Millisecond)/float64(b.N), "call-ms/msg")
		b.ReportMetric(float64(statusRecords(b, env)-records)/float64(b.N*groupMembers), "records/copy")
		const reads = 5
		start := time.Now()
		for range reads {
			if got, err := sb.GroupMembers(ctx, group); err != nil || len(got) != groupMembers {
				b.Fatalf("GroupMembers = %d members, %v; want %d", len(got), err, groupMembers)
			}
		}
		b.ReportMetric(float64(time.Since(start))/float64(time.Millisecond)/reads, "members-ms")
	}
	b.Run("bus", func(b *testing.B) { busGroup(b) })
	b.Run("bus-untracked", func(b *testing.B) { busGroup(b, bus.WithoutLifecycle()) })
}

// setUpGroup makes members the members of group, with an operator's
// AddToGroup, and creates the bus's consumers of each (Admin.EnsureConsumers)
// and the raw consumers rawConsumers, a few at a time.
func setUpGroup(b *testing.B, env *benchEnv, group string, members []string, rawConsumers []jetstream.ConsumerConfig) {
	b.Helper()
	ctx := context.Background()
	admin := newAdmin(b, env.connect(b))
	if err := admin.AddToGroup(ctx, group, members...); err != nil {
		b.Fatal(err)
	}
	const workers = 4
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	work := make(chan func() error)
	for range workers {
		wg.Go(func() {
			for f := range work {
				if err := f(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, member := range members {
		work <- func() error { return admin.EnsureConsumers(ctx, member) }
	}
	for _, cfg := range rawConsumers {
		work <- func() error {
			_, err := env.raw.CreateOrUpdateConsumer(ctx, "RAW", cfg)
			return err
		}
	}
	close(work)
	wg.Wait()
	// Deleting the streams drops their consumers in half a second; the
	// server's shutdown takes two minutes over the 12,000 of them (file
	// storage).
	b.Cleanup(func() {
		for _, stream := range []string{"RAW", subjects.Default().Stream()} {
			if err := env.raw.DeleteStream(context.Background(), stream); err != nil {
				b.Error(err)
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}

// reportGroup reports the figures of a BenchmarkPublishGroup sub-benchmark
// whose loop has ended: into base for the raw sub-benchmark name, against
// base for a bus one (name "").
func reportGroup(b *testing.B, base *baselines, name string, cpu time.Duration) {
	b.ReportMetric(float64(b.Elapsed())/float64(time.Millisecond)/float64(b.N), "ms/msg")
	copies := float64(b.N*groupMembers) / b.Elapsed().Seconds()
	b.ReportMetric(copies, "copies/s")
	c := cpuPer(b, cpu, b.N, time.Millisecond, "cpu-ms/msg")
	if name != "" {
		base.set("", name, copies)
		base.set("cpu-", name, c)
		return
	}
	base.report(b, "", copies)
	base.report(b, "cpu-", c)
}
