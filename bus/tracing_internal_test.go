package bus

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

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
				tmpl := destinationTemplate(s, c.kind, p)
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

func TestHeaderCarrier(t *testing.T) {
	h := nats.Header{"Traceparent": {"a"}, "ce-id": {"x"}}
	c := headerCarrier(h)
	if got := c.Get("traceparent"); got != "a" {
		t.Errorf("Get(traceparent) = %q, want a", got)
	}
	c.Set("traceparent", "b")
	if _, ok := h["Traceparent"]; ok {
		t.Error("Set kept the differently cased key")
	}
	if got := h["traceparent"]; len(got) != 1 || got[0] != "b" {
		t.Errorf("traceparent = %v, want [b]", got)
	}
	if got := c.Get("TRACEPARENT"); got != "b" {
		t.Errorf("Get(TRACEPARENT) = %q, want b", got)
	}
	if got := c.Get("tracestate"); got != "" {
		t.Errorf("Get(tracestate) = %q, want empty", got)
	}
	if n := len(c.Keys()); n != 2 {
		t.Errorf("Keys() has %d keys, want 2", n)
	}
}
