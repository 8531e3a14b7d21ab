package bus_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, embeddedtest.IgnoreServerGoroutines()...)
}

// testTimeout bounds every wait in these tests; generous for -race on a
// loaded 2-core machine.
const testTimeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newServer starts an embedded server and provisions the bus stream on it.
func newServer(t *testing.T, opts ...func(*embedded.Options)) *embedded.Server {
	t.Helper()
	s := embeddedtest.RunServer(t, opts...)
	nc := embeddedtest.Connect(t, s)
	if _, err := newAdmin(t, nc).Provision(testContext(t), bus.StreamConfig{}); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return s
}

// editStream changes the configuration of stream on s behind the bus's
// back, as an operator's "nats stream edit" would: edit changes the
// current configuration, which is then sent back.
func editStream(t *testing.T, s *embedded.Server, stream string, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(testContext(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	edit(&cfg)
	if _, err := js.UpdateStream(testContext(t), cfg); err != nil {
		t.Fatalf("edit stream %s: %v", stream, err)
	}
}

// startAgain starts a server with the options of one shut down, on its
// store, stopped when the test ends.
func startAgain(t *testing.T, opts embedded.Options) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(opts)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// newAdmin returns an operator's handle on nc, closed when the test ends.
func newAdmin(tb testing.TB, nc *nats.Conn, opts ...bus.Option) *bus.Admin {
	tb.Helper()
	a, err := bus.NewAdmin(nc, opts...)
	if err != nil {
		tb.Fatalf("bus.NewAdmin: %v", err)
	}
	tb.Cleanup(func() { a.Close() })
	return a
}

// adminOf returns an operator's handle on s, on a connection of its own.
func adminOf(t *testing.T, s *embedded.Server, opts ...bus.Option) *bus.Admin {
	t.Helper()
	return newAdmin(t, embeddedtest.Connect(t, s), opts...)
}

// newBus connects agent to s on a connection of its own.
func newBus(t *testing.T, s *embedded.Server, agent string, opts ...bus.Option) *bus.Bus {
	t.Helper()
	nc := embeddedtest.Connect(t, s)
	b, err := bus.New(nc, agent, opts...)
	if err != nil {
		t.Fatalf("bus.New(%q): %v", agent, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// dialBus is newBus over TCP with reconnects, for tests that restart the
// server or close connections.
func dialBus(t *testing.T, url, agent string, opts ...bus.Option) *bus.Bus {
	t.Helper()
	opts = append(opts, bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
	b, err := bus.Connect(url, agent, opts...)
	if err != nil {
		t.Fatalf("bus.Connect(%q): %v", agent, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func publish(t *testing.T, b *bus.Bus, m bus.Message) bus.PubAck {
	t.Helper()
	ack, err := b.Publish(testContext(t), m)
	if err != nil {
		t.Fatalf("publish %+v: %v", m, err)
	}
	return ack
}

// recorder is a handler that records what it was given.
type recorder struct {
	mu   sync.Mutex
	got  []*bus.Delivery
	more chan struct{}
}

func newRecorder() *recorder { return &recorder{more: make(chan struct{}, 1)} }

func (r *recorder) handle(_ context.Context, d *bus.Delivery) error {
	r.mu.Lock()
	r.got = append(r.got, d)
	r.mu.Unlock()
	select {
	case r.more <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) deliveries() []*bus.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*bus.Delivery(nil), r.got...)
}

func (r *recorder) types() []string {
	var out []string
	for _, d := range r.deliveries() {
		out = append(out, d.Type)
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes, then fails with
// the last state cond described.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	embeddedtest.WaitFor(t, testTimeout, what, cond)
}

// waitCount waits until r has recorded n deliveries.
func (r *recorder) waitCount(t *testing.T, n int) []*bus.Delivery {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d deliveries", n), func() (bool, string) {
		got := r.deliveries()
		return len(got) >= n, fmt.Sprintf("%d deliveries: %v", len(got), r.types())
	})
	return r.deliveries()
}

func subscribe(t *testing.T, b *bus.Bus, h bus.Handler, opts ...bus.SubscribeOption) *bus.Subscription {
	t.Helper()
	s, err := b.Subscribe(testContext(t), h, opts...)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		<-s.Done()
	})
	return s
}

func consumerInfo(t *testing.T, b *bus.Bus, name string) (*jetstream.ConsumerInfo, error) {
	js, err := jetstream.New(b.Conn())
	if err != nil {
		return nil, err
	}
	c, err := js.Consumer(testContext(t), b.Subjects().Stream(), name)
	if err != nil {
		return nil, err
	}
	return c.Info(testContext(t))
}

// indexedSubject returns the subject the bus publishes message id from
// from to to on, in the conversation correlationID names.
func indexedSubject(t *testing.T, to, from, typ string, priority int, id, correlationID string) string {
	t.Helper()
	subject, err := subjects.Default().IndexedDirect(to, from, typ, priority, id, correlationID)
	if err != nil {
		t.Fatal(err)
	}
	return subject
}

// withoutIndex returns subject, a direct or broadcast subject under the
// default root, without the message's index, if it has one.
func withoutIndex(t *testing.T, subject string) string {
	t.Helper()
	a, err := subjects.Default().Parse(subject)
	if err != nil {
		t.Fatal(err)
	}
	a.Index = subjects.Index{}
	subject, err = a.Subject(subjects.Default())
	if err != nil {
		t.Fatal(err)
	}
	return subject
}
