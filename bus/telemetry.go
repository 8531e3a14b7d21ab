package bus

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentbus/agentbus/subjects"
)

// telemetry is a bus's tracer and instruments, and the attribute sets it
// records with, computed once so that recording allocates nothing.
type telemetry struct {
	agent  string
	scheme subjects.Scheme
	tracer trace.Tracer
	meter  metric.Meter
	// untraced reports whether tracer makes no spans now (see
	// newUntraced); the send and process paths then skip the trace
	// context altogether.
	untraced func() bool

	sendOpts    []trace.SpanStartOption
	processOpts []trace.SpanStartOption

	// dests[0] are the direct destinations, dests[1] the broadcast ones,
	// by priority - 1.
	dests  [2][subjects.LowestPriority]destination
	levels [subjects.LowestPriority]level
	// broadcastObserve is what the backlog of the broadcast consumer, which
	// holds every priority, is observed with.
	broadcastObserve []metric.ObserveOption

	sent            metric.Int64Counter
	consumed        metric.Int64Counter
	opDuration      metric.Float64Histogram
	processDuration metric.Float64Histogram
	redeliveries    metric.Int64Counter
	deadLetters     metric.Int64Counter
	expirations     metric.Int64Counter
	findings        metric.Int64Counter
	backlog         metric.Int64ObservableGauge
	inflight        metric.Int64ObservableGauge
}

// level is what the metrics of one of the agent's priority levels record
// with.
type level struct {
	// consumers are the names of the durable consumers that deliver the
	// level's messages, the direct one and the agent's broadcast consumer
	// (the same for every level), indexed as telemetry.dests.
	consumers [2]string
	set       attribute.Set
	opts      []metric.AddOption
	observe   []metric.ObserveOption
}

// destinationMetrics are the attribute sets of one destination's metrics.
type destinationMetrics struct {
	sentSet, sendDurationSet, consumerSet attribute.Set

	sent         []metric.AddOption
	sendDuration []metric.RecordOption
	consumed     []metric.AddOption
	process      []metric.RecordOption
}

// withError returns set with error.type et, as a measurement option.
func (destinationMetrics) withError(set attribute.Set, et string) metric.MeasurementOption {
	kvs := append(set.ToSlice(), semconv.ErrorTypeKey.String(et))
	return metric.WithAttributes(kvs...)
}

// newUntraced returns the test of whether tp makes no spans: always for
// the no-op providers, and for OpenTelemetry's global provider until a
// program sets one (otel.SetTracerProvider), which may come after New.
// Any other provider is taken to trace, sampled or not.
//
// With no spans made, the bus computes no conversation root and starts no
// span; it only relays a trace context that a message carries to what its
// handler publishes, as a no-op tracer relays its parent's (startProcess,
// startSend). What messages carry is unchanged.
func newUntraced(tp trace.TracerProvider) func() bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return func() bool { return true }
	}
	if isGlobalDelegate(tp) {
		return func() bool { return otel.GetTracerProvider() == tp }
	}
	return func() bool { return false }
}

// isGlobalDelegate reports whether tp is OpenTelemetry's global tracer
// provider as a program finds it before setting one: a delegate that makes
// no spans until otel.SetTracerProvider, after which otel.GetTracerProvider
// returns the provider set.
func isGlobalDelegate(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" &&
		t.Elem().Name() == "tracerProvider"
}

func newTelemetry(o *options, agent string) (*telemetry, error) {
	t := &telemetry{
		agent:  agent,
		scheme: o.scheme,
		tracer: o.tracerProvider.Tracer(instrumentationName,
			trace.WithSchemaURL(semconv.SchemaURL)),
		untraced:    newUntraced(o.tracerProvider),
		sendOpts:    []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)},
		processOpts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)},
	}
	// An Admin has no agent, and so no levels of its own.
	cs := make([]subjects.Consumer, subjects.ConsumersPerAgent)
	if agent != "" {
		var err error
		if cs, err = o.scheme.Consumers(agent); err != nil {
			return nil, err
		}
	}
	for i := range t.levels {
		set := attribute.NewSet(attrAgent.String(agent), attrPriority.Int(i+1))
		t.levels[i] = level{
			// Consumers lists each priority's direct consumer, then the
			// broadcast one.
			consumers: [2]string{cs[i].Name, cs[subjects.LowestPriority].Name},
			set:       set,
			opts:      []metric.AddOption{metric.WithAttributeSet(set)},
			observe:   []metric.ObserveOption{metric.WithAttributeSet(set)},
		}
	}
	t.broadcastObserve = []metric.ObserveOption{metric.WithAttributeSet(
		attribute.NewSet(attrAgent.String(agent), attrBroadcast.Bool(true)))}
	for k, kind := range []subjects.Kind{subjects.KindDirect, subjects.KindBroadcast} {
		for i := range t.dests[k] {
			p := i + 1
			tmpl := o.scheme.Template(kind, p)
			sent := attribute.NewSet(messagingSystem, semconv.MessagingOperationName("send"),
				semconv.MessagingDestinationTemplate(tmpl))
			sendDuration := attribute.NewSet(messagingSystem, semconv.MessagingOperationName("send"),
				semconv.MessagingOperationTypeSend, semconv.MessagingDestinationTemplate(tmpl))
			consumer := attribute.NewSet(messagingSystem, semconv.MessagingOperationName("process"),
				semconv.MessagingDestinationTemplate(tmpl), semconv.MessagingConsumerGroupName(t.levels[i].consumers[k]))
			t.dests[k][i] = destination{
				priority:    p,
				template:    tmpl,
				sendName:    "send " + tmpl,
				processName: "process " + tmpl,
				metrics: destinationMetrics{
					sentSet: sent, sendDurationSet: sendDuration, consumerSet: consumer,
					sent:         []metric.AddOption{metric.WithAttributeSet(sent)},
					sendDuration: []metric.RecordOption{metric.WithAttributeSet(sendDuration)},
					consumed:     []metric.AddOption{metric.WithAttributeSet(consumer)},
					process:      []metric.RecordOption{metric.WithAttributeSet(consumer)},
				},
			}
		}
	}
	meter := o.meterProvider.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL))
	t.meter = meter
	var errs []error
	sent, err := messagingconv.NewClientSentMessages(meter)
	errs = append(errs, err)
	consumed, err := messagingconv.NewClientConsumedMessages(meter)
	errs = append(errs, err)
	opDuration, err := messagingconv.NewClientOperationDuration(meter,
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	processDuration, err := messagingconv.NewProcessDuration(meter,
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	t.sent, t.consumed = sent.Inst(), consumed.Inst()
	t.opDuration, t.processDuration = opDuration.Inst(), processDuration.Inst()
	t.redeliveries, err = meter.Int64Counter("agentbus.redeliveries", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries of a message after its first."))
	errs = append(errs, err)
	t.deadLetters, err = meter.Int64Counter("agentbus.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Messages terminated and written to the dead-letter stream, by agentbus.dead_letter.reason."))
	errs = append(errs, err)
	t.expirations, err = meter.Int64Counter("agentbus.expirations", metric.WithUnit("{message}"),
		metric.WithDescription("Messages found expired when delivered, and so terminated without reaching the handler."))
	errs = append(errs, err)
	t.findings, err = meter.Int64Counter("agentbus.protocol.findings", metric.WithUnit("{finding}"),
		metric.WithDescription("Rules of a lenient protocol (coordination) that delivered messages broke, by agentbus.protocol."))
	errs = append(errs, err)
	t.backlog, err = meter.Int64ObservableGauge("agentbus.backlog", metric.WithUnit("{message}"),
		metric.WithDescription("Messages stored for the agent at one priority and not yet delivered."))
	errs = append(errs, err)
	t.inflight, err = meter.Int64ObservableGauge("agentbus.inflight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages delivered to the agent at one priority and not yet acknowledged."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create instruments: %w", err)
	}
	return t, nil
}

// durationBuckets are the bucket boundaries the semantic conventions advise
// for messaging durations, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// observeBacklog reports the backlog of the agent's consumers from their
// info: one data point per priority from its direct consumer, and one for
// the broadcast consumer, which holds every priority (agentbus.broadcast).
// It reads nothing while the agent has no subscription.
func (b *Bus) observeBacklog(ctx context.Context, o metric.Observer) error {
	b.mu.Lock()
	subscribed := len(b.subs) > 0
	b.mu.Unlock()
	if !subscribed {
		return nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	stream := b.opts.scheme.Stream()
	var errs []error
	observe := func(name string, opts []metric.ObserveOption) {
		c, err := b.js.Consumer(ctx, stream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			// A priority nothing was sent at yet: its consumer is created
			// with its first message.
			o.ObserveInt64(b.tel.backlog, 0, opts...)
			o.ObserveInt64(b.tel.inflight, 0, opts...)
			return
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("backlog of consumer %s: %w", name, err))
			return
		}
		info := c.CachedInfo()
		o.ObserveInt64(b.tel.backlog, int64(info.NumPending), opts...)
		o.ObserveInt64(b.tel.inflight, int64(info.NumAckPending), opts...)
	}
	for i := range b.tel.levels {
		observe(b.tel.levels[i].consumers[0], b.tel.levels[i].observe)
	}
	observe(b.tel.levels[0].consumers[1], b.tel.broadcastObserve)
	return errors.Join(errs...)
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
