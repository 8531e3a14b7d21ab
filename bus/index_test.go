package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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

// TestStatusByIndexedSubject: a message whose sender wrote no record (here
// a foreign publisher that indexes its subjects) is found by its subject.
// An operator and its recipient read it pending at its sequence, then
// completed once handled, which nobody wrote: the lookup reads it off the
// recipient's consumer. A subject that names an ID its event does not carry
// finds nothing by that ID, and does not hide the message that has it from
// an operator, who reads every subject that names the ID, nor from its
// recipient, whose lookup reads every message of its filter when the last
// one is another (docs/security.md).
func TestStatusByIndexedSubject(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	admin := adminOf(t, s)
	ctx := testContext(t)
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	send := func(from, id, subjectID string) *jetstream.PubAck {
		t.Helper()
		m := &codec.Message{ID: id, From: from, To: "worker", Type: "T", Priority: 2, CorrelationID: "conv-ix"}
		m.SetDefaults(time.Now())
		h, data, err := codec.Binary{}.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		h[jetstream.MsgIDHeader] = []string{id}
		subject := indexedSubject(t, "worker", from, "T", 2, subjectID, "conv-ix")
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	ack := send("foreign", "ix-1", "ix-1")
	send("foreign", "ix-2", "ix-3") // names ix-3, carries ix-2

	check := func(who string, sts []bus.Status, err error, want bus.State) string {
		if err != nil || len(sts) != 1 {
			return fmt.Sprintf("%s: %+v, %v", who, sts, err)
		}
		st := sts[0]
		if st.ID != "ix-1" || st.From != "foreign" || st.To != "worker" || st.Type != "T" || st.Priority != 2 ||
			st.CorrelationID != "conv-ix" || st.Stream != "AGENTBUS" || st.Sequence != ack.Sequence || st.State != want {
			return fmt.Sprintf("%s: %+v, want ix-1 %s at sequence %d", who, st, want, ack.Sequence)
		}
		return ""
	}
	sts, err := admin.Status(ctx, "ix-1")
	if msg := check("Admin.Status", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}
	sts, err = worker.Status(ctx, "ix-1")
	if msg := check("the recipient's Status", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}
	send("mallory", "ix-9", "ix-1") // names ix-1 too, later
	for _, id := range []string{"ix-2", "ix-3"} {
		if sts, err := admin.Status(ctx, id); !errors.Is(err, bus.ErrNoStatus) {
			t.Errorf("Admin.Status(%s) = %+v, %v, want ErrNoStatus", id, sts, err)
		}
	}
	sts, err = admin.Status(ctx, "ix-1")
	if msg := check("Admin.Status after a later subject naming ix-1", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}
	sts, err = worker.Status(ctx, "ix-1")
	if msg := check("the recipient's Status after a later subject naming ix-1", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}

	r := newRecorder()
	subscribe(t, worker, r.handle)
	r.waitCount(t, 3)
	waitFor(t, "ix-1 read completed", func() (bool, string) {
		sts, err := admin.Status(ctx, "ix-1")
		msg := check("Admin.Status", sts, err, bus.StateCompleted)
		return msg == "", msg
	})
}

// TestIndexWindows: messages whose IDs (UUIDs version 7) fall in one 4 ms
// window share their indexed subject, as messages sent close together do,
// and every lookup still finds each by its ID: an operator's, and the
// sender's and the recipient's Status, which read the window's messages
// where the last of its subject is another. The conversations begun in the
// window share a token too; a trace and an agent's History keep their own
// conversation's messages. A message an earlier version stored under its
// ID's own token and its conversation key is found as well.
func TestIndexWindows(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	admin := adminOf(t, s)
	id := windowID
	if subjects.IndexToken(id(0)) != subjects.IndexToken(id(9)) || !subjects.Windowed(subjects.IndexToken(id(0))) {
		t.Fatal("the test's IDs are not of one window")
	}
	convOf := func(n int) string { return id(n % 2) } // id(0) and id(1) begin the two conversations
	seqs := map[string]uint64{}
	send := func(from *bus.Bus, to string, n int) {
		t.Helper()
		m := bus.Message{ID: id(n), To: to, Type: "T", CorrelationID: convOf(n)}
		if n < 2 {
			m.CorrelationID = "" // a conversation's first message: its own ID
		}
		ack, err := from.Publish(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		seqs[id(n)] = ack.Sequence
	}
	for n := range 6 {
		send(alice, "bob", n)
	}
	send(bob, "alice", 6) // the other way, in the first conversation

	// What an earlier version stored: the ID's own token and the
	// conversation's key, in the same window.
	old := id(7)
	msg := &codec.Message{ID: old, From: "alice", To: "bob", Type: "T", Priority: 3, CorrelationID: convOf(7)}
	msg.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	h[jetstream.MsgIDHeader] = []string{old}
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	direct, err := subjects.Default().Direct("bob", "alice", "T", 3)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: direct + "." + subjects.IDToken(old) + "." + subjects.ConversationKey(convOf(7)), Header: h, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	seqs[old] = ack.Sequence

	for n := range 8 {
		want := id(n)
		from, to := alice, bob
		if n == 6 {
			from, to = bob, alice
		}
		for _, who := range []struct {
			name   string
			status func(context.Context, string) ([]bus.Status, error)
		}{{"Admin", admin.Status}, {"sender", from.Status}, {"recipient", to.Status}} {
			sts, err := who.status(ctx, want)
			if err != nil || len(sts) != 1 || sts[0].ID != want || sts[0].Sequence != seqs[want] || sts[0].CorrelationID != convOf(n) || sts[0].State != bus.StatePending {
				t.Errorf("%s's Status(%d) = %+v, %v, want %s pending at sequence %d in %s", who.name, n, sts, err, want, seqs[want], convOf(n))
			}
		}
	}
	if sts, err := admin.Status(ctx, id(8)); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Admin.Status of an ID of the window never sent = %+v, %v, want ErrNoStatus", sts, err)
	}

	idsOf := func(sts []bus.Status) (out []string) {
		for _, st := range sts {
			out = append(out, st.ID)
		}
		return out
	}
	for conv, want := range map[string][]string{
		convOf(0): {id(0), id(2), id(4), id(6)},
		convOf(1): {id(1), id(3), id(5), id(7)},
	} {
		sts, err := admin.Conversation(ctx, conv)
		if got := idsOf(sts); err != nil || !slices.Equal(got, want) {
			t.Errorf("Admin.Conversation(%s) = %q, %v, want %q", conv, got, err, want)
		}
		for _, b := range []*bus.Bus{alice, bob} {
			p, err := b.History(ctx, conv, bus.HistoryQuery{})
			var got []string
			for _, e := range p.Entries {
				got = append(got, e.ID)
			}
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("History(%s) of %s = %q, %v, want %q", conv, b.Agent(), got, err, want)
			}
		}
	}
}

// TestRepliesInOneWindow: the replies Reply sends under the derived ID of
// requests made in one window share its window too, so a lookup of each
// request finds its reply among the others: replied, with the reply's ID,
// for the requester, the worker and an operator, though no record of the
// round trip was written.
func TestRepliesInOneWindow(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	orch, worker := newBus(t, s, "orchestrator"), newBus(t, s, "worker")
	admin := adminOf(t, s)
	replier(t, worker)
	id := windowID
	replies := map[string]string{}
	for n := range 4 {
		reply, err := orch.Request(ctx, bus.Message{ID: id(n), To: "worker", Type: "REQUEST"})
		if err != nil {
			t.Fatal(err)
		}
		if reply.CausationID != id(n) || subjects.IndexToken(reply.ID) != subjects.IndexToken(id(n)) || reply.ID == id(n) {
			t.Fatalf("reply %s to %s: want a derived ID in the request's window", reply.ID, reply.CausationID)
		}
		replies[id(n)] = reply.ID
	}
	for n := range 4 {
		for _, who := range []struct {
			name   string
			status func(context.Context, string) ([]bus.Status, error)
		}{{"requester", orch.Status}, {"worker", worker.Status}, {"operator", admin.Status}} {
			waitFor(t, fmt.Sprintf("the %s's lookup of request %d", who.name, n), func() (bool, string) {
				sts, err := who.status(ctx, id(n))
				ok := err == nil && len(sts) == 1 && sts[0].State == bus.StateReplied && sts[0].ReplyID == replies[id(n)]
				return ok, fmt.Sprintf("%+v, %v", sts, err)
			})
		}
	}
}

// TestIndexWindowsTwoProcesses: two processes of one agent look up
// messages of one window at the same time. Each reads the window with the
// agent's history consumer, of which the agent has one name; neither may
// read through the other's consumer (each would get part of the window)
// or fail because the other holds it.
func TestIndexWindowsTwoProcesses(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice := newBus(t, s, "alice")
	bobs := []*bus.Bus{newBus(t, s, "bob"), newBus(t, s, "bob")}
	id := windowID
	const sent = 40
	seqs := map[string]uint64{}
	for n := range sent {
		ack, err := alice.Publish(ctx, bus.Message{ID: id(n), To: "bob", Type: "T"})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id(n)] = ack.Sequence
	}
	const lookups = 30
	errs := make(chan error, len(bobs)*lookups)
	var wg sync.WaitGroup
	for i, b := range bobs {
		wg.Go(func() {
			for k := range lookups {
				want := id((k*7 + i) % (sent - 1)) // never the last: the window is read
				sts, err := b.Status(ctx, want)
				if err != nil || len(sts) != 1 || sts[0].ID != want || sts[0].Sequence != seqs[want] {
					errs <- fmt.Errorf("process %d: Status(%s) = %+v, %v; want it at sequence %d", i, want, sts, err, seqs[want])
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHistoryConsumerLeftBehind: a process that died while it read left
// the agent's history consumer behind; the server would remove it a minute
// later. Another process of the agent takes it over and answers.
func TestHistoryConsumerLeftBehind(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	id := windowID
	var first *bus.PubAck
	for n := range 3 {
		ack, err := alice.Publish(ctx, bus.Message{ID: id(n), To: "bob", Type: "T"})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			first = &ack
		}
	}
	name, filter, err := subjects.Default().ReceivedHistoryConsumer("bob")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, subjects.Default().Stream(), jetstream.ConsumerConfig{Name: name, FilterSubject: filter,
		AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, InactiveThreshold: time.Minute, Description: "left by a process that died"}); err != nil {
		t.Fatal(err)
	}
	sts, err := bob.Status(ctx, id(0)) // not the last of its window: the window is read
	if err != nil || len(sts) != 1 || sts[0].Sequence != first.Sequence {
		t.Fatalf("Status(%s) = %+v, %v; want it at sequence %d", id(0), sts, err, first.Sequence)
	}
}

// TestStatusStreamUnread: a lookup that cannot read the stream, here
// because the stream has no room for the consumer that reads a window,
// and finds no record either, says so: not ErrNoStatus, which would tell
// its caller that no such message was sent.
func TestStatusStreamUnread(t *testing.T) {
	s := embeddedtest.RunServer(t)
	ctx := testContext(t)
	const root = "full"
	if _, err := adminOf(t, s).Provision(ctx, bus.StreamConfig{Root: root, MaxConsumers: 1}); err != nil {
		t.Fatal(err)
	}
	alice, bob := newBus(t, s, "alice", bus.WithRoot(root)), newBus(t, s, "bob", bus.WithRoot(root))
	id := windowID
	for n := range 3 {
		if _, err := alice.Publish(ctx, bus.Message{ID: id(n), To: "bob", Type: "T"}); err != nil {
			t.Fatal(err)
		}
	}
	if sts, err := bob.Status(ctx, id(0)); err != nil || len(sts) != 1 {
		t.Fatalf("Status(%s) with room for a consumer = %+v, %v", id(0), sts, err)
	}
	scheme, err := subjects.New(root)
	if err != nil {
		t.Fatal(err)
	}
	takeLastConsumer(t, s, scheme.Stream())
	sts, err := bob.Status(ctx, id(0)) // not the last of its window: the window is read
	if err == nil || errors.Is(err, bus.ErrNoStatus) {
		t.Fatalf("Status(%s) with no room for a consumer = %+v, %v; want the stream's error, not ErrNoStatus", id(0), sts, err)
	}
}

// windowID returns the n-th of the test IDs of one 4 ms window: UUIDs
// version 7 of the same milliseconds, as IDs the bus makes within 4 ms
// have.
func windowID(n int) string { return fmt.Sprintf("019ab1c2-d3e4-7abc-8def-%012x", n) }

// takeLastConsumer creates a consumer on stream, provisioned with room for
// one, so that the server refuses any other.
func takeLastConsumer(t *testing.T, s *embedded.Server, stream string) {
	t.Helper()
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(testContext(t), stream, jetstream.ConsumerConfig{Name: "taken", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
}
