package benchmark

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

// The agents and message types of the scenarios.
const (
	senderAgent        = "bench-sender"
	receiverAgent      = "bench-receiver"
	otherReceiverAgent = "bench-receiver-2" // of the raw backlog with headers in the consume scenarios
	requesterAgent     = "bench-requester"
	responderAgent     = "bench-responder"
	messageType        = "BENCH"
	requestType        = "REQUEST"
	replyType          = "RESULT"
)

// env is one scenario's two sides on the server: the bus under a root of
// its own, provisioned by Admin.Provision, and raw nats.go on a stream of
// its own with the same configuration under another root, so that neither
// side sees the other's messages. Each side publishes on a connection of
// its own; every subscriber dials another.
type env struct {
	dial func() (*nats.Conn, error)

	bus    subjects.Scheme // the bus side's subjects and names
	raw    subjects.Scheme // the raw side's, the same scheme under another root
	admin  *nats.Conn      // the bus sender's connection; deletes the streams
	sender *bus.Bus        // publishes on the bus side as senderAgent
	js     jetstream.JetStream

	mu      sync.Mutex
	conns   []*nats.Conn
	buses   []*bus.Bus
	closers []func() // subscriptions to stop before the buses close
}

// onClose makes close call f first, before anything else.
func (e *env) onClose(f func()) {
	e.mu.Lock()
	e.closers = append(e.closers, f)
	e.mu.Unlock()
}

// newEnv provisions both sides under roots starting with root. On error
// the env holds what was set up, for close to remove.
func newEnv(ctx context.Context, dial func() (*nats.Conn, error), root string) (*env, error) {
	e := &env{dial: dial}
	var err error
	if e.bus, err = subjects.New(root + "-bus"); err != nil {
		return e, err
	}
	if e.raw, err = subjects.New(root + "-raw"); err != nil {
		return e, err
	}
	if e.admin, err = e.connect(); err != nil {
		return e, err
	}
	admin, err := bus.NewAdmin(e.admin)
	if err != nil {
		return e, err
	}
	if _, err := admin.Provision(ctx, bus.StreamConfig{Root: e.bus.Root()}); err != nil {
		return e, fmt.Errorf("provision the bus side: %w", err)
	}
	if e.sender, err = e.newBus(e.admin, senderAgent); err != nil {
		return e, err
	}
	rawConn, err := e.connect()
	if err != nil {
		return e, err
	}
	if e.js, err = jetstream.New(rawConn); err != nil {
		return e, fmt.Errorf("raw side: %w", err)
	}
	cfg, err := bus.StreamConfig{Root: e.raw.Root()}.JetStream()
	if err != nil {
		return e, err
	}
	cfg.Description = "agentbus bench: the raw nats.go side"
	if _, err := e.js.CreateStream(ctx, cfg); err != nil {
		return e, fmt.Errorf("create raw stream %s: %w", cfg.Name, err)
	}
	return e, nil
}

// connect dials a connection that close closes.
func (e *env) connect() (*nats.Conn, error) {
	nc, err := e.dial()
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	e.mu.Lock()
	e.conns = append(e.conns, nc)
	e.mu.Unlock()
	return nc, nil
}

// newBus returns the bus side's bus of agent on nc, with opts, which close
// closes.
func (e *env) newBus(nc *nats.Conn, agent string, opts ...bus.Option) (*bus.Bus, error) {
	b, err := bus.New(nc, agent, append([]bus.Option{bus.WithRoot(e.bus.Root())}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bus of %s: %w", agent, err)
	}
	e.mu.Lock()
	e.buses = append(e.buses, b)
	e.mu.Unlock()
	return b, nil
}

// close closes every bus, deletes every stream of both sides and closes
// every connection. It runs after ctx may have ended, so it bounds the
// deletion with a context of its own.
func (e *env) close() error {
	var errs []error
	flushCtx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, f := range e.closers {
		f()
	}
	for _, b := range e.buses {
		// The lifecycle records still in flight are work the scenario gave
		// the server: wait for them, so that it does not spill into the
		// next scenario's figures.
		if err := b.Flush(flushCtx); err != nil {
			errs = append(errs, fmt.Errorf("flush bus of %s: %w", b.Agent(), err))
		}
		if err := b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close bus of %s: %w", b.Agent(), err))
		}
	}
	// admin is set only once both schemes are, so the names matched below
	// carry the run ID: a zero Scheme's "AGENTBUS" is never matched.
	if e.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		errs = append(errs, e.deleteStreams(ctx))
		cancel()
	}
	for _, nc := range e.conns {
		nc.Close()
	}
	return errors.Join(errs...)
}

// deleteStreams deletes every stream whose name contains the stream name
// of either side: the streams themselves and whatever Admin.Provision
// created beside the bus's (dead letters, status bucket). The names carry
// the run ID, so no other stream matches.
func (e *env) deleteStreams(ctx context.Context) error {
	js, err := jetstream.New(e.admin)
	if err != nil {
		return fmt.Errorf("delete streams: %w", err)
	}
	names := js.StreamNames(ctx)
	var ours []string
	for name := range names.Name() {
		if strings.Contains(name, e.bus.Stream()) || strings.Contains(name, e.raw.Stream()) {
			ours = append(ours, name)
		}
	}
	errs := []error{names.Err()}
	for _, name := range ours {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// consumerCount returns how many consumers the stream called name has.
func (e *env) consumerCount(ctx context.Context, name string) (int, error) {
	js, err := jetstream.New(e.admin)
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", name, err)
	}
	return info.State.Consumers, nil
}
