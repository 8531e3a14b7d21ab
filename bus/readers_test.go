package bus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestReadsLeaveNoConsumers checks that every read of a stream through a
// consumer of its own (the registry, groups, status records, a lookup of
// the stream, dead letters) deletes that consumer before it returns, and
// so leaves the server's consumers as it found them. Each read finds
// something to read: a read of nothing makes no fetch.
func TestReadsLeaveNoConsumers(t *testing.T) {
	ctx := testContext(t)
	s := newServer(t)
	ops := adminOf(t, s)
	alice := newBus(t, s, "alice")
	bob := newBus(t, s, "bob")
	if err := alice.Register(ctx, bus.AgentCard{Description: "sends work"}); err != nil {
		t.Fatal(err)
	}
	if err := alice.JoinGroup(ctx, "senders"); err != nil {
		t.Fatal(err)
	}
	subscribe(t, bob, func(context.Context, *bus.Delivery) error {
		return bus.Permanent(errors.New("refused"))
	})
	ack := publish(t, alice, bus.Message{To: "bob", Type: "task", Data: []byte("x")})
	waitFor(t, "the refused message dead-lettered", func() (bool, string) {
		dls, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{})
		return err == nil && len(dls) == 1, fmt.Sprintf("%d dead letters, %v", len(dls), err)
	})
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}

	reads := []struct {
		name string
		read func() error
	}{
		{"Agents", func() error { _, err := ops.Agents(ctx); return err }},
		{"Groups", func() error { _, err := ops.Groups(ctx); return err }},
		{"Admin.Status", func() error { _, err := ops.Status(ctx, ack.ID); return err }},
		{"Bus.Status", func() error { _, err := alice.Status(ctx, ack.ID); return err }},
		{"DeadLetters", func() error { _, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{}); return err }},
		{"PurgeDeadLetters since", func() error {
			_, err := ops.PurgeDeadLetters(ctx, bus.DeadLetterFilter{Since: time.Now().Add(-time.Hour)})
			return err
		}},
	}
	for _, r := range reads {
		before := consumerCount(t, js)
		if err := r.read(); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		waitFor(t, r.name+" to leave the consumers as it found them", func() (bool, string) {
			n := consumerCount(t, js)
			return n == before, fmt.Sprintf("%d consumers, %d before %s", n, before, r.name)
		})
	}
}

// consumerCount returns how many consumers the server's streams have.
func consumerCount(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	n := 0
	streams := js.ListStreams(testContext(t))
	for info := range streams.Info() {
		n += info.State.Consumers
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
