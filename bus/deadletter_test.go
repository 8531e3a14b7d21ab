package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// handle is what a Bus and an Admin both have: a connection and a scheme.
type handle interface {
	Conn() *nats.Conn
	Subjects() subjects.Scheme
}

// deadLetters returns what the dead-letter stream holds.
func deadLetters(t *testing.T, b handle) []*jetstream.RawStreamMsg {
	t.Helper()
	js, err := jetstream.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(testContext(t), b.Subjects().DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(testContext(t), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func waitDeadLetters(t *testing.T, b handle, n int) []*jetstream.RawStreamMsg {
	t.Helper()
	var got []*jetstream.RawStreamMsg
	waitFor(t, fmt.Sprintf("%d dead letters", n), func() (bool, string) {
		got = deadLetters(t, b)
		return len(got) >= n, fmt.Sprintf("%d dead letters", len(got))
	})
	return got
}

func TestDeadLetterAfterMaxDeliver(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	ack := publish(t, sender, bus.Message{To: "agent", Type: "poison", Priority: 2, Data: []byte("payload")})
	publish(t, sender, bus.Message{To: "agent", Type: "fine", Priority: 2})
	r := newRecorder()
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "poison" {
			return errors.New("boom")
		}
		return r.handle(ctx, d)
	}, bus.WithMaxDeliver(3), bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))

	r.waitCount(t, 1) // the poison message does not block the level
	dl := waitDeadLetters(t, agent, 1)[0]
	h := dl.Header
	checks := map[string]string{
		bus.HeaderDeadLetterReason:     string(bus.ReasonMaxDeliveries),
		bus.HeaderDeadLetterDeliveries: "3",
		bus.HeaderDeadLetterStream:     "AGENTBUS",
		bus.HeaderDeadLetterSequence:   strconv.FormatUint(ack.Sequence, 10),
		bus.HeaderDeadLetterSubject:    ack.Subject,
		bus.HeaderDeadLetterAgent:      "agent",
		"ce-id":                        ack.ID,
		"ce-type":                      "poison",
	}
	for k, want := range checks {
		if got := h.Get(k); got != want {
			t.Errorf("dead letter header %s = %q, want %q", k, got, want)
		}
	}
	if e := h.Get(bus.HeaderDeadLetterError); e == "" {
		t.Error("dead letter has no error")
	}
	if string(dl.Data) != "payload" || dl.Subject != "agentbus.dlq.agent.sender.poison" {
		t.Errorf("dead letter %q on %s", dl.Data, dl.Subject)
	}
	// Exactly one dead letter, and the original is settled.
	waitFor(t, "settled", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p2")
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 0 && info.AckFloor.Stream == 2, fmt.Sprintf("%+v", info.AckFloor)
	})
	if n := len(deadLetters(t, agent)); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
}

func TestDeadLetterReasons(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	nc := embeddedtest.Connect(t, s)
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(testContext(t), "agentbus.agent.agent.p3.raw.junk", []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	publish(t, sender, bus.Message{To: "agent", Type: "refused"})
	publish(t, sender, bus.Message{To: "agent", Type: "stale", TTL: time.Second, Time: time.Now().Add(-time.Hour)})
	publish(t, sender, bus.Message{To: "agent", Type: "last"})
	agent := newBus(t, s, "agent")
	r := newRecorder()
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "refused" {
			return bus.Permanent(errors.New("not for me"))
		}
		return r.handle(ctx, d)
	})
	r.waitCount(t, 1)
	got := waitDeadLetters(t, agent, 2)
	reasons := map[string]string{}
	for _, m := range got {
		reasons[m.Subject] = m.Header.Get(bus.HeaderDeadLetterReason)
	}
	want := map[string]string{
		"agentbus.dlq.agent.raw.junk":       string(bus.ReasonMalformed),
		"agentbus.dlq.agent.sender.refused": string(bus.ReasonRejected),
	}
	if fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Errorf("dead letters %v, want %v (an expired message is not dead-lettered)", reasons, want)
	}
}

// TestDeadLetterUnsettled: a process that dies during the last allowed
// delivery never settles it; the server's MAX_DELIVERIES advisory makes the
// watcher dead-letter it and remove it from the stream.
func TestDeadLetterUnsettled(t *testing.T) {
	t.Run("kept", func(t *testing.T) { testDeadLetterUnsettled(t, false) })
	// Provisioned before the unsettled stream, or with another stream
	// of the account capturing the advisories: the watcher says so, and
	// hears them as they come.
	t.Run("without the unsettled stream", func(t *testing.T) { testDeadLetterUnsettled(t, true) })
}

func testDeadLetterUnsettled(t *testing.T, withoutStream bool) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	reported := make(chan error, 16)
	ops := adminOf(t, s, bus.WithErrorHandler(func(err error) {
		select {
		case reported <- err:
		default:
		}
	}))
	if withoutStream {
		js, _ := jetstream.New(ops.Conn())
		if err := js.DeleteStream(testContext(t), subjects.Default().UnsettledStream()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- ops.WatchDeadLetters(ctx) }()
	t.Cleanup(func() { cancel(); <-watched })
	if withoutStream {
		if err := <-reported; !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), subjects.Default().UnsettledStream()) {
			t.Errorf("reported %v, want the unsettled stream missing", err)
		}
	}

	ack := crashOnLastDelivery(t, s, sender, true)

	dl := waitDeadLetters(t, ops, 1)[0]
	if r := dl.Header.Get(bus.HeaderDeadLetterReason); r != string(bus.ReasonUnsettled) {
		t.Errorf("reason %q, want %q", r, bus.ReasonUnsettled)
	}
	if id := dl.Header.Get("ce-id"); id != ack.ID {
		t.Errorf("dead letter of %q, want %q", id, ack.ID)
	}
	js, _ := jetstream.New(ops.Conn())
	stream, err := js.Stream(testContext(t), "AGENTBUS")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "original removed", func() (bool, string) {
		_, err := stream.GetMsg(testContext(t), ack.Sequence)
		return errors.Is(err, jetstream.ErrMsgNotFound), fmt.Sprint(err)
	})
}

// TestDeadLetterUnsettledWithoutWatcher: a message whose last allowed
// delivery was never settled while no dead-letter watcher ran is
// dead-lettered by the watcher that starts later. The server's advisory
// was published to nobody, and the message read "delivered" for good,
// never handled again and never dead-lettered.
func TestDeadLetterUnsettledWithoutWatcher(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	ack := crashOnLastDelivery(t, s, sender, false)

	// The agent comes back: its pull makes the server give the message
	// up, with no watcher to hear it.
	subscribe(t, newBus(t, s, "agent"), func(context.Context, *bus.Delivery) error {
		t.Error("the unsettled message was delivered again")
		return nil
	}, lastDelivery...)
	ops := adminOf(t, s)
	waitUnsettled(t, ops, 1)

	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- ops.WatchDeadLetters(ctx) }()
	t.Cleanup(func() { cancel(); <-watched })
	dl := waitDeadLetters(t, ops, 1)[0]
	if r, id := dl.Header.Get(bus.HeaderDeadLetterReason), dl.Header.Get("ce-id"); r != string(bus.ReasonUnsettled) || id != ack.ID {
		t.Errorf("dead letter of %s, reason %s; want %s, %s", id, r, ack.ID, bus.ReasonUnsettled)
	}
	waitState(t, sender, ack.ID, bus.StateDeadLettered)
	waitUnsettled(t, ops, 0)
}

// lastDelivery makes every delivery of a subscription its last, settled
// or not within 200 ms.
var lastDelivery = []bus.SubscribeOption{bus.WithMaxDeliver(1), bus.WithAckWait(200 * time.Millisecond)}

// crashOnLastDelivery sends a message from sender to "agent", whose process
// crashes while it handles its last allowed delivery (lastDelivery), and
// returns its ack; with pull, the agent comes back (crashWhileHandling).
func crashOnLastDelivery(t *testing.T, s *embedded.Server, sender *bus.Bus, pull bool) bus.PubAck {
	t.Helper()
	ack := publish(t, sender, bus.Message{To: "agent", Type: "crasher"})
	crashWhileHandling(t, s, "agent", nil, pull)
	return ack
}

// crashWhileHandling has a process of agent crash while it handles the
// message match picks (any, for nil), on every delivery the server allows
// a subscription with lastDelivery: twice its own limit (the room for
// deliveries given back unhandled), so two. The next pull of the agent's
// consumer, as a process that comes back makes, makes the server give the
// message up unsettled; with pull, a process that fails the test if the
// message reaches it makes that pull.
func crashWhileHandling(t *testing.T, s *embedded.Server, agent string, match func(*bus.Delivery) bool, pull bool) {
	t.Helper()
	defer func() {
		if pull {
			subscribe(t, newBus(t, s, agent), func(_ context.Context, d *bus.Delivery) error {
				if match == nil || match(d) {
					t.Errorf("the unsettled message %s was delivered again", d.ID)
				}
				return nil
			}, lastDelivery...)
		}
	}()
	for range 2 {
		nc := embeddedtest.Connect(t, s)
		b, err := bus.New(nc, agent)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{}, 1)
		sub, err := b.Subscribe(testContext(t), func(ctx context.Context, d *bus.Delivery) error {
			if match != nil && !match(d) {
				return nil
			}
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, lastDelivery...)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-testContext(t).Done():
			t.Fatal("the message never delivered")
		}
		nc.Close() // crash: the delivery is never settled
		sub.Stop()
		<-sub.Done()
		b.Close()
	}
}

// waitUnsettled waits until the unsettled stream holds n advisories.
func waitUnsettled(t *testing.T, b handle, n uint64) {
	t.Helper()
	js, _ := jetstream.New(b.Conn())
	waitFor(t, fmt.Sprintf("%d advisories kept", n), func() (bool, string) {
		st, err := js.Stream(testContext(t), b.Subjects().UnsettledStream())
		if err != nil {
			return false, err.Error()
		}
		return st.CachedInfo().State.Msgs == n, fmt.Sprint(st.CachedInfo().State.Msgs)
	})
}

func TestDeadLetterListShowReplayPurge(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	ops := adminOf(t, s)
	for _, m := range []bus.Message{
		{To: "alpha", Type: "bad-a", Data: []byte("a1")},
		{To: "alpha", Type: "bad-b", Data: []byte("a2")},
		{To: "beta", Type: "bad-a", Data: []byte("b1")},
	} {
		publish(t, sender, m)
	}
	var fixed atomic.Bool
	replayed := newRecorder()
	for _, agent := range []string{"alpha", "beta"} {
		subscribe(t, newBus(t, s, agent), func(ctx context.Context, d *bus.Delivery) error {
			if !fixed.Load() {
				return bus.Permanent(errors.New("cannot handle " + d.Type))
			}
			return replayed.handle(ctx, d)
		})
	}
	waitDeadLetters(t, ops, 3)
	ctx := testContext(t)

	all, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{})
	if err != nil || len(all) != 3 {
		t.Fatalf("DeadLetters() = %d, %v; want 3", len(all), err)
	}
	alpha, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "alpha"})
	if err != nil || len(alpha) != 2 {
		t.Fatalf("DeadLetters(alpha) = %d, %v; want 2", len(alpha), err)
	}
	badA, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{Type: "bad-a"})
	if err != nil || len(badA) != 2 {
		t.Fatalf("DeadLetters(type bad-a) = %d, %v; want 2", len(badA), err)
	}
	limited, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{Limit: 1})
	if err != nil || len(limited) != 1 {
		t.Fatalf("DeadLetters(limit 1) = %d, %v", len(limited), err)
	}
	future, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{Since: time.Now().Add(time.Hour)})
	if err != nil || len(future) != 0 {
		t.Fatalf("DeadLetters(since future) = %d, %v; want 0", len(future), err)
	}
	first := alpha[0]
	if first.Reason != bus.ReasonRejected || first.Agent != "alpha" || first.Message == nil ||
		first.Message.Type != "bad-a" || string(first.Data) != "a1" || first.StreamSequence == 0 || first.Time.IsZero() {
		t.Errorf("dead letter %+v", first)
	}
	shown, err := ops.DeadLetter(ctx, first.Sequence)
	if err != nil || shown.Message.ID != first.Message.ID {
		t.Fatalf("DeadLetter(%d) = %+v, %v", first.Sequence, shown, err)
	}
	if _, err := ops.DeadLetter(ctx, 999); !errors.Is(err, bus.ErrDeadLetterNotFound) {
		t.Errorf("DeadLetter(999) error = %v, want ErrDeadLetterNotFound", err)
	}

	fixed.Store(true)
	ack, err := ops.ReplayDeadLetter(ctx, first.Sequence)
	if err != nil || ack.Duplicate || ack.ID != first.Message.ID {
		t.Fatalf("replay: %+v, %v", ack, err)
	}
	if again, err := ops.ReplayDeadLetter(ctx, first.Sequence); err != nil || !again.Duplicate {
		t.Errorf("second replay: %+v, %v; want a duplicate", again, err)
	}
	d := replayed.waitCount(t, 1)[0]
	if !d.Replayed || d.ID != first.Message.ID || d.To != "alpha" || string(d.Data) != "a1" {
		t.Errorf("replayed delivery %+v replayed=%v", d.Message, d.Replayed)
	}

	n, err := ops.PurgeDeadLetters(ctx, bus.DeadLetterFilter{Agent: "alpha", Since: time.Now().Add(-time.Hour)})
	if err != nil || n != 0 {
		t.Errorf("purge alpha before an hour ago = %d, %v; want 0", n, err)
	}
	n, err = ops.PurgeDeadLetters(ctx, bus.DeadLetterFilter{Agent: "alpha"})
	if err != nil || n != 2 {
		t.Errorf("purge alpha = %d, %v; want 2", n, err)
	}
	if rest, _ := ops.DeadLetters(ctx, bus.DeadLetterFilter{}); len(rest) != 1 || rest[0].Agent != "beta" {
		t.Errorf("after purge: %d dead letters", len(rest))
	}
}

// TestRequestDeadLettered: a Request whose request is dead-lettered ends at
// once with a *DeadLetteredError saying why, from the recipient's bus
// (rejected, failed on every delivery) or from an operator's dead-letter
// watcher (never settled). It waited out its deadline. The notice that
// ends it reaches no handler of the requester, and Attach to the request
// says it was dead-lettered.
func TestRequestDeadLettered(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason bus.DeadLetterReason
		opts   []bus.SubscribeOption
		err    string
	}{
		{name: "rejected", reason: bus.ReasonRejected, err: "no such tool"},
		{name: "failed on every delivery", reason: bus.ReasonMaxDeliveries, err: "flaky",
			opts: []bus.SubscribeOption{bus.WithMaxDeliver(2), bus.WithBackoff(func(int) time.Duration { return time.Millisecond })}},
		{name: "never settled", reason: bus.ReasonUnsettled},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			orch := newBus(t, s, "orch")
			rec := newRecorder()
			subscribe(t, orch, rec.handle)
			ctx := testContext(t)
			type result struct {
				d   *bus.Delivery
				err error
			}
			done := make(chan result, 1)
			send := func() {
				go func() {
					d, err := orch.Request(ctx, bus.Message{ID: "doomed", To: "agent", Type: "crasher"})
					done <- result{d, err}
				}()
			}
			if c.reason == bus.ReasonUnsettled {
				ops := adminOf(t, s)
				wctx, cancel := context.WithCancel(context.Background())
				watched := make(chan error, 1)
				go func() { watched <- ops.WatchDeadLetters(wctx) }()
				t.Cleanup(func() { cancel(); <-watched })
				send()
				crashWhileHandling(t, s, "agent", nil, true)
			} else {
				agent := newBus(t, s, "agent")
				subscribe(t, agent, func(context.Context, *bus.Delivery) error {
					if c.reason == bus.ReasonRejected {
						return bus.Permanent(errors.New(c.err))
					}
					return errors.New(c.err)
				}, c.opts...)
				send()
			}
			r := <-done
			var de *bus.DeadLetteredError
			if !errors.As(r.err, &de) || !errors.Is(r.err, bus.ErrDeadLettered) {
				t.Fatalf("Request = %v, %v; want a *DeadLetteredError", r.d, r.err)
			}
			if de.ID != "doomed" || de.Agent != "agent" || de.Reason != c.reason || !strings.Contains(de.Err, c.err) {
				t.Errorf("DeadLetteredError %+v, want request doomed at agent, %s, %q", de, c.reason, c.err)
			}
			_, err := orch.Attach(ctx, "doomed")
			if !errors.Is(err, bus.ErrDeadLettered) || !errors.Is(err, bus.ErrFinal) {
				t.Errorf("Attach = %v; want ErrDeadLettered and ErrFinal", err)
			}
			// After the notice, in the same queue: the notice reached no
			// handler.
			other := newBus(t, s, "other")
			publish(t, other, bus.Message{To: "orch", Type: "marker"})
			for _, d := range rec.waitCount(t, 1) {
				if d.Type != "marker" {
					t.Errorf("the requester's handler got %s %s", d.Type, d.Data)
				}
			}
		})
	}
}

// TestGatherCopyEnded: a Gather whose copy is dead-lettered, or canceled by
// its sender, counts it failed at once and ends when the replies it wants
// can no longer come. It waited out its deadline.
func TestGatherCopyEnded(t *testing.T) {
	for _, c := range []struct {
		name  string
		state bus.State
	}{
		{name: "dead-lettered", state: bus.StateDeadLettered},
		{name: "canceled", state: bus.StateCanceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			ctx := testContext(t)
			lead := newBus(t, s, "lead")
			held := make(chan string, 1)
			for _, name := range []string{"a", "b", "c"} {
				member := newBus(t, s, name)
				subscribe(t, member, func(ctx context.Context, d *bus.Delivery) error {
					switch {
					case name == "b" && c.state == bus.StateDeadLettered:
						return bus.Permanent(errors.New("cannot"))
					case name == "b":
						held <- d.ID
						<-ctx.Done() // until canceled
						return ctx.Err()
					}
					_, err := d.Reply(ctx, bus.Message{Type: "VOTE"})
					return err
				})
			}
			if c.state == bus.StateCanceled {
				go func() {
					id := <-held
					if _, err := lead.Cancel(ctx, id); err != nil {
						t.Errorf("Cancel(%s): %v", id, err)
					}
				}()
			}
			res, err := lead.Gather(ctx, bus.Message{Type: "VOTE?"}, []string{"a", "b", "c"})
			if !errors.Is(err, bus.ErrTooFewReplies) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Gather = %v; want ErrTooFewReplies, before the deadline", err)
			}
			if res == nil {
				t.Fatal("no result")
			}
			if !res.Replied("a") || !res.Replied("c") || len(res.Failed) != 1 || res.Failed[0].To != "b" || res.Failed[0].State != c.state || len(res.TimedOut) != 0 {
				t.Errorf("result: replies %d, failed %+v, timed out %v; want a and c replied, b %s", len(res.Replies), res.Failed, res.TimedOut, c.state)
			}
		})
	}
}

// TestImpersonatedOwnBroadcast: a broadcast on another agent's subject
// whose event claims to come from the recipient is dead-lettered by that
// recipient too (sender_mismatch), as by every other. The recipient took
// it for its own broadcast, by the event alone, and dropped it unhandled.
func TestImpersonatedOwnBroadcast(t *testing.T) {
	s := newServer(t)
	worker, alice := newBus(t, s, "worker"), newBus(t, s, "alice")
	subscribe(t, worker, newRecorder().handle)
	subscribe(t, alice, newRecorder().handle)
	m := &codec.Message{ID: "fake-1", From: "worker", To: "*", Type: "T", Priority: 3}
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	subject, err := subjects.Default().Broadcast("mallory", "T", 3)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(embeddedtest.Connect(t, s))
	if _, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: subject, Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both recipients' sender_mismatch dead letters", func() (bool, string) {
		got := map[string]string{}
		for _, dl := range deadLetters(t, worker) {
			got[dl.Header.Get(bus.HeaderDeadLetterAgent)] = dl.Header.Get(bus.HeaderDeadLetterReason)
		}
		mismatch := string(bus.ReasonSenderMismatch)
		return got["worker"] == mismatch && got["alice"] == mismatch, fmt.Sprintf("dead letters by agent: %v", got)
	})
}

// TestDeadLetterOfALargeMessage: a message too large to store beside the
// dead letter's headers (close to max_payload) is dead-lettered without
// its data, which its replay reads from the original. The write failed:
// the message was kept, delivered again and never dead-lettered.
func TestDeadLetterOfALargeMessage(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	ops := adminOf(t, s)
	ctx := testContext(t)
	// Near the largest data Publish takes: room for the message's headers
	// and a replay's, not for the dead letter's.
	n := int(sender.Conn().MaxPayload())
	for err := bus.ErrPayloadTooLarge; errors.Is(err, bus.ErrPayloadTooLarge); {
		n -= 32
		_, err = sender.Publish(ctx, bus.Message{To: "nobody", Type: "PROBE", Data: make([]byte, n)})
		if err != nil && !errors.Is(err, bus.ErrPayloadTooLarge) {
			t.Fatal(err)
		}
	}
	n -= 128
	ack, err := sender.Publish(ctx, bus.Message{To: "worker", Type: "POISON", Data: make([]byte, n)})
	if err != nil {
		t.Fatal(err)
	}
	replayed := make(chan int, 1)
	subscribe(t, newBus(t, s, "worker"), func(ctx context.Context, d *bus.Delivery) error {
		if d.Replayed {
			replayed <- len(d.Data)
			return nil
		}
		return bus.Permanent(errors.New("poison"))
	})
	raw := waitDeadLetters(t, ops, 1)[0]
	dl, err := ops.DeadLetter(ctx, raw.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if dl.DataDropped != n || len(dl.Data) != 0 || dl.Message == nil || dl.Message.ID != ack.ID || dl.Reason != bus.ReasonRejected {
		t.Errorf("dead letter: data dropped %d (want %d), data %d bytes, decoded %t, reason %s", dl.DataDropped, n, len(dl.Data), dl.Message != nil, dl.Reason)
	}
	if _, err := ops.ReplayDeadLetter(ctx, raw.Sequence); err != nil {
		t.Fatalf("ReplayDeadLetter: %v", err)
	}
	if got := <-replayed; got != n {
		t.Errorf("replayed with %d bytes of data, want %d", got, n)
	}
}

// TestDeadLetterOfAMessageWithLargeHeaders: a message whose headers are
// near the server's 64 KiB (a foreign publisher's; the codec refuses
// extensions over MaxExtensionsSize together, and so Publish does) is
// dead-lettered without its largest headers, named in
// HeaderDeadLetterHeadersDropped. Before, with the dead letter's own
// headers it passed 64 KiB, the server refused it, and the message was
// kept and delivered again for good (found by hunt h12).
func TestDeadLetterOfAMessageWithLargeHeaders(t *testing.T) {
	s := newServer(t, func(o *embedded.Options) { o.MaxPayload = 1 << 20 })
	ctx := testContext(t)
	sender := newBus(t, s, "sender")
	big := map[string]string{}
	for i := range 20 { // each extension within its limit, 80 KB together
		big[fmt.Sprintf("x%d", i)] = strings.Repeat("v", 4000)
	}
	var fe *codec.FieldError
	if _, err := sender.Publish(ctx, bus.Message{To: "worker", Type: "T", Extensions: big}); !errors.As(err, &fe) || fe.Field != "Extensions" || !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("Publish of 80 KB of extensions: %v, want ErrInvalidMessage on Extensions", err)
	}
	h := map[string]string{"ce-specversion": "1.0", "ce-id": "big-1", "ce-source": "/agents/lead", "ce-type": "T", "Nats-Msg-Id": "big-1"}
	for i := range 15 {
		h[fmt.Sprintf("ce-x%d", i)] = strings.Repeat("v", 4000)
	}
	size := len("NATS/1.0\r\n\r\n")
	for k, v := range h {
		size += len(k) + len(v) + len(": \r\n")
	}
	// 200 bytes under the server's 64 KiB, which takes it: no room for the
	// dead letter's headers.
	h["ce-last"] = strings.Repeat("v", 65535-200-size-len("ce-last: \r\n"))
	newForeignAgent(t, s, "lead").publishRaw(t, ctx, "agentbus.agent.worker.p3.lead.T", h, "{}")
	subscribe(t, newBus(t, s, "worker"), func(context.Context, *bus.Delivery) error {
		t.Error("handled a message whose extensions pass MaxExtensionsSize")
		return nil
	})
	raw := waitDeadLetters(t, sender, 1)[0]
	dropped := strings.Split(raw.Header.Get(bus.HeaderDeadLetterHeadersDropped), ",")
	if dropped[0] != "ce-last" || raw.Header.Get("ce-id") != "big-1" ||
		raw.Header.Get(bus.HeaderDeadLetterReason) != string(bus.ReasonMalformed) {
		t.Errorf("dead letter: dropped %q, ce-id %q, reason %q", dropped, raw.Header.Get("ce-id"), raw.Header.Get(bus.HeaderDeadLetterReason))
	}
}

// TestHandlerErrorWrappingCanceledOrExpired: a handler's failure that
// wraps ErrCanceled or ErrExpired (a Request of its own that was
// canceled: *CanceledError) is dead-lettered like any other. Whether a
// terminated message was dead-lettered was decided by errors.Is on the
// handler's own error: its message was terminated with no dead letter, on
// its last delivery or at once with Permanent, and read completed.
func TestHandlerErrorWrappingCanceledOrExpired(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		opts []bus.SubscribeOption
	}{
		{"permanent", bus.Permanent(fmt.Errorf("ask the pricer: %w", &bus.CanceledError{ID: "sub-1", By: "pricer"})), nil},
		{"max deliveries", fmt.Errorf("ask the pricer: %w", &bus.CanceledError{ID: "sub-1", By: "pricer"}),
			[]bus.SubscribeOption{bus.WithMaxDeliver(2), bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond })}},
		{"expired downstream", bus.Permanent(fmt.Errorf("downstream: %w", bus.ErrExpired)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t)
			sender := newBus(t, s, "sender")
			worker := newBus(t, s, "worker")
			ops := adminOf(t, s)
			calls := make(chan struct{}, 16)
			subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
				calls <- struct{}{}
				return tc.err
			}, tc.opts...)
			ack := publish(t, sender, bus.Message{To: "worker", Type: "order"})
			ctx := testContext(t)
			var st []bus.Status
			waitFor(t, "the message settled", func() (bool, string) {
				var err error
				st, err = ops.Status(ctx, ack.ID)
				return err == nil && len(st) == 1 && st[0].State.Final(), fmt.Sprint(st, err)
			})
			dls, err := ops.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "worker"})
			if err != nil || len(dls) != 1 || st[0].State != bus.StateDeadLettered {
				t.Fatalf("handler failed %d times; dead letters %d (%v); status %s: terminated without a dead letter",
					len(calls), len(dls), err, st[0].State)
			}
		})
	}
}

// TestHandlerErrorWrappingMalformed: a handler that rejects a message
// because a document inside it is not a valid CloudEvent (its error wraps
// codec.ErrMalformed) has it dead-lettered as rejected. The same
// classification filed it as malformed, the reason of a message the bus
// itself refused.
func TestHandlerErrorWrappingMalformed(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	worker := newBus(t, s, "worker")
	ops := adminOf(t, s)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		_, err := codec.UnmarshalJSON(d.Data) // the attachment is no event
		return bus.Permanent(fmt.Errorf("attachment: %w", err))
	})
	publish(t, sender, bus.Message{To: "worker", Type: "order", Data: []byte(`{"not":"an event"}`)})
	ctx := testContext(t)
	var dls []bus.DeadLetter
	waitFor(t, "a dead letter", func() (bool, string) {
		var err error
		dls, err = ops.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "worker"})
		return err == nil && len(dls) == 1, fmt.Sprint(len(dls), err)
	})
	if dls[0].Reason != bus.ReasonRejected {
		t.Fatalf("a message its handler rejected (Permanent) is dead-lettered as %q (%s), want %q", dls[0].Reason, dls[0].Error, bus.ReasonRejected)
	}
}

// TestSenderMismatchWritesNoRecord: a message that names another sender
// than its subject is dead-lettered (sender_mismatch) without a record. Its
// dead_lettered record was written under the key of the sender and ID it
// claims: mallory could write it over the record of a message of alice's
// to bob, and bob then skipped alice's request with that ID unhandled (its
// record was final).
func TestSenderMismatchWritesNoRecord(t *testing.T) {
	s := newServer(t)
	alice := newBus(t, s, "alice")
	bob := newBus(t, s, "bob")
	var calls atomic.Int32
	subscribe(t, bob, func(ctx context.Context, d *bus.Delivery) error {
		calls.Add(1)
		_, err := bob.Reply(ctx, &d.Message, bus.Message{Type: "answer"})
		return err
	})
	const id = "order-42" // an ID mallory knows: a client's own, one of a conversation it is in
	replyBy := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)
	forged := &codec.Message{ID: id, From: "alice", To: "bob", Type: "order", CorrelationID: id,
		Extensions: map[string]string{bus.ExtReplyBy: replyBy}}
	forged.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	raw := embeddedtest.Connect(t, s) // mallory, publishing as itself
	if err := raw.PublishMsg(&nats.Msg{Subject: "agentbus.agent.bob.p3.mallory.order", Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	ops := adminOf(t, s)
	dl := waitDeadLetters(t, ops, 1)[0]
	if r := dl.Header.Get(bus.HeaderDeadLetterReason); r != string(bus.ReasonSenderMismatch) {
		t.Fatalf("dead-lettered as %q, want %q", r, bus.ReasonSenderMismatch)
	}
	if st, err := ops.Status(ctx, id); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Status of alice's %s before alice sent anything = %+v, %v; want ErrNoStatus", id, st, err)
	}

	rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	_, err = alice.Request(rctx, bus.Message{ID: id, To: "bob", Type: "order"})
	if err != nil || calls.Load() != 1 {
		t.Fatalf("alice's genuine request: %v; bob's handler ran %d times, want 1", err, calls.Load())
	}
}

// TestPurgeDeadLettersCountsWhatItRemoved: PurgeDeadLetters returns how
// many dead letters it removed, with other agents' dead letters stored
// meanwhile. It counted the whole stream before and after: a purge that
// removed nothing returned a wrong count, or a huge one (the difference
// wrapped around).
func TestPurgeDeadLettersCountsWhatItRemoved(t *testing.T) {
	s := newServer(t)
	ops := adminOf(t, s)
	raw := embeddedtest.Connect(t, s)
	ctx, cancel := context.WithCancel(testContext(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		// Other agents' dead letters keep coming, as they do on a busy bus.
		for ctx.Err() == nil {
			if _, err := raw.Request("agentbus.dlq.other.sender.job", []byte("x"), testTimeout); err != nil {
				return
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()
	for i := range 200 {
		n, err := ops.PurgeDeadLetters(testContext(t), bus.DeadLetterFilter{Agent: "nobody"})
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("purge %d of nobody's dead letters (there are none) returned %d", i, n)
		}
	}
}

// TestDeadLetterSequenceZero: DeadLetter and ReplayDeadLetter of sequence
// 0, which no stream holds, return ErrDeadLetterNotFound, as of any
// sequence the stream does not hold. They returned the server's "bad
// request" (10003).
func TestDeadLetterSequenceZero(t *testing.T) {
	s := newServer(t)
	ops := adminOf(t, s)
	ctx := testContext(t)
	if _, err := ops.DeadLetter(ctx, 0); !errors.Is(err, bus.ErrDeadLetterNotFound) {
		t.Errorf("DeadLetter(0) = %v, want ErrDeadLetterNotFound", err)
	}
	if _, err := ops.ReplayDeadLetter(ctx, 0); !errors.Is(err, bus.ErrDeadLetterNotFound) {
		t.Errorf("ReplayDeadLetter(0) = %v, want ErrDeadLetterNotFound", err)
	}
	if _, err := ops.DeadLetter(ctx, 1<<63); !errors.Is(err, bus.ErrDeadLetterNotFound) {
		t.Errorf("DeadLetter(1<<63) = %v, want ErrDeadLetterNotFound", err)
	}
}

// TestWatchDeadLettersEndsWithItsConnection: WatchDeadLetters on a
// connection of the caller's returns an error once that connection
// closes, with the unsettled stream and without it. Without it, it waited
// for its context alone, watching nothing (found by a helper session).
func TestWatchDeadLettersEndsWithItsConnection(t *testing.T) {
	for _, withoutStream := range []bool{false, true} {
		t.Run(fmt.Sprint("without the unsettled stream: ", withoutStream), func(t *testing.T) {
			s := newServer(t)
			nc := embeddedtest.Connect(t, s)
			ops, err := bus.NewAdmin(nc, bus.WithErrorHandler(func(error) {}))
			if err != nil {
				t.Fatal(err)
			}
			defer ops.Close()
			if withoutStream {
				js, _ := jetstream.New(nc)
				if err := js.DeleteStream(testContext(t), subjects.Default().UnsettledStream()); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() { done <- ops.WatchDeadLetters(testContext(t)) }()
			waitFor(t, "the watch running", func() (bool, string) {
				n := goroutinesIn("bus.(*Admin).WatchDeadLetters")
				return n == 1, fmt.Sprint(n)
			})
			nc.Close()
			select {
			case err := <-done:
				if err == nil {
					t.Error("WatchDeadLetters returned nil when its connection closed; want an error")
				}
			case <-testContext(t).Done():
				t.Fatal("WatchDeadLetters still running after its connection closed")
			}
		})
	}
}
