package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// never made. The operator records the number in every shard's registry
// (StreamConfig.Shards, agentbus provision --shards), and a Shards of
// another number is refused with ErrShardCount as each shard's bus is made.
//
// The registry spans the shards: Agents, FindAgents, GroupMembers, Groups
// and the watches of presence and groups read every shard's, where each
// agent registers and joins groups on its own (LookupAgent reads the
// agent's shard); so does
// History, which finds what the agent sent on its recipients' shards. An
// operator's Admin (Status, Conversation, History) reads one shard, the
// root it was made with.
//
// The buses of the other shards are made when first needed, on the same
// connection; a call that needs one while the connection is down waits for
// it, until the call's context ends (10 s without a deadline; for
// PublishAsync too). Closing the agent's Bus closes them all
// (Shards.Close).
// Shards is safe for concurrent use.
type Shards struct {
	nc        *nats.Conn
	agent     string
	root      string
	n         int
	home      int
	opts      []Option
	provision *StreamConfig // each shard provisions it on its root, when WithProvision
	refusals  *refusals     // of the connection ConnectShards dialled, else nil
	ownsConn  bool          // ConnectShards dialled nc: Close closes it
	own       *Bus          // the agent's own, buses[home], made first

	mu     sync.Mutex // guards buses and closed
	buses  []*Bus
	closed bool
	// making holds a token per shard while one goroutine makes its bus;
	// the others wait for it, each no longer than its context.
	making []chan struct{}
}

// NewShards returns agent's handle on an installation of shards shards on
// nc, whose root is the one opts give (WithRoot, or the default). opts apply
// to every shard's bus; WithProvision provisions each shard's root as its bus
// is made (with the StreamConfig given, on that root). It makes the agent's
// own Bus at once.
//
// Errors: ErrInvalidAgentID, ErrInvalidOption (among them a shard count
// not 1 to subjects.MaxShards, or a root too long for its shard roots),
// ErrShardCount (the installation was provisioned with another number of
// shards), or New's.
func NewShards(nc *nats.Conn, agent string, shards int, opts ...Option) (*Shards, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	return newShards(nc, agent, shards, opts, o, nil)
}

// ConnectShards dials url as Connect does and returns agent's handle on an
// installation of shards shards on the new connection, which Close (and
// the Close of its Bus) closes.
func ConnectShards(url, agent string, shards int, opts ...Option) (*Shards, error) {
	if _, err := shardOf(agent, shards); err != nil {
		return nil, err
	}
	return connectAs(url, agent, opts, func(nc *nats.Conn, o options, r *refusals) (*Shards, error) {
		s, err := newShards(nc, agent, shards, opts, o, r)
		if err == nil {
			s.ownsConn = true
		}
		return s, err
	})
}

// newShards is NewShards on nc, with opts applied as o, whose refusals r
// are (nil for a connection the caller made).
func newShards(nc *nats.Conn, agent string, shards int, opts []Option, o options, r *refusals) (*Shards, error) {
	home, err := shardOf(agent, shards)
	if err != nil {
		return nil, err
	}
	root := o.scheme.Root()
	if o.provision != nil && o.provision.Root != "" {
		if ps, err := subjects.New(o.provision.Root); err != nil || ps.Root() != root {
			return nil, fmt.Errorf("%w: provision root %q differs from bus root %q", ErrInvalidOption, o.provision.Root, root)
		}
	}
	for k := range shards { // every shard root is valid before any bus is made
		if _, err := subjects.ShardRoot(root, k, shards); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	}
	s := &Shards{nc: nc, agent: agent, root: root, n: shards, home: home, opts: opts, provision: o.provision, refusals: r, buses: make([]*Bus, shards), making: make([]chan struct{}, shards)}
	for k := range s.making {
		s.making[k] = make(chan struct{}, 1)
	}
	if s.own, err = s.shard(context.Background(), home); err != nil {
		return nil, err
	}
	return s, nil
}

// shardOf returns agent's shard of shards (subjects.ShardOf), with a bad
// count of shards an ErrInvalidOption.
func shardOf(agent string, shards int) (int, error) {
	if err := subjects.ValidateIdentity(agent); err != nil {
		return 0, err
	}
	k, err := subjects.ShardOf(agent, shards)
	if errors.Is(err, subjects.ErrInvalidShard) {
		return 0, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return k, err
}

// Bus returns the agent's bus: it subscribes, registers and keeps its
// presence on the agent's own shard, and sends each message on its
// recipient's.
func (s *Shards) Bus() *Bus { return s.own }

// Close closes the bus of every shard (Bus.Close), and the connection if
// ConnectShards dialled it, and returns their errors. Close is idempotent;
// sending to a shard whose bus was not made yet fails with ErrClosed after
// it.
func (s *Shards) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := onEachMade(s.madeSoFar(), (*Bus).Close)
	if s.ownsConn {
		s.nc.Close()
	}
	return err
}

// shard returns the bus on shard k, making it when first asked, once the
// connection is up (connected). Shards are made at once; callers for one
// shard wait for the first.
func (s *Shards) shard(ctx context.Context, k int) (*Bus, error) {
	root, err := subjects.ShardRoot(s.root, k, s.n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if b, err := s.made(k); b != nil || err != nil {
		return b, err
	}
	select {
	case s.making[k] <- struct{}{}:
		defer func() { <-s.making[k] }()
	case <-ctx.Done():
		return nil, fmt.Errorf("shard %s: %w", root, ctx.Err())
	}
	if b, err := s.made(k); b != nil || err != nil {
		return b, err // made while this call waited
	}
	opts := append(s.opts[:len(s.opts):len(s.opts)], WithRoot(root))
	if s.provision != nil {
		cfg := *s.provision
		cfg.Root, cfg.Shards = root, s.n
		opts = append(opts, WithProvision(cfg))
	}
	o, err := applyOptions(opts) // checked by newShards, but for the root
	if err != nil {
		return nil, err
	}
	if err := s.connected(ctx); err != nil {
		return nil, fmt.Errorf("shard %s: %w", root, err)
	}
	b, err := newBus(s.nc, s.agent, o, s.refusals)
	if err == nil {
		if err = b.checkShards(ctx, s.n); err != nil {
			b.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", root, err)
	}
	s.mu.Lock()
	closed := s.closed
	if !closed {
		b.shards = s
		s.buses[k] = b
	}
	s.mu.Unlock()
	if closed { // Close ran while b was made
		b.Close()
		return nil, ErrClosed
	}
	return b, nil
}

// connected waits until the connection is up, or ctx ends (after 10 s
// without a deadline). A bus cannot be made while its connection is down
// (checkServer), so a call that needs a shard not made yet waits for the
// connection, as a call on a made shard waits for it to ask again
// (askAgain). The agent's own bus, made first (NewShards), is made as New
// makes a bus, and fails on a connection that is down.
func (s *Shards) connected(ctx context.Context) error {
	if s.own == nil {
		return nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	for {
		back := s.own.reconnects.connected() // before the look, so no reconnect is missed
		if s.nc.IsConnected() || s.nc.IsClosed() {
			return nil // closed: newBus says so
		}
		select {
		case <-back:
		case <-s.own.closing:
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("wait for the connection: %w", ctx.Err())
		}
	}
}

// made returns the bus of shard k if it is made, ErrClosed after Close.
func (s *Shards) made(k int) (*Bus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	return s.buses[k], nil
}

// of returns the bus on agent's shard. For an ID that names no agent it
// returns the agent's own bus, where the call then fails as on any bus.
func (s *Shards) of(ctx context.Context, agent string) (*Bus, error) {
	k, err := subjects.ShardOf(agent, s.n)
	if err != nil {
		k = s.home
	}
	return s.shard(ctx, k)
}

// all returns the bus of every shard, making those not made yet at once.
func (s *Shards) all(ctx context.Context) ([]*Bus, error) {
	out, errs := make([]*Bus, s.n), make([]error, s.n)
	var wg sync.WaitGroup
	for k := range out {
		if out[k], errs[k] = s.made(k); out[k] == nil && errs[k] == nil {
			wg.Go(func() { out[k], errs[k] = s.shard(ctx, k) })
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// busOf returns the bus that sends to agent: b itself, or, for a bus of
// Shards, the bus on agent's shard.
func (b *Bus) busOf(ctx context.Context, agent string) (*Bus, error) {
	if b.shards == nil {
		return b, nil
	}
	return b.shards.of(ctx, agent)
}

// presenceOfAgent reads agent's presence in the registry of its shard.
func (b *Bus) presenceOfAgent(ctx context.Context, agent string) (Presence, time.Duration, error) {
	at, err := b.busOf(ctx, agent)
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
		b, err := s.of(ctx, m.To)
		if err != nil {
			return PubAck{}, err
		}
		return b.publishHere(ctx, m)
	}
	return s.everywhere(ctx, &m, func(b *Bus) (PubAck, error) { return b.publishHere(ctx, m) })
}

// schedule is Bus.Schedule, on the shards publish would send m on.
func (s *Shards) schedule(ctx context.Context, m Message, w When) (PubAck, error) {
	if m.To != Broadcast {
		b, err := s.of(ctx, m.To)
		if err != nil {
			return PubAck{}, err
		}
		return b.scheduleHere(ctx, m, w)
	}
	if w.Once() && m.Time.IsZero() {
		m.Time = w.firing(time.Now()) // as scheduleHere gives it, before everywhere gives it now
	}
	return s.everywhere(ctx, &m, func(b *Bus) (PubAck, error) { return b.scheduleHere(ctx, m, w) })
}

// everywhere gives m its ID and time (oneMessage) and sends it on every
// shard with send, at once; it
// returns the ack of the agent's own shard and the errors of the others,
// each naming its shard.
func (s *Shards) everywhere(ctx context.Context, m *Message, send func(*Bus) (PubAck, error)) (PubAck, error) {
	oneMessage(m)
	buses, err := s.all(ctx)
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

// oneMessage gives m, about to be sent on every shard, its ID and time if
// it has none, so that every copy is the same message.
func oneMessage(m *Message) {
	if m.ID == "" {
		m.ID = codec.NewID()
	}
	if m.Time.IsZero() {
		m.Time = time.Now().UTC()
	}
}

// publishAsync is Bus.PublishAsync on the shards publish would send m on.
// For a broadcast it returns the future of the agent's own shard; a copy
// the server fails to store on another shard goes to the error handler,
// as every failed asynchronous publish does.
func (s *Shards) publishAsync(ctx context.Context, m Message) (*PublishFuture, error) {
	if m.To != Broadcast {
		b, err := s.of(ctx, m.To)
		if err != nil {
			return nil, err
		}
		return b.publishAsyncHere(ctx, m)
	}
	oneMessage(&m)
	buses, err := s.all(ctx)
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

// madeSoFar returns the buses made so far: those of the shards the agent
// sent on, and its own.
func (s *Shards) madeSoFar() []*Bus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Bus
	for _, b := range s.buses {
		if b != nil {
			out = append(out, b)
		}
	}
	return out
}

// flush is Bus.Flush on every shard the agent sent on, at once.
func (s *Shards) flush(ctx context.Context) error {
	return onEachMade(s.madeSoFar(), func(b *Bus) error { return b.flushHere(ctx) })
}

// onEachMade calls f with each of buses at once and returns their errors.
func onEachMade(buses []*Bus, f func(*Bus) error) error {
	errs := make([]error, len(buses))
	var wg sync.WaitGroup
	for i, b := range buses {
		wg.Go(func() { errs[i] = f(b) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// publishAsyncComplete is closed when every asynchronous publish made so
// far on every shard has been acknowledged or has failed.
func (s *Shards) publishAsyncComplete() <-chan struct{} {
	buses := s.madeSoFar()
	if len(buses) == 1 {
		return buses[0].pub.Complete()
	}
	waits := make([]<-chan struct{}, len(buses))
	for i, b := range buses {
		waits[i] = b.pub.Complete()
	}
	done := make(chan struct{})
	go func() {
		for _, w := range waits {
			<-w
		}
		close(done)
	}()
	return done
}

// status is Bus.Status on every shard at once: a message is on its
// recipient's shard, a broadcast on all of them.
func (s *Shards) status(ctx context.Context, id string) ([]Status, error) {
	type outcome struct {
		sts    []Status
		unread error // the shard could not read its stream and holds no record
	}
	found, err := onEvery(ctx, s, func(b *Bus) (outcome, error) {
		sts, err := b.statusHere(ctx, id)
		switch {
		case errors.Is(err, ErrNoStatus):
			return outcome{}, nil
		case errors.Is(err, errStreamUnread):
			return outcome{unread: fmt.Errorf("shard %s: %w", b.Subjects().Root(), err)}, nil
		}
		return outcome{sts: sts}, err
	})
	if err != nil {
		return nil, err
	}
	// A direct message is on one shard: where it was found, a shard that
	// could not tell does not matter; where it was not, it leaves it
	// unknown. A broadcast is on every shard, and so is its sender's
	// record: the one on this agent's shard is kept, once.
	var out []Status
	var unread []error
	seen := make(map[recordOf]bool)
	for _, k := range s.homeFirst() {
		for _, st := range found[k].sts {
			if r := (recordOf{st.ID, st.From, st.To}); !seen[r] {
				seen[r] = true
				out = append(out, st)
			}
		}
		if found[k].unread != nil {
			unread = append(unread, found[k].unread)
		}
	}
	switch {
	case len(out) > 0:
		return out, nil
	case len(unread) > 0:
		return nil, errors.Join(unread...)
	}
	return nil, fmt.Errorf("%w: %s on %d shards", ErrNoStatus, id, s.n)
}

// readRegistry is the agents of every shard's registry
// (client.readRegistry), by name: each agent registers on its own shard.
func (s *Shards) readRegistry(ctx context.Context) ([]AgentInfo, error) {
	found, err := onEvery(ctx, s, func(b *Bus) ([]AgentInfo, error) { return b.readRegistryHere(ctx) })
	if err != nil {
		return nil, err
	}
	out := slices.Concat(found...)
	slices.SortFunc(out, func(a, b AgentInfo) int { return strings.Compare(a.Card.Name, b.Card.Name) })
	return out, nil
}

// readGroups is the memberships of every shard's registry that match
// filter (client.readGroups): each agent joins on its own shard.
func (s *Shards) readGroups(ctx context.Context, filter string) (map[string][]string, error) {
	found, err := onEvery(ctx, s, func(b *Bus) (map[string][]string, error) { return b.readGroupsHere(ctx, filter) })
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, groups := range found {
		for g, members := range groups {
			out[g] = append(out[g], members...)
		}
	}
	for g, members := range out {
		slices.Sort(members)
		out[g] = slices.Compact(members)
	}
	return out, nil
}

// onEvery calls read with the bus of every shard at once and returns what
// each found, in shard order, or the first error, naming its shard.
func onEvery[T any](ctx context.Context, s *Shards, read func(*Bus) (T, error)) ([]T, error) {
	buses, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	found, errs := make([]T, len(buses)), make([]error, len(buses))
	var wg sync.WaitGroup
	for k, b := range buses {
		wg.Go(func() { found[k], errs[k] = read(b) })
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", buses[k].Subjects().Root(), err)
		}
	}
	return found, nil
}

// ownEntries is Bus.ownEntries on every shard at once, merged in order:
// the agent's messages of a conversation are on the shards of the agents
// it sent them to and on its own.
func (s *Shards) ownEntries(ctx context.Context, correlationID string, filters []string) ([]HistoryEntry, int, error) {
	type part struct {
		entries []HistoryEntry
		records int
	}
	parts, err := onEvery(ctx, s, func(b *Bus) (part, error) {
		entries, records, err := b.ownEntries(ctx, correlationID, filters)
		return part{entries, records}, err
	})
	if err != nil {
		return nil, 0, err
	}
	var (
		all     []HistoryEntry
		records int
		seen    = make(map[recordOf]bool)
	)
	for _, k := range s.homeFirst() {
		for _, e := range parts[k].entries {
			// A broadcast is stored on every shard: the copy on this
			// agent's shard is its entry. Before 2026-11-28 it was listed
			// once per shard, and with copies alike to the nanosecond and
			// the sequence a page's cursor named them all, so paging
			// never ended.
			if r := (recordOf{e.ID, e.From, e.To}); e.To != Broadcast || !seen[r] {
				seen[r] = true
				all = append(all, e)
			}
		}
		records += parts[k].records
	}
	slices.SortFunc(all, compareEntries)
	return all, records, nil
}

// homeFirst returns the shard indexes, this agent's own first.
func (s *Shards) homeFirst() []int {
	out := make([]int, 0, s.n)
	out = append(out, s.home)
	for k := range s.n {
		if k != s.home {
			out = append(out, k)
		}
	}
	return out
}

// readOwn is Bus.readOwn of each shard, at once, for the entries its
// stream holds.
func (s *Shards) readOwn(ctx context.Context, entries []HistoryEntry) error {
	at := make(map[string][]int) // the entries of each stream, by index
	for i, e := range entries {
		at[e.Stream] = append(at[e.Stream], i)
	}
	_, err := onEvery(ctx, s, func(b *Bus) (struct{}, error) {
		mine := at[b.Subjects().Stream()]
		if len(mine) == 0 {
			return struct{}{}, nil
		}
		part := make([]HistoryEntry, len(mine))
		for j, i := range mine {
			part[j] = entries[i]
		}
		err := b.readOwn(ctx, part)
		for j, i := range mine {
			entries[i] = part[j]
		}
		return struct{}{}, err
	})
	return err
}

// watchEvery runs watch on every shard at once, with f called for one
// change at a time, until ctx ends (it returns nil then) or a watch fails,
// which ends the others and returns its error, naming its shard.
func watchEvery[T any](ctx context.Context, s *Shards, f func(T), watch func(context.Context, *Bus, func(T)) error) error {
	buses, err := s.all(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	one := func(v T) {
		mu.Lock()
		defer mu.Unlock()
		f(v)
	}
	errs := make([]error, len(buses))
	var wg sync.WaitGroup
	for k, b := range buses {
		wg.Go(func() {
			if errs[k] = watch(ctx, b, one); errs[k] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			return fmt.Errorf("shard %s: %w", buses[k].Subjects().Root(), err)
		}
	}
	return nil
}

// cancel is Bus.Cancel on every shard at once: the one that holds message
// id's records cancels it (every one, for a scheduled broadcast).
func (s *Shards) cancel(ctx context.Context, id string) (Status, error) {
	type outcome struct {
		st  Status
		err error
	}
	found, err := onEvery(ctx, s, func(b *Bus) (outcome, error) {
		st, err := b.cancelHere(ctx, id)
		return outcome{st, err}, nil
	})
	if err != nil {
		return Status{}, err
	}
	// The shard that found it (canceled, or why not: ErrFinal, ...), else
	// the first that could not read its stream, else none has it.
	var unread *outcome
	for i, o := range found {
		switch {
		case errors.Is(o.err, ErrNoStatus):
		case errors.Is(o.err, errStreamUnread):
			if unread == nil {
				unread = &found[i]
			}
		default:
			return o.st, o.err
		}
	}
	if unread != nil {
		return unread.st, unread.err
	}
	return Status{}, fmt.Errorf("%w: %s on %d shards", ErrNoStatus, id, s.n)
}

// installationRecord is what the operator records in each shard's
// registry (subjects.InstallationKey) when it provisions an installation
// split into shards (StreamConfig.Shards).
type installationRecord struct {
	Shards int `json:"shards"`
}

// recordShards records in root's registry that root is one of shards
// shards. With keep (a bus or agentbus serve provisioning as it starts),
// a root recorded with another number is refused; without it
// (Admin.Provision, agentbus provision) the operator's number replaces it.
func recordShards(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, root string, shards int, keep bool) error {
	s, _ := subjects.New(root) // checked by StreamConfig.Validate
	have, err := readShards(ctx, nc, reconnectsOf(js), s)
	switch {
	case err != nil:
		return err
	case have == shards:
		return nil
	case have != 0 && keep:
		return fmt.Errorf("%w: root %s is one of %d shards, not %d", ErrShardCount, root, have, shards)
	}
	data, _ := json.Marshal(installationRecord{Shards: shards})
	if _, err := publishAgain(ctx, js, &nats.Msg{Subject: s.RegistrySubjectPrefix() + subjects.InstallationKey, Data: data}); err != nil {
		return fmt.Errorf("record the installation's shards in %s: %w", s.RegistryBucket(), err)
	}
	return nil
}

// readShards returns the number of shards recorded in the registry of s
// (subjects.InstallationKey), 0 when none is: a root not split, or
// provisioned before 2026-11-28.
func readShards(ctx context.Context, nc *nats.Conn, r *reconnects, s subjects.Scheme) (int, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	resp, err := directGetKey(ctx, nc, r, s.RegistryDirectGetPrefix(), subjects.InstallationKey)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return 0, nil // no registry: New says what is missing
	case err != nil:
		return 0, fmt.Errorf("read the installation's shards in %s: %w", s.RegistryBucket(), err)
	case resp == nil:
		return 0, nil // none recorded
	}
	var rec installationRecord
	if err := json.Unmarshal(resp.Data, &rec); err != nil || rec.Shards < 0 || rec.Shards > subjects.MaxShards {
		return 0, fmt.Errorf("read the installation's shards in %s: not a record of shards: %q", s.RegistryBucket(), resp.Data)
	}
	return rec.Shards, nil
}

// checkShards returns ErrShardCount when c's root is recorded as one of
// another number of shards than shards.
func (c *client) checkShards(ctx context.Context, shards int) error {
	have, err := readShards(ctx, c.nc, c.reconnects, c.opts.scheme)
	if err != nil {
		return err
	}
	if have > 1 && have != shards {
		return fmt.Errorf("%w: root %s is one of %d shards; this process was given %d", ErrShardCount, c.opts.scheme.Root(), have, shards)
	}
	return nil
}

// checkOwnShard returns ErrShardCount when b's root is one shard of an
// installation (recorded by its operator) and not b's agent's shard: a
// bus made with New or Connect on a shard's root, whose consumers there
// would never be sent to.
func (b *Bus) checkOwnShard(ctx context.Context) error {
	base, k, ok := subjects.ParseShardRoot(b.opts.scheme.Root())
	if !ok {
		return nil // no shard's root: no read
	}
	have, err := readShards(ctx, b.nc, b.reconnects, b.opts.scheme)
	if err != nil || have <= 1 {
		return err
	}
	if want, _ := subjects.ShardOf(b.agent, have); want != k {
		root, _ := subjects.ShardRoot(base, want, have)
		return fmt.Errorf("%w: agent %s lives on shard %d of %d (root %s), not on root %s: use NewShards or ConnectShards", ErrShardCount, b.agent, want, have, root, b.opts.scheme.Root())
	}
	return nil
}

// CheckShards returns ErrShardCount when the operator recorded the
// handle's root as one shard of an installation of another number of
// shards than shards (StreamConfig.Shards); nil when the numbers agree or
// nothing is recorded. The agentbus commands given --shards check each
// shard they reach with it.
func (a *Admin) CheckShards(ctx context.Context, shards int) error {
	if a.isClosed() {
		return ErrClosed
	}
	return a.checkShards(ctx, shards)
}
