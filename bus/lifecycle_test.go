package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

func TestLifecycleStates(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")

	// Queued for an offline agent: pending.
	done := publish(t, orch, bus.Message{To: "worker", Type: "DONE", CorrelationID: "conv-life"})
	retried := publish(t, orch, bus.Message{To: "worker", Type: "RETRY", CorrelationID: "conv-life"})
	rejected := publish(t, orch, bus.Message{To: "worker", Type: "REJECT", CorrelationID: "conv-life"})
	if st := waitState(t, orch, done.ID, bus.StatePending); st.From != "orchestrator" || st.To != "worker" || st.Type != "DONE" || st.By != "orchestrator" {
		t.Errorf("pending status = %+v", st)
	}

	subscribe(t, worker, func(_ context.Context, d *bus.Delivery) error {
		switch {
		case d.Type == "RETRY" && d.Deliveries == 1:
			return errors.New("try again")
		case d.Type == "REJECT":
			return bus.Permanent(errors.New("not for me"))
		}
		return nil
	}, bus.WithBackoff(func(int) time.Duration { return 0 }))

	if st := waitState(t, orch, done.ID, bus.StateCompleted); st.By != "worker" || st.Sequence != done.Sequence {
		t.Errorf("completed status = %+v, want by worker, sequence %d", st, done.Sequence)
	}
	if st := waitState(t, worker, retried.ID, bus.StateCompleted); st.By != "worker" || st.Sequence != retried.Sequence {
		t.Errorf("retried status = %+v, want completed by worker after its failure", st)
	}
	if st := waitState(t, worker, rejected.ID, bus.StateDeadLettered); st.Reason == "" {
		t.Errorf("dead-lettered status = %+v, want a reason", st)
	}

	// The conversation's records, in the order the messages were made.
	conv, err := adminOf(t, s).Conversation(testContext(t), "conv-life")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, st := range conv {
		ids = append(ids, st.ID)
	}
	if want := []string{done.ID, retried.ID, rejected.ID}; !slices.Equal(ids, want) {
		t.Errorf("Conversation IDs = %v, want %v", ids, want)
	}
}

// TestLookupsRefuseInvalidIDs: a lookup by an ID no message can have (empty,
// blank, with a control character, longer than codec.MaxIDLen) fails with
// ErrInvalidMessage before it asks the server. An empty ID used to reach the
// status bucket as a key with an empty token, answered "no responders".
func TestLookupsRefuseInvalidIDs(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "agent")
	a := newAdmin(t, b.Conn())
	for _, id := range []string{"", "  ", "a\nb", "\x00", strings.Repeat("x", codec.MaxIDLen+1)} {
		t.Run(fmt.Sprintf("%.12q", id), func(t *testing.T) {
			calls := []call{
				{"Status", func(ctx context.Context) error { _, err := b.Status(ctx, id); return err }},
				{"Cancel", func(ctx context.Context) error { _, err := b.Cancel(ctx, id); return err }},
				{"Received", func(ctx context.Context) error { _, err := b.Received(ctx, id); return err }},
				{"Attach", func(ctx context.Context) error { _, err := b.Attach(ctx, id); return err }},
				{"History", func(ctx context.Context) error { _, err := b.History(ctx, id, bus.HistoryQuery{}); return err }},
				{"Admin.Status", func(ctx context.Context) error { _, err := a.Status(ctx, id); return err }},
				{"Admin.Cancel", func(ctx context.Context) error { _, err := a.Cancel(ctx, id); return err }},
				{"Admin.Conversation", func(ctx context.Context) error { _, err := a.Conversation(ctx, id); return err }},
				{"Admin.History", func(ctx context.Context) error { _, err := a.History(ctx, id, bus.HistoryQuery{}); return err }},
				{"Admin.Redeliver", func(ctx context.Context) error { _, err := a.Redeliver(ctx, id, "agent"); return err }},
			}
			eachCall(t, calls, testTimeout, func(t *testing.T, err error) {
				if !errors.Is(err, bus.ErrInvalidMessage) {
					t.Errorf("%v, want ErrInvalidMessage", err)
				}
			})
		})
	}
}

func TestLifecycleExpired(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	ack := publish(t, orch, bus.Message{To: "offline", Type: "STALE", TTL: time.Second})
	waitState(t, orch, ack.ID, bus.StateExpired)
	// The lookup wrote it back: a fresh reader sees it too.
	sts, err := adminOf(t, s).Status(testContext(t), ack.ID)
	if err != nil || len(sts) != 1 || sts[0].State != bus.StateExpired {
		t.Fatalf("Admin.Status = %+v, %v; want one expired record", sts, err)
	}
}

func TestLifecycleBroadcast(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	for _, a := range []string{"w1", "w2"} {
		subscribe(t, newBus(t, s, a), newRecorder().handle)
	}
	ack := publish(t, orch, bus.Message{To: bus.Broadcast, Type: "ANNOUNCE"})
	waitFor(t, "both recipients completed", func() (bool, string) {
		sts, err := orch.Status(testContext(t), ack.ID)
		if err != nil {
			return false, err.Error()
		}
		got := map[string]bus.State{}
		for _, st := range sts {
			got[st.To] = st.State
		}
		return got[bus.Broadcast] == bus.StatePending && got["w1"] == bus.StateCompleted && got["w2"] == bus.StateCompleted, fmt.Sprint(got)
	})
}

func TestLifecycleScopeAndSwitch(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	ack := publish(t, orch, bus.Message{To: "worker", Type: "T"})
	waitState(t, orch, ack.ID, bus.StatePending)

	// A third agent's lookup sees none of it; an operator's sees it all.
	if _, err := newBus(t, s, "bystander").Status(testContext(t), ack.ID); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("bystander Status error = %v, want ErrNoStatus", err)
	}
	if sts, err := adminOf(t, s).Status(testContext(t), ack.ID); err != nil || len(sts) != 1 {
		t.Errorf("Admin.Status = %v, %v", sts, err)
	}

	// Switched off, nothing is written and lookups say so.
	quiet := newBus(t, s, "quiet", bus.WithoutLifecycle())
	untracked := publish(t, quiet, bus.Message{To: "worker", Type: "T"})
	if _, err := quiet.Status(testContext(t), untracked.ID); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("Status with lifecycle off error = %v, want ErrInvalidOption", err)
	}
	// Flush waits until every record the bus wrote is stored, had it
	// written one.
	if err := quiet.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	// Nor is its subject indexed: nobody finds it.
	if withoutIndex(t, untracked.Subject) != untracked.Subject {
		t.Errorf("untracked message on %s, want a subject without the index", untracked.Subject)
	}
	if _, err := adminOf(t, s).Status(testContext(t), untracked.ID); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Admin.Status of an untracked message error = %v, want ErrNoStatus", err)
	}
}

// TestLifecycleReadFromConsumer: neither the sender nor the recipient
// writes a record for a direct message without a TTL that is handled on
// its first delivery; a lookup reads pending off the stored message (its
// index), delivered (while the handler works) and completed (once
// acknowledged) from the recipient's consumer, and writes completed down
// once, so that the record's history is that one state.
func TestLifecycleReadFromConsumer(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	fast := publish(t, orch, bus.Message{To: "worker", Type: "FAST", CorrelationID: "conv-work"})
	slow := publish(t, orch, bus.Message{To: "worker", Type: "SLOW", CorrelationID: "conv-work"})
	if err := orch.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, orch, fast.ID, bus.StatePending); st.Sequence != fast.Sequence || st.Stream != fast.Stream {
		t.Errorf("pending status at %s/%d, want the message's %s/%d", st.Stream, st.Sequence, fast.Stream, fast.Sequence)
	}
	if got := recordHistory(t, s, "conv-work", fast.ID, "orchestrator", "worker"); got != nil {
		t.Errorf("history of a message just sent = %v, want no record: its sender writes none", got)
	}
	release := make(chan struct{})
	handled := newRecorder()
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "SLOW" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return handled.handle(ctx, d)
	})

	history := func(ack bus.PubAck) []bus.State {
		t.Helper()
		return recordHistory(t, s, "conv-work", ack.ID, "orchestrator", "worker")
	}

	if st := waitState(t, orch, slow.ID, bus.StateDelivered); st.By != "worker" {
		t.Errorf("delivered status = %+v, want by worker", st)
	}
	handled.waitCount(t, 1) // FAST; SLOW is still running
	if err := worker.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if got := history(fast); got != nil {
		t.Errorf("history of the handled message before a lookup = %v, want no record: the recipient writes none", got)
	}
	if st := waitState(t, orch, fast.ID, bus.StateCompleted); st.By != "worker" {
		t.Errorf("completed status = %+v, want by worker", st)
	}
	close(release)
	waitState(t, orch, slow.ID, bus.StateCompleted)
	waitState(t, orch, fast.ID, bus.StateCompleted) // read again: no second write
	if err := orch.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	for _, ack := range []bus.PubAck{fast, slow} {
		if got := history(ack); !slices.Equal(got, []bus.State{bus.StateCompleted}) {
			t.Errorf("history of %s = %v, want [completed]", ack.ID, got)
		}
	}
}

// TestLifecyclePendingAfterAsyncAck: an asynchronous publish's pending
// record is written once the ack arrives and holds the stream sequence the
// ack gave; a lookup then reads completed from the recipient's consumer.
func TestLifecyclePendingAfterAsyncAck(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	f, err := orch.PublishAsync(testContext(t), bus.Message{To: "worker", Type: "ASYNC"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := f.Wait(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := orch.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	sts, err := orch.Status(testContext(t), ack.ID)
	if err != nil || len(sts) != 1 {
		t.Fatalf("Status = %+v, %v; want one record", sts, err)
	}
	if st := sts[0]; st.State != bus.StatePending || st.Sequence != ack.Sequence || st.Stream != ack.Stream || st.By != "orchestrator" {
		t.Errorf("record %+v, want pending by orchestrator at %s/%d", st, ack.Stream, ack.Sequence)
	}
	r := newRecorder()
	subscribe(t, worker, r.handle)
	r.waitCount(t, 1)
	if st := waitState(t, orch, ack.ID, bus.StateCompleted); st.By != "worker" || st.Deliveries != 1 {
		t.Errorf("record %+v, want completed by worker after 1 delivery", st)
	}
}

// TestLifecyclePendingRightAfterPublish: Publish has the pending record of
// a message with a TTL written by the tracker's writer after it returns,
// and writes none for one without (its subject is its index); a lookup
// from the same bus straight after it reads pending either way, every
// time, and Close leaves every record stored.
func TestLifecyclePendingRightAfterPublish(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	var ids []string
	timed := func(i int) bool { return i%4 < 2 }
	for i := range 50 {
		m := bus.Message{To: "worker", Type: "SYNC"}
		if timed(i) {
			m.TTL = time.Hour
		}
		ack, err := orch.Publish(testContext(t), m)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ack.ID)
		if i%2 == 1 {
			continue // looked up by another bus after Close
		}
		sts, err := orch.Status(testContext(t), ack.ID)
		if err != nil || len(sts) != 1 || sts[0].State != bus.StatePending || sts[0].Sequence != ack.Sequence {
			t.Fatalf("Status of message %d right after Publish = %+v, %v; want pending at sequence %d", i, sts, err, ack.Sequence)
		}
	}
	if err := orch.Close(); err != nil {
		t.Fatal(err)
	}
	admin := newAdmin(t, embeddedtest.Connect(t, s))
	for i, id := range ids {
		if sts, err := admin.Status(testContext(t), id); err != nil || len(sts) != 1 || sts[0].State != bus.StatePending {
			t.Errorf("Status of message %d after Close = %+v, %v; want pending", i, sts, err)
		}
		want := []bus.State(nil)
		if timed(i) {
			want = []bus.State{bus.StatePending}
		}
		if got := recordHistory(t, s, id, id, "orchestrator", "worker"); !slices.Equal(got, want) {
			t.Errorf("record of message %d (TTL %v) = %v, want %v", i, timed(i), got, want)
		}
	}
}

// TestLifecycleAsyncPublishFailed: an asynchronous publish that fails
// after it went out is recorded failed, with or without a pending record
// held for it (a message without a TTL has none: its failed record is
// made from the message).
func TestLifecycleAsyncPublishFailed(t *testing.T) {
	s := newServer(t)
	var errs errorTally
	orch := newBus(t, s, "orchestrator", bus.WithErrorHandler(errs.add))
	admin := adminOf(t, s)
	ctx := testContext(t)
	// The stream goes; the status bucket stays.
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, subjects.Default().Stream()); err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{0, time.Hour} {
		f, err := orch.PublishAsync(ctx, bus.Message{To: "worker", Type: "ASYNC", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Wait(ctx); err == nil {
			t.Fatalf("publish (TTL %v) without a stream succeeded", ttl)
		}
		if err := orch.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("failed record (TTL %v)", ttl), func() (bool, string) {
			sts, err := admin.Status(ctx, f.ID())
			return err == nil && len(sts) == 1 && sts[0].State == bus.StateFailed && sts[0].To == "worker" && sts[0].From == "orchestrator",
				fmt.Sprintf("%+v, %v", sts, err)
		})
	}
}

// TestPublishAsyncAckLost: an asynchronous publish whose ack never comes
// (the stream sends none) fails at WithPublishAsyncTimeout with an error
// wrapping jetstream.ErrAsyncPublishTimeout (never before it:
// asyncpub's TestPublishTimeoutCountsWholeTicks), and is recorded failed;
// Flush does not wait for it longer. The stream stored it all the same
// (it only sends no acks), so since 2026-11-28 a lookup reads what the
// stream holds, pending, over the sender's failed record.
func TestPublishAsyncAckLost(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	editStream(t, s, subjects.Default().Stream(), func(cfg *jetstream.StreamConfig) { cfg.NoAck = true })
	const timeout = 300 * time.Millisecond
	var errs errorTally
	orch := newBus(t, s, "orchestrator", bus.WithPublishAsyncTimeout(timeout), bus.WithErrorHandler(errs.add))
	f, err := orch.PublishAsync(ctx, bus.Message{To: "worker", Type: "ASYNC"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Wait(ctx); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("Wait: %v, want an error wrapping jetstream.ErrAsyncPublishTimeout", err)
	}
	if err := orch.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "failed record", func() (bool, string) {
		got := recordHistory(t, s, f.ID(), f.ID(), "orchestrator", "worker")
		return slices.Contains(got, bus.StateFailed), fmt.Sprint(got)
	})
	sts, err := adminOf(t, s).Status(ctx, f.ID())
	if err != nil || len(sts) != 1 || sts[0].State != bus.StatePending || sts[0].Sequence == 0 {
		t.Errorf("Status of the stored message: %+v, %v; want pending, with its sequence", sts, err)
	}
}

// recordHistory returns the states written to the status record of message
// id from from to to in conversation conv, oldest first.
func recordHistory(t *testing.T, s *embedded.Server, conv, id, from, to string) []bus.State {
	t.Helper()
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(testContext(t), subjects.Default().StatusBucket())
	if err != nil {
		t.Fatal(err)
	}
	key, err := subjects.StatusKey(conv, id, from, to)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := kv.History(testContext(t), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil // no record
	}
	if err != nil {
		t.Fatalf("history of %s: %v", key, err)
	}
	var got []bus.State
	for _, e := range entries {
		var st bus.Status
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		got = append(got, st.State)
	}
	return got
}

// TestLifecycleNotExpiredBeforeExpiry: a message with a TTL that its
// recipient settled before the TTL passed is not read expired. Its
// recipient records how it ended, but a lookup can read the record before
// that write lands and the recipient's consumer after the ack: the ack
// floor has then passed the message, which is not the server removing it
// at its expiry. (A Gather's requester that attached to a copy as its
// reply came got a *DeadlineError this way.) The recipient here writes no
// record at all, which holds that moment open.
func TestLifecycleNotExpiredBeforeExpiry(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker", bus.WithoutLifecycle())
	ack := publish(t, orch, bus.Message{To: "worker", Type: "TIMELY", TTL: time.Hour})
	r := newRecorder()
	subscribe(t, worker, r.handle)
	r.waitCount(t, 1)
	waitFor(t, "the worker's ack", func() (bool, string) {
		info, err := consumerInfo(t, worker, "worker_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream >= ack.Sequence, fmt.Sprint(info.AckFloor)
	})
	sts, err := orch.Status(testContext(t), ack.ID)
	if err != nil || len(sts) != 1 || sts[0].State == bus.StateExpired {
		t.Errorf("Status of a message acknowledged an hour before its expiry = %+v, %v; want it not expired", sts, err)
	}
}

// TestLifecycleWithoutIndex: a bus WithoutIndex, for a rolling upgrade from
// a version before the index, sends plain direct subjects and writes the
// pending record of each message instead, sync and async; a lookup finds
// the message by that record, and reads completed off the recipient's
// consumer once it is handled.
func TestLifecycleWithoutIndex(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator", bus.WithoutIndex())
	worker := newBus(t, s, "worker")
	ctx := testContext(t)
	sent := publish(t, orch, bus.Message{To: "worker", Type: "SYNC"})
	f, err := orch.PublishAsync(ctx, bus.Message{To: "worker", Type: "ASYNC"})
	if err != nil {
		t.Fatal(err)
	}
	async, err := f.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := orch.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ack := range []bus.PubAck{sent, async} {
		if withoutIndex(t, ack.Subject) != ack.Subject {
			t.Errorf("%s published on %s, want a subject without the index", ack.ID, ack.Subject)
		}
		if got := recordHistory(t, s, ack.ID, ack.ID, "orchestrator", "worker"); !slices.Equal(got, []bus.State{bus.StatePending}) {
			t.Errorf("record of %s = %v, want [pending]", ack.ID, got)
		}
		if sts, err := orch.Status(ctx, ack.ID); err != nil || len(sts) != 1 || sts[0].State != bus.StatePending || sts[0].Sequence != ack.Sequence {
			t.Errorf("Status(%s) = %+v, %v; want pending at sequence %d", ack.ID, sts, err, ack.Sequence)
		}
	}
	r := newRecorder()
	subscribe(t, worker, r.handle)
	r.waitCount(t, 2)
	waitState(t, orch, sent.ID, bus.StateCompleted)
	waitState(t, orch, async.ID, bus.StateCompleted)
}

// TestLostAsyncAckKeepsTheCompletion: a PublishAsync whose ack is lost
// with the connection fails its future, though the server stored the
// message and its recipient handled it: the message reads completed. The
// sender's failed record was a put over the recipient's completed one, and
// past the TTL a lookup read expired (found by a helper session). It is
// now written only if no record exists.
func TestLostAsyncAckKeepsTheCompletion(t *testing.T) {
	for _, ttl := range []time.Duration{0, 3 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) {
			s := newServer(t)
			ctx := testContext(t)
			p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
			sender := dialBus(t, p.URL(), "sender", bus.WithPublishAsyncTimeout(time.Second),
				bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
			worker := newBus(t, s, "worker")
			r := newRecorder()
			subscribe(t, worker, r.handle)

			cut := p.cutOnDelivery(`"stream":"AGENTBUS"`)
			start := time.Now()
			f, err := sender.PublishAsync(ctx, bus.Message{To: "worker", Type: "job", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			r.waitCount(t, 1)
			waitFor(t, "the ack cut", func() (bool, string) { return wasCut(cut), "not yet" })
			if err := worker.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Wait(ctx); err == nil {
				t.Fatal("the future succeeded: the ack was not cut")
			}
			_ = sender.Flush(ctx) // the failed record written, if it is
			sts, err := sender.Status(ctx, f.ID())
			if err != nil {
				t.Fatal(err)
			}
			if sts[0].State != bus.StateCompleted {
				t.Errorf("stored and handled message reads %s by %s (%q); want completed", sts[0].State, sts[0].By, sts[0].Reason)
			}
			if ttl > 0 {
				waitFor(t, "past the TTL", func() (bool, string) { return time.Since(start) > ttl+200*time.Millisecond, "not yet" })
				sts, err = sender.Status(ctx, f.ID())
				if err != nil {
					t.Fatal(err)
				}
				if sts[0].State != bus.StateCompleted {
					t.Errorf("past its TTL, stored and handled message reads %s (%q); want completed", sts[0].State, sts[0].Reason)
				}
			}
		})
	}
}

// TestUnsettledIsNotCompleted: a message whose every delivery allowed
// crashed, given up by the server, does not read completed once the
// recipient's ack floor passes it (a later message handled): it was never
// handled. It read completed, written back to the bucket, and with no
// dead-letter watcher stayed so for good (found by a helper session). It
// reads delivered until a watcher dead-letters it.
func TestUnsettledIsNotCompleted(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	ack := crashOnLastDelivery(t, s, sender, false)
	later := newRecorder()
	agent := newBus(t, s, "agent")
	subscribe(t, agent, later.handle, lastDelivery...) // its pull makes the server give the message up
	ops := adminOf(t, s)
	waitUnsettled(t, ops, 1)
	publish(t, sender, bus.Message{To: "agent", Type: "fine"})
	later.waitCount(t, 1)
	waitFor(t, "the ack floor past the unsettled message", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream > ack.Sequence, fmt.Sprint(info.AckFloor)
	})
	if sts, err := sender.Status(testContext(t), ack.ID); err != nil || sts[0].State != bus.StateDelivered {
		t.Fatalf("Status of the unsettled message = %+v, %v; want delivered", sts, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- ops.WatchDeadLetters(ctx) }()
	t.Cleanup(func() { cancel(); <-watched })
	waitState(t, sender, ack.ID, bus.StateDeadLettered)
}

// TestStructuredSenderLookupAndHistory: a sender in structured mode
// (WithCodec(codec.Structured{})) writes the pending record of its direct
// messages: their headers carry no attributes for a lookup to read. Before,
// of 20 messages sent at once, those sharing an indexed subject's window
// read "no status recorded", and History left them out (found by a helper
// session).
func TestStructuredSenderLookupAndHistory(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead", bus.WithCodec(codec.Structured{}))
	var ids []string
	for range 20 {
		ids = append(ids, publish(t, lead, bus.Message{To: "worker", Type: "task", CorrelationID: "conv-s", Data: []byte(`{}`)}).ID)
	}
	for _, id := range ids {
		if sts, err := lead.Status(ctx, id); err != nil || len(sts) != 1 || sts[0].State != bus.StatePending {
			t.Errorf("Status(%s) = %+v, %v; want pending", id, sts, err)
		}
	}
	if page, err := lead.History(ctx, "conv-s", bus.HistoryQuery{}); err != nil || len(page.Entries) != len(ids) {
		t.Errorf("History: %d entries, %v; want %d", len(page.Entries), err, len(ids))
	}
}

// TestStaleFailedRecord: a process whose handler failed while its
// connection was held writes its failed record only over the record as it
// stood: another process that handled the redelivery meanwhile keeps its
// completed. Before, the failure landed on top once the connection was let
// go, and the message, which has a TTL, read expired past it (carried over
// from stop 54).
func TestStaleFailedRecord(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	sender := newBus(t, s, "sender")
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	a := dialBus(t, p.URL(), "worker", bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
	ack := publish(t, sender, bus.Message{To: "worker", Type: "job", TTL: 3 * time.Second})
	start := time.Now()
	var failed atomic.Bool
	subscribe(t, a, func(ctx context.Context, d *bus.Delivery) error {
		if !failed.Swap(true) {
			p.hold()
			return errors.New("fail while held")
		}
		<-ctx.Done()
		return ctx.Err()
	}, bus.WithAckWait(time.Second))
	waitFor(t, "A failed", func() (bool, string) { return failed.Load(), "" })
	r := newRecorder()
	subscribe(t, newBus(t, s, "worker"), r.handle, bus.WithAckWait(time.Second))
	r.waitCount(t, 1)
	waitState(t, sender, ack.ID, bus.StateCompleted)
	p.release()
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "past the TTL", func() (bool, string) { return time.Since(start) > 3500*time.Millisecond, "" })
	if sts, err := sender.Status(ctx, ack.ID); err != nil || sts[0].State != bus.StateCompleted {
		t.Errorf("past its TTL, the message handled on its second delivery reads %+v, %v; want completed", sts, err)
	}
}
