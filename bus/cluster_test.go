package bus_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestClusterReplicatedStream: on a 3-node cluster, a stream with three
// replicas carries messages between agents connected to different nodes,
// in priority order.
func TestClusterReplicatedStream(t *testing.T) {
	c := embeddedtest.RunCluster(t, 3)
	nodes := c.Servers()
	admin := embeddedtest.Connect(t, nodes[0])
	info, err := bus.Provision(testContext(t), admin, bus.StreamConfig{Replicas: 3})
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
