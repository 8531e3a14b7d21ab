package bus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// pathBuses are the buses BenchmarkHandlerPath and BenchmarkPublishPath
// measure: with its defaults, and without lifecycle tracking.
var pathBuses = []struct {
	name string
	opts []Option
}{
	{"defaults", nil},
	{"untracked", []Option{WithoutLifecycle()}},
}

// BenchmarkHandlerPath measures the bus's work on one delivered message
// between the dispatcher and the user's handler and back, without the
// server: decoding it, its checks, its telemetry with tracing off, its
// cancelable context and Delivery, and a handler that returns nil. The
// settlement (an ack, one publish) is left out. BenchmarkConsume's
// "dispatcher" and "bus-untracked" rows show the same work in a running
// subscription; this one isolates it for profiles and before/after
// comparisons. Decoding alone is BenchmarkBinaryDecode in package codec.
func BenchmarkHandlerPath(b *testing.B) {
	s := provisionedServer(b)
	// Sent as a bus with its defaults sends it, on an indexed subject.
	sender := benchBus(b, s, "bench-sender")
	cm := deliveredMsg(b, sender, &Message{To: "bench-receiver", Type: "BENCH", Data: make([]byte, 1024)})
	for _, bm := range pathBuses {
		b.Run(bm.name, func(b *testing.B) {
			bb := benchBus(b, s, "bench-receiver", bm.opts...)
			b.ReportAllocs()
			for b.Loop() {
				if err := handlerPath(bb, cm); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// handlerPath is deliver's work on cm up to the settlement, with a handler
// that returns nil: the decode into a Message on the stack, the telemetry
// with tracing off, and handle.
func handlerPath(bb *Bus, cm *consumers.Msg) error {
	ctx := context.Background()
	var m Message
	th, derr := codec.DecodeWithTraceHeadersInto(&m, cm.Header, cm.Data)
	hctx, op := bb.tel.startProcess(ctx, cm, &m, th)
	err := bb.handle(hctx, func(context.Context, *Delivery) error { return nil }, cm, &m, derr, consumers.DefaultMaxDeliver)
	op.end(bb.tel, hctx, err)
	op.span.End()
	return err
}

// TestHandlerPathAllocates: the handler path allocates once per message,
// the handler's Delivery; the decoded Message stays on the stack, unless
// something it is passed to keeps a pointer to it.
func TestHandlerPathAllocates(t *testing.T) {
	s := provisionedServer(t)
	cm := deliveredMsg(t, benchBus(t, s, "bench-sender"), &Message{To: "bench-receiver", Type: "BENCH", Data: make([]byte, 1024)})
	for _, bm := range pathBuses {
		bb := benchBus(t, s, "bench-receiver", bm.opts...)
		var err error
		if n := testing.AllocsPerRun(100, func() { err = handlerPath(bb, cm) }); n != 1 || err != nil {
			t.Errorf("%s: %v allocations per message, error %v; want 1", bm.name, n, err)
		}
	}
}

// deliveredMsg returns m, sent by bb, as the dispatcher hands it to the
// recipient after its first delivery.
func deliveredMsg(b testing.TB, bb *Bus, m *Message) *consumers.Msg {
	b.Helper()
	m.From = bb.agent
	m.SetDefaults(time.Now())
	msg, err := bb.encode(m)
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := msg.Header[jetstream.MsgIDHeader]; !ok {
		b.Fatal("no message ID header")
	}
	return &consumers.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data, Metadata: consumers.Metadata{
		Stream: bb.opts.scheme.Stream(), Consumer: "bench-receiver_p3", Deliveries: 1, StreamSeq: 1, ConsumerSeq: 1,
		Timestamp: time.Now(),
	}}
}

// BenchmarkPublishPath measures the bus's work on one message before the
// wire, the counterpart of BenchmarkHandlerPath: filling its defaults (ID,
// time, conversation), its telemetry with tracing off, validating and
// encoding it, and its subject: indexed for a bus with its defaults
// ("defaults"), plain without lifecycle tracking ("untracked").
// BenchmarkPublishAsync and BenchmarkPublishSync show the same work with
// the server's; this one isolates it for profiles and before/after
// comparisons.
func BenchmarkPublishPath(b *testing.B) {
	s := provisionedServer(b)
	for _, bm := range pathBuses {
		b.Run(bm.name, func(b *testing.B) {
			bb := benchBus(b, s, "bench-sender", bm.opts...)
			data, ctx := make([]byte, 1024), context.Background()
			b.ReportAllocs()
			for b.Loop() {
				m := Message{To: "bench-receiver", Type: "BENCH", Data: data}
				if _, op, err := bb.prepare(ctx, &m); err != nil {
					b.Fatal(err)
				} else {
					op.end(bb.tel, ctx, nil, false)
				}
			}
		})
	}
}

// BenchmarkTelemetry measures the telemetry of one message with tracing and
// metrics off, a bus's defaults: a send's (startSend, end) and a
// handling's (startProcess, end), the parts of BenchmarkPublishPath and
// BenchmarkHandlerPath that are the same whatever the message.
func BenchmarkTelemetry(b *testing.B) {
	s := provisionedServer(b)
	sender := benchBus(b, s, "bench-sender")
	cm := deliveredMsg(b, sender, &Message{To: "bench-receiver", Type: "BENCH", Data: make([]byte, 1024)})
	receiver := benchBus(b, s, "bench-receiver")
	m, th, err := codec.DecodeWithTraceHeaders(cm.Header, cm.Data)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("send", func(b *testing.B) {
		msg := Message{From: "bench-sender", To: "bench-receiver", Type: "BENCH"}
		msg.SetDefaults(time.Now())
		for b.Loop() {
			op := sender.tel.startSend(ctx, &msg, msg.Time)
			op.end(sender.tel, ctx, nil, false)
		}
	})
	b.Run("process", func(b *testing.B) {
		for b.Loop() {
			hctx, op := receiver.tel.startProcess(ctx, cm, m, th)
			op.end(receiver.tel, hctx, nil)
			op.span.End()
		}
	})
}

// unprovisioned returns a connection to a server of its own with nothing
// provisioned on it, and the connection's JetStream.
func unprovisioned(tb testing.TB) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc := embeddedtest.Connect(tb, embeddedtest.RunServer(tb))
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

// provisionedServer starts an embedded server with the bus's streams and
// buckets provisioned under the default root.
func provisionedServer(b testing.TB) *embedded.Server {
	b.Helper()
	s := embeddedtest.RunServer(b)
	a, err := NewAdmin(embeddedtest.Connect(b, s))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := a.Provision(context.Background(), StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	return s
}

// benchBus returns a bus of agent on s, closed when b ends.
func benchBus(b testing.TB, s *embedded.Server, agent string, opts ...Option) *Bus {
	b.Helper()
	bb, err := New(embeddedtest.Connect(b, s), agent, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.Close() })
	return bb
}
