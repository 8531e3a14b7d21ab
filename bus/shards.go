package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Shards is one agent's handle on an installation split into several
// shards, each a root of its own (subjects.ShardRoot) with its own streams,
// buckets and consumers: the way an installation grows past the consumers
// one stream holds and, with its shards placed on different servers
// (StreamConfig.Tags), past one server (docs/performance.md).
//
// Every agent lives on one shard, subjects.ShardOf: its consumers, its
// registry card and presence are there, and every message to it is sent
// there. So an agent subscribes on its own shard (Home) and sends to
// another agent on that agent's shard (For, or Publish and Request, which
// route by Message.To). A reply goes back on the shard its request came
// on, where the requester listens, and a broadcast is published on every
// shard with one ID (Publish). Every participant must use the same root and
// number of shards: a message sent to the wrong shard waits for a consumer
// that is never made.
//
// Each shard is a Bus, made when first needed, on one shared connection;
// features that read one root work on the shard they are called on: a
// group, a gather and an agent's history (Home's has what it received and
// what it sent on its own shard) do not span shards, and Status looks on
// every shard. Shards is safe for concurrent use.
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
// is made (each with the StreamConfig given, on its own root). It makes the
// bus of the agent's own shard, Home, at once.
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
	if _, err := s.Shard(home); err != nil {
		return nil, err
	}
	return s, nil
}

// Agent returns the agent the shards' buses publish as.
func (s *Shards) Agent() string { return s.agent }

// Len returns the number of shards.
func (s *Shards) Len() int { return s.n }

// Home returns the bus on the agent's own shard: the one to Subscribe,
// Register and read History on.
func (s *Shards) Home() *Bus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buses[s.home]
}

// For returns the bus on agent's shard, which sends to agent, requests from
// it and cancels or attaches to what was sent to it. Errors:
// ErrInvalidAgentID (Broadcast among them: Publish sends a broadcast to
// every shard), ErrClosed, or New's.
func (s *Shards) For(agent string) (*Bus, error) {
	k, err := subjects.ShardOf(agent, s.n)
	if err != nil {
		return nil, err
	}
	return s.Shard(k)
}

// Shard returns the bus on shard k, 0 to Len()-1, making it when first
// asked. Errors: ErrInvalidOption for a shard out of range, ErrClosed, or
// New's.
func (s *Shards) Shard(k int) (*Bus, error) {
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
	s.buses[k] = b
	return b, nil
}

// Publish sends m on the shard of its recipient, as Bus.Publish does. A
// broadcast (To is Broadcast) is sent on every shard with one ID, so that
// every agent receives it once on its own shard; it returns the ack of the
// agent's own shard, and an error naming each shard it could not be sent
// on (the shards that took it keep it: publishing m again with its ID sends
// it to the others only, their copies dropped as duplicates).
func (s *Shards) Publish(ctx context.Context, m Message) (PubAck, error) {
	if m.To != Broadcast {
		b, err := s.For(m.To)
		if err != nil {
			return PubAck{}, err
		}
		return b.Publish(ctx, m)
	}
	if m.ID == "" {
		m.ID = codec.NewID()
	}
	acks, errs := make([]PubAck, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k := range s.n {
		b, err := s.Shard(k)
		if err != nil {
			errs[k] = err
			continue
		}
		wg.Go(func() {
			acks[k], errs[k] = b.Publish(ctx, m)
			if errs[k] != nil {
				errs[k] = fmt.Errorf("shard %d: %w", k, errs[k])
			}
		})
	}
	wg.Wait()
	return acks[s.home], errors.Join(errs...)
}

// Request sends m to its recipient on the recipient's shard and waits for
// the reply, as Bus.Request does; the reply comes back on that shard.
func (s *Shards) Request(ctx context.Context, m Message, opts ...RequestOption) (*Delivery, error) {
	b, err := s.For(m.To)
	if err != nil {
		return nil, err
	}
	return b.Request(ctx, m, opts...)
}

// Status returns the lifecycle records of message id that name the agent,
// as Bus.Status does, looking on every shard at once: a message is on its
// recipient's shard, a reply on its request's, a broadcast on all of them.
// It returns ErrNoStatus when no shard has any.
func (s *Shards) Status(ctx context.Context, id string) ([]Status, error) {
	found, errs := make([][]Status, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k := range s.n {
		b, err := s.Shard(k)
		if err != nil {
			return nil, err
		}
		wg.Go(func() { found[k], errs[k] = b.Status(ctx, id) })
	}
	wg.Wait()
	var out []Status
	for k := range s.n {
		switch {
		case errors.Is(errs[k], ErrNoStatus):
		case errs[k] != nil:
			return nil, fmt.Errorf("shard %d: %w", k, errs[k])
		default:
			out = append(out, found[k]...)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s on %d shards", ErrNoStatus, id, s.n)
	}
	return out, nil
}

// Close closes every shard's bus (Bus.Close) and returns their errors.
// Close is idempotent; Shard, For and the methods that use them return
// ErrClosed after it.
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
