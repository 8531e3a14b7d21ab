package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// TestClusterReplicatedStream: on a 3-node cluster, a stream with three
// replicas carries messages between agents connected to different nodes,
// in priority order.
func TestClusterReplicatedStream(t *testing.T) {
	c := embeddedtest.RunCluster(t, 3)
	nodes := c.Servers()
	admin := embeddedtest.Connect(t, nodes[0])
	info, err := newAdmin(t, admin).Provision(testContext(t), bus.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if info.Config.Replicas != 3 {
		t.Fatalf("replicas = %d, want 3", info.Config.Replicas)
	}
	if _, err := c.WaitForStreamLeader(testContext(t), "", info.Config.Name); err != nil {
		t.Fatal(err)
	}

	sender := newBus(t, nodes[1], "planner")
	for i, p := range []int{4, 1, 3} {
		publish(t, sender, bus.Message{To: "builder", Type: fmt.Sprintf("p%d-%d", p, i), Priority: p})
	}
	r := newRecorder()
	subscribe(t, newBus(t, nodes[2], "builder"), r.handle)
	r.waitCount(t, 3)
	if got, want := r.types(), []string{"p1-1", "p3-2", "p4-0"}; !slices.Equal(got, want) {
		t.Errorf("handled %v, want %v", got, want)
	}
}

// TestClusterSchedule: on a 3-node cluster with three replicas, a message
// scheduled through one node reaches an agent on another when it is due:
// the replicated schedule stream fires it and the message stream sources
// it.
func TestClusterSchedule(t *testing.T) {
	c := embeddedtest.RunCluster(t, 3)
	nodes := c.Servers()
	ctx := testContext(t)
	info, err := newAdmin(t, embeddedtest.Connect(t, nodes[0])).Provision(ctx, bus.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	for _, stream := range []string{info.Config.Name, subjects.Default().ScheduleStream()} {
		if _, err := c.WaitForStreamLeader(ctx, "", stream); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := newBus(t, nodes[1], "planner").Schedule(ctx, bus.Message{To: "builder", Type: "nightly"}, bus.In(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	subscribe(t, newBus(t, nodes[2], "builder"), r.handle)
	if d := r.waitCount(t, 1)[0]; d.ID != ack.ID {
		t.Errorf("delivered %s, want %s", d.ID, ack.ID)
	}
}

// TestClusterQuorumLossIsUnavailable: a replicated stream that lost its
// quorum is reported as unavailable, not as missing.
func TestClusterQuorumLossIsUnavailable(t *testing.T) {
	c := embeddedtest.RunCluster(t, 3)
	admin := embeddedtest.Connect(t, c.Servers()[0])
	if _, err := newAdmin(t, admin).Provision(testContext(t), bus.StreamConfig{Replicas: 3}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if _, err := c.WaitForStreamLeader(testContext(t), "", "AGENTBUS"); err != nil {
		t.Fatal(err)
	}
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

// TestClusterPresence: on a 3-node cluster with a replicated registry, an
// agent on one node is seen online from another, offline at once after a
// clean shutdown, and, after a crash, offline three heartbeats later, from
// the server's expiry of its record, with no client watching. (Stopping
// the crashed agent's node as well made registry reads time out for 20 s
// now and then: not yet understood, see the closing note of session 5.)
func TestClusterPresence(t *testing.T) {
	c := embeddedtest.RunCluster(t, 3)
	nodes := c.Servers()
	info, err := newAdmin(t, embeddedtest.Connect(t, nodes[0])).Provision(testContext(t), bus.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	for _, stream := range []string{info.Config.Name, "KV_AGENTBUS_AGENTS"} {
		if _, err := c.WaitForStreamLeader(testContext(t), "", stream); err != nil {
			t.Fatal(err)
		}
	}
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
	if a := agentInfo(t, observer, "crashy", bus.Offline); a.Presence.Reason != bus.ReasonSilent {
		t.Errorf("crash: %+v", a.Presence)
	}
}
