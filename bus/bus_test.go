package bus_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestClosedBus: Close stops the subscriptions and may be called again;
// every call after it fails with ErrClosed, on a Bus and on an Admin, the
// lookups included though the connection, which New does not own, is
// still open.
func TestClosedBus(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "agent")
	sub := subscribe(t, b, newRecorder().handle)
	sent := publish(t, b, bus.Message{To: "other", Type: "TASK"})
	a := newAdmin(t, embeddedtest.Connect(t, s))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Done():
	default:
		t.Error("subscription still running after Close")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if _, err := b.Publish(testContext(t), bus.Message{To: "x", Type: "T"}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	closed := func(t *testing.T, err error) {
		if !errors.Is(err, bus.ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
	}
	eachCall(t, busCalls(b, sent.ID), testTimeout, closed)
	eachCall(t, adminCalls(a, sent.ID), testTimeout, closed)
	if err := a.WatchDeadLetters(testContext(t)); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Admin.WatchDeadLetters after Close: %v, want ErrClosed", err)
	}
	if _, err := a.Provision(testContext(t), bus.StreamConfig{}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Admin.Provision after Close: %v, want ErrClosed", err)
	}
}

// TestCloseEndsWaits: Close ends a Request, an Attach and a Gather waiting
// for replies with ErrClosed, at once, where they waited until their
// contexts ended: Close stops the listener their replies would come by.
func TestCloseEndsWaits(t *testing.T) {
	s := newServer(t)
	// Each call's wait closes waiting once it waits for replies, from
	// workers w1 and w2, which hold what they receive in held and report
	// progress on it until the test ends, never replying.
	type call func(ctx context.Context, b *bus.Bus, held <-chan *bus.Delivery, waiting chan struct{}) error
	for _, c := range []struct {
		name string
		wait call
	}{
		{"Request", func(ctx context.Context, b *bus.Bus, held <-chan *bus.Delivery, waiting chan struct{}) error {
			go func() { <-held; close(waiting) }()
			_, err := b.Request(ctx, bus.Message{To: "w1", Type: "TASK"})
			return err
		}},
		{"Gather", func(ctx context.Context, b *bus.Bus, held <-chan *bus.Delivery, waiting chan struct{}) error {
			go func() { <-held; <-held; close(waiting) }()
			res, err := b.Gather(ctx, bus.Message{Type: "TASK"}, []string{"w1", "w2"})
			if res == nil || len(res.Requests) != 2 {
				return fmt.Errorf("result %+v, want the two requests", res)
			}
			return err
		}},
		{"Attach", func(ctx context.Context, b *bus.Bus, held <-chan *bus.Delivery, waiting chan struct{}) error {
			// Another process of the lead sends the request.
			go newBus(t, s, "lead").Request(ctx, bus.Message{To: "w1", Type: "TASK"}) //nolint:errcheck
			d := <-held
			var once sync.Once
			_, err := b.Attach(ctx, d.ID, bus.OnProgress(func(*bus.Delivery) { once.Do(func() { close(waiting) }) }))
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			held := make(chan *bus.Delivery, 2)
			for _, w := range []string{"w1", "w2"} {
				subscribe(t, newBus(t, s, w), func(ctx context.Context, d *bus.Delivery) error {
					held <- d
					for {
						if err := d.Progress(ctx, bus.Progress{Message: "working"}); err != nil {
							return err
						}
						select {
						case <-ctx.Done():
							return ctx.Err()
						case <-time.After(20 * time.Millisecond):
						}
					}
				})
			}
			b := newBus(t, s, "lead")
			waiting := make(chan struct{})
			returned := make(chan error, 1)
			go func() { returned <- c.wait(ctx, b, held, waiting) }()
			select {
			case <-waiting:
			case err := <-returned:
				t.Fatalf("returned before Close: %v", err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-returned; !errors.Is(err, bus.ErrClosed) || ctx.Err() != nil {
				t.Errorf("after Close: %v (its context: %v), want ErrClosed before the context ends", err, ctx.Err())
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	tests := []struct {
		name    string
		agent   string
		opts    []bus.Option
		wantErr error
	}{
		{"empty agent", "", nil, bus.ErrInvalidAgentID},
		{"broadcast agent", "*", nil, bus.ErrInvalidAgentID},
		{"the operator's name", "agentbus", nil, bus.ErrInvalidAgentID}, // it would speak for the operator
		{"bad root", "a", []bus.Option{bus.WithRoot("a b")}, bus.ErrInvalidOption},
		{"nil codec", "a", []bus.Option{bus.WithCodec(nil)}, bus.ErrInvalidOption},
		{"zero async pending", "a", []bus.Option{bus.WithMaxAsyncPending(0)}, bus.ErrInvalidOption},
		{"provision root mismatch", "a", []bus.Option{bus.WithRoot("one"), bus.WithProvision(bus.StreamConfig{Root: "two"})}, bus.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := bus.New(nc, tt.agent, tt.opts...); !errors.Is(err, tt.wantErr) {
				t.Errorf("New error = %v, want %v", err, tt.wantErr)
			}
		})
	}
	b := newBus(t, s, "a")
	for _, opt := range []bus.SubscribeOption{bus.WithConcurrency(0), bus.WithPrefetch(-1), bus.WithAckWait(time.Millisecond),
		bus.WithMaxDeliver(0), bus.WithMaxDeliver(math.MaxInt/2 + 1), bus.WithMaxAckPending(math.MaxInt/6 + 1),
		bus.WithPolicy(bus.Weighted, 1, 2), bus.WithBackoff(nil)} {
		if _, err := b.Subscribe(testContext(t), newRecorder().handle, opt); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("Subscribe with a bad option = %v, want ErrInvalidOption", err)
		}
	}
	// More handlers than the six consumers hand out messages at once could
	// never run; each would still be a goroutine (a million took 2 GiB of
	// stacks and 9.5 s to start).
	for _, opts := range [][]bus.SubscribeOption{
		{bus.WithConcurrency(6001)},
		{bus.WithConcurrency(61), bus.WithMaxAckPending(10)},
	} {
		if _, err := b.Subscribe(testContext(t), newRecorder().handle, opts...); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("Subscribe with more handlers than messages out at once = %v, want ErrInvalidOption", err)
		}
	}
	sub, err := b.Subscribe(testContext(t), newRecorder().handle, bus.WithConcurrency(60), bus.WithMaxAckPending(10))
	if err != nil {
		t.Fatalf("Subscribe with as many handlers as messages out at once: %v", err)
	}
	sub.Stop()
	<-sub.Done()
}

// TestNilOptions: a nil option, one a caller left unset (var opt
// bus.Option; if tls { opt = ... }), sets nothing, and a nil function for
// a watch is ErrInvalidOption. Before, each was a nil-pointer panic, the
// watches' at their first change (found by hunt h14).
func TestNilOptions(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	ctx := testContext(t)
	b, err := bus.New(nc, "alice", nil)
	if err != nil {
		t.Fatalf("New with a nil option: %v", err)
	}
	defer b.Close()
	a, err := bus.NewAdmin(nc, nil)
	if err != nil {
		t.Fatalf("NewAdmin with a nil option: %v", err)
	}
	defer a.Close()
	r := newRecorder()
	sub, err := b.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "Q" {
			_, err := d.Reply(ctx, bus.Message{Type: "A"})
			return err
		}
		return r.handle(ctx, d)
	}, nil)
	if err != nil {
		t.Fatalf("Subscribe with a nil option: %v", err)
	}
	defer sub.Stop()
	if err := b.EnsureConsumers(ctx, nil); err != nil {
		t.Errorf("EnsureConsumers with a nil option: %v", err)
	}
	bob := newBus(t, s, "bob")
	reply, err := bob.Request(ctx, bus.Message{To: "alice", Type: "Q"}, nil)
	if err != nil {
		t.Fatalf("Request with a nil option: %v", err)
	}
	if _, err := bob.Attach(ctx, reply.CausationID, nil); err != nil {
		t.Errorf("Attach with a nil option: %v", err)
	}
	if _, err := bob.Gather(ctx, bus.Message{Type: "Q"}, []string{"alice"}, nil); err != nil {
		t.Errorf("Gather with a nil option: %v", err)
	}
	if err := b.WatchPresence(ctx, nil); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("WatchPresence(nil): %v, want ErrInvalidOption", err)
	}
	if err := a.WatchGroups(ctx, "", nil); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("WatchGroups(nil): %v, want ErrInvalidOption", err)
	}
}

// TestCallsUnderWayAtClose: calls that Close meets under way (here waiting
// for a server that is down) fail with an error wrapping ErrClosed, as
// calls after Close do. Before, Register, JoinGroup, LeaveGroup,
// LookupAgent, Schedule, Subscribe and EnsureConsumers returned nats.go's
// "connection closed" once Close closed the connection it dialled (found
// by hunt h10).
func TestCallsUnderWayAtClose(t *testing.T) {
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = t.TempDir() })
	b := dialBus(t, s.ClientURL(), "caller")
	if err := b.JoinGroup(testContext(t), "crew"); err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	waitFor(t, "the caller to see the server gone", func() (bool, string) {
		return !b.Conn().IsConnected(), b.Conn().Status().String()
	})
	calls := []call{
		{"Register", func(ctx context.Context) error { return b.Register(ctx, bus.AgentCard{}) }},
		{"JoinGroup", func(ctx context.Context) error { return b.JoinGroup(ctx, "crew2") }},
		{"LeaveGroup", func(ctx context.Context) error { return b.LeaveGroup(ctx, "crew") }},
		{"LookupAgent", func(ctx context.Context) error { _, err := b.LookupAgent(ctx, "other"); return err }},
		{"Schedule", func(ctx context.Context) error {
			_, err := b.Schedule(ctx, bus.Message{To: "other", Type: "LATER"}, bus.In(time.Hour))
			return err
		}},
		{"Subscribe", func(ctx context.Context) error {
			sub, err := b.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
			if sub != nil {
				sub.Stop()
			}
			return err
		}},
		{"EnsureConsumers", func(ctx context.Context) error { return b.EnsureConsumers(ctx) }},
		{"Publish", func(ctx context.Context) error {
			_, err := b.Publish(ctx, bus.Message{To: "other", Type: "T"})
			return err
		}},
	}
	errs := make(chan error, len(calls))
	for _, c := range calls {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.do(ctx); !errors.Is(err, bus.ErrClosed) {
				errs <- fmt.Errorf("%s under way at Close: %v, want an error wrapping ErrClosed", c.name, err)
				return
			}
			errs <- nil
		}()
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestCloseWhileClosing: a Close while another closes returns once that
// one has: its running handlers returned, the subscription done. Before,
// it returned at once, and a program that exited after it (a signal
// handler beside a deferred Close) dropped what Close waits for (found by
// hunt h10).
func TestCloseWhileClosing(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "worker")
	running, release := make(chan struct{}), make(chan struct{})
	sub, err := b.Subscribe(testContext(t), func(context.Context, *bus.Delivery) error {
		close(running)
		<-release // finishing its work after its context ended
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, newBus(t, s, "boss"), bus.Message{To: "worker", Type: "T"})
	<-running
	first := make(chan error, 1)
	go func() { first <- b.Close() }()
	waitFor(t, "the first Close to begin", func() (bool, string) {
		_, err := b.Publish(testContext(t), bus.Message{To: "x", Type: "T"})
		return errors.Is(err, bus.ErrClosed), fmt.Sprint(err)
	})
	doneAtSecond := make(chan bool, 1)
	go func() {
		b.Close()
		select {
		case <-sub.Done():
			doneAtSecond <- true
		default:
			doneAtSecond <- false
		}
	}()
	// A bounded look for what must not happen: it cannot fail on a slow
	// machine, only miss it.
	select {
	case ok := <-doneAtSecond:
		t.Fatalf("the second Close returned while the first waited for a running handler (subscription done: %v)", ok)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if !<-doneAtSecond {
		t.Error("the second Close returned before the subscription was done")
	}
}
