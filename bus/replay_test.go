package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// failUntilFixed is a handler that rejects every message until fixed is
// set, then records it with done.
func failUntilFixed(fixed *atomic.Bool, done *recorder) bus.Handler {
	return func(ctx context.Context, d *bus.Delivery) error {
		if !fixed.Load() {
			return bus.Permanent(errors.New("cannot yet"))
		}
		return done.handle(ctx, d)
	}
}

// replayTheDeadLetter waits for agent's one dead letter and replays it.
func replayTheDeadLetter(t *testing.T, ops *bus.Admin, agent string) bus.PubAck {
	t.Helper()
	ctx := testContext(t)
	var dls []bus.DeadLetter
	waitFor(t, agent+"'s dead letter", func() (bool, string) {
		var err error
		dls, err = ops.DeadLetters(ctx, bus.DeadLetterFilter{Agent: agent})
		return err == nil && len(dls) == 1, fmt.Sprint(len(dls), err)
	})
	ack, err := ops.ReplayDeadLetter(ctx, dls[0].Sequence)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

// TestReplayDeadLetterHandledAnew: a replayed dead letter reaches the
// handler of the agent that dead-lettered it, and its record and history
// follow the replay. Before, a replayed request was skipped (its record
// read dead_lettered, a final state); a handled replay kept reading
// dead_lettered, and History listed the message twice; a message whose TTL
// had passed was dropped unread as expired; and a broadcast's replay went
// to every agent again (found by a helper session).
func TestReplayDeadLetterHandledAnew(t *testing.T) {
	t.Run("message", func(t *testing.T) {
		s := newServer(t)
		sender, ops := newBus(t, s, "sender"), adminOf(t, s)
		var fixed atomic.Bool
		done := newRecorder()
		subscribe(t, newBus(t, s, "worker"), failUntilFixed(&fixed, done))
		ack := publish(t, sender, bus.Message{To: "worker", Type: "job"})
		waitState(t, sender, ack.ID, bus.StateDeadLettered)
		fixed.Store(true)
		replay := replayTheDeadLetter(t, ops, "worker")
		if d := done.waitCount(t, 1)[0]; !d.Replayed || d.ID != ack.ID {
			t.Errorf("handled %s, replayed %t; want %s, replayed", d.ID, d.Replayed, ack.ID)
		}
		waitState(t, sender, ack.ID, bus.StateCompleted)
		page, err := ops.History(testContext(t), ack.ID, bus.HistoryQuery{})
		if err != nil || len(page.Entries) != 1 || page.Entries[0].Sequence != replay.Sequence {
			t.Errorf("History = %+v, %v; want one entry, the replay at %d", page.Entries, err, replay.Sequence)
		}
	})
	t.Run("request", func(t *testing.T) {
		s := newServer(t)
		requester, worker, ops := newBus(t, s, "requester"), newBus(t, s, "worker"), adminOf(t, s)
		var fixed atomic.Bool
		var calls atomic.Int32
		subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
			calls.Add(1)
			if !fixed.Load() {
				return bus.Permanent(errors.New("cannot yet"))
			}
			_, err := d.Reply(ctx, bus.Message{Type: "answer"})
			return err
		})
		_, err := requester.Request(testContext(t), bus.Message{ID: "ask-1", To: "worker", Type: "ask"})
		if !errors.Is(err, bus.ErrDeadLettered) {
			t.Fatalf("Request = %v, want ErrDeadLettered", err)
		}
		fixed.Store(true)
		replayTheDeadLetter(t, ops, "worker")
		waitFor(t, "the replay handled", func() (bool, string) { return calls.Load() == 2, fmt.Sprint(calls.Load()) })
		waitState(t, requester, "ask-1", bus.StateReplied)
	})
	t.Run("TTL passed", func(t *testing.T) {
		s := newServer(t)
		sender, ops := newBus(t, s, "sender"), adminOf(t, s)
		var fixed atomic.Bool
		done := newRecorder()
		subscribe(t, newBus(t, s, "worker"), failUntilFixed(&fixed, done))
		ack := publish(t, sender, bus.Message{To: "worker", Type: "job", TTL: time.Second})
		waitState(t, sender, ack.ID, bus.StateDeadLettered)
		expiry := time.Now().Add(time.Second)
		waitFor(t, "the TTL passed", func() (bool, string) { return time.Now().After(expiry), "" })
		fixed.Store(true)
		replayTheDeadLetter(t, ops, "worker")
		done.waitCount(t, 1)
	})
	t.Run("broadcast", func(t *testing.T) {
		s := newServer(t)
		sender, ops := newBus(t, s, "sender"), adminOf(t, s)
		var fixed atomic.Bool
		alpha, beta := newRecorder(), newRecorder()
		subscribe(t, newBus(t, s, "alpha"), failUntilFixed(&fixed, alpha))
		subscribe(t, newBus(t, s, "beta"), beta.handle)
		ack := publish(t, sender, bus.Message{To: bus.Broadcast, Type: "news"})
		beta.waitCount(t, 1)
		fixed.Store(true)
		replay := replayTheDeadLetter(t, ops, "alpha")
		if d := alpha.waitCount(t, 1)[0]; d.ID != ack.ID || !d.Replayed {
			t.Errorf("alpha handled %s, replayed %t; want %s, replayed", d.ID, d.Replayed, ack.ID)
		}
		if addr, err := subjects.Default().Parse(replay.Subject); err != nil || addr.Kind != subjects.KindDirect || addr.To != "alpha" {
			t.Errorf("replayed on %s (%+v, %v); want a direct message to alpha alone", replay.Subject, addr, err)
		}
	})
}

// TestReplayKeepsOtherHeaders: the replay of a valid event, encoded anew,
// keeps the headers of the original that are not the event's, the
// server's or the bus's: a foreign producer's W3C trace headers, a user's
// own. Before, it dropped them.
func TestReplayKeepsOtherHeaders(t *testing.T) {
	s := newServer(t)
	ops := adminOf(t, s)
	var fixed atomic.Bool
	done := newRecorder()
	subscribe(t, newBus(t, s, "worker"), failUntilFixed(&fixed, done))
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg("agentbus.agent.worker.p3.producer.job")
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-id": "job-1", "ce-source": "/agents/producer", "ce-type": "job",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=1",
		"X-Tenant": "acme", "Nats-Msg-Id": "job-1",
	} {
		msg.Header.Set(k, v)
	}
	if _, err := js.PublishMsg(testContext(t), msg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead letter", func() (bool, string) {
		dls, err := ops.DeadLetters(testContext(t), bus.DeadLetterFilter{Agent: "worker"})
		return err == nil && len(dls) == 1, fmt.Sprint(len(dls), err)
	})
	fixed.Store(true)
	replay := replayTheDeadLetter(t, ops, "worker")
	done.waitCount(t, 1)
	st, err := js.Stream(testContext(t), replay.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetMsg(testContext(t), replay.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"traceparent": msg.Header.Get("traceparent"), "tracestate": "vendor=1", "X-Tenant": "acme"} {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("the replay's %s = %q, want %q (headers %v)", k, got, v, raw.Header)
		}
	}
}
