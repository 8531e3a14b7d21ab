package bus

import (
	"context"
	"testing"
	"time"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// TestStoredLanes: the lanes Subscribe starts with are consumers.Lane.Stored
// (Strict waits for their first message) only where the look found a
// message for a consumer that has delivered none: not for a priority whose
// consumer has delivered before, where the message found may be one it was
// acknowledged, nor for the broadcasts.
func TestStoredLanes(t *testing.T) {
	s := provisionedServer(t)
	sender, worker := benchBus(t, s, "sender"), benchBus(t, s, "worker")
	ctx := t.Context()
	if _, err := sender.Publish(ctx, Message{To: "worker", Type: "EARLIER", Priority: 1}); err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{}, 1)
	sub, err := worker.Subscribe(ctx, func(context.Context, *Delivery) error {
		handled <- struct{}{}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-handled
	sub.Stop()
	<-sub.Done()
	if _, err := sender.Publish(ctx, Message{To: "worker", Type: "NOW", Priority: 3}); err != nil {
		t.Fatal(err)
	}
	cs, err := worker.opts.scheme.Consumers("worker")
	if err != nil {
		t.Fatal(err)
	}
	name := func(p int) string { return cs[p-1].Name }
	embeddedtest.WaitFor(t, time.Minute, "the priority 1 consumer's delivery counted", func() (bool, string) {
		c, err := worker.js.Consumer(ctx, worker.opts.scheme.Stream(), name(1))
		if err != nil {
			return false, err.Error()
		}
		return c.CachedInfo().Delivered.Consumer == 1, ""
	})
	lanes, _, err := worker.ensureConsumers(ctx, "worker", subscribeOptions{concurrency: 1}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{name(1): false, name(3): true, cs[subjects.LowestPriority].Name: false}
	got := make(map[string]bool)
	for _, l := range lanes {
		got[l.Consumer] = l.Stored
	}
	if len(got) != len(want) {
		t.Fatalf("lanes %+v, want the consumers of priorities 1 and 3 and of the broadcasts", lanes)
	}
	for c, stored := range want {
		if got[c] != stored {
			t.Errorf("lane %s: Stored %t, want %t", c, got[c], stored)
		}
	}
}
