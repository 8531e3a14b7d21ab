package bus_test

// Benchmarks of the cost of tracing and metrics on publish and consume, on
// the embedded server of newBenchEnv. Run:
//
//	go test -run '^$' -bench 'Traced' -benchtime 20000x ./bus
//
// Each has four sub-benchmarks:
//
//	off        no-op tracer and meter providers (what a bus records with
//	           no OpenTelemetry SDK installed)
//	sampled    SDK tracer, AlwaysSample, spans kept by an in-memory exporter
//	unsampled  SDK tracer, NeverSample: trace context is still propagated
//	metrics    no-op tracer, SDK meter with a manual reader
//
// docs/observability.md records the figures.

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/agentbus/agentbus/bus"
)

// telemetryMode is one configuration of the providers.
type telemetryMode struct {
	name    string
	options func(b *testing.B) []bus.Option
}

var telemetryModes = []telemetryMode{
	{"off", func(*testing.B) []bus.Option {
		return []bus.Option{bus.WithTracerProvider(tracenoop.NewTracerProvider()), bus.WithMeterProvider(metricnoop.NewMeterProvider())}
	}},
	{"sampled", func(b *testing.B) []bus.Option {
		return []bus.Option{bus.WithTracerProvider(sdkTracer(b, sdktrace.AlwaysSample())), bus.WithMeterProvider(metricnoop.NewMeterProvider())}
	}},
	{"unsampled", func(b *testing.B) []bus.Option {
		return []bus.Option{bus.WithTracerProvider(sdkTracer(b, sdktrace.NeverSample())), bus.WithMeterProvider(metricnoop.NewMeterProvider())}
	}},
	{"metrics", func(b *testing.B) []bus.Option {
		return []bus.Option{bus.WithTracerProvider(tracenoop.NewTracerProvider()), bus.WithMeterProvider(sdkMeter(b))}
	}},
}

func sdkTracer(b *testing.B, s sdktrace.Sampler) trace.TracerProvider {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithBatcher(exp))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

func sdkMeter(b *testing.B) metric.MeterProvider {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { mp.Shutdown(context.Background()) })
	return mp
}

func BenchmarkTracedPublishSync(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	for _, mode := range telemetryModes {
		b.Run(mode.name, func(b *testing.B) {
			pb, err := bus.New(env.connect(b), "bench-sender", mode.options(b)...)
			if err != nil {
				b.Fatal(err)
			}
			defer pb.Close()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pb.Publish(ctx, bus.Message{To: "bench-receiver", Type: "BENCH", Data: payload}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkTracedPublishAsync(b *testing.B) {
	env := newBenchEnv(b)
	for _, mode := range telemetryModes {
		b.Run(mode.name, func(b *testing.B) {
			pb, err := bus.New(env.connect(b), "bench-sender", mode.options(b)...)
			if err != nil {
				b.Fatal(err)
			}
			defer pb.Close()
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := pb.PublishAsync(context.Background(), bus.Message{To: "bench-receiver", Type: "BENCH", Data: payload}); err != nil {
					b.Fatal(err)
				}
			}
			<-pb.PublishAsyncComplete()
		})
	}
}

// BenchmarkTracedConsume is BenchmarkConsume/bus under each mode: the
// subscriber's providers are the mode's, the backlog is published untraced.
func BenchmarkTracedConsume(b *testing.B) {
	env := newBenchEnv(b)
	for _, mode := range telemetryModes {
		b.Run(mode.name, func(b *testing.B) {
			benchConsumeBus(b, env, nil, env.name("consumer-"+mode.name), []bus.SubscribeOption{bus.WithPrefetch(500)}, mode.options(b)...)
		})
	}
}
