package bus_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestHostileRawPublishers: a raw NATS client publishes broken events
// straight onto an agent's subject. None reaches the handler, none panics
// the process, each ends in the dead-letter stream as malformed with an
// error that names what is wrong, and valid messages keep flowing.
func TestHostileRawPublishers(t *testing.T) {
	s := newServer(t)
	valid := func() nats.Header {
		return nats.Header{
			"ce-specversion": {"1.0"}, "ce-id": {"x-1"}, "ce-source": {"/agents/raw"},
			"ce-type": {"T"}, "ce-to": {"victim"},
		}
	}
	with := func(k, v string) nats.Header {
		h := valid()
		if v == "" {
			delete(h, k)
		} else {
			h[k] = []string{v}
		}
		return h
	}
	cases := []struct {
		name   string
		header nats.Header
		data   string
		want   string // in the dead letter's error
	}{
		{"no headers at all", nil, "just bytes", "not a CloudEvent"},
		{"unknown specversion", with("ce-specversion", "0.3"), "", "specversion"},
		{"missing id", with("ce-id", ""), "", "id"},
		{"missing source", with("ce-source", ""), "", "source"},
		{"missing type", with("ce-type", ""), "", "type"},
		{"invalid UTF-8 in source", with("ce-source", "/agents/%C0%A0"), "", "source"},
		{"priority out of range", with("ce-priority", "9"), "", "priority"},
		{"control character in type", with("ce-type", "a%0Db"), "", "type"},
		{"bad time", with("ce-time", "yesterday"), "", "time"},
		{"structured, not JSON", nats.Header{"Content-Type": {"application/cloudevents+json"}}, "{not json", "malformed"},
		{"structured, wrong specversion", nats.Header{"Content-Type": {"application/cloudevents+json"}},
			`{"specversion":"2.0","id":"1","source":"/x","type":"T"}`, "specversion"},
	}
	raw := embeddedtest.Connect(t, s)
	for i, c := range cases {
		m := &nats.Msg{Subject: fmt.Sprintf("agentbus.agent.victim.p1.raw.case%d", i), Header: c.header, Data: []byte(c.data)}
		if err := raw.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	publish(t, newBus(t, s, "sender"), bus.Message{To: "victim", Type: "good", Priority: 1})

	var malformed atomic.Int32
	victim := newBus(t, s, "victim", bus.WithErrorHandler(func(err error) {
		if errors.Is(err, codec.ErrMalformed) {
			malformed.Add(1)
		}
	}))
	r := newRecorder()
	subscribe(t, victim, r.handle)
	r.waitCount(t, 1)
	if got := r.types(); len(got) != 1 || got[0] != "good" {
		t.Fatalf("handled %v, want only the good message", got)
	}
	dls := waitDeadLetters(t, victim, len(cases))
	bySubject := map[string]string{}
	for _, dl := range dls {
		if dl.Header.Get(bus.HeaderDeadLetterReason) != string(bus.ReasonMalformed) {
			t.Errorf("dead letter on %s: reason %q", dl.Subject, dl.Header.Get(bus.HeaderDeadLetterReason))
		}
		bySubject[dl.Header.Get(bus.HeaderDeadLetterSubject)] = dl.Header.Get(bus.HeaderDeadLetterError)
	}
	for i, c := range cases {
		e, ok := bySubject[fmt.Sprintf("agentbus.agent.victim.p1.raw.case%d", i)]
		if !ok {
			t.Errorf("%s: no dead letter", c.name)
			continue
		}
		if !strings.Contains(e, c.want) {
			t.Errorf("%s: dead-letter error %q does not mention %q", c.name, e, c.want)
		}
	}
	if n := int(malformed.Load()); n != len(cases) {
		t.Errorf("%d malformed messages reported to the error handler, want %d", n, len(cases))
	}
}
