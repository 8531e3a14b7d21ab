package bus_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

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

// event is what the foreign agent publishes.
type event struct {
	id, to, typ, correlationID, causationID, traceparent string
	priority                                             int
	data                                                 string
}

// publish sends e in binary mode and, as a sender should, creates its
// pending status record with the stream sequence the ack gave.
func (f *foreignAgent) publish(t *testing.T, ctx context.Context, e event) *jetstream.PubAck {
	t.Helper()
	now := time.Now().UTC()
	msg := nats.NewMsg(fmt.Sprintf("agentbus.agent.%s.p%d.%s.%s", e.to, e.priority, f.name, e.typ))
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-id": e.id, "ce-source": "/agents/" + f.name, "ce-type": e.typ,
		"ce-time": now.Format(time.RFC3339Nano), "ce-to": e.to, "ce-priority": strconv.Itoa(e.priority),
		"ce-datacontenttype": "application/json", "ce-correlationid": e.correlationID,
		"ce-causationid": e.causationID, "ce-traceparent": e.traceparent,
		"Nats-Msg-Id": e.id, // the same as ce-id: JetStream drops a repeat
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
	f.writeStatus(t, ctx, conv, e.id, f.name, e.to, map[string]any{
		"id": e.id, "from": f.name, "to": e.to, "type": e.typ, "priority": e.priority,
		"correlationId": conv, "causationId": e.causationID, "state": "pending", "time": now, "updated": now,
		"by": f.name, "stream": ack.Stream, "sequence": ack.Sequence,
	}, true)
	return ack
}

// writeStatus writes the status record of message id from from to to;
// with create, only if there is none yet (a recipient that wrote first,
// such as a Request that took the message as its reply, wins).
func (f *foreignAgent) writeStatus(t *testing.T, ctx context.Context, correlationID, id, from, to string, record map[string]any, create bool) {
	t.Helper()
	sum := sha256.Sum256([]byte(correlationID))
	key := hex.EncodeToString(sum[:16]) + "." + id + "." + from + "." + to
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
