package bus_test

import (
	"context"
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
)

// TestHostileRawPublishers: a raw NATS client publishes broken events
// straight onto an agent's subject. None reaches the handler, none panics
// the process, each ends in the dead-letter stream as malformed with an
// error that names what is wrong, and valid messages keep flowing.
func TestHostileRawPublishers(t *testing.T) {
	s := newServer(t)
	valid := func() nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {"x-1"}, "ce-source": {"/agents/raw"},
			"ce-type": {"T"}, "ce-to": {"victim"},
		}
	}
	with := func(k, v string) nats.Header {
		h := valid()
		if v == "" {
			delete(h, k)
		} else {
			h[k] = []string{v}
		}
		return h
	}
	cases := []struct {
		name   string
		header nats.Header
		data   string
		want   string // in the dead letter's error
	}{
		{"no headers at all", nil, "just bytes", "not a CloudEvent"},
		{"unknown specversion", with("ce-specversion", "0.3"), "", "specversion"},
		{"missing id", with("ce-id", ""), "", "id"},
		{"missing source", with("ce-source", ""), "", "source"},
		{"missing type", with("ce-type", ""), "", "type"},
		{"invalid UTF-8 in source", with("ce-source", "/agents/%C0%A0"), "", "source"},
		{"priority out of range", with("ce-priority", "9"), "", "priority"},
		{"control character in type", with("ce-type", "a%0Db"), "", "type"},
		{"bad time", with("ce-time", "yesterday"), "", "time"},
		{"structured, not JSON", nats.Header{"Content-Type": {"application/cloudevents+json"}}, "{not json", "malformed"},
		{"structured, wrong specversion", nats.Header{"Content-Type": {"application/cloudevents+json"}},
			`{"specversion":"2.0","id":"1","source":"/x","type":"T"}`, "specversion"},
	}
	raw := embeddedtest.Connect(t, s)
	for i, c := range cases {
		m := &nats.Msg{Subject: fmt.Sprintf("agentbus.agent.victim.p1.raw.case%d", i), Header: c.header, Data: []byte(c.data)}
		if err := raw.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, newBus(t, s, "sender"), bus.Message{To: "victim", Type: "good", Priority: 1})

	victim, malformed := handleOnly(t, s, "victim", "good", codec.ErrMalformed)
	dls := waitDeadLetters(t, victim, len(cases))
	bySubject := map[string]string{}
	for _, dl := range dls {
		if dl.Header.Get(bus.HeaderDeadLetterReason) != string(bus.ReasonMalformed) {
			t.Errorf("dead letter on %s: reason %q", dl.Subject, dl.Header.Get(bus.HeaderDeadLetterReason))
		}
		bySubject[dl.Header.Get(bus.HeaderDeadLetterSubject)] = dl.Header.Get(bus.HeaderDeadLetterError)
	}
	for i, c := range cases {
		e, ok := bySubject[fmt.Sprintf("agentbus.agent.victim.p1.raw.case%d", i)]
		if !ok {
			t.Errorf("%s: no dead letter", c.name)
			continue
		}
		if !strings.Contains(e, c.want) {
			t.Errorf("%s: dead-letter error %q does not mention %q", c.name, e, c.want)
		}
	}
	if n := int(malformed.Load()); n != len(cases) {
		t.Errorf("%d malformed messages reported to the error handler, want %d", n, len(cases))
	}
}

// TestSenderMismatchIsDeadLettered: an event whose source names another
// agent than its subject's sender never reaches the handler; it is
// dead-lettered with the reason.
func TestSenderMismatchIsDeadLettered(t *testing.T) {
	s := newServer(t)
	raw := embeddedtest.Connect(t, s)
	forged := &codec.Message{From: "orchestrator", To: "victim", Type: "ORDER"}
	forged.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	// Published on a subject that names "mallory" as the sender.
	if err := raw.PublishMsg(&nats.Msg{Subject: "agentbus.agent.victim.p1.mallory.ORDER", Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, newBus(t, s, "orchestrator"), bus.Message{To: "victim", Type: "REAL", Priority: 1})

	victim, mismatches := handleOnly(t, s, "victim", "REAL", bus.ErrSenderMismatch)
	dl := waitDeadLetters(t, victim, 1)[0]
	if reason := dl.Header.Get(bus.HeaderDeadLetterReason); reason != string(bus.ReasonSenderMismatch) {
		t.Errorf("dead-letter reason %q, want %q", reason, bus.ReasonSenderMismatch)
	}
	if e := dl.Header.Get(bus.HeaderDeadLetterError); !strings.Contains(e, "mallory") || !strings.Contains(e, "orchestrator") {
		t.Errorf("dead-letter error %q does not name both senders", e)
	}
	if mismatches.Load() != 1 {
		t.Errorf("%d mismatches reported, want 1", mismatches.Load())
	}
}

// handleOnly subscribes agent with a handler that must see exactly one
// message, of type want, and returns its bus and a count of the background
// errors matching reported.
func handleOnly(t *testing.T, s *embedded.Server, agent, want string, reported error) (*bus.Bus, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	b := newBus(t, s, agent, bus.WithErrorHandler(func(err error) {
		if errors.Is(err, reported) {
			n.Add(1)
		}
	}))
	r := newRecorder()
	subscribe(t, b, r.handle)
	r.waitCount(t, 1)
	if got := r.types(); len(got) != 1 || got[0] != want {
		t.Fatalf("handled %v, want only %s", got, want)
	}
	return b, &n
}

// TestMalformedSubjectsAreNotStored: a publish to a subject of another
// shape than the scheme's (a priority outside 1..5, a token too many or too
// few) finds no stream: it fails at the publisher instead of being stored
// and acknowledged where no consumer would deliver it.
func TestMalformedSubjectsAreNotStored(t *testing.T) {
	s := newServer(t)
	newBus(t, s, "victim") // provisions
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{
		"agentbus.agent.victim.p0.a.T", "agentbus.agent.victim.p9.a.T", "agentbus.agent.victim.p1.a",
		"agentbus.agent.victim.p1.a.T.extra", "agentbus.all.p7.a.T", "agentbus.all.p1.a", "agentbus.all.p1.a.T.extra",
	} {
		ctx, cancel := context.WithTimeout(testContext(t), 2*time.Second)
		_, err := js.Publish(ctx, subj, []byte("x"), jetstream.WithRetryAttempts(0))
		cancel()
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("publish to %s: %v, want no stream to answer", subj, err)
		}
	}
}

// TestLiteralWildcardRecipientReachesNobody: a raw client may publish to a
// subject whose recipient token is a literal '*' (NATS permissions and
// stream subjects cannot tell it from a wildcard, so the sender's own
// permission allows it and the stream stores it). No agent's consumer
// matches it, so it is delivered to nobody, counts in no agent's backlog
// and blocks nothing; it ages out with the stream's MaxAge.
// docs/reliability.md records this limit.
func TestLiteralWildcardRecipientReachesNobody(t *testing.T) {
	s := newServer(t)
	victim := newBus(t, s, "victim")
	if err := adminOf(t, s).EnsureConsumers(testContext(t), "victim"); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	h, data := rawEvent(t, codec.Message{From: "mallory", To: "victim", Type: "T"})
	ack, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: "agentbus.agent.*.p3.mallory.T", Header: h, Data: data})
	if err != nil {
		t.Fatalf("publish with a literal * recipient: %v (if the server now refuses it, update docs/reliability.md)", err)
	}
	orch := newBus(t, s, "orchestrator")
	publish(t, orch, bus.Message{To: "victim", Type: "REAL", Priority: 3})
	publish(t, orch, bus.Message{To: "victim", Type: "REAL", Priority: 3})
	c, err := js.Consumer(testContext(t), "AGENTBUS", "victim_p3")
	if err != nil {
		t.Fatal(err)
	}
	// The server counts new messages into a consumer's pending in the
	// background, in stream order: once both REALs, stored after the *
	// message, are counted, the * message has been passed on or over.
	var pending uint64
	waitFor(t, "both REAL messages counted pending", func() (bool, string) {
		info, err := c.Info(testContext(t))
		if err != nil {
			return false, err.Error()
		}
		pending = info.NumPending
		return pending >= 2, fmt.Sprint(pending)
	})
	if pending != 2 {
		t.Errorf("victim_p3 has %d pending, want 2: only the REALs (the * message at stream sequence %d matches no agent)", pending, ack.Sequence)
	}
	r := newRecorder()
	subscribe(t, victim, r.handle)
	r.waitCount(t, 2)
	if types := r.types(); !slices.Equal(types, []string{"REAL", "REAL"}) {
		t.Errorf("handled %v, want only the two REALs", types)
	}
}

// TestMalformedSubjectsAreDeadLettered: a valid event stored on a subject
// its recipient's consumers match but the scheme does not (as a stream
// provisioned by an earlier agentbus, which captured <root>.agent.> and
// <root>.all.>, stores them) never reaches the handler and is dead-lettered
// as malformed, not as a sender mismatch.
func TestMalformedSubjectsAreDeadLettered(t *testing.T) {
	s := newServer(t)
	victim := newBus(t, s, "victim", bus.WithErrorHandler(func(error) {}))
	if err := victim.EnsureConsumers(testContext(t)); err != nil { // its broadcasts start now
		t.Fatal(err)
	}
	editStream(t, s, "AGENTBUS", func(cfg *jetstream.StreamConfig) {
		cfg.Subjects = []string{"agentbus.agent.>", "agentbus.all.>"} // the earlier layout
	})
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	h, data := rawEvent(t, codec.Message{From: "mallory", To: "victim", Type: "T"})
	subjects := []string{"agentbus.all.p7.mallory.T", "agentbus.agent.victim.p1.mallory.T.extra"}
	for _, subj := range subjects {
		if _, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: subj, Header: h, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, newBus(t, s, "orchestrator"), bus.Message{To: "victim", Type: "REAL", Priority: 5})
	r := newRecorder()
	subscribe(t, victim, r.handle)
	r.waitCount(t, 1)
	got := map[string]string{}
	for _, dl := range waitDeadLetters(t, victim, len(subjects)) {
		got[dl.Header.Get(bus.HeaderDeadLetterSubject)] = dl.Header.Get(bus.HeaderDeadLetterReason)
	}
	for _, subj := range subjects {
		if got[subj] != string(bus.ReasonMalformed) {
			t.Errorf("dead letter of %s: reason %q, want %q (all: %v)", subj, got[subj], bus.ReasonMalformed, got)
		}
	}
	if types := r.types(); len(types) != 1 || types[0] != "REAL" {
		t.Errorf("handled %v, want only REAL", types)
	}
}

// TestAttributesDisagreeingWithSubject: an event whose to or priority
// attribute disagrees with its subject is handled as the subject says (the
// subject is what the sender's permissions allowed and what routed it),
// and the disagreement is reported.
func TestAttributesDisagreeingWithSubject(t *testing.T) {
	s := newServer(t)
	var mismatches atomic.Int32
	bob := newBus(t, s, "bob", bus.WithErrorHandler(func(err error) {
		if errors.Is(err, bus.ErrAttributeMismatch) {
			mismatches.Add(1)
		}
	}))
	raw := embeddedtest.Connect(t, s)
	js, err := jetstream.New(raw)
	if err != nil {
		t.Fatal(err)
	}
	h, data := rawEvent(t, codec.Message{From: "alice", To: "carol", Type: "T", Priority: 1})
	if _, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: "agentbus.agent.bob.p3.alice.T", Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	subscribe(t, bob, r.handle)
	d := r.waitCount(t, 1)[0]
	if d.To != "bob" || d.Priority != 3 {
		t.Errorf("delivered to %q priority %d, want the subject's bob, 3", d.To, d.Priority)
	}
	if n := mismatches.Load(); n != 1 {
		t.Errorf("%d mismatches reported, want 1", n)
	}
}

// rawEvent returns m, with its defaults, as a binary-mode CloudEvent
// without a Nats-Msg-Id, for a raw client to publish.
func rawEvent(t *testing.T, m codec.Message) (nats.Header, []byte) {
	t.Helper()
	m.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	return h, data
}
