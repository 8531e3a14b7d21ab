package bus

import (
	"context"
	"crypto/sha256"
	"errors"
	"maps"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// instrumentationName names the tracer and meter of the bus.
const instrumentationName = "github.com/agentbus/agentbus/bus"

// Attributes of the bus's spans and metrics beyond the OpenTelemetry
// semantic conventions; docs/observability.md lists them all.
const (
	attrAgent            = attribute.Key("agentbus.agent")
	attrPriority         = attribute.Key("agentbus.priority")
	attrBroadcast        = attribute.Key("agentbus.broadcast")
	attrProtocol         = attribute.Key("agentbus.protocol")
	attrFrom             = attribute.Key("agentbus.from")
	attrTo               = attribute.Key("agentbus.to")
	attrCausationID      = attribute.Key("agentbus.causation_id")
	attrDeliveryCount    = attribute.Key("agentbus.delivery_count")
	attrStreamSequence   = attribute.Key("agentbus.stream_sequence")
	attrDuplicate        = attribute.Key("agentbus.duplicate")
	attrNakDelay         = attribute.Key("agentbus.nak_delay")
	attrDeadLetterReason = attribute.Key("agentbus.dead_letter.reason")
	attrReplayed         = attribute.Key("agentbus.replayed")
)

// messagingSystem is the messaging.system of every span and metric.
var messagingSystem = semconv.MessagingSystemKey.String("nats")

// ConversationTraceID returns the trace ID of the conversation named
// correlationID: the first 16 bytes of the SHA-256 digest of its UTF-8
// bytes. Every span of the bus belongs to the trace of the conversation of
// its message, so the trace of a conversation can be found from its
// correlation ID alone:
//
//	printf %s "$CORRELATION_ID" | sha256sum | cut -c1-32
//
// A message without a correlation ID is a conversation of its own, named by
// its ID (see codec.Message.SetDefaults).
func ConversationTraceID(correlationID string) trace.TraceID {
	return conversationRoot(correlationID).TraceID()
}

// conversationRoot returns the span context that stands for the start of a
// conversation: the trace ID of ConversationTraceID and, as span ID, bytes
// 16 to 23 of the same digest. No span has it; it is the remote parent of
// the spans that start a conversation or continue it after a hop that
// carried no trace context. It is marked sampled, so a parent-based sampler
// records the conversation; see docs/observability.md for ratio sampling.
func conversationRoot(correlationID string) trace.SpanContext {
	sum := sha256.Sum256([]byte(correlationID))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[:16])
	copy(sid[:], sum[16:24])
	// An all-zero ID is invalid; a digest starting with 16 or 8 zero bytes
	// is not going to happen, but must not break the trace if it does.
	if !tid.IsValid() {
		tid[15] = 1
	}
	if !sid.IsValid() {
		sid[7] = 1
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tid,
		SpanID:     sid,
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
}

// conversationOf returns the conversation a message belongs to: its
// correlation ID, or its own ID if it has none.
func conversationOf(m *Message) string {
	if m.CorrelationID != "" {
		return m.CorrelationID
	}
	return m.ID
}

// parentFor returns the context a span about a message of conversation
// conv starts under, and the span context to link to. sc is the context of
// the span that caused the message: the caller's span for a send, the
// producer's (from the trace context it carries) for a process span. If sc is in
// the conversation's trace it is the parent; otherwise the conversation
// root is, and sc, if valid, is linked to. So every span of a conversation
// is in one trace, even when it started inside another trace (such as the
// request an orchestrator started it from, which is linked) or when a hop
// carried no trace context.
func parentFor(ctx context.Context, sc trace.SpanContext, conv string) (context.Context, trace.SpanContext) {
	return parentUnder(ctx, sc, conversationRoot(conv))
}

// parentUnder is parentFor with the conversation root already computed.
func parentUnder(ctx context.Context, sc, root trace.SpanContext) (context.Context, trace.SpanContext) {
	if sc.IsValid() && sc.TraceID() == root.TraceID() {
		if sc.IsRemote() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
		return ctx, trace.SpanContext{}
	}
	return trace.ContextWithRemoteSpanContext(ctx, root), sc
}

// traceContext is the W3C Trace Context propagator: the bus always
// propagates traceparent and tracestate, whatever the global propagator.
var traceContext propagation.TraceContext

// The trace context travels as the CloudEvents Distributed Tracing
// extension: the attributes traceparent and tracestate, so ce-traceparent
// and ce-tracestate headers in binary mode and members of the event in
// structured mode. A producer that is not a CloudEvents one may instead
// write the plain W3C traceparent header (as nats.go and OpenTelemetry's
// NATS instrumentations do): the bus reads that when the event has none.

// extensionCarrier adapts a message's extension attributes to
// propagation.TextMapCarrier, to write the trace context into a message
// about to be encoded.
type extensionCarrier map[string]string

var _ propagation.TextMapCarrier = extensionCarrier(nil)

// Get returns the extension key.
func (c extensionCarrier) Get(key string) string { return c[key] }

// Set sets the extension key.
func (c extensionCarrier) Set(key, value string) { c[key] = value }

// Keys returns the extension names.
func (c extensionCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// incomingCarrier reads the trace context of a delivered message: the
// event's distributed tracing extension if it has one (ext, the decoded
// extensions; or, for a message that could not be decoded, its ce-
// headers), else the plain W3C headers. Headers match in any case:
// nats.Header is case-sensitive, and other clients write "Traceparent" or
// "CE-TraceParent".
type incomingCarrier struct {
	h   nats.Header
	ext map[string]string // nil when the message could not be decoded
}

var _ propagation.TextMapCarrier = incomingCarrier{}

// Get returns the value of key, from the extension first.
func (c incomingCarrier) Get(key string) string {
	if c.ext != nil {
		if v := c.ext[key]; v != "" {
			return v
		}
		// A decoded event's ce- headers are in ext already.
	} else if v := headerValue(c.h, codecHeaderPrefix+key); v != "" {
		return v
	}
	return headerValue(c.h, key)
}

// Set does nothing: the carrier is read only.
func (incomingCarrier) Set(string, string) {}

// Keys returns the header keys.
func (c incomingCarrier) Keys() []string {
	out := make([]string, 0, len(c.h))
	for k := range c.h {
		out = append(out, k)
	}
	return out
}

// codecHeaderPrefix is the CloudEvents NATS binding's attribute header
// prefix.
const codecHeaderPrefix = "ce-"

// headerValue returns the first value of key in h, matched
// case-insensitively.
func headerValue(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// deliveryKey is the context key of the *handling of the Delivery being
// handled.
type deliveryKey struct{}

// ContextWithDelivery returns ctx carrying d as the message being handled.
// The context a Handler receives carries its Delivery, so that a message
// published with it continues d's conversation: Publish gives it d's
// correlation ID and, as CausationID (causationid), d's ID, unless the message
// sets them. ContextWithDelivery(ctx, nil) drops the Delivery, for a handler
// that starts an unrelated conversation.
func ContextWithDelivery(ctx context.Context, d *Delivery) context.Context {
	var h *handling
	if d != nil {
		h = &handling{d: d}
	}
	return context.WithValue(ctx, deliveryKey{}, h)
}

// DeliveryFromContext returns the Delivery ctx carries, if any.
func DeliveryFromContext(ctx context.Context) (*Delivery, bool) {
	if h := handlingOf(ctx); h != nil {
		return h.d, true
	}
	return nil, false
}

// handlingOf returns the handling ctx carries, or nil.
func handlingOf(ctx context.Context) *handling {
	h, _ := ctx.Value(deliveryKey{}).(*handling)
	return h
}

// inherit fills m's correlation ID and CausationID from the Delivery ctx
// carries, where m leaves them empty. A message that answers a Request's
// request this way also carries its deadline (ExtReplyBy), as a Reply does.
func inherit(ctx context.Context, m *Message) {
	d, ok := DeliveryFromContext(ctx)
	if !ok {
		return
	}
	if m.CorrelationID == "" {
		m.CorrelationID = conversationOf(&d.Message)
	}
	if m.CausationID == "" {
		m.CausationID = d.ID
	}
	if by, ok := d.Extensions[ExtReplyBy]; ok && m.CausationID == d.ID {
		setExtension(m, ExtReplyBy, by)
	}
}

// setExtension sets extension name of m to v without changing the map m
// was given with, which the caller may share.
func setExtension(m *Message, name, v string) {
	if m.Extensions[name] == v {
		return
	}
	m.Extensions = maps.Clone(m.Extensions)
	if m.Extensions == nil {
		m.Extensions = make(map[string]string, 1)
	}
	m.Extensions[name] = v
}

// destination is one low-cardinality destination template of the bus: a
// kind (direct or broadcast) at one priority. Everything that depends only
// on it is computed once, in newTelemetry.
type destination struct {
	priority    int
	template    string // messaging.destination.template
	sendName    string // "send <template>"
	processName string // "process <template>"
	metrics     destinationMetrics
}

// destinationFor returns the destination of a message about to be sent,
// nil when its priority is out of range (encoding it fails).
func (t *telemetry) destinationFor(m *Message) *destination {
	if m.Priority < subjects.HighestPriority || m.Priority > subjects.LowestPriority {
		return nil
	}
	k := 0
	if m.Broadcast() {
		k = 1
	}
	return &t.dests[k][m.Priority-1]
}

// destinationOf returns the destination of a delivered message's subject,
// or nil if the subject is not a direct or broadcast subject of the bus. It
// does not allocate.
func (t *telemetry) destinationOf(subject string) *destination {
	kind, p := t.scheme.Route(subject)
	switch kind {
	case subjects.KindDirect:
		return &t.dests[0][p-1]
	case subjects.KindBroadcast:
		return &t.dests[1][p-1]
	}
	return nil
}

// sendOp is a publish under way: its span and when it started.
type sendOp struct {
	span  trace.Span
	start time.Time
	dest  *destination
}

// startSend starts the producer span of m, about to be encoded, and writes
// its trace context into m as the distributed tracing extension (on a copy
// of m.Extensions: the caller's map is left alone). Call describe once m is
// encoded, or abandon if it does not encode.
func (t *telemetry) startSend(ctx context.Context, m *Message) sendOp {
	dest := t.destinationFor(m)
	name := "send" // of a message that will not encode
	if dest != nil {
		name = dest.sendName
	}
	root := conversationRoot(conversationOf(m))
	ctx, link := parentUnder(ctx, trace.SpanContextFromContext(ctx), root)
	ctx, span := t.tracer.Start(ctx, name, t.sendOpts...)
	if link.IsValid() && span.IsRecording() {
		span.AddLink(trace.Link{SpanContext: link})
	}
	// A tracer that made no span of its own (the no-op tracer: tracing is
	// off) leaves the conversation root in place. The receiver derives that
	// from the correlation ID anyway, so nothing is written: two more
	// headers on every message for nothing.
	if sc := span.SpanContext(); sc.IsValid() && sc.SpanID() != root.SpanID() {
		ext := make(map[string]string, len(m.Extensions)+2)
		maps.Copy(ext, m.Extensions)
		delete(ext, extTraceState) // the caller's, if any, is not this span's
		traceContext.Inject(ctx, extensionCarrier(ext))
		m.Extensions = ext
	}
	return sendOp{span: span, start: time.Now(), dest: dest}
}

// The distributed tracing extension's attributes.
const (
	extTraceParent = "traceparent"
	extTraceState  = "tracestate"
)

// describe puts the attributes of m, encoded as msg, on the span.
func (op sendOp) describe(m *Message, msg *nats.Msg) {
	if op.span.IsRecording() {
		op.span.SetAttributes(messageAttrs(op.dest, msg.Subject, m, len(msg.Data),
			semconv.MessagingOperationName("send"), semconv.MessagingOperationTypeSend)...)
	}
}

// abandon ends the span of a message that could not be encoded: no send
// took place, so no metric counts it.
func (op sendOp) abandon(err error) {
	op.span.SetStatus(codes.Error, err.Error())
	op.span.End()
}

// end ends the send: err is its error, nil on success.
func (op sendOp) end(t *telemetry, ctx context.Context, err error, duplicate bool) {
	elapsed := time.Since(op.start).Seconds()
	if err == nil {
		t.sent.Add(ctx, 1, op.dest.metrics.sent...)
		t.opDuration.Record(ctx, elapsed, op.dest.metrics.sendDuration...)
		if duplicate && op.span.IsRecording() {
			op.span.SetAttributes(attrDuplicate.Bool(true))
		}
	} else {
		et := publishErrorType(err)
		t.sent.Add(ctx, 1, op.dest.metrics.withError(op.dest.metrics.sentSet, et))
		t.opDuration.Record(ctx, elapsed, op.dest.metrics.withError(op.dest.metrics.sendDurationSet, et))
		if op.span.IsRecording() {
			op.span.SetAttributes(semconv.ErrorTypeKey.String(et))
			op.span.SetStatus(codes.Error, err.Error())
		}
	}
	op.span.End()
}

// processOp is a delivered message being handled.
type processOp struct {
	span  trace.Span
	start time.Time
	dest  *destination // nil for a subject not of the bus
}

// startProcess starts the consumer span of a delivered message. m is the
// decoded message, nil if it could not be decoded. The span's parent is the
// producer's span, from the trace context it carries, if it is in the
// conversation's trace, and the conversation root otherwise; the producer's
// span is also linked to.
func (t *telemetry) startProcess(ctx context.Context, cm *consumers.Msg, m *Message) (context.Context, processOp) {
	dest := t.destinationOf(cm.Subject)
	name := "process"
	if dest != nil {
		name = dest.processName
		t.consumed.Add(ctx, 1, dest.metrics.consumed...)
		if cm.Metadata.Deliveries > 1 {
			t.redeliveries.Add(ctx, 1, t.levels[dest.priority-1].opts...)
		}
	}
	carrier := incomingCarrier{h: cm.Header}
	if m != nil {
		carrier.ext = m.Extensions
		if carrier.ext == nil {
			carrier.ext = map[string]string{}
		}
	}
	producer := trace.SpanContextFromContext(traceContext.Extract(ctx, carrier))
	var link trace.SpanContext
	switch {
	case m != nil:
		ctx, link = parentFor(ctx, producer, conversationOf(m))
		if !link.IsValid() {
			link = producer // the parent: linked too, as the conventions ask
		}
	case producer.IsValid():
		// Undecodable: no conversation is known, so follow the producer.
		ctx, link = trace.ContextWithRemoteSpanContext(ctx, producer), producer
	}
	ctx, span := t.tracer.Start(ctx, name, t.processOpts...)
	if span.IsRecording() {
		if link.IsValid() {
			span.AddLink(trace.Link{SpanContext: link})
		}
		attrs := []attribute.KeyValue{
			messagingSystem,
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(cm.Subject),
			semconv.MessagingConsumerGroupName(cm.Metadata.Consumer),
			semconv.MessagingMessageBodySize(len(cm.Data)),
			attrDeliveryCount.Int64(int64(cm.Metadata.Deliveries)),
			attrStreamSequence.Int64(int64(cm.Metadata.StreamSeq)),
			attrAgent.String(t.agent),
		}
		if dest != nil {
			attrs = append(attrs, semconv.MessagingDestinationTemplate(dest.template))
		}
		if m != nil {
			attrs = append(attrs, messageFields(m)...)
		}
		if len(cm.Header[HeaderReplayOf]) > 0 {
			attrs = append(attrs, attrReplayed.Bool(true))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, processOp{span: span, start: time.Now(), dest: dest}
}

// end records the handling's result: err is what the handler returned.
// Settlement ends the span (see Bus.settled).
func (op processOp) end(t *telemetry, ctx context.Context, err error) {
	elapsed := time.Since(op.start).Seconds()
	if op.dest != nil {
		if err == nil {
			t.processDuration.Record(ctx, elapsed, op.dest.metrics.process...)
		} else {
			t.processDuration.Record(ctx, elapsed, op.dest.metrics.withError(op.dest.metrics.consumerSet, handlerErrorType(err)))
		}
	}
	if err != nil && op.span.IsRecording() {
		op.span.SetAttributes(semconv.ErrorTypeKey.String(handlerErrorType(err)))
		op.span.SetStatus(codes.Error, err.Error())
	}
}

// settleEvent adds the settlement of a message to its span as an event;
// err is the error sending it, if any.
func settleEvent(span trace.Span, s settlement, err error) {
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeSettle,
		semconv.MessagingOperationName(string(s.outcome)),
	}
	switch s.outcome {
	case outcomeNak:
		attrs = append(attrs, attrNakDelay.Float64(s.delay.Seconds()))
	case outcomeTerm:
		if r, ok := deadLetterReasonOf(s.reason); ok {
			attrs = append(attrs, attrDeadLetterReason.String(string(r)))
		}
	}
	if err != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(semconv.ErrorType(err).Value.AsString()))
	}
	span.AddEvent(string(s.outcome), trace.WithAttributes(attrs...))
}

// messageAttrs returns the attributes of a span about m sent on subject.
func messageAttrs(dest *destination, subject string, m *Message, bodySize int, extra ...attribute.KeyValue) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 16)
	attrs = append(attrs,
		messagingSystem,
		semconv.MessagingDestinationName(subject),
		semconv.MessagingDestinationTemplate(dest.template),
		semconv.MessagingMessageBodySize(bodySize),
	)
	attrs = append(attrs, extra...)
	return append(attrs, messageFields(m)...)
}

// messageFields returns the attributes that describe m itself.
func messageFields(m *Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		semconv.MessagingMessageID(m.ID),
		semconv.MessagingMessageConversationID(conversationOf(m)),
		semconv.CloudEventsEventID(m.ID),
		semconv.CloudEventsEventType(m.Type),
		semconv.CloudEventsEventSource(codec.SourcePrefix + subjects.EncodeToken(m.From)),
		semconv.CloudEventsEventSpecVersion(codec.SpecVersion),
		attrFrom.String(m.From),
		attrTo.String(m.To),
		attrPriority.Int(m.Priority),
	}
	if m.CausationID != "" {
		attrs = append(attrs, attrCausationID.String(m.CausationID))
	}
	return attrs
}

// publishErrorType returns the error.type of a failed publish.
func publishErrorType(err error) string {
	switch {
	case errors.Is(err, ErrPayloadTooLarge):
		return "payload_too_large"
	case errors.Is(err, ErrNotProvisioned):
		return "not_provisioned"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// handlerErrorType returns the error.type of a failed handling: the
// dead-letter reason where there is one, "expired", "panic" or "canceled",
// the error's ErrorType() method if it has one, else its Go type.
func handlerErrorType(err error) string {
	switch {
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.Is(err, codec.ErrMalformed), errors.Is(err, ErrMalformedSubject):
		return string(ReasonMalformed)
	case errors.Is(err, ErrHandlerPanic):
		return "panic"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	var et interface{ ErrorType() string }
	if errors.As(err, &et) {
		return et.ErrorType()
	}
	if isPermanent(err) {
		return string(ReasonRejected)
	}
	return semconv.ErrorType(err).Value.AsString()
}
