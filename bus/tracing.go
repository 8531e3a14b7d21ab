package bus

import (
	"context"
	"crypto/sha256"
	"errors"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

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

var _ propagation.TextMapCarrier = extensionCarrier(nil)

var _ propagation.TextMapCarrier = incomingCarrier{}

// sendOp is a publish under way: its span and when it started.
type sendOp struct {
	span  trace.Span
	start time.Time
	dest  *destination
}

// startSend starts the producer span of m, about to be encoded, and writes
// its trace context into m as the distributed tracing extension (on a copy
// of m.Extensions: the caller's map is left alone). The send began at
// start. Call describe once m is encoded, or abandon if it does not encode.
func (t *telemetry) startSend(ctx context.Context, m *Message, start time.Time) sendOp {
	dest := t.destinationFor(m)
	name := "send" // of a message that will not encode
	if dest != nil {
		name = dest.sendName
	}
	sc := trace.SpanContextFromContext(ctx)
	untraced := t.untraced()
	if untraced && !sc.IsValid() {
		// No span to start and no trace context to relay: nothing to do.
		return sendOp{span: noop.Span{}, start: start, dest: dest}
	}
	root := conversationRoot(conversationOf(m))
	ctx, link := parentUnder(ctx, sc, root)
	var span trace.Span = noop.Span{}
	if !untraced {
		ctx, span = t.tracer.Start(ctx, name, t.sendOpts...)
		if link.IsValid() && span.IsRecording() {
			span.AddLink(trace.Link{SpanContext: link})
		}
	}
	// Untraced, the trace context ctx carries (a handler's, received with
	// its message) is relayed, as a no-op tracer relays its parent's.
	writeTraceContext(ctx, m, root)
	return sendOp{span: span, start: start, dest: dest}
}

// writeTraceContext writes the trace context of ctx's span into m as the
// distributed tracing extension, on a copy of m.Extensions, unless it is
// the conversation's root: a tracer that made no span of its own (the
// no-op tracer: tracing is off) leaves the root in place, which the
// receiver derives from the correlation ID anyway, so nothing is written:
// two more headers on every message for nothing.
func writeTraceContext(ctx context.Context, m *Message, root trace.SpanContext) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || sc.SpanID() == root.SpanID() {
		return
	}
	ext := make(map[string]string, len(m.Extensions)+2)
	maps.Copy(ext, m.Extensions)
	delete(ext, extTraceState) // the caller's, if any, is not this span's
	traceContext.Inject(ctx, extensionCarrier(ext))
	m.Extensions = ext
}

// describe puts the attributes of m, encoded as msg, on the span. The
// destination is msg's subject without the message's index (s.WithoutIndex),
// as on the recipient's span.
func (op sendOp) describe(s subjects.Scheme, m *Message, msg *nats.Msg) {
	if op.span.IsRecording() {
		op.span.SetAttributes(messageAttrs(op.dest, s.WithoutIndex(msg.Subject), m, len(msg.Data),
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
	// The clock is read only for a histogram that records: with no meter
	// set, the read was a fifth of the send's telemetry.
	timed := t.opDuration.Enabled(ctx)
	if err == nil {
		t.sent.Add(ctx, 1, op.dest.metrics.sent...)
		if timed {
			t.opDuration.Record(ctx, time.Since(op.start).Seconds(), op.dest.metrics.sendDuration...)
		}
		if duplicate && op.span.IsRecording() {
			op.span.SetAttributes(attrDuplicate.Bool(true))
		}
	} else {
		et := publishErrorType(err)
		t.sent.Add(ctx, 1, op.dest.metrics.withError(op.dest.metrics.sentSet, et))
		if timed {
			t.opDuration.Record(ctx, time.Since(op.start).Seconds(), op.dest.metrics.withError(op.dest.metrics.sendDurationSet, et))
		}
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
	start time.Time    // zero when the process duration is not recorded
	dest  *destination // nil for a subject not of the bus
}

// startProcess starts the consumer span of a delivered message. m is the
// decoded message, nil if it could not be decoded, and th its plain trace
// headers (codec.DecodeWithTraceHeadersInto). The span's parent is the
// producer's span, from the trace context it carries, if it is in the
// conversation's trace, and the conversation root otherwise; the producer's
// span is also linked to.
func (t *telemetry) startProcess(ctx context.Context, cm *consumers.Msg, m *Message, th codec.TraceHeaders) (context.Context, processOp) {
	dest := t.destinationOf(cm.Subject)
	name := "process"
	if dest != nil {
		name = dest.processName
		t.consumed.Add(ctx, 1, dest.metrics.consumed...)
		if cm.Metadata.Deliveries > 1 {
			t.redeliveries.Add(ctx, 1, t.levels[dest.priority-1].opts...)
		}
	}
	carrier := incomingCarrier{h: cm.Header, plain: th}
	if m != nil {
		carrier.ext = m.Extensions
		if carrier.ext == nil {
			carrier.ext = noExtensions
		}
	}
	// Untraced, a message without a trace context costs nothing more:
	// there is no span to parent and nothing to relay.
	untraced := t.untraced()
	var producer trace.SpanContext
	if !untraced || carrier.Get(traceParentKey) != "" {
		producer = trace.SpanContextFromContext(traceContext.Extract(ctx, carrier))
	}
	var link trace.SpanContext
	switch {
	case m != nil && (!untraced || producer.IsValid()):
		ctx, link = parentFor(ctx, producer, conversationOf(m))
		if !link.IsValid() {
			link = producer // the parent: linked too, as the conventions ask
		}
	case producer.IsValid():
		// Undecodable: no conversation is known, so follow the producer.
		ctx, link = trace.ContextWithRemoteSpanContext(ctx, producer), producer
	}
	// Timed only for a histogram that records (see sendOp.end).
	var start time.Time
	if t.processDuration.Enabled(ctx) {
		start = time.Now()
	}
	if untraced {
		// No span; the trace context now in ctx is relayed by what the
		// handler publishes (startSend), as a no-op tracer relays its
		// parent's.
		return ctx, processOp{span: noop.Span{}, start: start, dest: dest}
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
			semconv.MessagingDestinationName(t.scheme.WithoutIndex(cm.Subject)),
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
	return ctx, processOp{span: span, start: start, dest: dest}
}

// end records the handling's result: err is what the handler returned.
// Settlement ends the span (see Bus.settled).
func (op processOp) end(t *telemetry, ctx context.Context, err error) {
	if op.dest != nil && !op.start.IsZero() {
		elapsed := time.Since(op.start).Seconds()
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

// handlerErrorType returns the error.type of a failed handling: for a
// termination the bus decided (busTerm), "expired", "canceled" or the
// dead-letter reason "malformed"; "panic" for a panic (or runtime.Goexit)
// the bus recovered; "canceled" when the subscription stopped under the
// handler; else the error's ErrorType() method if it has one, "rejected"
// for a Permanent error, or its Go type. A handler's own error is
// classified by what it is, not by what it wraps, as its dead letter is
// (deadLetterReasonOf): before 2026-11-28 one wrapping ErrExpired read
// expired though it was dead-lettered as rejected, and a canceled message
// read rejected.
func handlerErrorType(err error) string {
	var bt busTerm
	if errors.As(err, &bt) {
		switch { // canceled first: its reason wraps what the handler returned
		case errors.Is(bt.err, ErrCanceled):
			return "canceled"
		case errors.Is(bt.err, ErrExpired):
			return "expired"
		case errors.Is(bt.err, codec.ErrMalformed), errors.Is(bt.err, ErrMalformedSubject):
			return string(ReasonMalformed)
		}
	}
	switch {
	case errors.Is(err, ErrHandlerPanic) && !isPermanent(err):
		return "panic"
	case errors.Is(err, context.Canceled) && !isPermanent(err):
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
