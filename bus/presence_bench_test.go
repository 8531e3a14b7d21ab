package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// BenchmarkPresenceHeartbeats measures what heartbeats cost: one op is one
// round, a heartbeat of each of N agents, written as Bus.Register writes
// them (a structured CloudEvent of ~250 bytes with a Nats-TTL of three
// intervals, to each agent's presence key), asynchronously, on the
// in-process server with file storage. It reports the time per heartbeat
// (client and server together), what the registry stream holds per agent,
// and, from those, the share of one core that 10,000 agents at the default
// 10 s interval (1,000 writes a second) take.
//
//	go test -run '^$' -bench PresenceHeartbeats -benchtime 10x ./bus
func BenchmarkPresenceHeartbeats(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			nc := embeddedtest.Connect(b, s)
			ctx := context.Background()
			if _, err := newAdmin(b, nc).Provision(ctx, bus.StreamConfig{}); err != nil {
				b.Fatal(err)
			}
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4000))
			if err != nil {
				b.Fatal(err)
			}
			scheme := subjects.Default()
			msgs := heartbeats(n, "30")
			round := func() {
				for _, m := range msgs {
					if _, err := js.PublishMsgAsync(m); err != nil {
						b.Fatal(err)
					}
				}
				<-js.PublishAsyncComplete()
			}
			round() // every key exists before timing
			start := time.Now()
			for b.Loop() {
				round()
			}
			perBeat := time.Since(start) / time.Duration(b.N*n)
			st, err := js.Stream(ctx, "KV_"+scheme.PresenceBucket())
			if err != nil {
				b.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(perBeat.Nanoseconds()), "ns/heartbeat")
			b.ReportMetric(float64(info.State.Bytes)/float64(n), "stored-B/agent")
			b.ReportMetric(float64(perBeat.Nanoseconds())*1000/1e9*100, "%core@10k-agents")
		})
	}
}

// BenchmarkPresenceServerMemory reports what the presence of 10,000
// agents costs the server, in a process of its own: the growth of its heap
// after a GC and of its resident memory per agent once each agent's
// presence record (with its TTL) is stored, and then per process once each
// answers on its agent's processes subject (subjects.Scheme.ProcessesSubject),
// one core subscription as Register makes it.
//
//	go test -run '^$' -bench PresenceServerMemory -benchtime 1x ./bus
func BenchmarkPresenceServerMemory(b *testing.B) {
	const n = 10_000
	srv := startServerProcess(b, buildNATSServer(b))
	nc, err := nats.Connect(srv.url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	if _, err := newAdmin(b, nc).Provision(ctx, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4000))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		before := srv.stats(b)
		for _, m := range heartbeats(n, "3600") {
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		after := srv.stats(b)
		b.ReportMetric((after.heap-before.heap)/n, "server-heap-B/agent")
		b.ReportMetric((after.rss-before.rss)/n, "server-rss-B/agent")

		before = after
		subs := make([]*nats.Subscription, n)
		for i := range subs {
			subject, _ := subjects.Default().ProcessesSubject(fmt.Sprintf("agent-%05d", i))
			if subs[i], err = nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
				b.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		after = srv.stats(b)
		b.ReportMetric((after.heap-before.heap)/n, "server-heap-B/process")
		b.ReportMetric((after.rss-before.rss)/n, "server-rss-B/process")
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
}

// heartbeats returns one presence record of each of n agents, as
// Bus.Register writes them, with a TTL of ttl seconds.
func heartbeats(n int, ttl string) []*nats.Msg {
	prefix := subjects.Default().PresenceSubjectPrefix()
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		agent := fmt.Sprintf("agent-%05d", i)
		key, _ := subjects.PresenceKey(agent)
		data, _ := json.Marshal(map[string]any{
			"specversion": "1.0", "id": "3f0c5e2a-8d1b-4a7e-9c55-2f1d8e0c9b7a", "source": "/agents/" + agent,
			"type": bus.EventPresenceOnline, "time": time.Now().UTC(), "datacontenttype": "application/json",
			"data": map[string]any{"agent": agent, "status": "online", "since": time.Now().UTC(), "interval": "10s"},
		})
		msgs[i] = &nats.Msg{Subject: prefix + key, Data: data, Header: nats.Header{jetstream.MsgTTLHeader: []string{ttl}}}
	}
	return msgs
}

// BenchmarkPresenceDetection measures how long after a registered agent's
// process dies a watcher learns it is offline, with a heartbeat of 1 s:
// three missed heartbeats, then the server's expiry and the watcher.
//
//	go test -run '^$' -bench PresenceDetection -benchtime 3x ./bus
func BenchmarkPresenceDetection(b *testing.B) {
	s := embeddedtest.RunServer(b)
	ctx := context.Background()
	admin := newAdmin(b, embeddedtest.Connect(b, s))
	if _, err := admin.Provision(ctx, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	changes := make(chan bus.PresenceChange, 16)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go admin.WatchPresence(wctx, func(c bus.PresenceChange) { changes <- c }) //nolint:errcheck // ends with wctx
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		agent := fmt.Sprintf("agent-%d", i)
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		ab, err := bus.New(nc, agent, bus.WithHeartbeat(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := ab.Register(ctx, bus.AgentCard{}); err != nil {
			b.Fatal(err)
		}
		for c := range changes {
			if c.Agent == agent && c.Presence.Status == bus.Online {
				break
			}
		}
		nc.Close()
		killed := time.Now()
		for c := range changes {
			if c.Agent == agent && c.Presence.Status == bus.Offline {
				break
			}
		}
		total += time.Since(killed)
		ab.Close()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/detection")
}
