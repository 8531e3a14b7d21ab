package bus_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// replicatedCluster starts a 3-node cluster, provisions the bus on it
// with three replicas of everything, and waits for the leaders of the
// message stream and of the other streams the test uses.
func replicatedCluster(t *testing.T, streams ...string) *embedded.Cluster {
	t.Helper()
	c := embeddedtest.RunCluster(t, 3)
	info, err := newAdmin(t, embeddedtest.Connect(t, c.Servers()[0])).Provision(testContext(t), bus.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if info.Config.Replicas != 3 {
		t.Fatalf("replicas = %d, want 3", info.Config.Replicas)
	}
	for _, stream := range append([]string{info.Config.Name}, streams...) {
		if _, err := c.WaitForStreamLeader(testContext(t), "", stream); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestClusterReplicatedStream: on a 3-node cluster, a stream with three
// replicas carries messages between agents connected to different nodes,
// in priority order: the order of what every replica has stored when the
// agent starts (docs/architecture.md: a look that a replica behind the
// others answers can miss a message acknowledged a moment before).
func TestClusterReplicatedStream(t *testing.T) {
	nodes := replicatedCluster(t).Servers()
	sender := newBus(t, nodes[1], "planner")
	var last bus.PubAck
	for i, p := range []int{4, 1, 3} {
		last = publish(t, sender, bus.Message{To: "builder", Type: fmt.Sprintf("p%d-%d", p, i), Priority: p})
	}
	storedEverywhere(t, nodes, last)
	r := newRecorder()
	subscribe(t, newBus(t, nodes[2], "builder"), r.handle)
	r.waitCount(t, 3)
	if got, want := r.types(), []string{"p1-1", "p3-2", "p4-0"}; !slices.Equal(got, want) {
		t.Errorf("handled %v, want %v", got, want)
	}
}

// storedEverywhere waits until every node's replica of the stream ack
// names has stored it.
func storedEverywhere(t *testing.T, nodes []*embedded.Server, ack bus.PubAck) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s sequence %d on every replica", ack.Stream, ack.Sequence), func() (bool, string) {
		var seqs []uint64
		for _, n := range nodes {
			js, err := n.NATS().Jsz(&server.JSzOptions{Accounts: true, Streams: true})
			if err != nil {
				return false, err.Error()
			}
			var seq uint64
			for _, a := range js.AccountDetails {
				for _, st := range a.Streams {
					if st.Name == ack.Stream {
						seq = st.State.LastSeq
					}
				}
			}
			seqs = append(seqs, seq)
		}
		return slices.Min(seqs) >= ack.Sequence, fmt.Sprintf("last sequences %v", seqs)
	})
}

// TestClusterRequestReply: on a 3-node cluster with three replicas, a
// request and its reply between agents on two nodes write no record of the
// request, and a lookup through the third reads it replied, off the reply
// it finds by the derived ID on a replica.
func TestClusterRequestReply(t *testing.T) {
	scheme := subjects.Default()
	nodes := replicatedCluster(t, "KV_"+scheme.StatusBucket(), "KV_"+scheme.RegistryBucket(), "KV_"+scheme.PresenceBucket()).Servers()
	worker := newBus(t, nodes[2], "worker")
	replier(t, worker)
	orch := newBus(t, nodes[1], "orchestrator")
	subscribe(t, orch, func(context.Context, *bus.Delivery) error { return nil })
	reply, err := orch.Request(testContext(t), bus.Message{ID: "cluster-q", To: "worker", Type: "REQUEST", CorrelationID: "conv-cluster"})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	noRequestRecord(t, nodes[0], orch, worker, "conv-cluster", "cluster-q")
	lookup := newBus(t, nodes[0], "orchestrator")
	if st := waitState(t, lookup, "cluster-q", bus.StateReplied); st.ReplyID != reply.ID || st.By != "worker" {
		t.Errorf("status %+v, want replied by worker with %s", st, reply.ID)
	}
	// The cluster shuts down with nothing left to write or replicate.
	for _, b := range []*bus.Bus{lookup, orch, worker} {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitReplicasCurrent(t, embeddedtest.Connect(t, nodes[0]))
}

// waitReplicasCurrent waits until every replica of every stream and of
// its consumers is current: a Raft group still being made when the
// cluster shuts down is stopped late, and its goroutines outlive the test.
func waitReplicasCurrent(t *testing.T, nc *nats.Conn) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	current := func(name string, ci *jetstream.ClusterInfo, replicas int) (bool, string) {
		if ci == nil || len(ci.Replicas) != replicas-1 {
			return false, fmt.Sprintf("%s: %+v", name, ci)
		}
		for _, r := range ci.Replicas {
			if !r.Current {
				return false, fmt.Sprintf("%s: replica %s not current", name, r.Name)
			}
		}
		return true, ""
	}
	// Each list is read to its end before it is judged: nats.go's lister
	// sends on an unbuffered channel without watching its context, and
	// one left half read would wait for ever (goleak caught it).
	waitFor(t, "every stream's and consumer's replicas current", func() (bool, string) {
		ctx := testContext(t)
		streams := js.ListStreams(ctx)
		var sis []*jetstream.StreamInfo
		for si := range streams.Info() {
			sis = append(sis, si)
		}
		if err := streams.Err(); err != nil || len(sis) == 0 {
			return false, fmt.Sprintf("%d streams, %v", len(sis), err)
		}
		for _, si := range sis {
			if ok, why := current(si.Config.Name, si.Cluster, si.Config.Replicas); !ok {
				return false, why
			}
			s, err := js.Stream(ctx, si.Config.Name)
			if err != nil {
				return false, err.Error()
			}
			consumers := s.ListConsumers(ctx)
			var cis []*jetstream.ConsumerInfo
			for ci := range consumers.Info() {
				cis = append(cis, ci)
			}
			if err := consumers.Err(); err != nil {
				return false, err.Error()
			}
			for _, ci := range cis {
				replicas := cmp.Or(ci.Config.Replicas, si.Config.Replicas)
				if ok, why := current(si.Config.Name+"/"+ci.Name, ci.Cluster, replicas); !ok {
					return false, why
				}
			}
		}
		return true, ""
	})
}

// TestClusterSchedule: on a 3-node cluster with three replicas, a message
// scheduled through one node reaches an agent on another when it is due:
// the replicated schedule stream fires it and the message stream sources
// it.
func TestClusterSchedule(t *testing.T) {
	nodes := replicatedCluster(t, subjects.Default().ScheduleStream()).Servers()
	ctx := testContext(t)
	js, err := jetstream.New(embeddedtest.Connect(t, nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	// The message stream's leader sets its source up a few hundred
	// milliseconds after it is elected. Should that fail, nats-server
	// tries again only about 10 s later, then 20 s, up to 2 minutes
	// (retryBackOff in its stream.go), and the fired message waits.
	waitFor(t, "the message stream to source the schedule stream", func() (bool, string) {
		return sourcing(ctx, js)
	})
	ack, err := newBus(t, nodes[1], "planner").Schedule(ctx, bus.Message{To: "builder", Type: "nightly"}, bus.In(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	// A firing notice can go unsent while the schedule stream's leader
	// changes, as it may in a cluster just formed: the subscriber's looks
	// at the stream, made every second here, find the message then.
	subscribe(t, newBus(t, nodes[2], "builder"), r.handle, bus.WithLooks(2*time.Second, time.Second))
	waitFor(t, "the scheduled message", func() (bool, string) {
		_, source := sourcing(ctx, js)
		return len(r.deliveries()) == 1, fmt.Sprintf("%d deliveries; %s", len(r.deliveries()), source)
	})
	if d := r.deliveries()[0]; d.ID != ack.ID {
		t.Errorf("delivered %s, want %s", d.ID, ack.ID)
	}
}

// sourcing reports whether the message stream's source of the schedule
// stream is active, and its state.
func sourcing(ctx context.Context, js jetstream.JetStream) (bool, string) {
	s, err := js.Stream(ctx, subjects.Default().Stream())
	if err != nil {
		return false, err.Error()
	}
	for _, src := range s.CachedInfo().Sources {
		if src.Name == subjects.Default().ScheduleStream() {
			return src.Active >= 0 && src.Error == nil,
				fmt.Sprintf("source %s: last active %v ago, lag %d, error %v", src.Name, src.Active, src.Lag, src.Error)
		}
	}
	return false, "the message stream has no source of the schedule stream"
}

// TestClusterQuorumLossIsUnavailable: a replicated stream that lost its
// quorum is reported as unavailable, not as missing.
func TestClusterQuorumLossIsUnavailable(t *testing.T) {
	c := replicatedCluster(t)
	sender := newBus(t, c.Servers()[0], "planner")
	publish(t, sender, bus.Message{To: "builder", Type: "before"})
	for _, i := range []int{1, 2} {
		if err := c.StopServer(i); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
	defer cancel()
	// Without a leader the publish either gets no answer in time (the
	// caller's deadline) or is told no stream answered: never that the
	// stream does not exist.
	_, err := sender.Publish(ctx, bus.Message{To: "builder", Type: "during"})
	if errors.Is(err, bus.ErrNotProvisioned) || !(errors.Is(err, bus.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		t.Errorf("publish without quorum: %v, want ErrUnavailable or the deadline", err)
	}
}

// TestClusterPublishToALeaderWithoutQuorum: a Publish through the stream's
// leader after its two peers stopped, with time to spare, ends with an
// error wrapping ErrUnavailable once its attempts are spent. Before, the
// leader's answer to the attempts after the first, "duplicate message id
// is in process" (its proposal of the first waits for a quorum), came back
// as it was, a 409 that reads as if the message were stored, and the
// attempts were spent 100 and 200 ms apart (found by hunt h11).
func TestClusterPublishToALeaderWithoutQuorum(t *testing.T) {
	c := replicatedCluster(t)
	leader, err := c.WaitForStreamLeader(testContext(t), "", subjects.Default().Stream())
	if err != nil {
		t.Fatal(err)
	}
	li := c.Index(leader)
	sender := newBus(t, leader, "planner")
	publish(t, sender, bus.Message{To: "builder", Type: "before"})
	for i := range 3 {
		if i != li {
			if err := c.StopServer(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sender.Publish(ctx, bus.Message{ID: "during", To: "builder", Type: "during"}); !errors.Is(err, bus.ErrUnavailable) {
		t.Errorf("publish without quorum: %v, want an error wrapping ErrUnavailable", err)
	}
}

// TestClusterPresence: on a 3-node cluster with a replicated registry, an
// agent on one node is seen online from another, offline at once after a
// clean shutdown, and, after a crash that takes its node down too, offline
// three heartbeats later, from the server's expiry of its record, with no
// client watching. A node going down loses the answers to some consumer
// creates: before the registry's reads asked again (askAgain in newReader),
// one read in four here waited out its whole context.
func TestClusterPresence(t *testing.T) {
	c := replicatedCluster(t, "KV_AGENTBUS_AGENTS", "KV_AGENTBUS_PRESENCE")
	nodes := c.Servers()
	observer := newBus(t, nodes[0], "observer")

	clean := newBus(t, nodes[1], "clean", bus.WithHeartbeat(time.Second))
	if err := clean.Register(testContext(t), bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	agentInfo(t, observer, "clean", bus.Online)
	clean.Close()
	if a := agentInfo(t, observer, "clean", bus.Offline); a.Presence.Reason != bus.ReasonShutdown {
		t.Errorf("clean shutdown: %+v", a.Presence)
	}

	nc := embeddedtest.Connect(t, nodes[2])
	crashy, err := bus.New(nc, "crashy", bus.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer crashy.Close()
	if err := crashy.Register(testContext(t), bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	agentInfo(t, observer, "crashy", bus.Online)
	nc.Close()
	if err := c.StopServer(2); err != nil {
		t.Fatal(err)
	}
	if a := agentInfo(t, observer, "crashy", bus.Offline); a.Presence.Reason != bus.ReasonSilent {
		t.Errorf("crash: %+v", a.Presence)
	}
}

// TestClusterConsumerCreatedWhenDueReportsNothing: on a 3-node cluster, the
// processes of an agent on two nodes, subscribed before its first message,
// take it once the consumer is created when due, and report nothing. A
// consumer a cluster has just created answers pulls with 503 for tens of
// milliseconds, and the process that did not create it reported those as
// a failed pull: 8 to 10 reports for these four agents in three runs,
// before the dispatcher gave them a grace of a second.
func TestClusterConsumerCreatedWhenDueReportsNothing(t *testing.T) {
	nodes := replicatedCluster(t).Servers()
	sender := newBus(t, nodes[0], "planner")
	var errs errorTally
	agents := []string{"w0", "w1", "w2", "w3"}
	var processes []*bus.Bus
	r := newRecorder()
	for _, agent := range agents {
		for _, node := range nodes[1:] {
			b := newBus(t, node, agent, bus.WithErrorHandler(errs.add))
			subscribe(t, b, r.handle)
			processes = append(processes, b)
		}
	}
	for _, agent := range agents {
		publish(t, sender, bus.Message{To: agent, Type: "first"})
	}
	r.waitCount(t, len(agents))
	// Both processes of each agent pull from its consumer: each had its
	// answer from it.
	for i, agent := range agents {
		waitFor(t, agent+"'s processes waiting on its consumer", func() (bool, string) {
			info, err := consumerInfo(t, processes[2*i], agent+"_p3")
			return err == nil && info.NumWaiting == 2, fmt.Sprint(info, err)
		})
	}
	if n := errs.total(); n != 0 {
		t.Errorf("%d errors reported: %v", n, &errs)
	}
}

// TestClusterQuorumLossEveryCall: with two of three nodes stopped and no
// meta leader, every call of a bus and an admin through the remaining node
// answers, or fails as unavailable or at its deadline: never blaming a
// missing stream or server feature, nor with the JetStream API's raw
// answer. Before, about twenty of them (Subscribe, EnsureConsumers, the
// admin's reads, the dead letters) returned the API's "503 JetStream
// system temporarily unavailable" as it was (found by hunt h11).
func TestClusterQuorumLossEveryCall(t *testing.T) {
	c := replicatedCluster(t, "KV_AGENTBUS_STATUS", "KV_AGENTBUS_AGENTS", "KV_AGENTBUS_PRESENCE")
	nodes := c.Servers()
	b := newBus(t, nodes[0], "caller")
	other := newBus(t, nodes[0], "other")
	subscribe(t, other, func(context.Context, *bus.Delivery) error { return nil })
	sent := publish(t, b, bus.Message{To: "other", Type: "TASK"})
	if err := b.JoinGroup(testContext(t), "crew"); err != nil {
		t.Fatal(err)
	}
	a := adminOf(t, nodes[0])
	for _, i := range []int{1, 2} {
		if err := c.StopServer(i); err != nil {
			t.Fatal(err)
		}
	}
	// The node left alone may have been handed the meta leadership by a
	// node that stopped; it steps down once it finds its quorum lost.
	embeddedtest.WaitFor(t, 45*time.Second, "no meta leader", func() (bool, string) {
		l := c.MetaLeader()
		return l == nil, fmt.Sprint("meta leader ", l)
	})
	check := func(t *testing.T, err error) {
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, bus.ErrUnsupportedServer), errors.Is(err, bus.ErrNotProvisioned):
			t.Errorf("without quorum: %v; it blames what it cannot know", err)
		case errors.As(err, &apiErr) && !errors.Is(err, bus.ErrUnavailable):
			t.Errorf("without quorum: %v; want ErrUnavailable", err)
		}
	}
	eachCall(t, busCalls(b, sent.ID), 4*time.Second, check)
	eachCall(t, adminCalls(a, sent.ID), 4*time.Second, check)
}

// TestClusterConsumerLeaderChangeReportsNothing: the node leading an
// agent's consumer stops while the agent's subscriber, connected to
// another node, waits on it. The subscriber goes on with the new leader,
// and nothing is reported: a leader's change is the cluster working, as
// the 503s of a consumer being made are
// (TestClusterConsumerCreatedWhenDueReportsNothing). Before, the pull's
// "409 Server Shutdown" (or "Leadership Change") was reported as a failed
// pull (found by hunt h11).
func TestClusterConsumerLeaderChangeReportsNothing(t *testing.T) {
	c := replicatedCluster(t)
	nodes := c.Servers()
	probe := newBus(t, nodes[0], "builder")
	if err := adminOf(t, nodes[0]).EnsureConsumers(testContext(t), "builder"); err != nil {
		t.Fatal(err)
	}
	var leaderName string
	waitFor(t, "a leader of builder_p3", func() (bool, string) {
		ci, err := consumerInfo(t, probe, "builder_p3")
		if err != nil || ci.Cluster == nil || ci.Cluster.Leader == "" {
			return false, fmt.Sprint(ci, err)
		}
		leaderName = ci.Cluster.Leader
		return true, ""
	})
	li := -1
	for i, n := range nodes {
		if n.Options().ServerName == leaderName {
			li = i
		}
	}
	home := nodes[(li+1)%3]
	var errs errorTally
	receiver := newBus(t, home, "builder", bus.WithErrorHandler(errs.add))
	r := newRecorder()
	subscribe(t, receiver, r.handle)
	sender := newBus(t, home, "planner")
	publish(t, sender, bus.Message{To: "builder", Type: "before"})
	r.waitCount(t, 1)
	// The subscriber's lanes wait on the consumers now.
	waitFor(t, "the subscriber waiting on builder_p3", func() (bool, string) {
		ci, err := consumerInfo(t, receiver, "builder_p3")
		return err == nil && ci.NumWaiting >= 1, fmt.Sprint(ci, err)
	})
	if err := c.StopServer(li); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new leader of builder_p3", func() (bool, string) {
		ci, err := consumerInfo(t, receiver, "builder_p3")
		return err == nil && ci.Cluster != nil && ci.Cluster.Leader != "" && ci.Cluster.Leader != leaderName, fmt.Sprint(ci, err)
	})
	publish(t, sender, bus.Message{To: "builder", Type: "after"})
	// The 409 came before the lane pulled again, which it did for this.
	r.waitCount(t, 2)
	if n := errs.total(); n != 0 {
		t.Errorf("%d errors reported for a consumer leader's change: %s", n, &errs)
	}
}

// TestClusterStatusBucketWithoutALeader: a record written while the status
// bucket has no leader (its replicas' quorum lost, or an election under
// way) is sent again until the bucket takes it, and the failure is never
// blamed on a bucket not provisioned. Before, the record was lost, the
// error said to run agentbus provision, and every such failure after it
// on the bus went unreported (found by hunt h11).
func TestClusterStatusBucketWithoutALeader(t *testing.T) {
	scheme := subjects.Default()
	statusStream := "KV_" + scheme.StatusBucket()
	c := replicatedCluster(t, statusStream)
	nodes := c.Servers()
	// The message stream at one replica, the status bucket at three: the
	// bucket can lose its quorum while messages still flow.
	editStream(t, nodes[0], scheme.Stream(), func(cfg *jetstream.StreamConfig) { cfg.Replicas = 1 })
	var home int
	waitFor(t, "the message stream at one replica", func() (bool, string) {
		l := c.StreamLeader("", scheme.Stream())
		if l == nil {
			return false, "no leader"
		}
		home = c.Index(l)
		return true, ""
	})
	js, err := jetstream.New(embeddedtest.Connect(t, nodes[home]))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message stream scaled down", func() (bool, string) {
		st, err := js.Stream(testContext(t), scheme.Stream())
		if err != nil {
			return false, err.Error()
		}
		ci := st.CachedInfo().Cluster
		return ci != nil && len(ci.Replicas) == 0 && ci.Leader == nodes[home].Options().ServerName, fmt.Sprintf("%+v", ci)
	})
	publish(t, newBus(t, nodes[home], "warmup"), bus.Message{To: "x", Type: "warm"})
	// The bucket is led from a node that stops: it has no leader then.
	leadElsewhere(t, c, statusStream, home)
	for i := range nodes {
		if i != home {
			if err := c.StopServer(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitLeaderless(t, c, statusStream)
	var errs errorTally
	sender := newBus(t, nodes[home], "planner", bus.WithErrorHandler(errs.add), bus.WithPublishAsyncTimeout(2*time.Second))
	// A broadcast's sender writes its pending record.
	ack := publish(t, sender, bus.Message{To: bus.Broadcast, Type: "news"})
	// The bucket comes back: the broadcast's pending record, which the
	// bus failed to write, is sent again until it is stored.
	for i := range nodes {
		if i != home {
			if err := c.RestartServer(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.WaitForStreamLeader(testContext(t), "", statusStream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the broadcast's record", func() (bool, string) {
		sts, err := sender.Status(testContext(t), ack.ID)
		return err == nil, fmt.Sprint(sts, err)
	})
	errs.mu.Lock()
	defer errs.mu.Unlock()
	if n := errs.counts["bus.ErrNotProvisioned"]; n > 0 {
		t.Errorf("a status bucket without a leader reported as not provisioned: %s", &errs)
	}
}

// leadElsewhere makes stream led by another node than node keep,
// asking its leader to step down until it is.
func leadElsewhere(t *testing.T, c *embedded.Cluster, stream string, keep int) {
	t.Helper()
	nc := embeddedtest.Connect(t, c.Servers()[keep])
	waitFor(t, stream+" led elsewhere than "+c.Servers()[keep].String(), func() (bool, string) {
		l := c.StreamLeader("", stream)
		if l == nil {
			return false, "no leader"
		}
		if c.Index(l) != keep {
			return true, ""
		}
		_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, testTimeout/4)
		return false, fmt.Sprintf("led by %s; step down: %v", l, err)
	})
}

// waitLeaderless waits until stream has no leader: a node left alone
// may be handed the leadership by the nodes that stop, and steps down
// only once it finds its quorum lost, 10 to 20 s later.
func waitLeaderless(t *testing.T, c *embedded.Cluster, stream string) {
	t.Helper()
	embeddedtest.WaitFor(t, 45*time.Second, stream+" without a leader", func() (bool, string) {
		l := c.StreamLeader("", stream)
		return l == nil, fmt.Sprint("led by ", l)
	})
}
