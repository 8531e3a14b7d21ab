package bus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/agentbus/agentbus/bus"
)

func processErrorType(t *testing.T, at *agentTelemetry, typ string) string {
	t.Helper()
	var et string
	waitFor(t, "the process span of "+typ, func() (bool, string) {
		for _, sp := range at.spans.Ended() {
			if sp.SpanKind().String() != "consumer" {
				continue
			}
			a := attrs(sp)
			if a[attribute.Key("cloudevents.event_type")].AsString() == typ {
				et = a[attribute.Key("error.type")].AsString()
				return true, ""
			}
		}
		return false, describeSpans(at.spans.Ended())
	})
	return et
}

// TestErrorTypeOfACanceledHandling: a message its sender cancels while its
// handler runs is canceled (docs/observability.md: error.type `canceled`),
// whatever the handler returns. Before, a handler that returned nil or an
// error of its own got `rejected` (found by a helper session).
func TestErrorTypeOfACanceledHandling(t *testing.T) {
	for _, ret := range []struct {
		name string
		err  func(ctx context.Context) error
	}{
		{"nil", func(context.Context) error { return nil }},
		{"own error", func(context.Context) error { return errors.New("stopped half way") }},
		{"ctx.Err", func(ctx context.Context) error { return ctx.Err() }},
	} {
		t.Run(ret.name, func(t *testing.T) {
			s := newServer(t)
			orch := newBus(t, s, "orchestrator")
			worker, wt := newTracedBus(t, s, "worker")
			started := make(chan struct{})
			subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
				close(started)
				<-ctx.Done()
				return ret.err(ctx)
			})
			ack := publish(t, orch, bus.Message{To: "worker", Type: "LONG"})
			<-started
			if _, err := orch.Cancel(testContext(t), ack.ID); err != nil {
				t.Fatal(err)
			}
			if et := processErrorType(t, wt, "LONG"); et != "canceled" {
				t.Errorf("error.type %q, want canceled", et)
			}
		})
	}
}

// TestErrorTypeOfAHandlersPermanentError: a handler's Permanent error is
// a rejection whatever it wraps, on its span as in its dead letter (see
// busTerm in deliver.go). Before, error.type read the wrapped sentinel
// (`expired` for a handler whose own sub-request expired, `panic` for one
// that reports a panic it recovered) while the settlement event said
// rejected (found by a helper session).
func TestErrorTypeOfAHandlersPermanentError(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	worker, wt := newTracedBus(t, s, "worker")
	subscribe(t, worker, func(_ context.Context, d *bus.Delivery) error {
		switch d.Type {
		case "E":
			return bus.Permanent(fmt.Errorf("my sub-task: %w", bus.ErrExpired))
		case "P":
			return bus.Permanent(fmt.Errorf("plugin: %w", bus.ErrHandlerPanic))
		}
		return nil
	})
	publish(t, sender, bus.Message{To: "worker", Type: "E"})
	publish(t, sender, bus.Message{To: "worker", Type: "P"})
	for _, typ := range []string{"E", "P"} {
		if et := processErrorType(t, wt, typ); et != "rejected" {
			t.Errorf("%s: error.type %q, want rejected (the message is dead-lettered as rejected)", typ, et)
		}
	}
}

// TestErrorTypeCanceledWhileQueued: a message canceled while queued is
// never handed to its handler, and its process span says canceled (it
// said rejected).
func TestErrorTypeCanceledWhileQueued(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker, wt := newTracedBus(t, s, "worker")
	ack := publish(t, orch, bus.Message{To: "worker", Type: "QUEUED"})
	if _, err := orch.Cancel(testContext(t), ack.ID); err != nil {
		t.Fatal(err)
	}
	subscribe(t, worker, func(_ context.Context, d *bus.Delivery) error {
		t.Errorf("canceled %s handled", d.ID)
		return nil
	})
	if et := processErrorType(t, wt, "QUEUED"); et != "canceled" {
		t.Errorf("error.type %q, want canceled", et)
	}
}

// TestUnsettledDeadLetterAttributes: docs/observability.md lists the
// attributes of agentbus.dead_letters as agentbus.agent, agentbus.priority
// and agentbus.dead_letter.reason, `unsettled` included ("from the
// dead-letter watcher, which counts under the agent whose delivery it
// was"), as the subscriber's count has them. Before, the watcher's had no
// agentbus.priority and an extra messaging.system (found by a helper
// session).
func TestUnsettledDeadLetterAttributes(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	ops := adminOf(t, s, bus.WithMeterProvider(mp))
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- ops.WatchDeadLetters(ctx) }()
	t.Cleanup(func() { cancel(); <-watched })

	crashOnLastDelivery(t, s, sender, true) // to "agent", priority 3
	waitDeadLetters(t, ops, 1)

	want := attribute.NewSet(attribute.String("agentbus.agent", "agent"), attribute.Int("agentbus.priority", 3),
		attribute.String("agentbus.dead_letter.reason", "unsettled"))
	var points string
	waitFor(t, "the unsettled dead letter counted", func() (bool, string) {
		rm := collect(t, reader)
		points = ""
		if m, ok := find(rm, "agentbus.dead_letters"); ok {
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				points += fmt.Sprintf("%v=%d ", p.Attributes.ToSlice(), p.Value)
			}
		}
		return points != "", points
	})
	if got := sum(collect(t, reader), "agentbus.dead_letters", want); got != 1 {
		t.Errorf("agentbus.dead_letters{agent, priority 3, unsettled} = %d, want 1; points: %s", got, points)
	}
}
