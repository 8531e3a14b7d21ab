//go:build unix

package deploy_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

// shardAgents is how many agents BenchmarkShards sets up in each
// sub-benchmark, spread evenly over its shards.
var shardAgents = flag.Int("agentbus.shard-agents", 3000, "agents BenchmarkShards sets up")

// BenchmarkShards measures how an installation grows past one stream and
// one server on the cluster of nats/ (three nats-server processes): it
// sets up -agentbus.shard-agents agents (bus.NewShards and Subscribe with
// defaults on the agent's own shard, on one admin connection, one after
// another) on an installation of N shards (subjects.ShardRoot), each
// provisioned with one replica, then sends each agent one message from an
// agent of its own, routed to the recipient's shard (Bus.Publish of bus.Shards).
// Run with -benchtime 1x:
//
//	shards=1  one stream: every agent's consumers on one server
//	shards=3  three streams, shard k placed on node k by its server tag
//	          (StreamConfig.Tags, server_tags in nats/node-N.conf)
//
// Each reports the time per agent set up (µs/agent), how many servers hold
// a shard's stream (servers-used), the growth of each server's resident
// memory (/varz "mem") per agent set up: the most any one server grew
// (max-server-rss-KiB/agent, the figure that decides when a server is
// full) and all of them together (cluster-rss-KiB/agent), and the time
// per message from the first send until every agent has handled its
// message (routed-µs/msg).
func BenchmarkShards(b *testing.B) {
	natsServer, _ := binaries(b)
	for _, shards := range []int{1, 3} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			ns := startCluster(b, natsServer)
			nc, err := nats.Connect(ns[0].url(), nats.UserInfo(adminUser, adminPassword))
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			ctx := context.Background()
			admin, err := bus.NewAdmin(nc)
			if err != nil {
				b.Fatal(err)
			}
			defer admin.Close()
			roots := make([]string, shards)
			for k := range roots {
				if roots[k], err = subjects.ShardRoot("", k, shards); err != nil {
					b.Fatal(err)
				}
				cfg := bus.StreamConfig{Root: roots[k], Replicas: 1}
				if shards > 1 {
					cfg.Tags = []string{"node:" + ns[k%len(ns)].name}
				}
				if _, err := admin.Provision(ctx, cfg); err != nil {
					b.Fatal(err)
				}
			}
			iteration := 0
			for b.Loop() {
				iteration++
				measureShards(b, ns, nc, roots, iteration)
			}
		})
	}
}

// measureShards sets up the agents of one iteration of BenchmarkShards,
// new ones, on an installation of len(roots) shards, sends each one
// message, reports its figures and closes them.
func measureShards(b *testing.B, ns []*node, nc *nats.Conn, roots []string, iteration int) {
	ctx := context.Background()
	handles := make([]*bus.Shards, 0, *shardAgents)
	defer func() {
		var wg sync.WaitGroup
		for _, h := range handles {
			wg.Go(func() { h.Close() }) // stops its subscription
		}
		wg.Wait()
		b.StartTimer()
	}()
	var handled atomic.Int64
	handle := func(context.Context, *bus.Delivery) error {
		handled.Add(1)
		return nil
	}
	before := rss(b, ns)
	start := time.Now()
	for i := range *shardAgents {
		h, err := bus.NewShards(nc, fmt.Sprintf("agent-%d-%d", iteration, i), len(roots))
		if err != nil {
			b.Fatal(err)
		}
		handles = append(handles, h)
		if _, err := h.Bus().Subscribe(ctx, handle); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	after := rss(b, ns)
	grew := make([]float64, len(ns))
	var total float64
	for i := range ns {
		grew[i] = (after[i] - before[i]) / 1024 / float64(*shardAgents)
		total += grew[i]
	}
	sender, err := bus.NewShards(nc, fmt.Sprintf("sender-%d", iteration), len(roots))
	if err != nil {
		b.Fatal(err)
	}
	handles = append(handles, sender)
	start = time.Now()
	for _, h := range handles[:*shardAgents] {
		if _, err := sender.Bus().Publish(ctx, bus.Message{To: h.Bus().Agent(), Type: "TASK"}); err != nil {
			b.Fatal(err)
		}
	}
	if err := poll(time.Minute, func() bool { return handled.Load() == int64(*shardAgents) }); err != nil {
		b.Fatalf("%d of %d messages handled: %v", handled.Load(), *shardAgents, err)
	}
	routed := time.Since(start)
	b.ReportMetric(float64(elapsed.Microseconds())/float64(*shardAgents), "µs/agent")
	b.ReportMetric(slices.Max(grew), "max-server-rss-KiB/agent")
	b.ReportMetric(total, "cluster-rss-KiB/agent")
	b.ReportMetric(float64(serversUsed(b, nc, roots)), "servers-used")
	b.ReportMetric(float64(routed.Microseconds())/float64(*shardAgents), "routed-µs/msg")
}

// rss returns each node's resident memory, from /varz.
func rss(b *testing.B, ns []*node) []float64 {
	out := make([]float64, len(ns))
	for i, n := range ns {
		resp, err := monitorClient.Get(fmt.Sprintf("http://127.0.0.1:%d/varz", n.http))
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		var varz struct {
			Mem int64 `json:"mem"`
		}
		if err := json.Unmarshal(body, &varz); err != nil {
			b.Fatalf("%s /varz: %v", n.name, err)
		}
		out[i] = float64(varz.Mem)
	}
	return out
}

// serversUsed returns how many servers lead the messages streams of roots.
func serversUsed(b *testing.B, nc *nats.Conn, roots []string) int {
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	leaders := map[string]bool{}
	for _, root := range roots {
		cfg, err := bus.StreamConfig{Root: root}.JetStream()
		if err != nil {
			b.Fatal(err)
		}
		s, err := js.Stream(context.Background(), cfg.Name)
		if err != nil {
			b.Fatal(err)
		}
		if c := s.CachedInfo().Cluster; c != nil {
			leaders[c.Leader] = true
		}
	}
	return len(leaders)
}
