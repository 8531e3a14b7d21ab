package bus_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// agentTelemetry is what one agent process records: its spans and metrics.
type agentTelemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

// newTracedBus connects agent to s with a tracer and meter provider of its
// own, as a separate process would have.
func newTracedBus(t *testing.T, s *embedded.Server, agent string, opts ...bus.Option) (*bus.Bus, *agentTelemetry) {
	t.Helper()
	at := &agentTelemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(at.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(at.reader))
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	return newBus(t, s, agent, append([]bus.Option{bus.WithTracerProvider(tp), bus.WithMeterProvider(mp)}, opts...)...), at
}

// waitSpans waits until at has ended n spans and returns them.
func (at *agentTelemetry) waitSpans(t *testing.T, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d ended spans", n), func() (bool, string) {
		got := at.spans.Ended()
		return len(got) >= n, describeSpans(got)
	})
	return at.spans.Ended()
}

func describeSpans(spans []sdktrace.ReadOnlySpan) string {
	var parts []string
	for _, s := range spans {
		parts = append(parts, fmt.Sprintf("%s(%s)", s.Name(), s.SpanKind()))
	}
	return fmt.Sprintf("%d spans: %s", len(spans), strings.Join(parts, ", "))
}

// spanNamed returns the one span named name.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one span %q, have %s", name, describeSpans(spans))
	}
	return found[0]
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// checkAttrs fails unless span s has every attribute of want.
func checkAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	got := attrs(s)
	for k, w := range want {
		v, ok := got[attribute.Key(k)]
		if !ok {
			t.Errorf("span %q: no attribute %s", s.Name(), k)
			continue
		}
		if fmt.Sprint(v.AsInterface()) != fmt.Sprint(w) {
			t.Errorf("span %q: %s = %v, want %v", s.Name(), k, v.AsInterface(), w)
		}
	}
}

// rootSpanID is the span ID of the conversation root of correlationID, as
// docs/observability.md defines it.
func rootSpanID(correlationID string) trace.SpanID {
	sum := sha256.Sum256([]byte(correlationID))
	var sid trace.SpanID
	copy(sid[:], sum[16:24])
	return sid
}

func TestConversationTraceID(t *testing.T) {
	// printf %s conv-1 | sha256sum | cut -c1-32
	sum := sha256.Sum256([]byte("conv-1"))
	var want trace.TraceID
	copy(want[:], sum[:16])
	if got := bus.ConversationTraceID("conv-1"); got != want {
		t.Errorf("ConversationTraceID = %s, want %s", got, want)
	}
	if bus.ConversationTraceID("a") == bus.ConversationTraceID("b") {
		t.Error("two conversations share a trace ID")
	}
}

// TestTracingThreeHops: orchestrator -> worker -> reviewer -> orchestrator,
// each a bus client with a tracer provider of its own, publishing from inside
// their handlers. Every span is in the conversation's trace, and the spans
// chain producer -> consumer -> producer through the headers alone.
func TestTracingThreeHops(t *testing.T) {
	s := newServer(t)
	orch, orchTel := newTracedBus(t, s, "orchestrator")
	worker, workerTel := newTracedBus(t, s, "worker")
	reviewer, reviewerTel := newTracedBus(t, s, "reviewer")

	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		_, err := worker.Publish(ctx, bus.Message{To: "reviewer", Type: "RESULT", Data: []byte("42")})
		return err
	})
	subscribe(t, reviewer, func(ctx context.Context, d *bus.Delivery) error {
		_, err := reviewer.Publish(ctx, bus.Message{To: "orchestrator", Type: "REVIEW", Priority: 2, Data: []byte("ok")})
		return err
	})
	got := newRecorder()
	subscribe(t, orch, got.handle)

	task := publish(t, orch, bus.Message{To: "worker", Type: "TASK", Data: []byte("do it")})
	review := got.waitCount(t, 1)[0]

	conv := task.ID
	if review.CorrelationID != conv {
		t.Errorf("review correlation ID %q, want the task's ID %q", review.CorrelationID, conv)
	}
	orchSpans := orchTel.waitSpans(t, 2)
	workerSpans := workerTel.waitSpans(t, 2)
	reviewerSpans := reviewerTel.waitSpans(t, 2)

	sendTask := spanNamed(t, orchSpans, "send agentbus.agent.{to}.p3.{from}.{type}")
	processTask := spanNamed(t, workerSpans, "process agentbus.agent.{to}.p3.{from}.{type}")
	sendResult := spanNamed(t, workerSpans, "send agentbus.agent.{to}.p3.{from}.{type}")
	processResult := spanNamed(t, reviewerSpans, "process agentbus.agent.{to}.p3.{from}.{type}")
	sendReview := spanNamed(t, reviewerSpans, "send agentbus.agent.{to}.p2.{from}.{type}")
	processReview := spanNamed(t, orchSpans, "process agentbus.agent.{to}.p2.{from}.{type}")

	traceID := bus.ConversationTraceID(conv)
	for _, sp := range []sdktrace.ReadOnlySpan{sendTask, processTask, sendResult, processResult, sendReview, processReview} {
		if sp.SpanContext().TraceID() != traceID {
			t.Errorf("span %q in trace %s, want the conversation's %s", sp.Name(), sp.SpanContext().TraceID(), traceID)
		}
	}
	if p := sendTask.Parent(); p.SpanID() != rootSpanID(conv) || !p.IsRemote() {
		t.Errorf("first send's parent %s (remote %v), want the conversation root %s", p.SpanID(), p.IsRemote(), rootSpanID(conv))
	}
	chain := []struct{ child, parent sdktrace.ReadOnlySpan }{
		{processTask, sendTask}, {sendResult, processTask}, {processResult, sendResult},
		{sendReview, processResult}, {processReview, sendReview},
	}
	for _, c := range chain {
		if c.child.Parent().SpanID() != c.parent.SpanContext().SpanID() {
			t.Errorf("span %q of %s: parent %s, want %q %s", c.child.Name(), c.child.SpanContext().SpanID(), c.child.Parent().SpanID(), c.parent.Name(), c.parent.SpanContext().SpanID())
		}
	}
	for _, c := range []struct{ consumer, producer sdktrace.ReadOnlySpan }{{processTask, sendTask}, {processResult, sendResult}, {processReview, sendReview}} {
		links := c.consumer.Links()
		if len(links) != 1 || links[0].SpanContext.SpanID() != c.producer.SpanContext().SpanID() {
			t.Errorf("consumer span %q links %v, want its producer %s", c.consumer.Name(), links, c.producer.SpanContext().SpanID())
		}
		if c.consumer.SpanKind() != trace.SpanKindConsumer || c.producer.SpanKind() != trace.SpanKindProducer {
			t.Errorf("kinds %s and %s, want consumer and producer", c.consumer.SpanKind(), c.producer.SpanKind())
		}
		if ev := c.consumer.Events(); len(ev) != 1 || ev[0].Name != "ack" {
			t.Errorf("consumer span %q events %v, want one ack", c.consumer.Name(), ev)
		}
	}

	checkAttrs(t, sendTask, map[string]any{
		"messaging.system":                  "nats",
		"messaging.operation.name":          "send",
		"messaging.operation.type":          "send",
		"messaging.destination.name":        "agentbus.agent.worker.p3.orchestrator.TASK",
		"messaging.destination.template":    "agentbus.agent.{to}.p3.{from}.{type}",
		"messaging.message.id":              task.ID,
		"messaging.message.conversation_id": conv,
		"messaging.message.body.size":       len("do it"),
		"cloudevents.event_id":              task.ID,
		"cloudevents.event_type":            "TASK",
		"cloudevents.event_source":          "/agents/orchestrator",
		"agentbus.from":                     "orchestrator",
		"agentbus.to":                       "worker",
		"agentbus.priority":                 3,
	})
	checkAttrs(t, processTask, map[string]any{
		"messaging.system":                  "nats",
		"messaging.operation.name":          "process",
		"messaging.operation.type":          "process",
		"messaging.destination.name":        "agentbus.agent.worker.p3.orchestrator.TASK",
		"messaging.destination.template":    "agentbus.agent.{to}.p3.{from}.{type}",
		"messaging.consumer.group.name":     "worker_p3",
		"messaging.message.id":              task.ID,
		"messaging.message.conversation_id": conv,
		"messaging.message.body.size":       len("do it"),
		"cloudevents.event_type":            "TASK",
		"agentbus.delivery_count":           1,
		"agentbus.agent":                    "worker",
	})
	result := attrs(sendResult)
	checkAttrs(t, sendResult, map[string]any{
		"messaging.message.conversation_id": conv,
		"agentbus.causation_id":             task.ID,
	})
	checkAttrs(t, sendReview, map[string]any{
		"messaging.message.conversation_id": conv,
		"agentbus.causation_id":             result["messaging.message.id"].AsString(),
		"agentbus.priority":                 2,
	})
	if review.CausationID != result["messaging.message.id"].AsString() {
		t.Errorf("review's causation ID %q, want the result's ID %s", review.CausationID, result["messaging.message.id"].AsString())
	}
}

// TestTracingStartedInsideAnotherTrace: a conversation started under a span
// of another trace (a request the orchestrator serves) stays in the
// conversation's trace and links that span.
func TestTracingStartedInsideAnotherTrace(t *testing.T) {
	s := newServer(t)
	orch, orchTel := newTracedBus(t, s, "orchestrator")
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, request := tp.Tracer("test").Start(testContext(t), "request")
	defer request.End()
	ack, err := orch.Publish(ctx, bus.Message{To: "worker", Type: "TASK", CorrelationID: "conv-req"})
	if err != nil {
		t.Fatal(err)
	}
	send := orchTel.waitSpans(t, 1)[0]
	if send.SpanContext().TraceID() != bus.ConversationTraceID("conv-req") {
		t.Errorf("send span in trace %s, want the conversation's", send.SpanContext().TraceID())
	}
	if links := send.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != request.SpanContext().SpanID() {
		t.Errorf("send span links %v, want the request span", links)
	}
	if ack.ID == "" {
		t.Error("no ID")
	}
}

// traceparentOf is sc as a W3C traceparent value, sampled.
func traceparentOf(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// foreignSpans returns a remote span context in the trace of conversation
// conv and one of another trace, as a raw publisher's traceparent carries.
func foreignSpans(conv string) (inTrace, other trace.SpanContext) {
	inTrace = trace.NewSpanContext(trace.SpanContextConfig{TraceID: bus.ConversationTraceID(conv), SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled})
	other = trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9, 9, 9}, SpanID: trace.SpanID{8, 8, 8}, TraceFlags: trace.FlagsSampled})
	return inTrace, other
}

// publishRawEvent publishes m, defaults filled in and encoded in binary
// mode, with the extra headers h, to subject with raw nats.go, as a
// foreign producer would.
func publishRawEvent(t *testing.T, nc *nats.Conn, subject string, m *codec.Message, h map[string]string) {
	t.Helper()
	m.SetDefaults(time.Now())
	hdr, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		hdr[k] = []string{v}
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// TestTracingRawPublisher: an uninstrumented nats.go client publishes a
// CloudEvent without a traceparent; its handling still lands in the trace of
// its correlation ID. A traceparent written "Traceparent" is read, and one of
// another trace is linked, not followed.
func TestTracingRawPublisher(t *testing.T) {
	s := newServer(t)
	worker, workerTel := newTracedBus(t, s, "worker")
	subscribe(t, worker, newRecorder().handle)
	raw := embeddedtest.Connect(t, s)

	const conv = "conv-raw"
	traceID := bus.ConversationTraceID(conv)
	inTrace, other := foreignSpans(conv)
	tests := []struct {
		name       string
		header     string // the traceparent header's key; "" for none
		sc         trace.SpanContext
		plain      trace.SpanContext // also in a plain traceparent header, if valid
		wantParent trace.SpanID
		wantLink   trace.SpanID
	}{
		{name: "no traceparent", wantParent: rootSpanID(conv)},
		{name: "Traceparent in the conversation's trace", header: "Traceparent", sc: inTrace, wantParent: inTrace.SpanID(), wantLink: inTrace.SpanID()},
		{name: "TRACEPARENT of another trace", header: "TRACEPARENT", sc: other, wantParent: rootSpanID(conv), wantLink: other.SpanID()},
		{name: "ce-traceparent, the CloudEvents extension", header: "ce-traceparent", sc: inTrace, wantParent: inTrace.SpanID(), wantLink: inTrace.SpanID()},
		{name: "ce-traceparent wins over traceparent", header: "ce-traceparent", sc: inTrace, plain: other, wantParent: inTrace.SpanID(), wantLink: inTrace.SpanID()},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.header != "" {
				h[tt.header] = traceparentOf(tt.sc)
			}
			if tt.plain.IsValid() {
				h["traceparent"] = traceparentOf(tt.plain)
			}
			publishRawEvent(t, raw, "agentbus.agent.worker.p3.raw.RAW",
				&codec.Message{ID: fmt.Sprintf("raw-%d", i), From: "raw", To: "worker", Type: "RAW", CorrelationID: conv}, h)
			sp := workerTel.waitSpans(t, i+1)[i]
			if sp.SpanContext().TraceID() != traceID {
				t.Errorf("process span in trace %s, want %s", sp.SpanContext().TraceID(), traceID)
			}
			if sp.Parent().SpanID() != tt.wantParent {
				t.Errorf("parent %s, want %s", sp.Parent().SpanID(), tt.wantParent)
			}
			var links []trace.SpanID
			for _, l := range sp.Links() {
				links = append(links, l.SpanContext.SpanID())
			}
			var want []trace.SpanID
			if tt.wantLink.IsValid() {
				want = append(want, tt.wantLink)
			}
			if !slices.Equal(links, want) {
				t.Errorf("links %v, want %v", links, want)
			}
			checkAttrs(t, sp, map[string]any{"messaging.message.conversation_id": conv, "agentbus.from": "raw"})
		})
	}
}

// TestTracingRelayedWhileOff: an agent with tracing off (a no-op tracer
// provider) makes no spans but relays the trace context it receives, as a
// no-op tracer relays its parent's: what its handler publishes carries the
// producer's traceparent when that is in the conversation's trace, and
// none when the message carried none or one of another trace (the
// conversation's root is what a receiver derives anyway).
func TestTracingRelayedWhileOff(t *testing.T) {
	s := newServer(t)
	relay := newBus(t, s, "relay", bus.WithTracerProvider(noop.NewTracerProvider()))
	sink := newBus(t, s, "sink")
	subscribe(t, relay, func(ctx context.Context, d *bus.Delivery) error {
		_, err := relay.Publish(ctx, bus.Message{To: "sink", Type: "ONWARD"})
		return err
	})
	got := make(chan bus.Message, 1)
	subscribe(t, sink, func(_ context.Context, d *bus.Delivery) error {
		got <- d.Message
		return nil
	})
	raw := embeddedtest.Connect(t, s)
	const conv = "conv-relayed"
	inTrace, other := foreignSpans(conv)
	tests := []struct {
		name string
		sc   trace.SpanContext // carried as ce-traceparent, if valid
		want string            // the onward message's traceparent
	}{
		{name: "in the conversation's trace", sc: inTrace, want: traceparentOf(inTrace)},
		{name: "none"},
		{name: "of another trace", sc: other},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.sc.IsValid() {
				h["ce-traceparent"] = traceparentOf(tt.sc)
			}
			publishRawEvent(t, raw, "agentbus.agent.relay.p3.raw.IN",
				&codec.Message{ID: fmt.Sprintf("relayed-%d", i), From: "raw", To: "relay", Type: "IN", CorrelationID: conv}, h)
			select {
			case onward := <-got:
				if onward.CorrelationID != conv {
					t.Errorf("onward message in conversation %q, want %q", onward.CorrelationID, conv)
				}
				if tp := onward.Extensions["traceparent"]; tp != tt.want {
					t.Errorf("onward traceparent %q, want %q", tp, tt.want)
				}
			case <-testContext(t).Done():
				t.Fatal("no onward message")
			}
		})
	}
}

// TestTracingWritesTheCloudEventsExtension: with tracing on, a published
// event carries its send span's context as the CloudEvents distributed
// tracing extension: ce-traceparent in binary mode, a traceparent member
// in structured mode, and no plain traceparent header. With tracing off it
// carries none. The caller's Extensions map is left alone.
func TestTracingWritesTheCloudEventsExtension(t *testing.T) {
	s := newServer(t)
	raw := embeddedtest.Connect(t, s)
	sub, err := raw.SubscribeSync("agentbus.agent.worker.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	traced, tel := newTracedBus(t, s, "orchestrator")
	structured, structuredTel := newTracedBus(t, s, "planner", bus.WithCodec(codec.Structured{}))
	untraced := newBus(t, s, "reviewer")
	mine := map[string]string{"traceparent": "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01", "tracestate": "x=y"}
	next := func() *nats.Msg {
		t.Helper()
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	want := func(at *agentTelemetry) string {
		return traceparentOf(at.waitSpans(t, 1)[0].SpanContext())
	}

	if _, err := traced.Publish(testContext(t), bus.Message{To: "worker", Type: "T", Extensions: mine}); err != nil {
		t.Fatal(err)
	}
	msg := next()
	if got, w := msg.Header.Get("ce-traceparent"), want(tel); got != w {
		t.Errorf("binary: ce-traceparent %q, want the send span's %q", got, w)
	}
	if got := msg.Header.Values("ce-tracestate"); len(got) != 0 {
		t.Errorf("binary: ce-tracestate %q, want none (the caller's is not the span's)", got)
	}
	if got := msg.Header.Get("traceparent"); got != "" {
		t.Errorf("binary: plain traceparent %q, want none", got)
	}
	if mine["traceparent"] != "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01" || mine["tracestate"] != "x=y" {
		t.Errorf("the caller's extensions were changed: %v", mine)
	}

	if _, err := structured.Publish(testContext(t), bus.Message{To: "worker", Type: "T"}); err != nil {
		t.Fatal(err)
	}
	msg = next()
	var event map[string]any
	if err := json.Unmarshal(msg.Data, &event); err != nil {
		t.Fatal(err)
	}
	if got, w := event["traceparent"], want(structuredTel); got != w {
		t.Errorf("structured: traceparent member %v, want the send span's %q", got, w)
	}
	if len(msg.Header.Values("traceparent")) != 0 || len(msg.Header.Values("ce-traceparent")) != 0 {
		t.Errorf("structured: trace headers %v, want none", msg.Header)
	}

	if _, err := untraced.Publish(testContext(t), bus.Message{To: "worker", Type: "T"}); err != nil {
		t.Fatal(err)
	}
	msg = next()
	for k := range msg.Header {
		if strings.Contains(strings.ToLower(k), "trace") {
			t.Errorf("tracing off: header %s: %v, want no trace context", k, msg.Header[k])
		}
	}
}

// TestTracingCausationOverride: a handler's publish keeps a correlation ID
// and CausationID it sets, and ContextWithDelivery(ctx, nil) starts a new
// conversation.
func TestTracingCausationOverride(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if _, ok := bus.DeliveryFromContext(ctx); !ok {
			return bus.Permanent(errors.New("no delivery in ctx"))
		}
		for _, m := range []bus.Message{
			{ID: "inherited", To: "sink", Type: "R"},
			{ID: "overridden", To: "sink", Type: "R", CorrelationID: "mine", CausationID: "someone"},
		} {
			if _, err := worker.Publish(ctx, m); err != nil {
				return err
			}
		}
		_, err := worker.Publish(bus.ContextWithDelivery(ctx, nil), bus.Message{ID: "fresh", To: "sink", Type: "R"})
		return err
	})
	sink := newRecorder()
	subscribe(t, newBus(t, s, "sink"), sink.handle)
	publish(t, newBus(t, s, "boss"), bus.Message{ID: "task", To: "worker", Type: "T", CorrelationID: "conv"})
	got := map[string]*bus.Delivery{}
	for _, d := range sink.waitCount(t, 3) {
		got[d.ID] = d
	}
	want := map[string][2]string{"inherited": {"conv", "task"}, "overridden": {"mine", "someone"}, "fresh": {"fresh", ""}}
	for id, w := range want {
		d := got[id]
		if d == nil {
			t.Errorf("%s not delivered", id)
			continue
		}
		if d.CorrelationID != w[0] || d.CausationID != w[1] {
			t.Errorf("%s: correlation %q causation %q, want %q %q", id, d.CorrelationID, d.CausationID, w[0], w[1])
		}
	}
}

// TestTracingSettlement: a failure naks, a permanent failure terminates
// with a dead letter; the spans carry the settlement events and error.type,
// and the metrics count the redelivery and the dead letter.
func TestTracingSettlement(t *testing.T) {
	s := newServer(t)
	worker, tel := newTracedBus(t, s, "worker")
	subscribe(t, worker, func(_ context.Context, d *bus.Delivery) error {
		if d.Deliveries == 1 {
			return errors.New("try again")
		}
		return bus.Permanent(errors.New("no"))
	}, bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))
	publish(t, newBus(t, s, "boss"), bus.Message{To: "worker", Type: "T", Priority: 1})
	spans := tel.waitSpans(t, 2)
	var events []string
	for _, sp := range spans {
		for _, e := range sp.Events() {
			events = append(events, e.Name)
		}
		if _, ok := attrs(sp)["error.type"]; !ok {
			t.Errorf("span %q has no error.type", sp.Name())
		}
	}
	if !slices.Equal(events, []string{"nak", "term"}) {
		t.Errorf("settle events %v, want nak, term", events)
	}
	checkAttrs(t, spans[1], map[string]any{"error.type": "rejected", "agentbus.delivery_count": 2})
	term := spans[1].Events()[0]
	if !slices.Contains(term.Attributes, attribute.String("agentbus.dead_letter.reason", "rejected")) {
		t.Errorf("term event attributes %v, want the dead-letter reason", term.Attributes)
	}
	rm := collect(t, tel.reader)
	level := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Int("agentbus.priority", 1))
	if got := sum(rm, "agentbus.redeliveries", level); got != 1 {
		t.Errorf("redeliveries %d, want 1", got)
	}
	rejected := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Int("agentbus.priority", 1), attribute.String("agentbus.dead_letter.reason", "rejected"))
	if got := sum(rm, "agentbus.dead_letters", rejected); got != 1 {
		t.Errorf("dead letters %d, want 1", got)
	}
}

func collect(t *testing.T, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(testContext(t), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// sum returns the int64 sum or gauge value of metric name with exactly the
// attributes set, -1 if there is none.
func sum(rm metricdata.ResourceMetrics, name string, set attribute.Set) int64 {
	m, ok := find(rm, name)
	if !ok {
		return -1
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				return p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&set) {
				return p.Value
			}
		}
	}
	return -1
}

// histogramCount returns how many values histogram name holds in all.
func histogramCount(rm metricdata.ResourceMetrics, name string) uint64 {
	m, _ := find(rm, name)
	var n uint64
	if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
		for _, p := range h.DataPoints {
			n += p.Count
		}
	}
	return n
}

// TestMetrics: sends, consumption, durations, expirations and the backlog
// gauge are recorded.
func TestMetrics(t *testing.T) {
	s := newServer(t)
	sender, senderTel := newTracedBus(t, s, "sender")
	worker, workerTel := newTracedBus(t, s, "worker")
	for range 3 {
		publish(t, sender, bus.Message{To: "worker", Type: "T"})
	}
	// Already expired when it is delivered: Time an hour ago, TTL 1s.
	publish(t, sender, bus.Message{To: "worker", Type: "T", Priority: 4, Time: time.Now().Add(-time.Hour), TTL: time.Hour - time.Second})
	// Held back: the handler blocks on the first message until released, so
	// the other two wait in the backlog.
	release := make(chan struct{})
	done := newRecorder()
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return done.handle(ctx, d)
	}, bus.WithPrefetch(1))

	p3 := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Int("agentbus.priority", 3))
	waitFor(t, "a backlog and one in flight at priority 3", func() (bool, string) {
		rm := collect(t, workerTel.reader)
		backlog, inflight := sum(rm, "agentbus.backlog", p3), sum(rm, "agentbus.inflight", p3)
		return backlog+inflight == 3 && inflight >= 1, fmt.Sprintf("backlog %d, in flight %d", backlog, inflight)
	})
	close(release)
	done.waitCount(t, 3)
	p4 := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Int("agentbus.priority", 4))
	waitFor(t, "the expiration and the backlog drained", func() (bool, string) {
		rm := collect(t, workerTel.reader)
		exp, backlog := sum(rm, "agentbus.expirations", p4), sum(rm, "agentbus.backlog", p3)
		return exp == 1 && backlog == 0, fmt.Sprintf("expirations %d, backlog %d", exp, backlog)
	})

	rm := collect(t, senderTel.reader)
	sentP3 := attribute.NewSet(attribute.String("messaging.system", "nats"), attribute.String("messaging.operation.name", "send"),
		attribute.String("messaging.destination.template", "agentbus.agent.{to}.p3.{from}.{type}"))
	if got := sum(rm, "messaging.client.sent.messages", sentP3); got != 3 {
		t.Errorf("sent messages at p3 %d, want 3", got)
	}
	if got := histogramCount(rm, "messaging.client.operation.duration"); got != 4 {
		t.Errorf("operation durations %d, want 4", got)
	}
	wm := collect(t, workerTel.reader)
	consumedP3 := attribute.NewSet(attribute.String("messaging.system", "nats"), attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.template", "agentbus.agent.{to}.p3.{from}.{type}"),
		attribute.String("messaging.consumer.group.name", "worker_p3"))
	if got := sum(wm, "messaging.client.consumed.messages", consumedP3); got != 3 {
		t.Errorf("consumed messages at p3 %d, want 3", got)
	}
	if got := histogramCount(wm, "messaging.process.duration"); got != 4 {
		t.Errorf("process durations %d, want 4 (3 handled, 1 expired)", got)
	}
}

// TestMetricsBacklogDirectAndBroadcast: a priority's backlog gauges count
// its direct consumer, the broadcast consumer has gauges of its own (it
// holds every priority), and a consumed broadcast names the broadcast
// consumer and its priority's destination.
func TestMetricsBacklogDirectAndBroadcast(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	worker, workerTel := newTracedBus(t, s, "worker")
	release := make(chan struct{})
	done := newRecorder()
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return done.handle(ctx, d)
	}, bus.WithPrefetch(1))
	publish(t, sender, bus.Message{To: "worker", Type: "T", Priority: 2})
	publish(t, sender, bus.Message{To: bus.Broadcast, Type: "T", Priority: 2})
	publish(t, sender, bus.Message{To: "worker", Type: "T", Priority: 2})

	p2 := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Int("agentbus.priority", 2))
	broadcasts := attribute.NewSet(attribute.String("agentbus.agent", "worker"), attribute.Bool("agentbus.broadcast", true))
	waitFor(t, "two direct and one broadcast message stored or in flight", func() (bool, string) {
		rm := collect(t, workerTel.reader)
		direct := sum(rm, "agentbus.backlog", p2) + sum(rm, "agentbus.inflight", p2)
		all := sum(rm, "agentbus.backlog", broadcasts) + sum(rm, "agentbus.inflight", broadcasts)
		return direct == 2 && all == 1, fmt.Sprintf("direct at p2 %d, broadcast %d", direct, all)
	})
	close(release)
	done.waitCount(t, 3)
	broadcastP2 := attribute.NewSet(attribute.String("messaging.system", "nats"), attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.template", "agentbus.all.p2.{from}.{type}"),
		attribute.String("messaging.consumer.group.name", "worker_b"))
	if got := sum(collect(t, workerTel.reader), "messaging.client.consumed.messages", broadcastP2); got != 1 {
		t.Errorf("consumed broadcasts at p2 by worker_b %d, want 1", got)
	}
}

// TestWithProviderOptions: nil providers are invalid options.
func TestWithProviderOptions(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	tests := []struct {
		name    string
		opt     bus.Option
		wantErr error
	}{
		{"nil tracer provider", bus.WithTracerProvider(nil), bus.ErrInvalidOption},
		{"nil meter provider", bus.WithMeterProvider(nil), bus.ErrInvalidOption},
		{"tracer provider", bus.WithTracerProvider(sdktrace.NewTracerProvider()), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := bus.New(nc, "agent", tt.opt)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New: %v, want %v", err, tt.wantErr)
			}
			if b != nil {
				b.Close()
			}
		})
	}
}
