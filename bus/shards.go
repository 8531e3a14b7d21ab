package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Shards is one agent's handle on an installation split into several
// shards, each a root of its own (subjects.ShardRoot) with its own streams,
// buckets and consumers: the way an installation grows past the consumers
// one stream holds and, with its shards placed on different servers
// (StreamConfig.Tags), past one server (docs/operations.md).
//
// Every agent lives on one shard, subjects.ShardOf: its consumers, its
// registry card and presence are there, and every message to it is sent
// there. The agent's Bus subscribes and registers on its own shard and
// sends each message on its recipient's: Publish, PublishAsync, Request,
// Schedule, Reply and every other way a message leaves it. A broadcast is
// sent on every shard with one ID; Status and Cancel look for a message on
// every shard. Every participant must use the same root and number of
// shards: a message sent to the wrong shard waits for a consumer that is
// never made.
//
// What is read from one root stays on the agent's shard: a group's members
// and a gather's presence come from its registry, and History,
// Conversation and Attach read its stream, so they see what the agent
// received and what it sent to agents of its own shard.
//
// The buses of the other shards are made when first needed, on the same
// connection. Shards is safe for concurrent use.
type Shards struct {
	nc        *nats.Conn
	agent     string
	root      string
	n         int
	home      int
	opts      []Option
	provision *StreamConfig // each shard provisions it on its root, when WithProvision

	mu     sync.Mutex
	buses  []*Bus
	closed bool
}

// NewShards returns agent's handle on an installation of shards shards on
// nc, whose root is the one opts give (WithRoot, or the default). opts apply
// to every shard's bus; WithProvision provisions each shard's root as its bus
// is made (with the StreamConfig given, on that root). It makes the agent's
// own Bus at once.
//
// Errors: ErrInvalidAgentID, ErrInvalidOption (among them a shard count
// not 1 to subjects.MaxShards, or a root too long for its shard roots), or
// New's.
func NewShards(nc *nats.Conn, agent string, shards int, opts ...Option) (*Shards, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	home, err := subjects.ShardOf(agent, shards)
	if errors.Is(err, subjects.ErrInvalidShard) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	} else if err != nil {
		return nil, err
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	root := o.scheme.Root()
	for k := range shards { // every shard root is valid before any bus is made
		if _, err := subjects.ShardRoot(root, k, shards); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	}
	s := &Shards{nc: nc, agent: agent, root: root, n: shards, home: home, opts: opts, provision: o.provision, buses: make([]*Bus, shards)}
	if _, err := s.shard(home); err != nil {
		return nil, err
	}
	return s, nil
}

// Bus returns the agent's bus: it subscribes, registers and keeps its
// presence on the agent's own shard, and sends each message on its
// recipient's.
func (s *Shards) Bus() *Bus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buses[s.home]
}

// Len returns the number of shards.
func (s *Shards) Len() int { return s.n }

// Close closes the bus of every shard (Bus.Close) and returns their
// errors. Close is idempotent; sending to a shard whose bus was not made
// yet fails with ErrClosed after it.
func (s *Shards) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	buses := s.buses
	s.mu.Unlock()
	errs := make([]error, len(buses))
	var wg sync.WaitGroup
	for k, b := range buses {
		if b != nil {
			wg.Go(func() { errs[k] = b.Close() })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// shard returns the bus on shard k, making it when first asked.
func (s *Shards) shard(k int) (*Bus, error) {
	root, err := subjects.ShardRoot(s.root, k, s.n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if b := s.buses[k]; b != nil {
		return b, nil
	}
	opts := append(s.opts[:len(s.opts):len(s.opts)], WithRoot(root))
	if s.provision != nil {
		cfg := *s.provision
		cfg.Root = root
		opts = append(opts, WithProvision(cfg))
	}
	b, err := New(s.nc, s.agent, opts...)
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", root, err)
	}
	b.shards = s
	s.buses[k] = b
	return b, nil
}

// of returns the bus on agent's shard. For an ID that names no agent it
// returns the agent's own bus, where the call then fails as on any bus.
func (s *Shards) of(agent string) (*Bus, error) {
	k, err := subjects.ShardOf(agent, s.n)
	if err != nil {
		k = s.home
	}
	return s.shard(k)
}

// all returns the bus of every shard.
func (s *Shards) all() ([]*Bus, error) {
	out := make([]*Bus, s.n)
	for k := range out {
		b, err := s.shard(k)
		if err != nil {
			return nil, err
		}
		out[k] = b
	}
	return out, nil
}

// busOf returns the bus that sends to agent: b itself, or, for a bus of
// Shards, the bus on agent's shard.
func (b *Bus) busOf(agent string) (*Bus, error) {
	if b.shards == nil {
		return b, nil
	}
	return b.shards.of(agent)
}

// presenceOfAgent reads agent's presence in the registry of its shard.
func (b *Bus) presenceOfAgent(ctx context.Context, agent string) (Presence, time.Duration, error) {
	at, err := b.busOf(agent)
	if err != nil {
		return Presence{}, 0, err
	}
	return at.presenceOf(ctx, agent)
}

// publish is Bus.Publish: a direct message on its recipient's shard, a
// broadcast on every shard with one ID. It returns the ack of the agent's
// own shard, and an error naming each shard the broadcast could not be
// sent on (the shards that took it keep it: publishing it again with its
// ID sends it to the others only, their copies dropped as duplicates).
func (s *Shards) publish(ctx context.Context, m Message) (PubAck, error) {
	if m.To != Broadcast {
		b, err := s.of(m.To)
		if err != nil {
			return PubAck{}, err
		}
		return b.publishHere(ctx, m)
	}
	return s.everywhere(&m, func(b *Bus) (PubAck, error) { return b.publishHere(ctx, m) })
}

// schedule is Bus.Schedule, on the shards publish would send m on.
func (s *Shards) schedule(ctx context.Context, m Message, w When) (PubAck, error) {
	if m.To != Broadcast {
		b, err := s.of(m.To)
		if err != nil {
			return PubAck{}, err
		}
		return b.scheduleHere(ctx, m, w)
	}
	return s.everywhere(&m, func(b *Bus) (PubAck, error) { return b.scheduleHere(ctx, m, w) })
}

// everywhere gives m an ID if it has none and sends it on every shard
// with send, at once; it returns the ack of the agent's own shard and the
// errors of the others, each naming its shard.
func (s *Shards) everywhere(m *Message, send func(*Bus) (PubAck, error)) (PubAck, error) {
	if m.ID == "" {
		m.ID = codec.NewID()
	}
	buses, err := s.all()
	if err != nil {
		return PubAck{}, err
	}
	acks, errs := make([]PubAck, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k, b := range buses {
		wg.Go(func() {
			if acks[k], errs[k] = send(b); errs[k] != nil {
				errs[k] = fmt.Errorf("shard %s: %w", b.Subjects().Root(), errs[k])
			}
		})
	}
	wg.Wait()
	return acks[s.home], errors.Join(errs...)
}

// publishAsync is Bus.PublishAsync on the shards publish would send m on.
// For a broadcast it returns the future of the agent's own shard; a copy
// the server fails to store on another shard goes to the error handler,
// as every failed asynchronous publish does.
func (s *Shards) publishAsync(ctx context.Context, m Message) (*PublishFuture, error) {
	if m.To != Broadcast {
		b, err := s.of(m.To)
		if err != nil {
			return nil, err
		}
		return b.publishAsyncHere(ctx, m)
	}
	if m.ID == "" {
		m.ID = codec.NewID()
	}
	buses, err := s.all()
	if err != nil {
		return nil, err
	}
	var (
		home *PublishFuture
		errs []error
	)
	for k, b := range buses {
		f, err := b.publishAsyncHere(ctx, m)
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", b.Subjects().Root(), err))
		}
		if k == s.home {
			home = f
		}
	}
	return home, errors.Join(errs...)
}

// status is Bus.Status on every shard at once: a message is on its
// recipient's shard, a broadcast on all of them.
func (s *Shards) status(ctx context.Context, id string) ([]Status, error) {
	buses, err := s.all()
	if err != nil {
		return nil, err
	}
	found, errs := make([][]Status, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k, b := range buses {
		wg.Go(func() { found[k], errs[k] = b.statusHere(ctx, id) })
	}
	wg.Wait()
	var out []Status
	for k := range buses {
		switch {
		case errors.Is(errs[k], ErrNoStatus):
		case errs[k] != nil:
			return nil, fmt.Errorf("shard %s: %w", buses[k].Subjects().Root(), errs[k])
		default:
			out = append(out, found[k]...)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s on %d shards", ErrNoStatus, id, s.n)
	}
	return out, nil
}

// cancel is Bus.Cancel on the shard that holds message id's records.
func (s *Shards) cancel(ctx context.Context, id string) (Status, error) {
	buses, err := s.all()
	if err != nil {
		return Status{}, err
	}
	canceled, errs := make([]Status, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k, b := range buses {
		wg.Go(func() { canceled[k], errs[k] = b.cancelHere(ctx, id) })
	}
	wg.Wait()
	for k := range buses { // the shard that found it, or the first that failed otherwise
		if !errors.Is(errs[k], ErrNoStatus) {
			return canceled[k], errs[k]
		}
	}
	return Status{}, fmt.Errorf("%w: %s on %d shards", ErrNoStatus, id, s.n)
}
