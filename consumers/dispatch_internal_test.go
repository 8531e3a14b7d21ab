package consumers

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// BenchmarkDispatchPath measures the dispatcher's own work for one message,
// run on one goroutine so that no hand-off or scheduling is timed: the
// lane's subscription taking the message in (onMessage), the worker's pick,
// the handler's call and its ack, and the message leaving the running set.
// The connection and server are real; the messages are made here, with the
// reply subjects JetStream gives its deliveries, and their acks go to a
// consumer that does not exist, which the server ignores.
func BenchmarkDispatchPath(b *testing.B) {
	nc := embeddedtest.Connect(b, embeddedtest.RunServer(b))
	opts := Options{Prefetch: 500}
	if err := opts.setDefaults(5); err != nil {
		b.Fatal(err)
	}
	d := newDispatcher(nc, "AGENTBUS", 5, func(_ context.Context, m *Msg) { m.Ack() }, opts)
	defer d.stopAll()
	defer d.stopPull()
	l, err := d.newLane(Lane{Consumer: "c", Level: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer l.sub.Unsubscribe()
	d.addLaneLocked(l)
	msgs := make([]*nats.Msg, 1024)
	ts := time.Now().UnixNano()
	for i := range msgs {
		seq := strconv.Itoa(i + 1)
		msgs[i] = &nats.Msg{
			Subject: "agentbus.agent.receiver.p3.sender.BENCH",
			Reply:   "$JS.ACK.AGENTBUS.c.1." + seq + "." + seq + "." + strconv.FormatInt(ts, 10) + ".0",
			Header:  nats.Header{"Nats-Msg-Id": []string{seq}},
			Data:    make([]byte, 1024),
		}
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		d.onMessage(l, msgs[n%len(msgs)])
		d.mu.Lock()
		h := d.pickLocked()
		d.mu.Unlock()
		d.handle(h, n)
		d.mu.Lock()
		d.finishedLocked(h)
		d.mu.Unlock()
		n++
	}
}
