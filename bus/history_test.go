package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// conversation is a conversation among alice, bob and carol, with a
// broadcast by alice that bob and carol handled, and a message of another
// conversation in between.
type conversation struct {
	s                  *embedded.Server
	admin              *bus.Admin
	alice, bob, carol  *bus.Bus
	ids                []string // the conversation's messages, in order
	sender, recipients map[string]string
}

const historyConv = "conv-history"

func newConversation(t *testing.T) *conversation {
	t.Helper()
	s := newServer(t)
	c := &conversation{s: s, admin: adminOf(t, s),
		alice: newBus(t, s, "alice"), bob: newBus(t, s, "bob"), carol: newBus(t, s, "carol"),
		sender: map[string]string{}, recipients: map[string]string{}}
	// bob and carol handle what comes, so that they record the broadcast.
	rb, rc := newRecorder(), newRecorder()
	subscribe(t, c.bob, rb.handle)
	subscribe(t, c.carol, rc.handle)
	for _, step := range []struct {
		from *bus.Bus
		m    bus.Message
	}{
		{c.alice, bus.Message{ID: "h-1", To: "bob", Type: "TASK", Priority: 2, Data: []byte("review the patch")}},
		{c.bob, bus.Message{ID: "h-2", To: "carol", Type: "SUBTASK", Data: []byte("run the tests"), CausationID: "h-1"}},
		{c.alice, bus.Message{ID: "other", To: "bob", Type: "TASK", CorrelationID: "elsewhere", Data: []byte("not this one")}},
		{c.carol, bus.Message{ID: "h-3", To: "bob", Type: "RESULT", Data: []byte("tests pass"), CausationID: "h-2"}},
		{c.bob, bus.Message{ID: "h-4", To: "alice", Type: "RESULT", Priority: 1, Data: []byte("approved"), CausationID: "h-1"}},
		{c.alice, bus.Message{ID: "h-5", To: bus.Broadcast, Type: "NOTE", Data: []byte("merged")}},
	} {
		if step.m.CorrelationID == "" {
			step.m.CorrelationID = historyConv
			c.ids = append(c.ids, step.m.ID)
			c.sender[step.m.ID], c.recipients[step.m.ID] = step.from.Agent(), step.m.To
		}
		publish(t, step.from, step.m)
	}
	// bob got h-1, other, h-3 and h-5; carol h-2 and h-5.
	rb.waitCount(t, 4)
	rc.waitCount(t, 2)
	ctx := testContext(t)
	waitFor(t, "the broadcast's records of bob and carol", func() (bool, string) {
		sts, err := c.admin.Status(ctx, "h-5")
		return err == nil && len(sts) == 3, fmt.Sprintf("%+v, %v", sts, err)
	})
	return c
}

// ids returns the IDs of entries.
func ids(entries []bus.HistoryEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.ID)
	}
	return out
}

// TestHistoryOperator: an operator reads the whole conversation, every
// message with its body, in order, paged, and the pages add up to it.
func TestHistoryOperator(t *testing.T) {
	c := newConversation(t)
	ctx := testContext(t)

	p, err := c.admin.History(ctx, historyConv, bus.HistoryQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(p.Entries); !slices.Equal(got, c.ids) || p.Next != "" || p.CorrelationID != historyConv {
		t.Fatalf("History = %v next %q, want %v and no next page", got, p.Next, c.ids)
	}
	bodies := map[string]string{"h-1": "review the patch", "h-2": "run the tests", "h-3": "tests pass", "h-4": "approved", "h-5": "merged"}
	for _, e := range p.Entries {
		if e.Err != nil || string(e.Data) != bodies[e.ID] || e.From != c.sender[e.ID] || e.To != c.recipients[e.ID] ||
			e.CorrelationID != historyConv || e.Stream != "AGENTBUS" || e.Sequence == 0 || e.Subject == "" {
			t.Errorf("entry %+v, want %s from %s to %s with %q", e, e.ID, c.sender[e.ID], c.recipients[e.ID], bodies[e.ID])
		}
	}
	if e := p.Entries[3]; e.Priority != 1 || e.Type != "RESULT" || e.CausationID != "h-1" || e.Subject != indexedSubject(t, "alice", "bob", "RESULT", 1, "h-4", historyConv) {
		t.Errorf("h-4 = %+v, want bob's priority-1 RESULT to alice caused by h-1", e)
	}

	// Two at a time: three pages, the last without a next.
	var paged []string
	q := bus.HistoryQuery{Limit: 2}
	for pages := 1; ; pages++ {
		p, err := c.admin.History(ctx, historyConv, q)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, ids(p.Entries)...)
		if p.Next == "" {
			if pages != 3 {
				t.Errorf("%d pages of 2 for 5 messages, want 3", pages)
			}
			break
		}
		if pages > 3 {
			t.Fatalf("more than 3 pages: %v", paged)
		}
		q.After = p.Next
	}
	if !slices.Equal(paged, c.ids) {
		t.Errorf("pages %v, want %v", paged, c.ids)
	}

	if _, err := c.admin.History(ctx, "no such conversation", bus.HistoryQuery{}); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("History of an unknown conversation: %v, want ErrNoStatus", err)
	}
}

// TestHistoryAgentView: an agent reads the messages it sent or received in
// the conversation, and nothing of what passed between others; an agent
// that took no part gets ErrNotParticipant.
func TestHistoryAgentView(t *testing.T) {
	c := newConversation(t)
	ctx := testContext(t)
	for _, tt := range []struct {
		b    *bus.Bus
		want []string
	}{
		{c.alice, []string{"h-1", "h-4", "h-5"}},
		{c.bob, []string{"h-1", "h-2", "h-3", "h-4", "h-5"}},
		{c.carol, []string{"h-2", "h-3", "h-5"}},
	} {
		t.Run(tt.b.Agent(), func(t *testing.T) {
			p, err := tt.b.History(ctx, historyConv, bus.HistoryQuery{})
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(p.Entries); !slices.Equal(got, tt.want) || p.Next != "" {
				t.Fatalf("History = %v next %q, want %v", got, p.Next, tt.want)
			}
			for _, e := range p.Entries {
				if e.Err != nil || len(e.Data) == 0 || e.From != c.sender[e.ID] || e.To != c.recipients[e.ID] {
					t.Errorf("entry %s: %+v, want its body", e.ID, e)
				}
			}
			// Paged one at a time, the same.
			var paged []string
			for q := (bus.HistoryQuery{Limit: 1}); ; {
				p, err := tt.b.History(ctx, historyConv, q)
				if err != nil {
					t.Fatal(err)
				}
				paged = append(paged, ids(p.Entries)...)
				if q.After = p.Next; q.After == "" || len(paged) > len(tt.want) {
					break
				}
			}
			if !slices.Equal(paged, tt.want) {
				t.Errorf("pages of one: %v, want %v", paged, tt.want)
			}
		})
	}

	dave := newBus(t, c.s, "dave")
	if p, err := dave.History(ctx, historyConv, bus.HistoryQuery{}); !errors.Is(err, bus.ErrNotParticipant) || len(p.Entries) != 0 {
		t.Errorf("dave's History = %v, %v; want ErrNotParticipant", ids(p.Entries), err)
	}
	// The history consumers are gone after each read.
	for _, name := range []string{"bob_h", "bob_hs", "bob_ha"} {
		if _, err := consumerInfo(t, c.bob, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("consumer %s after History: %v, want it deleted", name, err)
		}
	}
}

// TestHistoryReplyOutsideHandler: a reply sent outside the request's
// handler rewrites the request's record without its sequence; History
// finds the request by the record's earlier state.
func TestHistoryReplyOutsideHandler(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	ctx := testContext(t)
	publish(t, alice, bus.Message{ID: "q-1", To: "bob", Type: "QUESTION", CorrelationID: "conv-q", Data: []byte("why?")})
	waitState(t, bob, "q-1", bus.StatePending)
	req, err := bob.Received(ctx, "q-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Reply(ctx, &req, bus.Message{ID: "q-2", Type: "ANSWER", Data: []byte("because")}); err != nil {
		t.Fatal(err)
	}
	if st := waitState(t, bob, "q-1", bus.StateReplied); st.Sequence != 0 {
		t.Logf("the replied record kept the sequence %d: this test no longer covers a record without one", st.Sequence)
	}
	for name, read := range map[string]func() (bus.HistoryPage, error){
		"operator": func() (bus.HistoryPage, error) { return admin.History(ctx, "conv-q", bus.HistoryQuery{}) },
		"alice":    func() (bus.HistoryPage, error) { return alice.History(ctx, "conv-q", bus.HistoryQuery{}) },
		"bob":      func() (bus.HistoryPage, error) { return bob.History(ctx, "conv-q", bus.HistoryQuery{}) },
	} {
		p, err := read()
		if err != nil || !slices.Equal(ids(p.Entries), []string{"q-1", "q-2"}) || p.Entries[0].Err != nil || string(p.Entries[0].Data) != "why?" {
			t.Errorf("%s: History = %+v, %v; want the question and the answer", name, p.Entries, err)
		}
	}
}

// TestHistoryGone: a message whose TTL passed is reported, to the operator
// and to its participants, with ErrMessageGone and what its record says.
func TestHistoryGone(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	ctx := testContext(t)
	publish(t, alice, bus.Message{ID: "g-1", To: "bob", Type: "PING", CorrelationID: "conv-g", TTL: time.Second, Data: []byte("soon gone")})
	publish(t, bob, bus.Message{ID: "g-2", To: "alice", Type: "PONG", CorrelationID: "conv-g", Data: []byte("stays")})

	check := func(t *testing.T, read func() (bus.HistoryPage, error)) {
		t.Helper()
		var p bus.HistoryPage
		waitFor(t, "g-1 gone", func() (bool, string) {
			var err error
			p, err = read()
			return err == nil && len(p.Entries) == 2 && errors.Is(p.Entries[0].Err, bus.ErrMessageGone),
				fmt.Sprintf("%+v, %v", p.Entries, err)
		})
		gone, kept := p.Entries[0], p.Entries[1]
		if gone.ID != "g-1" || gone.From != "alice" || gone.To != "bob" || gone.Type != "PING" || gone.Sequence == 0 || len(gone.Data) != 0 || gone.Subject != "" {
			t.Errorf("gone entry %+v, want g-1 from its record, without a body", gone)
		}
		if kept.ID != "g-2" || kept.Err != nil || string(kept.Data) != "stays" {
			t.Errorf("second entry %+v, want g-2 with its body", kept)
		}
	}
	t.Run("operator", func(t *testing.T) {
		check(t, func() (bus.HistoryPage, error) { return admin.History(ctx, "conv-g", bus.HistoryQuery{}) })
	})
	t.Run("participant", func(t *testing.T) {
		check(t, func() (bus.HistoryPage, error) { return bob.History(ctx, "conv-g", bus.HistoryQuery{}) })
	})
	if _, err := admin.Redeliver(ctx, "g-1", "bob"); !errors.Is(err, bus.ErrMessageGone) {
		t.Errorf("Redeliver of a gone message: %v, want ErrMessageGone", err)
	}
}

// TestHistoryBadInput: bad queries, a message in the stream that is no
// event, and a record that names another message give typed errors, in
// the entry or from the call, never a panic.
func TestHistoryBadInput(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	bob := newBus(t, s, "bob")
	ctx := testContext(t)
	publish(t, bob, bus.Message{ID: "b-1", To: "alice", Type: "TASK", CorrelationID: "conv-b", Data: []byte("fine")})
	elsewhere := publish(t, bob, bus.Message{ID: "e-1", To: "alice", Type: "TASK", CorrelationID: "conv-e", Data: []byte("not conv-b's")})

	for _, tt := range []struct {
		name    string
		q       bus.HistoryQuery
		wantErr error
	}{
		{"negative limit", bus.HistoryQuery{Limit: -1}, bus.ErrInvalidOption},
		{"limit too large", bus.HistoryQuery{Limit: bus.MaxHistoryLimit + 1}, bus.ErrInvalidOption},
		{"cursor of nothing", bus.HistoryQuery{After: "yesterday"}, bus.ErrInvalidCursor},
		{"cursor with a bad part", bus.HistoryQuery{After: "1.2000000000.3.YQ"}, bus.ErrInvalidCursor},
		{"cursor with a bad ID", bus.HistoryQuery{After: "1.2.3.!"}, bus.ErrInvalidCursor},
		{"cursor too long", bus.HistoryQuery{After: "1.2.3.YQ.5"}, bus.ErrInvalidCursor},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := admin.History(ctx, "conv-b", tt.q); !errors.Is(err, tt.wantErr) {
				t.Errorf("Admin.History: %v, want %v", err, tt.wantErr)
			}
			if _, err := bob.History(ctx, "conv-b", tt.q); !errors.Is(err, tt.wantErr) {
				t.Errorf("Bus.History: %v, want %v", err, tt.wantErr)
			}
		})
	}
	untracked := newBus(t, s, "bob", bus.WithoutLifecycle())
	if _, err := untracked.History(ctx, "conv-b", bus.HistoryQuery{}); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("History without lifecycle tracking: %v, want ErrInvalidOption", err)
	}
	if _, err := admin.Redeliver(ctx, "b-1", "*"); !errors.Is(err, bus.ErrInvalidAgentID) {
		t.Errorf("Redeliver to '*': %v, want ErrInvalidAgentID", err)
	}
	if _, err := admin.Redeliver(ctx, "nope", "bob"); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Redeliver of an unknown ID: %v, want ErrNoStatus", err)
	}
	if _, err := admin.RedeliverEntry(ctx, bus.HistoryEntry{Message: bus.Message{ID: "b-1"}}, "bob"); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("RedeliverEntry of an entry not read: %v, want ErrInvalidMessage", err)
	}

	// Garbage on a subject to bob, and a record in the conversation that
	// points at it; another record points at a message of another
	// conversation, and one at b-1 under another ID: neither hides b-1.
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	garbage, err := js.Publish(ctx, "agentbus.agent.bob.p3.mallory.TASK", []byte("\x00not an event"))
	if err != nil {
		t.Fatal(err)
	}
	forge := func(id, from, to string, seq uint64) {
		t.Helper()
		st := bus.Status{ID: id, From: from, To: to, Type: "TASK", Priority: 3, CorrelationID: "conv-b",
			State: bus.StatePending, Time: time.Now().UTC(), Stream: "AGENTBUS", Sequence: seq}
		key, err := subjects.StatusKey("conv-b", id, from, to)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(st)
		if _, err := js.Publish(ctx, "$KV.AGENTBUS_STATUS."+key, data); err != nil {
			t.Fatal(err)
		}
	}
	forge("garbage", "mallory", "bob", garbage.Sequence)
	forge("forged", "mallory", "bob", elsewhere.Sequence)
	forge("twin", "mallory", "bob", recordedSeq(t, admin, "b-1"))

	// bob does not find the message of another conversation where its
	// record says: to bob, it is not among bob's messages.
	for _, tt := range []struct {
		name     string
		read     func() (bus.HistoryPage, error)
		wantErrs map[string]error
	}{
		{"operator", func() (bus.HistoryPage, error) { return admin.History(ctx, "conv-b", bus.HistoryQuery{}) },
			map[string]error{"b-1": nil, "garbage": codec.ErrMalformed, "forged": bus.ErrNotRecorded, "twin": bus.ErrNotRecorded}},
		{"bob", func() (bus.HistoryPage, error) { return bob.History(ctx, "conv-b", bus.HistoryQuery{}) },
			map[string]error{"b-1": nil, "garbage": codec.ErrMalformed, "forged": bus.ErrMessageGone, "twin": bus.ErrNotRecorded}},
	} {
		wantErrs := tt.wantErrs
		t.Run(tt.name, func(t *testing.T) {
			p, err := tt.read()
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(p.Entries); !slices.Equal(got, []string{"b-1", "garbage", "forged", "twin"}) {
				t.Fatalf("entries %v, want b-1, garbage, forged, twin", got)
			}
			for _, e := range p.Entries {
				want := wantErrs[e.ID]
				if (want == nil) != (e.Err == nil) || want != nil && !errors.Is(e.Err, want) {
					t.Errorf("%s: Err %v, want %v", e.ID, e.Err, want)
				}
			}
		})
	}
	if _, err := admin.Redeliver(ctx, "garbage", "bob"); !errors.Is(err, codec.ErrMalformed) {
		t.Errorf("Redeliver of garbage: %v, want the codec's error", err)
	}
}

// TestRedeliver: an operator delivers a past message again to an agent
// that starts from scratch; it arrives with a new ID, marked as a
// redelivery of the original, with the original's sender, type, priority,
// conversation, causation, time and data, and without its TTL.
func TestRedeliver(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	alice := newBus(t, s, "alice")
	ctx := testContext(t)
	orig := bus.Message{ID: "r-1", To: "bob", Type: "TASK", Priority: 2, CorrelationID: "conv-r", CausationID: "r-0",
		ContentType: "text/plain", TTL: time.Hour, Data: []byte("the context"), Extensions: map[string]string{"subject": "build 7"}}
	sent := publish(t, alice, orig)

	// bob handles it once, then starts from scratch.
	first := newBus(t, s, "bob")
	r := newRecorder()
	sub := subscribe(t, first, r.handle)
	r.waitCount(t, 1)
	sub.Stop()
	<-sub.Done()
	first.Close()

	ack, err := admin.Redeliver(ctx, "r-1", "bob")
	if err != nil {
		t.Fatal(err)
	}
	if ack.ID == "r-1" || ack.ID == "" || ack.Duplicate || ack.Sequence <= sent.Sequence || withoutIndex(t, ack.Subject) != "agentbus.agent.bob.p2.alice.TASK" {
		t.Errorf("ack %+v, want a new message from alice to bob at priority 2", ack)
	}
	again := newBus(t, s, "bob")
	r = newRecorder()
	subscribe(t, again, r.handle)
	d := r.waitCount(t, 1)[0]
	sentAt := recordedTime(t, admin, "r-1")
	check := func(d *bus.Delivery, to string) {
		t.Helper()
		if d.ID == "r-1" || d.Extensions[bus.ExtRedeliveryOf] != "r-1" || d.Extensions["subject"] != "build 7" {
			t.Errorf("delivery %s extensions %v, want a new ID, %s=r-1 and the original's", d.ID, d.Extensions, bus.ExtRedeliveryOf)
		}
		if d.From != "alice" || d.To != to || d.Type != "TASK" || d.Priority != 2 || d.CorrelationID != "conv-r" || d.CausationID != "r-0" ||
			d.ContentType != "text/plain" || string(d.Data) != "the context" || d.TTL != 0 || !d.Time.Equal(sentAt) {
			t.Errorf("delivery %+v, want the original's attributes, to %s, without a TTL", d.Message, to)
		}
	}
	check(d, "bob")

	// From a history entry, to another agent; the repeat is part of the
	// conversation now.
	p, err := admin.History(ctx, "conv-r", bus.HistoryQuery{})
	if err != nil || len(p.Entries) != 2 || p.Entries[1].Extensions[bus.ExtRedeliveryOf] != "r-1" {
		t.Fatalf("History = %+v, %v; want the original and its repeat", p.Entries, err)
	}
	if _, err := admin.RedeliverEntry(ctx, p.Entries[0], "carol"); err != nil {
		t.Fatal(err)
	}
	carol := newBus(t, s, "carol")
	rc := newRecorder()
	subscribe(t, carol, rc.handle)
	check(rc.waitCount(t, 1)[0], "carol")
}

// recordedSeq returns the stream sequence of message id, as its records
// say.
func recordedSeq(t *testing.T, admin *bus.Admin, id string) uint64 {
	t.Helper()
	sts, err := admin.Status(testContext(t), id)
	if err != nil || len(sts) == 0 {
		t.Fatalf("status of %s: %v", id, err)
	}
	return sts[0].Sequence
}

// recordedTime returns the time of message id, as its records say.
func recordedTime(t *testing.T, admin *bus.Admin, id string) time.Time {
	t.Helper()
	sts, err := admin.Status(testContext(t), id)
	if err != nil || len(sts) == 0 {
		t.Fatalf("status of %s: %v", id, err)
	}
	return sts[0].Time
}

// FuzzHistoryCursor: any After is accepted or refused with
// ErrInvalidCursor, never a panic, and every entry's Cursor is accepted.
func FuzzHistoryCursor(f *testing.F) {
	for _, c := range []string{"", "1795000000.123456789.42.aC0x", "yesterday", "1.2.3", "-1.0.0.", "1.999999999.18446744073709551615.YQ"} {
		f.Add(c, int64(1795000000), uint64(7), "h-1")
	}
	f.Fuzz(func(t *testing.T, after string, sec int64, seq uint64, id string) {
		if err := (bus.HistoryQuery{After: after}).Validate(); err != nil && !errors.Is(err, bus.ErrInvalidCursor) {
			t.Errorf("Validate(%q) = %v, want nil or ErrInvalidCursor", after, err)
		}
		e := bus.HistoryEntry{Message: bus.Message{ID: id, Time: time.Unix(sec, int64(seq%1e9))}, Sequence: seq}
		if err := (bus.HistoryQuery{After: e.Cursor()}).Validate(); err != nil {
			t.Errorf("the cursor %q of %+v: %v", e.Cursor(), e, err)
		}
	})
}

// TestHistoryOfARecurringSchedule: each firing of a recurring schedule is
// one entry of its conversation's history, as its recipient got it (its
// own ID, ExtScheduleID), and Redeliver repeats it by that ID. Each was
// two entries, one under the schedule's ID and one under the firing's
// with ErrNotRecorded (the stored event holds the schedule's ID), and
// Redeliver of a firing failed with ErrNotRecorded.
func TestHistoryOfARecurringSchedule(t *testing.T) {
	_, alice, rec, admin := scheduling(t)
	ctx := testContext(t)
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "tick"}, bus.Every(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fired := rec.waitCount(t, 2)[:2]
	if _, err := alice.Cancel(ctx, ack.ID); err != nil {
		t.Fatal(err)
	}
	for _, d := range fired {
		waitFor(t, "the firing's record", func() (bool, string) {
			st := statusOf(t, admin, d.ID)
			return st.State == bus.StateCompleted, fmt.Sprint(st)
		})
	}
	for who, history := range map[string]func(context.Context, string, bus.HistoryQuery) (bus.HistoryPage, error){
		"operator": admin.History, "sender": alice.History,
	} {
		p, err := history(ctx, ack.ID, bus.HistoryQuery{})
		if err != nil {
			t.Fatalf("%s's History: %v", who, err)
		}
		seen := map[string]int{}
		for _, e := range p.Entries {
			if e.Err != nil {
				t.Errorf("%s's History: entry %s at %d: %v", who, e.ID, e.Sequence, e.Err)
			}
			seen[e.ID]++
		}
		for _, d := range fired {
			if seen[d.ID] != 1 || seen[ack.ID] != 0 {
				t.Errorf("%s's History: firing %s %d times, the schedule's ID %d times; want once and none: %v", who, d.ID, seen[d.ID], seen[ack.ID], seen)
			}
		}
	}
	if _, err := admin.Redeliver(ctx, fired[0].ID, "bob"); err != nil {
		t.Errorf("Redeliver of firing %s: %v", fired[0].ID, err)
	}
}

// TestRedeliverOfAScheduleNotFired: Redeliver of a message scheduled and
// not fired says so (ErrNoStatus: nothing is stored), where it said only
// "no status recorded" while its status read scheduled.
func TestRedeliverOfAScheduleNotFired(t *testing.T) {
	_, alice, _, admin := scheduling(t)
	ctx := testContext(t)
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "later"}, bus.In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = admin.Redeliver(ctx, ack.ID, "bob")
	if !errors.Is(err, bus.ErrNoStatus) || !strings.Contains(err.Error(), "has not fired") {
		t.Errorf("Redeliver of a schedule not fired: %v; want ErrNoStatus saying it has not fired", err)
	}
}
