package bus

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// TestDestinationTemplates: each template is its subjects with {to},
// {from} and {type} for the tokens, and destinationOf finds it from them.
func TestDestinationTemplates(t *testing.T) {
	for _, root := range []string{"agentbus", "prod.bus-1"} {
		s, err := subjects.New(root)
		if err != nil {
			t.Fatal(err)
		}
		o := defaultOptions()
		o.scheme = s
		tel, err := newTelemetry(&o, "me")
		if err != nil {
			t.Fatal(err)
		}
		for p := subjects.HighestPriority; p <= subjects.LowestPriority; p++ {
			direct, _ := s.Direct("to-agent", "from-agent", "the.type", p)
			broadcast, _ := s.Broadcast("from-agent", "the.type", p)
			for _, c := range []struct {
				subject string
				kind    subjects.Kind
			}{{direct, subjects.KindDirect}, {broadcast, subjects.KindBroadcast}} {
				tmpl := s.Template(c.kind, p)
				r := strings.NewReplacer("{to}", subjects.EncodeToken("to-agent"), "{from}", subjects.EncodeToken("from-agent"), "{type}", subjects.EncodeToken("the.type"))
				if got := r.Replace(tmpl); got != c.subject {
					t.Errorf("template %q filled is %q, want %q", tmpl, got, c.subject)
				}
				d := tel.destinationOf(c.subject)
				if d == nil || d.template != tmpl || d.priority != p {
					t.Errorf("destinationOf(%q) = %+v, want template %q", c.subject, d, tmpl)
				}
			}
		}
		for _, bad := range []string{"", root, root + ".agent", root + ".agent.x", root + ".agent.x.p9.a.b", root + ".all.q1.a.b", root + ".dlq.a.b.c", "other.agent.x.p1.a.b"} {
			if d := tel.destinationOf(bad); d != nil {
				t.Errorf("destinationOf(%q) = %q, want nil", bad, d.template)
			}
		}
	}
}

// TestIncomingCarrier: the distributed tracing extension wins over the
// plain W3C headers; those are read in any case when the event has none;
// an undecodable message's ce- headers are read in any case.
func TestIncomingCarrier(t *testing.T) {
	h := nats.Header{"Traceparent": {"plain"}, "CE-TraceParent": {"ce"}, "ce-id": {"x"}}
	for _, c := range []struct {
		name string
		ext  map[string]string
		want string
	}{
		{"decoded with the extension", map[string]string{"traceparent": "ext"}, "ext"},
		{"decoded without it", map[string]string{}, "plain"},
		{"undecodable", nil, "ce"},
	} {
		carrier := incomingCarrier{h: h, ext: c.ext, plain: codec.ReadTraceHeaders(h)}
		if got := carrier.Get("traceparent"); got != c.want {
			t.Errorf("%s: Get(traceparent) = %q, want %q", c.name, got, c.want)
		}
		if got := carrier.Get("tracestate"); got != "" {
			t.Errorf("%s: Get(tracestate) = %q, want empty", c.name, got)
		}
	}
	upper := nats.Header{"TRACEPARENT": {"p"}}
	if got := (incomingCarrier{h: upper, plain: codec.ReadTraceHeaders(upper)}).Get("traceparent"); got != "p" {
		t.Errorf("Get(traceparent) of TRACEPARENT = %q, want p", got)
	}
}

// TestUntraced: the no-op providers make no spans, an SDK provider does,
// and the global provider makes none until a program sets one, which the
// test checks in a child process so as to leave this one's global alone.
func TestUntraced(t *testing.T) {
	if !newUntraced(noop.NewTracerProvider())() || !newUntraced(&noop.TracerProvider{})() {
		t.Error("a no-op provider is taken to trace")
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	if newUntraced(tp)() {
		t.Error("an SDK provider is taken to make no spans")
	}
	if os.Getenv("AGENTBUS_TEST_SET_GLOBAL_TRACER") != "" {
		untraced := newUntraced(otel.GetTracerProvider())
		if !untraced() {
			t.Fatal("the global provider before it is set is taken to trace")
		}
		otel.SetTracerProvider(tp)
		if untraced() {
			t.Fatal("the global provider still taken to make no spans after otel.SetTracerProvider")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUntraced$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AGENTBUS_TEST_SET_GLOBAL_TRACER=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
