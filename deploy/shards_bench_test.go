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
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
)

// shardAgents is how many agents BenchmarkShards sets up in each
// sub-benchmark, spread evenly over its shards.
var shardAgents = flag.Int("agentbus.shard-agents", 3000, "agents BenchmarkShards sets up")

// BenchmarkShards measures how an installation grows past one stream and
// one server on the cluster of nats/ (three nats-server processes): it
// sets up -agentbus.shard-agents agents (bus.New and Subscribe with
// defaults, on one admin connection, one after another), spread over N
// shards, each shard a root of its own (bus.WithRoot) whose streams are
// provisioned with one replica, so that the cluster places each shard's
// stream, and with it the consumers of its agents, on one server. Run with
// -benchtime 1x:
//
//	shards=1  one stream: every agent's consumers on one server
//	shards=3  three streams, placed by the cluster (it spreads streams
//	          over the servers with the fewest)
//
// Each reports the time per agent (µs/agent), how many servers hold a
// shard's stream (servers-used), and the growth of each server's resident
// memory (/varz "mem") per agent set up: the most any one server grew
// (max-server-rss-KiB/agent, the figure that decides when a server is
// full) and all of them together (cluster-rss-KiB/agent).
//
// A shard here is a root: agents of different roots do not exchange
// messages through the bus. It measures the resources of the plan in
// docs/performance.md (shards placed on different servers), not the
// routing between shards, which is not built.
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
			for i := range roots {
				roots[i] = fmt.Sprintf("shard%d", i)
				if _, err := admin.Provision(ctx, bus.StreamConfig{Root: roots[i], Replicas: 1}); err != nil {
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
// new ones, spread over roots, reports its figures and closes them.
func measureShards(b *testing.B, ns []*node, nc *nats.Conn, roots []string, iteration int) {
	buses := make([]*bus.Bus, 0, *shardAgents)
	defer func() {
		var wg sync.WaitGroup
		for _, ab := range buses {
			wg.Go(func() { ab.Close() }) // stops its subscription
		}
		wg.Wait()
		b.StartTimer()
	}()
	before := rss(b, ns)
	start := time.Now()
	for i := range *shardAgents {
		ab, err := bus.New(nc, fmt.Sprintf("agent-%d-%d", iteration, i), bus.WithRoot(roots[i%len(roots)]))
		if err != nil {
			b.Fatal(err)
		}
		buses = append(buses, ab)
		if _, err := ab.Subscribe(context.Background(), func(context.Context, *bus.Delivery) error { return nil }); err != nil {
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
	b.ReportMetric(float64(elapsed.Microseconds())/float64(*shardAgents), "µs/agent")
	b.ReportMetric(slices.Max(grew), "max-server-rss-KiB/agent")
	b.ReportMetric(total, "cluster-rss-KiB/agent")
	b.ReportMetric(float64(serversUsed(b, nc, roots)), "servers-used")
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
