package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// telemetryShutdownTimeout bounds flushing spans and metrics on exit.
const telemetryShutdownTimeout = 5 * time.Second

// telemetry is the OpenTelemetry set-up of one run of the command line: the
// providers it made global, and how to undo that.
type telemetry struct {
	shutdown []func(context.Context) error
	restore  func()
}

// setupTelemetry installs global tracer and meter providers when the
// environment or --trace-stderr asks for them, and nothing otherwise:
//
//   - spans go over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, and OTEL_TRACES_EXPORTER is
//     not "none";
//   - metrics go over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, and OTEL_METRICS_EXPORTER
//     is not "none";
//   - with traceStderr, spans are also printed to stderr, one JSON object a
//     line, as each ends.
//
// OTEL_SDK_DISABLED=true turns all of it off. The exporters read the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression, ...) and
// the SDK reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER and OTEL_METRIC_EXPORT_INTERVAL themselves.
func (a *app) setupTelemetry(ctx context.Context, traceStderr bool) (*telemetry, error) {
	t := &telemetry{restore: func() {}}
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return t, nil
	}
	otlpTraces := envSet("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") && os.Getenv("OTEL_TRACES_EXPORTER") != "none"
	otlpMetrics := envSet("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") && os.Getenv("OTEL_METRICS_EXPORTER") != "none"
	if !otlpTraces && !otlpMetrics && !traceStderr {
		return t, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("agentbus")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	prevTP, prevMP := otel.GetTracerProvider(), otel.GetMeterProvider()
	var restore []func()
	if otlpTraces || traceStderr {
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		if otlpTraces {
			exp, err := otlptracehttp.New(ctx)
			if err != nil {
				return nil, t.fail(fmt.Errorf("OTLP trace exporter: %w", err))
			}
			opts = append(opts, sdktrace.WithBatcher(exp))
		}
		if traceStderr {
			exp, err := stdouttrace.New(stdouttrace.WithWriter(a.stderr))
			if err != nil {
				return nil, t.fail(fmt.Errorf("stderr trace exporter: %w", err))
			}
			opts = append(opts, sdktrace.WithSyncer(exp))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		t.shutdown = append(t.shutdown, tp.Shutdown)
		otel.SetTracerProvider(tp)
		restore = append(restore, func() { otel.SetTracerProvider(prevTP) })
	}
	if otlpMetrics {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, t.fail(fmt.Errorf("OTLP metric exporter: %w", err))
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
		t.shutdown = append(t.shutdown, mp.Shutdown)
		otel.SetMeterProvider(mp)
		restore = append(restore, func() { otel.SetMeterProvider(prevMP) })
	}
	// Export failures are warnings on stderr, never the command's error.
	warn := func(err error) { a.warnf("telemetry: %v", err) }
	telemetryWarn.Store(&warn)
	installErrorHandler.Do(func() {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			if f := telemetryWarn.Load(); f != nil {
				(*f)(err)
			}
		}))
	})
	restore = append(restore, func() { telemetryWarn.Store(nil) })
	t.restore = func() {
		for _, f := range restore {
			f()
		}
	}
	return t, nil
}

// fail shuts down what was set up before err and returns err.
func (t *telemetry) fail(err error) error {
	t.close(context.Background())
	return err
}

// close flushes and stops the exporters and gives the globals back.
func (t *telemetry) close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetryShutdownTimeout)
	defer cancel()
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	t.shutdown = nil
	t.restore()
	t.restore = func() {}
	return errors.Join(errs...)
}

// OpenTelemetry delegates its default global error handler to the first
// one set, for good; so one handler is installed per process, and it
// forwards to the warnings of the run under way, if any.
var (
	installErrorHandler sync.Once
	telemetryWarn       atomic.Pointer[func(error)]
)

// envSet reports whether any of the environment variables is non-empty.
func envSet(names ...string) bool {
	for _, n := range names {
		if os.Getenv(n) != "" {
			return true
		}
	}
	return false
}
