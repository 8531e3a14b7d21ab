package bus_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestLenientFindingsAreShown: a coordination message that breaks one of
// the protocol's rules is handled, as the protocol asks, and its finding is
// logged, counted in agentbus.protocol.findings and put on the receiver's
// span.
func TestLenientFindingsAreShown(t *testing.T) {
	s := newServer(t)
	spans := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	logs := &embeddedtest.SyncBuffer{}
	orch := newBus(t, s, "orchestrator", bus.WithTracerProvider(tp), bus.WithMeterProvider(mp),
		bus.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	r := newRecorder()
	subscribe(t, orch, r.handle)

	p := profile(t, "coordination")
	native := replaceOnce(`"in_progress"`, `"blocked"`)(t, readFile(t, filepath.Join(protoTestdata, "coordination", "status_update.json")))
	ack, err := newBus(t, s, "database-build-agent").PublishNative(testContext(t), p, native, profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	waitDelivery(t, r, ack.ID)

	if got := logs.String(); !strings.Contains(got, "protocol finding") || !strings.Contains(got, "blockedBy") {
		t.Errorf("log %q, want the finding", got)
	}
	set := attribute.NewSet(attribute.String("agentbus.agent", "orchestrator"), attribute.String("agentbus.protocol", "coordination"))
	if got := sum(collect(t, reader), "agentbus.protocol.findings", set); got != 1 {
		t.Errorf("agentbus.protocol.findings = %d, want 1", got)
	}
	waitFor(t, "the process span with the finding", func() (bool, string) {
		for _, sp := range spans.Ended() {
			for _, ev := range sp.Events() {
				if ev.Name == "protocol.finding" {
					return true, ""
				}
			}
		}
		return false, "no span with a protocol.finding event"
	})
}
