package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// controlHeaderCase is a message carrying a JetStream control header that
// any client may set. before is the message published just before it on
// the same subject, with Nats-Msg-Id beforeID: the value may depend on it.
// Both have type "poison"; the poison's data is "poison", before's
// "before".
type controlHeaderCase struct {
	name        string
	header      func(before *jetstream.PubAck, beforeID string) nats.Header
	mainRefuses bool // the bus's stream refuses it: it can never be poison
}

func controlHeader(k, v string) func(*jetstream.PubAck, string) nats.Header {
	return func(*jetstream.PubAck, string) nats.Header { return nats.Header{k: {v}} }
}

// controlHeaderCases are the headers nats-server 2.15 acts on when a
// message is published (server/stream.go, jetstream_api.go, msgtrace.go).
// Those the bus's stream accepts but the dead-letter stream would refuse
// made a message impossible to dead-letter: it stayed unacknowledged
// behind the ack floor for good.
var controlHeaderCases = []controlHeaderCase{
	// Poison before the fix: AGENTBUS_DLQ refused the copy.
	{name: "Nats-Expected-Stream", header: controlHeader("Nats-Expected-Stream", "AGENTBUS")},
	{name: "Nats-Expected-Last-Sequence", header: func(before *jetstream.PubAck, _ string) nats.Header {
		return nats.Header{"Nats-Expected-Last-Sequence": {strconv.FormatUint(before.Sequence, 10)}}
	}},
	{name: "Nats-Expected-Last-Subject-Sequence", header: func(before *jetstream.PubAck, _ string) nats.Header {
		return nats.Header{"Nats-Expected-Last-Subject-Sequence": {strconv.FormatUint(before.Sequence, 10)}}
	}},
	{name: "Nats-Expected-Last-Subject-Sequence-Subject", header: func(before *jetstream.PubAck, _ string) nats.Header {
		return nats.Header{
			"Nats-Expected-Last-Subject-Sequence":         {strconv.FormatUint(before.Sequence, 10)},
			"Nats-Expected-Last-Subject-Sequence-Subject": {"agentbus.agent.>"},
		}
	}},
	{name: "Nats-Expected-Last-Msg-Id", header: func(_ *jetstream.PubAck, beforeID string) nats.Header {
		return nats.Header{"Nats-Expected-Last-Msg-Id": {beforeID}}
	}},
	{name: "Nats-TTL", header: controlHeader("Nats-TTL", "1h")},
	// Accepted by both streams; still the server's, not the message's.
	{name: "Nats-Counter-Sources", header: controlHeader("Nats-Counter-Sources", "{}")},
	{name: "Nats-Batch-Sequence", header: controlHeader("Nats-Batch-Sequence", "1")},
	{name: "Nats-Batch-Commit", header: controlHeader("Nats-Batch-Commit", "1")},
	{name: "Nats-Schedule-Time-Zone", header: controlHeader("Nats-Schedule-Time-Zone", "UTC")},
	{name: "Nats-Schedule-TTL", header: controlHeader("Nats-Schedule-TTL", "5m")},
	{name: "Nats-Schedule-Rollup", header: controlHeader("Nats-Schedule-Rollup", "sub")},
	{name: "Nats-Schedule-Target", header: controlHeader("Nats-Schedule-Target", "agentbus.agent.x.p1.y.z")},
	{name: "Nats-Schedule-Source", header: controlHeader("Nats-Schedule-Source", "agentbus.agent.x.p1.y.z")},
	{name: "Nats-Marker-Reason", header: controlHeader("Nats-Marker-Reason", "MaxAge")},
	{name: "Nats-Required-Api-Level", header: controlHeader("Nats-Required-Api-Level", "99")},
	{name: "Nats-Trace-Dest", header: controlHeader("Nats-Trace-Dest", "trace.poison")},
	{name: "Nats-Trace-Only", header: controlHeader("Nats-Trace-Only", "false")},
	{name: "Nats-Trace-Hop", header: controlHeader("Nats-Trace-Hop", "1")},
	{name: "Nats-Trace-Origin-Account", header: controlHeader("Nats-Trace-Origin-Account", "ACC")},
	// A foreign client's header names may be in any case.
	{name: "lower-case nats-expected-stream", header: controlHeader("nats-expected-stream", "ELSEWHERE")},
	{name: "upper-case NATS-TTL", header: controlHeader("NATS-TTL", "1h")},
	// Refused by the bus's stream, so never delivered.
	{name: "Nats-Rollup", header: controlHeader("Nats-Rollup", "sub"), mainRefuses: true},
	{name: "Nats-Incr", header: controlHeader("Nats-Incr", "1"), mainRefuses: true},
	{name: "Nats-Batch-Id", header: controlHeader("Nats-Batch-Id", "b1"), mainRefuses: true},
	{name: "Nats-Schedule", header: controlHeader("Nats-Schedule", "@every 1m"), mainRefuses: true},
	{name: "Nats-Scheduler", header: controlHeader("Nats-Scheduler", "x"), mainRefuses: true},
	{name: "Nats-Schedule-Next", header: controlHeader("Nats-Schedule-Next", "purge"), mainRefuses: true},
	{name: "Nats-Stream-Source", header: controlHeader("Nats-Stream-Source", "X 1 > > x"), mainRefuses: true},
}

// deadLetterPath makes agent dead-letter the message with data "poison"
// that waits for it, one way, and handle every other.
type deadLetterPath struct {
	name   string
	reason bus.DeadLetterReason
	run    func(t *testing.T, s *embedded.Server, agent string)
}

var deadLetterPaths = []deadLetterPath{
	{"handler", bus.ReasonRejected, func(t *testing.T, s *embedded.Server, agent string) {
		subscribe(t, newBus(t, s, agent), func(_ context.Context, d *bus.Delivery) error {
			if string(d.Data) == "poison" {
				return bus.Permanent(errors.New("poison"))
			}
			return nil
		})
	}},
	{"max deliveries", bus.ReasonMaxDeliveries, func(t *testing.T, s *embedded.Server, agent string) {
		subscribe(t, newBus(t, s, agent), func(_ context.Context, d *bus.Delivery) error {
			if string(d.Data) == "poison" {
				return errors.New("poison")
			}
			return nil
		}, bus.WithMaxDeliver(2), bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))
	}},
	// The subscriber crashes while it handles the message's last allowed
	// delivery; the server's advisory makes WatchDeadLetters dead-letter it.
	{"unsettled", bus.ReasonUnsettled, func(t *testing.T, s *embedded.Server, agent string) {
		crashWhileHandling(t, s, agent, func(d *bus.Delivery) bool { return string(d.Data) == "poison" }, true)
	}},
}

// TestDeadLetterStripsJetStreamControlHeaders: a message carrying a header
// the server acts on (Nats-Expected-Stream, Nats-TTL, ...) is dead-lettered
// every way, handler, max deliveries and unsettled, and its original
// settled; the dead letter keeps the header as Agentbus-Dlq-Orig-<header>.
func TestDeadLetterStripsJetStreamControlHeaders(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(testContext(t), "AGENTBUS")
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.Stream(testContext(t), "AGENTBUS_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	ops := adminOf(t, s, bus.WithErrorHandler(func(err error) { t.Logf("watcher: %v", err) }))
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- ops.WatchDeadLetters(ctx) }()
	t.Cleanup(func() { cancel(); <-watched })

	// publish publishes a valid event of type poison with payload to agent
	// and returns its ID and ack.
	publish := func(t *testing.T, agent, payload string, extra nats.Header) (string, *jetstream.PubAck, error) {
		t.Helper()
		m := &codec.Message{From: "sender", To: agent, Type: "poison", Priority: 1, Data: []byte(payload)}
		m.SetDefaults(time.Now())
		h, data, err := codec.Binary{}.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		h[jetstream.MsgIDHeader] = []string{m.ID}
		for k, v := range extra {
			h[k] = v
		}
		subject := fmt.Sprintf("agentbus.agent.%s.p1.sender.poison", agent)
		ack, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: subject, Header: h, Data: data})
		return m.ID, ack, err
	}

	for i, c := range controlHeaderCases {
		t.Run(c.name, func(t *testing.T) {
			if c.mainRefuses {
				agent := fmt.Sprintf("refused%d", i)
				beforeID, before, err := publish(t, agent, "before", nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _, err = publish(t, agent, "poison", c.header(before, beforeID))
				var apiErr *jetstream.APIError
				if !errors.As(err, &apiErr) {
					t.Fatalf("the bus's stream accepted it (error %v): it can be poison, test it every way", err)
				}
				return
			}
			for j, p := range deadLetterPaths {
				t.Run(p.name, func(t *testing.T) {
					agent := fmt.Sprintf("c%dp%d", i, j)
					beforeID, before, err := publish(t, agent, "before", nil)
					if err != nil {
						t.Fatal(err)
					}
					extra := c.header(before, beforeID)
					_, ack, err := publish(t, agent, "poison", extra)
					if err != nil {
						t.Fatalf("the bus's stream refused it: %v", err)
					}
					stored, err := stream.GetMsg(testContext(t), ack.Sequence)
					if err != nil {
						t.Fatal(err)
					}
					p.run(t, s, agent)

					var dl *jetstream.RawStreamMsg
					waitFor(t, "the dead letter", func() (bool, string) {
						dl, err = dlq.GetLastMsgForSubject(testContext(t), "agentbus.dlq."+agent+".sender.poison")
						return err == nil, fmt.Sprint(err)
					})
					if r := dl.Header.Get(bus.HeaderDeadLetterReason); r != string(p.reason) {
						t.Errorf("reason %q, want %q", r, p.reason)
					}
					for k := range extra {
						for dk := range dl.Header {
							if strings.EqualFold(dk, k) {
								t.Errorf("dead letter carries %s: %q", dk, dl.Header[dk])
							}
						}
						for sk, want := range stored.Header {
							if !strings.EqualFold(sk, k) {
								continue
							}
							if got := dl.Header[bus.HeaderDeadLetterOrigPrefix+sk]; fmt.Sprint(got) != fmt.Sprint(want) {
								t.Errorf("dead letter's %s%s = %q, want the original's %q", bus.HeaderDeadLetterOrigPrefix, sk, got, want)
							}
						}
					}

					if p.reason == bus.ReasonUnsettled {
						waitFor(t, "the original removed", func() (bool, string) {
							_, err := stream.GetMsg(testContext(t), ack.Sequence)
							return errors.Is(err, jetstream.ErrMsgNotFound), fmt.Sprint(err)
						})
						return
					}
					waitFor(t, "the original acknowledged", func() (bool, string) {
						c, err := js.Consumer(testContext(t), "AGENTBUS", agent+"_p1")
						if err != nil {
							return false, err.Error()
						}
						info, err := c.Info(testContext(t))
						if err != nil {
							return false, err.Error()
						}
						return info.NumAckPending == 0 && info.NumPending == 0 && info.AckFloor.Stream == ack.Sequence,
							fmt.Sprintf("ack floor %d (want %d), %d ack pending, %d pending",
								info.AckFloor.Stream, ack.Sequence, info.NumAckPending, info.NumPending)
					})
				})
			}
		})
	}
}
