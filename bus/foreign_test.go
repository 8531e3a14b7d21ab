package bus_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// foreignAgent is an agent written with nothing but a NATS client, as
// docs/foreign-agents.md describes one: raw nats.go and its jetstream
// package, the CloudEvents NATS binding by hand, and no package bus. Its
// name needs no escaping in subjects (letters, digits, '-' and '_').
type foreignAgent struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream
}

// The names a foreign agent uses, spelled out as docs/foreign-agents.md
// spells them, not taken from package subjects.
const (
	foreignStream = "AGENTBUS"
	foreignBucket = "AGENTBUS_STATUS"
)

func newForeignAgent(t *testing.T, s *embedded.Server, name string) *foreignAgent {
	t.Helper()
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &foreignAgent{name: name, nc: nc, js: js}
}

// createConsumers creates the agent's six durable consumers with the
// settings the page gives.
func (f *foreignAgent) createConsumers(t *testing.T, ctx context.Context) {
	t.Helper()
	for p := 1; p <= 6; p++ {
		cfg := jetstream.ConsumerConfig{
			Durable:       fmt.Sprintf("%s_p%d", f.name, p),
			FilterSubject: fmt.Sprintf("agentbus.agent.%s.p%d.>", f.name, p),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       30 * time.Second,
			MaxDeliver:    5,
			MaxAckPending: 1000,
		}
		if p == 6 { // the broadcasts, from now on
			cfg.Durable, cfg.FilterSubject, cfg.DeliverPolicy = f.name+"_b", "agentbus.all.>", jetstream.DeliverNewPolicy
		}
		if _, err := f.js.CreateOrUpdateConsumer(ctx, foreignStream, cfg); err != nil {
			t.Fatalf("create consumer %s: %v", cfg.Durable, err)
		}
	}
}

// event is what the foreign agent publishes: to is the recipient's
// subject token; replyBy, when set, makes it a request (ce-replyby).
type event struct {
	id, to, typ, correlationID, causationID, traceparent string
	priority                                             int
	data                                                 string
	replyBy                                              time.Time
}

// publish sends e in binary mode and, as a sender should, creates its
// pending status record with the stream sequence the ack gave.
func (f *foreignAgent) publish(t *testing.T, ctx context.Context, e event) *jetstream.PubAck {
	t.Helper()
	now := time.Now().UTC()
	msg := nats.NewMsg(fmt.Sprintf("agentbus.agent.%s.p%d.%s.%s", e.to, e.priority, f.name, e.typ))
	var replyBy string
	if !e.replyBy.IsZero() {
		replyBy = e.replyBy.UTC().Format(time.RFC3339Nano)
	}
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-id": e.id, "ce-source": "/agents/" + f.name, "ce-type": e.typ,
		"ce-time": now.Format(time.RFC3339Nano), "ce-to": e.to, "ce-priority": strconv.Itoa(e.priority),
		"ce-datacontenttype": "application/json", "ce-correlationid": e.correlationID,
		"ce-causationid": e.causationID, "ce-traceparent": e.traceparent,
		"ce-replyby": replyBy, "Nats-Msg-Id": e.id, // the same as ce-id: JetStream drops a repeat
	} {
		if v != "" {
			msg.Header.Set(k, v)
		}
	}
	msg.Data = []byte(e.data)
	ack, err := f.js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("publish %s: %v", e.id, err)
	}
	conv := e.correlationID
	if conv == "" {
		conv = e.id
	}
	to, err := url.PathUnescape(e.to) // the record holds agent IDs
	if err != nil {
		t.Fatal(err)
	}
	f.writeStatus(t, ctx, conv, e.id, f.name, e.to, map[string]any{
		"id": e.id, "from": f.name, "to": to, "type": e.typ, "priority": e.priority,
		"correlationId": conv, "causationId": e.causationID, "state": "pending", "time": now, "updated": now,
		"by": f.name, "stream": ack.Stream, "sequence": ack.Sequence,
	}, true)
	return ack
}

// writeStatus writes the status record of message id from from to to
// (subject tokens, written in the key as the page says: '%' as '=');
// with create, only if there is none yet (a recipient that wrote first,
// such as a Request that took the message as its reply, wins).
func (f *foreignAgent) writeStatus(t *testing.T, ctx context.Context, correlationID, id, from, to string, record map[string]any, create bool) {
	t.Helper()
	sum := sha256.Sum256([]byte(correlationID))
	keyToken := func(tok string) string { return strings.ReplaceAll(tok, "%", "=") }
	key := hex.EncodeToString(sum[:16]) + "." + keyToken(id) + "." + keyToken(from) + "." + keyToken(to)
	value, err := json.Marshal(record)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg("$KV." + foreignBucket + "." + key)
	msg.Data = value
	if create {
		msg.Header.Set("Nats-Expected-Last-Subject-Sequence", "0")
	}
	_, err = f.js.PublishMsg(ctx, msg)
	var apiErr *jetstream.APIError
	if create && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return // a recipient wrote its state first: it stands
	}
	if err != nil {
		t.Fatalf("status record %s: %v", key, err)
	}
}

// next returns the next message of the agent's consumer at priority p.
func (f *foreignAgent) next(t *testing.T, ctx context.Context, p int) jetstream.Msg {
	t.Helper()
	c, err := f.js.Consumer(ctx, foreignStream, fmt.Sprintf("%s_p%d", f.name, p))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	t.Fatalf("no message for %s at priority %d: %v", f.name, p, batch.Error())
	return nil
}

// childOf returns a traceparent of a new span in the trace of parent, a
// traceparent: what the foreign agent's tracer would write.
func childOf(t *testing.T, parent string, span trace.SpanID) string {
	t.Helper()
	if len(parent) != 55 {
		t.Fatalf("traceparent %q is not version 00", parent)
	}
	return parent[:36] + span.String() + parent[52:]
}

// TestForeignAgent plays an agent that uses only a NATS client against Go
// agents on the bus: it creates its consumers, receives a message and the
// trace context, acknowledges it (the sender's lookup reads completed),
// publishes a request with its status record that a Go agent answers while
// it is still queued (as "agentbus reply" does), carries its own trace
// context to a Go handler, and answers a Go Request, recording the request
// replied.
func TestForeignAgent(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	py := newForeignAgent(t, s, "py-agent")
	py.createConsumers(t, ctx)
	orch, orchTel := newTracedBus(t, s, "orchestrator")
	worker, workerTel := newTracedBus(t, s, "worker")

	// The consumers the page gives are the ones a Go agent of that name
	// would make: a Go process of the same agent accepts them.
	if err := newBus(t, s, "py-agent").EnsureConsumers(ctx); err != nil {
		t.Fatalf("EnsureConsumers over the foreign agent's consumers: %v", err)
	}

	t.Run("receives from a Go agent", func(t *testing.T) {
		ctx := testContext(t)
		ack, err := orch.Publish(ctx, bus.Message{To: "py-agent", Type: "TASK", Priority: 2, CorrelationID: "conv-task", Data: []byte(`{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		m := py.next(t, ctx, 2)
		h := m.Headers()
		if h.Get("ce-id") != ack.ID || h.Get("Nats-Msg-Id") != ack.ID || h.Get("ce-source") != "/agents/orchestrator" ||
			h.Get("ce-type") != "TASK" || h.Get("ce-correlationid") != "conv-task" || string(m.Data()) != `{"n":1}` {
			t.Errorf("headers %v, data %s", h, m.Data())
		}
		sent := orchTel.waitSpans(t, 1)[0].SpanContext()
		if tp, want := h.Get("ce-traceparent"), "00-"+sent.TraceID().String()+"-"+sent.SpanID().String()+"-01"; tp != want {
			t.Errorf("ce-traceparent %q, want the send span's %q", tp, want)
		}
		if sent.TraceID() != bus.ConversationTraceID("conv-task") {
			t.Errorf("send span in trace %s, want the conversation's", sent.TraceID())
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		if st := waitState(t, orch, ack.ID, bus.StateCompleted); st.By != "py-agent" {
			t.Errorf("status %+v, want completed by py-agent", st)
		}
	})

	t.Run("request answered while queued", func(t *testing.T) {
		ctx := testContext(t)
		py.publish(t, ctx, event{id: "py-req-1", to: "worker", typ: "REVIEW", priority: 2, correlationID: "conv-review", data: `{"pr":7}`})
		// What "agentbus reply --from worker --to-message py-req-1" does:
		// the worker has not subscribed; its status record finds the request.
		sts, err := worker.Status(ctx, "py-req-1")
		if err != nil || len(sts) != 1 || sts[0].State != bus.StatePending || sts[0].From != "py-agent" {
			t.Fatalf("Status = %+v, %v; want the foreign agent's pending record", sts, err)
		}
		req := sts[0].Message()
		rack, err := worker.Reply(ctx, &req, bus.Message{Type: "REVIEWED", Data: []byte(`{"ok":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		m := py.next(t, ctx, 2) // the request's priority
		h := m.Headers()
		if h.Get("ce-id") != rack.ID || h.Get("ce-causationid") != "py-req-1" || h.Get("ce-correlationid") != "conv-review" || h.Get("ce-source") != "/agents/worker" {
			t.Errorf("reply headers %v", h)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		if st := waitState(t, worker, "py-req-1", bus.StateReplied); st.ReplyID != rack.ID {
			t.Errorf("request status %+v, want replied with %s", st, rack.ID)
		}
	})

	t.Run("trace context reaches a Go handler", func(t *testing.T) {
		ctx := testContext(t)
		root := "00-" + bus.ConversationTraceID("conv-event").String() + "-0102030405060708-01"
		mine := childOf(t, root, trace.SpanID{0xa, 0xb, 0xc, 0xd, 1, 2, 3, 4})
		py.publish(t, ctx, event{id: "py-event-1", to: "worker", typ: "EVENT", priority: 3, correlationID: "conv-event", traceparent: mine, data: `{}`})
		r := newRecorder()
		subscribe(t, worker, r.handle)
		var d *bus.Delivery
		waitFor(t, "EVENT delivered", func() (bool, string) {
			for _, got := range r.deliveries() {
				if got.Message.Type == "EVENT" {
					d = got
					return true, ""
				}
			}
			return false, fmt.Sprint(r.types())
		})
		if d.Message.From != "py-agent" || d.Message.Extensions["traceparent"] != mine {
			t.Errorf("delivery %+v, want from py-agent with its traceparent", d.Message)
		}
		var process sdktrace.ReadOnlySpan
		waitFor(t, "the process span of py-event-1", func() (bool, string) {
			for _, sp := range workerTel.spans.Ended() {
				for _, a := range sp.Attributes() {
					if a.Key == "messaging.message.id" && a.Value.AsString() == "py-event-1" && sp.Name() != "" && sp.SpanKind() == trace.SpanKindConsumer {
						process = sp
						return true, ""
					}
				}
			}
			return false, describeSpans(workerTel.spans.Ended())
		})
		if process.Parent().SpanID() != (trace.SpanID{0xa, 0xb, 0xc, 0xd, 1, 2, 3, 4}) {
			t.Errorf("process span's parent %s, want the foreign agent's span", process.Parent().SpanID())
		}
		if st := waitState(t, worker, "py-event-1", bus.StateCompleted); st.By != "worker" {
			t.Errorf("status %+v, want completed by worker", st)
		}
	})

	t.Run("answers a Go request", func(t *testing.T) {
		ctx := testContext(t)
		type result struct {
			d   *bus.Delivery
			err error
		}
		done := make(chan result, 1)
		go func() {
			d, err := orch.Request(ctx, bus.Message{ID: "go-ask-1", To: "py-agent", Type: "ASK", Priority: 1, Data: []byte(`{"q":"?"}`)})
			done <- result{d, err}
		}()
		m := py.next(t, ctx, 1)
		h := m.Headers()
		if h.Get("ce-id") != "go-ask-1" || h.Get("ce-replyby") == "" {
			t.Errorf("request headers %v, want go-ask-1 with its replyby", h)
		}
		conv := h.Get("ce-correlationid")
		if conv == "" {
			conv = "go-ask-1"
		}
		py.publish(t, ctx, event{id: "py-answer-1", to: "orchestrator", typ: "ANSWER", priority: 1,
			correlationID: conv, causationID: "go-ask-1", traceparent: childOf(t, h.Get("ce-traceparent"), trace.SpanID{7, 7}), data: `{"a":42}`})
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		py.writeStatus(t, ctx, conv, "go-ask-1", "orchestrator", "py-agent", map[string]any{
			"id": "go-ask-1", "from": "orchestrator", "to": "py-agent", "type": "ASK", "priority": 1, "correlationId": conv,
			"state": "replied", "updated": now, "by": "py-agent", "replyId": "py-answer-1",
		}, false)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.d.Message.ID != "py-answer-1" || r.d.Message.Type != "ANSWER" || string(r.d.Message.Data) != `{"a":42}` {
			t.Errorf("reply %+v", r.d.Message)
		}
		if st := waitState(t, orch, "go-ask-1", bus.StateReplied); st.By != "py-agent" || st.ReplyID != "py-answer-1" {
			t.Errorf("request status %+v, want replied by py-agent with py-answer-1", st)
		}
	})
}

// TestForeignTTLRemovedUnreadReadsExpired: a foreign sender of a message
// with a TTL writes its pending record as docs/foreign-agents.md gives it,
// with expiresAt; once the server removed the message unread, a lookup
// reads expired. The page gave the record without expiresAt, and a lookup
// read completed: the recipient's ack floor passed its sequence, and the
// record had no expiry to tell the two apart (found by a helper session).
func TestForeignTTLRemovedUnreadReadsExpired(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	f := newForeignAgent(t, s, "js-agent")
	worker := newBus(t, s, "worker")

	// The worker's p3 consumer exists: it handled a first message.
	r := newRecorder()
	sub, err := worker.Subscribe(ctx, r.handle)
	if err != nil {
		t.Fatal(err)
	}
	f.publish(t, ctx, event{id: "first", to: "worker", typ: "T", priority: 3, data: "{}"})
	r.waitCount(t, 1)
	sub.Stop()
	<-sub.Done()

	// A message with a TTL of 1s, sent and recorded as the page says.
	now := time.Now().UTC()
	msg := nats.NewMsg("agentbus.agent.worker.p3.js-agent.T")
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-id": "ttl-1", "ce-source": "/agents/js-agent", "ce-type": "T",
		"ce-time": now.Format(time.RFC3339Nano), "ce-to": "worker", "ce-priority": "3",
		"ce-expirytime": now.Add(time.Second).Format(time.RFC3339Nano),
		"Nats-Msg-Id":   "ttl-1", "Nats-TTL": "1s",
	} {
		msg.Header.Set(k, v)
	}
	msg.Data = []byte("{}")
	ack, err := f.js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	f.writeStatus(t, ctx, "ttl-1", "ttl-1", "js-agent", "worker", map[string]any{
		"id": "ttl-1", "from": "js-agent", "to": "worker", "type": "T", "priority": 3,
		"correlationId": "ttl-1", "causationId": "", "state": "pending", "time": now, "updated": now,
		"expiresAt": now.Add(time.Second), "by": "js-agent", "stream": ack.Stream, "sequence": ack.Sequence,
	}, true)
	st, err := f.js.Stream(ctx, foreignStream)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to remove ttl-1", func() (bool, string) {
		_, err := st.GetMsg(ctx, ack.Sequence)
		return err != nil, "still stored, seq " + strconv.FormatUint(ack.Sequence, 10)
	})
	// The worker comes back and handles the next message.
	f.publish(t, ctx, event{id: "second", to: "worker", typ: "T", priority: 3, data: "{}"})
	subscribe(t, worker, r.handle)
	r.waitCount(t, 2)
	for _, d := range r.deliveries() {
		if d.ID == "ttl-1" {
			t.Fatalf("ttl-1 was delivered; the test wanted it removed unread")
		}
	}
	var got []bus.Status
	waitFor(t, "ttl-1's status to settle", func() (bool, string) {
		got, err = worker.Status(ctx, "ttl-1")
		if err != nil || len(got) == 0 {
			return false, fmt.Sprint(err)
		}
		return got[0].State != bus.StatePending && got[0].State != bus.StateDelivered, string(got[0].State)
	})
	if got[0].State != bus.StateExpired {
		t.Errorf("ttl-1, removed unread at its expiry, reads %s (%s), want expired", got[0].State, got[0].Reason)
	}
}

// TestForeignNatsTTLAloneHandledReadsCompleted: a foreign message whose
// expiry is the Nats-TTL header alone (no ce-expirytime), handled at once,
// reads completed after its TTL passed: its recipient records the
// completion, as for a message with an expirytime. Before, the recipient
// saw no TTL and wrote nothing, and a lookup, which cannot tell a handled
// message from one removed unread, read expired (found by a helper
// session).
func TestForeignNatsTTLAloneHandledReadsCompleted(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	f := newForeignAgent(t, s, "js-agent")
	worker := newBus(t, s, "worker")
	r := newRecorder()
	subscribe(t, worker, r.handle)
	now := time.Now().UTC()
	msg := nats.NewMsg("agentbus.agent.worker.p3.js-agent.T")
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-id": "ttl-h", "ce-source": "/agents/js-agent", "ce-type": "T",
		"ce-time": now.Format(time.RFC3339Nano), "ce-to": "worker", "ce-priority": "3",
		"Nats-Msg-Id": "ttl-h", "Nats-TTL": "1s",
	} {
		msg.Header.Set(k, v)
	}
	msg.Data = []byte("{}")
	ack, err := f.js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	f.writeStatus(t, ctx, "ttl-h", "ttl-h", "js-agent", "worker", map[string]any{
		"id": "ttl-h", "from": "js-agent", "to": "worker", "type": "T", "priority": 3,
		"correlationId": "ttl-h", "state": "pending", "time": now, "updated": now,
		"expiresAt": now.Add(time.Second), "by": "js-agent", "stream": ack.Stream, "sequence": ack.Sequence,
	}, true)
	r.waitCount(t, 1)
	waitFor(t, "completed after the expiry", func() (bool, string) {
		sts, err := worker.Status(ctx, "ttl-h")
		if err != nil || len(sts) != 1 {
			return false, fmt.Sprint(sts, err)
		}
		return time.Now().After(now.Add(2*time.Second)) && sts[0].State == bus.StateCompleted, string(sts[0].State) + " " + sts[0].Reason
	})
}

// replySpace is the namespace of the reply IDs docs/foreign-agents.md
// gives (Replying).
var replySpace = uuid.MustParse("9c4e7b1a-2d63-4f0e-8a57-c31b6e0d94f2")

// pageReplyID derives the ID of a Go handler's reply to request id as
// docs/foreign-agents.md says: the UUID version 5 of id in replySpace, but
// for a UUID version 7 in canonical form, the request's first 6 bytes
// and version 7.
func pageReplyID(id string) string {
	u := uuid.NewSHA1(replySpace, []byte(id))
	if r, err := uuid.Parse(id); err == nil && len(id) == 36 && r.Version() == 7 && r.Variant() == uuid.RFC4122 {
		copy(u[:6], r[:6])
		u[6] = u[6]&0x0f | 0x70
	}
	return u.String()
}

// windowToken is the =T window of a UUID version 7 id, as
// docs/subjects.md gives it: "=T" and the lower-case hex of its Unix
// milliseconds divided by 4.
func windowToken(t *testing.T, id string) string {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil || u.Version() != 7 {
		t.Fatalf("%s is not a UUID version 7", id)
	}
	sec, nsec := u.Time().UnixTime()
	return fmt.Sprintf("=T%x", uint64(sec*1000+nsec/1e6)/4)
}

// TestForeignReplyIDOfAGoRequest: a foreign agent answers a Go Request
// (whose ID is a UUID version 7) with the reply ID docs/foreign-agents.md
// derives, on the indexed subject, and writes no record: the request reads
// replied with it. A Go handler's replies to foreign requests, one with a
// UUID version 7 ID and one with another ID, carry the IDs the page
// derives. The page gave the version 5 UUID alone, which a lookup of a Go
// request does not find (found by a helper session).
func TestForeignReplyIDOfAGoRequest(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	py := newForeignAgent(t, s, "py-agent")
	py.createConsumers(t, ctx)
	orch := newBus(t, s, "orchestrator")

	type result struct {
		d   *bus.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := orch.Request(ctx, bus.Message{To: "py-agent", Type: "ASK", Priority: 2, Data: []byte(`{}`)})
		done <- result{d, err}
	}()
	m := py.next(t, ctx, 2)
	h := m.Headers()
	reqID, conv := h.Get("ce-id"), h.Get("ce-correlationid")
	if conv == "" {
		conv = reqID
	}
	replyID := pageReplyID(reqID)
	// The indexed subject: a UUID version 7's ID and conversation are =T
	// windows.
	convTok := windowToken(t, conv)
	py.publishRaw(t, ctx, fmt.Sprintf("agentbus.agent.orchestrator.p2.py-agent.ANSWER.%s.%s", windowToken(t, replyID), convTok), map[string]string{
		"ce-specversion": "1.0", "ce-id": replyID, "ce-source": "/agents/py-agent", "ce-type": "ANSWER",
		"ce-time": time.Now().UTC().Format(time.RFC3339Nano), "ce-to": "orchestrator", "ce-priority": "2",
		"ce-correlationid": conv, "ce-causationid": reqID, "ce-datacontenttype": "application/json",
		"Nats-Msg-Id": replyID,
	}, `{"a":1}`)
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.d.ID != replyID {
		t.Fatalf("reply %s, want %s", r.d.ID, replyID)
	}
	if st := waitState(t, orch, reqID, bus.StateReplied); st.ReplyID != replyID {
		t.Errorf("request status %+v, want replied with %s", st, replyID)
	}

	// A Go handler's replies to foreign requests.
	worker := newBus(t, s, "worker")
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "ANSWER", Data: []byte(`{}`)})
		return err
	})
	v7, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"py-req-reply-id", v7.String()} {
		py.publish(t, ctx, event{id: id, to: "worker", typ: "ASK", priority: 3, data: `{}`, replyBy: time.Now().Add(time.Minute)})
		m := py.next(t, ctx, 3)
		if got, want := m.Headers().Get("ce-id"), pageReplyID(id); got != want || m.Headers().Get("ce-causationid") != id {
			t.Errorf("the Go reply to %s has ID %s (causation %s), want %s", id, got, m.Headers().Get("ce-causationid"), want)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// publishRaw publishes a message on subject with exactly the headers
// given, as a foreign client would.
func (f *foreignAgent) publishRaw(t *testing.T, ctx context.Context, subject string, h map[string]string, data string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	for k, v := range h {
		msg.Header.Set(k, v)
	}
	msg.Data = []byte(data)
	if _, err := f.js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("publish on %s: %v", subject, err)
	}
}

// TestForeignListingEscapedSenderRecord does, in Go, what the JavaScript
// and Python agents of docs/foreign-agents.md do with a Go Request from an
// agent whose ID needs escaping ("build orchestrator"): the reply goes to
// the sender's token, and the replied record's key writes the token's '%'
// as '=' and its "from" is the agent ID, so the request reads replied. The
// listings wrote the record under the raw token, where nobody reads it
// (found by a helper session).
func TestForeignListingEscapedSenderRecord(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	js := newForeignAgent(t, s, "js-agent")
	js.createConsumers(t, ctx)
	orch := newBus(t, s, "build orchestrator")

	done := make(chan error, 1)
	go func() {
		_, err := orch.Request(ctx, bus.Message{To: "js-agent", Type: "ASK", Priority: 1, Data: []byte(`{"q":1}`)})
		done <- err
	}()
	m := js.next(t, ctx, 1)
	h := m.Headers()
	attr := func(n string) string { return h.Get("ce-" + n) }
	id := attr("id")
	// ce-source, percent-decoded once, is the sender's token; decoded once
	// more, its ID.
	fromTok, err := url.PathUnescape(strings.TrimPrefix(attr("source"), "/agents/"))
	if err != nil {
		t.Fatal(err)
	}
	from, err := url.PathUnescape(fromTok)
	if err != nil {
		t.Fatal(err)
	}
	if fromTok != "build%20orchestrator" || from != "build orchestrator" {
		t.Fatalf("ce-source %q: token %q, ID %q", attr("source"), fromTok, from)
	}
	correlationID := attr("correlationid")
	if correlationID == "" {
		correlationID = id
	}
	replyID := uuid.NewString()
	js.publish(t, ctx, event{id: replyID, to: fromTok, typ: "ANSWER", priority: 1, correlationID: correlationID, causationID: id, data: `{"answer":42}`})
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	js.writeStatus(t, ctx, correlationID, id, fromTok, "js-agent", map[string]any{
		"id": id, "from": from, "to": "js-agent", "type": attr("type"), "priority": 1,
		"correlationId": correlationID, "state": "replied", "time": attr("time"), "updated": time.Now().UTC(),
		"by": "js-agent", "replyId": replyID,
	}, false)
	if err := <-done; err != nil {
		t.Fatalf("Request: %v", err)
	}
	if st := waitState(t, orch, id, bus.StateReplied); st.ReplyID != replyID || st.From != "build orchestrator" || st.By != "js-agent" {
		t.Errorf("request status %+v, want replied by js-agent with %s", st, replyID)
	}
	// The reply's pending record, to an escaped recipient, is found too.
	if sts, err := orch.Status(ctx, replyID); err != nil || len(sts) != 1 || sts[0].To != "build orchestrator" {
		t.Errorf("the reply's status %+v, %v; want one record to build orchestrator", sts, err)
	}
}

// TestForeignRequestWithReplyByGetsDeadLetteredNotice: a foreign request
// with its ce-replyby, as docs/foreign-agents.md now sends one, that its Go
// handler rejects brings the foreign requester an agentbus.dead_lettered
// notice. The page's requests had no ce-replyby, and got none: their
// senders waited for good (found by a helper session).
func TestForeignRequestWithReplyByGetsDeadLetteredNotice(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	js := newForeignAgent(t, s, "js-agent")
	js.createConsumers(t, ctx)
	worker := newBus(t, s, "worker", bus.WithErrorHandler(func(error) {}))
	subscribe(t, worker, func(context.Context, *bus.Delivery) error {
		return bus.Permanent(errors.New("no such question"))
	})
	js.publish(t, ctx, event{id: "js-q-1", to: "worker", typ: "QUESTION", priority: 2, data: `{"question":"ready?"}`, replyBy: time.Now().Add(time.Minute)})
	m := js.next(t, ctx, 2)
	h := m.Headers()
	if h.Get("ce-type") != bus.TypeDeadLettered || h.Get("ce-causationid") != "js-q-1" {
		t.Fatalf("got %s caused by %s, want the %s notice of js-q-1", h.Get("ce-type"), h.Get("ce-causationid"), bus.TypeDeadLettered)
	}
	var notice struct{ ID, From, To, Reason string }
	if err := json.Unmarshal(m.Data(), &notice); err != nil || notice.ID != "js-q-1" || notice.From != "js-agent" || notice.To != "worker" || notice.Reason == "" {
		t.Errorf("notice %s (%v), want id, from, to and reason", m.Data(), err)
	}
}

// TestForeignRequestWithReplyByAnsweredWhileQueuedIsSkipped: a foreign
// request with its ce-replyby answered while queued (as "agentbus reply"
// does) is not handled again when its Go recipient subscribes, and the
// foreign agent gets one answer. Without ce-replyby, as the page's
// requests were sent, the handler ran again and answered twice (found by
// a helper session).
func TestForeignRequestWithReplyByAnsweredWhileQueuedIsSkipped(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	py := newForeignAgent(t, s, "py-agent")
	py.createConsumers(t, ctx)
	worker := newBus(t, s, "worker")

	py.publish(t, ctx, event{id: "py-req-q", to: "worker", typ: "REVIEW", priority: 2, correlationID: "conv-q", data: `{"pr":7}`, replyBy: time.Now().Add(time.Minute)})
	sts, err := worker.Status(ctx, "py-req-q")
	if err != nil || len(sts) != 1 {
		t.Fatalf("Status = %+v, %v", sts, err)
	}
	req := sts[0].Message()
	if _, err := worker.Reply(ctx, &req, bus.Message{Type: "REVIEWED", Data: []byte(`{"ok":true}`)}); err != nil {
		t.Fatal(err)
	}
	waitState(t, worker, "py-req-q", bus.StateReplied)

	var ran atomic.Int32
	r := newRecorder()
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if d.ID == "py-req-q" {
			ran.Add(1)
			_, err := d.Reply(ctx, bus.Message{Type: "REVIEWED", Data: []byte(`{"again":true}`)})
			return err
		}
		return r.handle(ctx, d)
	})
	// A later message at the same priority: once it is handled, the
	// request's turn has passed.
	py.publish(t, ctx, event{id: "py-after", to: "worker", typ: "NOTE", priority: 2, data: `{}`})
	r.waitCount(t, 1)
	if n := ran.Load(); n != 0 {
		t.Errorf("the handler ran %d times on a request already answered while queued", n)
	}
	c, err := py.js.Consumer(ctx, foreignStream, "py-agent_p2")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	answers := 0
	for m := range batch.Messages() {
		if m.Headers().Get("ce-causationid") == "py-req-q" {
			answers++
		}
		_ = m.Ack()
	}
	if answers != 1 {
		t.Errorf("the foreign agent got %d answers to its request, want 1", answers)
	}
}
