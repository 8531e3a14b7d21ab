package bus

import (
	"context"
	"fmt"
	"strconv"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
	"github.com/nats-io/nats.go"
)

// Delivery is one message handed to a Handler, with where it came from.
type Delivery struct {
	// Message is the decoded message.
	Message
	// Subject is the subject the message was published on.
	Subject string
	// Stream and Consumer name the stream and durable consumer it came from.
	Stream, Consumer string
	// Sequence is the message's stream sequence.
	Sequence uint64
	// Deliveries counts the deliveries of this message, 1 for the first.
	Deliveries int
	// Replayed reports a message replayed from the dead-letter stream.
	Replayed bool
	// Late reports a reply to a Request that arrived after the requester's
	// deadline (see ExtReplyBy): the Request gave up waiting for it.
	Late bool

	bus *Bus // the bus it was delivered to, which Reply answers with
}

// Reply answers d with m, on the bus that delivered d: Bus.Reply(ctx,
// &d.Message, m). Inside the handler of d, pass the handler's ctx.
func (d *Delivery) Reply(ctx context.Context, m Message) (PubAck, error) {
	if d.bus == nil {
		return PubAck{}, fmt.Errorf("%w: reply to a delivery the bus did not make", ErrInvalidMessage)
	}
	return d.bus.Reply(ctx, &d.Message, m)
}

// Handler handles one delivery. Returning nil acknowledges the message.
// Returning an error makes the server redeliver it after a backoff, until
// its last allowed delivery, when it is terminated; Permanent(err)
// terminates it at once. An error after the handler replied (Reply)
// acknowledges the message all the same, and goes to the error handler.
// ctx is cancelled when the subscription stops.
//
// The Delivery's Data and Extensions are shared with the bus, which
// settles the message by them after the handler returns (its dead letter,
// the notice to a waiting requester): copy them before changing them,
// as a forwarded message built from d.Message must.
type Handler func(ctx context.Context, d *Delivery) error

// Subscription consumes the agent's inbox: its direct messages and the
// broadcasts, at all five priority levels.
type Subscription struct {
	b *Bus
	d *consumers.Dispatcher
	// notices takes cancel notices as they are published, so that a
	// running handler is cancelled even while every handler slot is busy;
	// the stored copy comes through the dispatcher later.
	notices []*nats.Subscription
	// watch adds the lanes of the priorities that have no consumer yet.
	watch *laneWatch
}

// Stop stops consuming at once: messages held in memory are given back for
// redelivery and running handlers' contexts are cancelled. It does not wait;
// Done is closed when the last handler returned. Stop is idempotent.
func (s *Subscription) Stop() { s.watch.stop(); s.d.Stop(); s.forget() }

// Drain stops fetching, gives back the messages held in memory and waits for
// running handlers to finish and their messages to be settled. If ctx ends
// first it stops like Stop and returns ctx's error. A handler of the
// subscription that drains it waits for itself, until ctx ends: it calls
// Drain on a goroutine of its own (go sub.Drain(ctx)), or Stop.
func (s *Subscription) Drain(ctx context.Context) error {
	s.watch.stop()
	err := s.d.Drain(ctx)
	s.forget()
	if err != nil {
		return err
	}
	select {
	case <-s.watch.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done is closed when the subscription has stopped and every message it
// received is settled or given back.
func (s *Subscription) Done() <-chan struct{} { return s.watch.done }

// Buffered returns how many messages this process holds in memory waiting
// for a handler at each priority: Buffered()[0] is priority 1.
func (s *Subscription) Buffered() []int { return s.d.Buffered() }

func (s *Subscription) forget() {
	unsubscribe(s.notices)
	s.b.mu.Lock()
	delete(s.b.subs, s)
	s.b.mu.Unlock()
}

// listenForCancels subscribes to the cancel notices to the agent as they
// are published, on indexed subjects and others.
func (b *Bus) listenForCancels() ([]*nats.Subscription, error) {
	filters, err := b.opts.scheme.TypeFilters(b.agent, TypeCancel, 1)
	if err != nil {
		return nil, err
	}
	take := func(nm *nats.Msg) {
		m, err := codec.Decode(nm.Header, nm.Data)
		if err != nil {
			return // the stored copy is dead-lettered through the dispatcher
		}
		if _, err := b.checkSender(nm.Subject, m); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
		defer cancel()
		b.takeNotice(ctx, m)
	}
	var subs []*nats.Subscription
	for _, f := range filters {
		sub, err := b.nc.Subscribe(f, take)
		if err != nil {
			unsubscribe(subs)
			return nil, err
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// unsubscribe ends the subscriptions subs.
func unsubscribe(subs []*nats.Subscription) {
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
}

// Subscribe starts consuming the agent's inbox: its direct messages and the
// broadcasts, through one durable consumer per priority for the direct
// messages and one for the broadcasts (see docs/subjects.md), and runs h on
// each message in priority order: with the default Strict policy the
// highest-priority message waiting always starts next, and messages of one
// priority, direct and broadcast together, start in the order they were
// published.
//
// It creates the broadcast consumer, and the direct consumer of every
// priority the stream holds a message for, if missing, and updates those
// whose settings differ; the direct consumer of any other priority is
// created when its first message comes (a consumer costs the server memory
// whether it is read or not). Nothing sent before is lost either way:
// direct messages wait for the agent in the stream from the first one on.
//
// Several processes of one agent may subscribe at once; they share the
// consumers and so split the work. Messages that expired before delivery,
// that cannot be decoded, and the agent's own broadcasts never reach h.
//
// ctx bounds the setting up (10 s if it has no deadline), not the
// subscription, which runs until Subscription.Stop or Bus.Close.
//
// Errors: ErrInvalidOption, ErrNotProvisioned, ErrClosed, or the server's.
func (b *Bus) Subscribe(ctx context.Context, h Handler, opts ...SubscribeOption) (*Subscription, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrInvalidOption)
	}
	o := subscribeOptions{concurrency: 1} // prefetch 0: adaptive
	for _, opt := range opts {
		if opt == nil {
			continue // an option left unset: none
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if most := MaxConcurrency(o.settings.MaxAckPending); o.concurrency > most {
		return nil, fmt.Errorf("%w: concurrency %d, but the agent's %d consumers hand out at most %d messages at once (WithMaxAckPending); the other handlers could never run",
			ErrInvalidOption, o.concurrency, subjects.ConsumersPerAgent, most)
	}
	if b.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	// The notices published from now on are heard (the watches' flush
	// below makes sure the server has the subscriptions); those stored
	// before are read before the first message is handled.
	notices, err := b.listenForCancels()
	if err != nil {
		return nil, b.closedBy(fmt.Errorf("listen for cancel notices: %w", err))
	}
	w, err := b.watchPriorities(ctx, o)
	if err != nil {
		unsubscribe(notices)
		return nil, b.closedBy(err)
	}
	lanes, p1, err := b.ensureConsumers(ctx, b.agent, o, false)
	if err != nil {
		w.unwatch()
		unsubscribe(notices)
		return nil, b.closedBy(err)
	}
	b.takeQueuedNotices(ctx, p1)
	stream := b.opts.scheme.Stream()
	dopts := consumers.Options{
		Concurrency: o.concurrency,
		Prefetch:    o.prefetch,
		Policy:      o.policy,
		Weights:     o.weights,
		LevelOf:     b.levelOf,
		AckWait:     o.settings.AckWait,
		OnError:     b.opts.onError,
		Logger:      b.opts.logger,
	}
	d, err := consumers.Start(b.nc, stream, subjects.LowestPriority, lanes, b.deliver(h, o), dopts)
	if err != nil {
		w.unwatch()
		unsubscribe(notices)
		if b.isClosed() || b.nc.IsClosed() {
			return nil, b.closedBy(err) // not the options': the connection
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	w.start(d, lanes)
	b.takeMissedNotices(d)
	s := &Subscription{b: b, d: d, watch: w, notices: notices}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		s.Stop()
		<-s.Done()
		return nil, ErrClosed
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	return s, nil
}

// EnsureConsumers makes sure the agent's durable consumers that are due
// exist, with the settings opts give (as Subscribe would), without
// consuming anything: its broadcast consumer, and the direct consumer of
// every priority the stream holds a message for. Messages sent to an agent
// wait for it from its first message on; the broadcasts wait for it only
// from the moment its broadcast consumer exists, so a new agent is not
// handed the broadcasts of the past. Admin.EnsureConsumers creates all six
// for any agent, with an operator's identity.
//
// Errors: ErrInvalidOption, ErrNotProvisioned, ErrClosed, or the server's.
func (b *Bus) EnsureConsumers(ctx context.Context, opts ...SubscribeOption) error {
	return b.client.ensureConsumersOf(ctx, b.agent, opts, false)
}

// ensureConsumersOf is EnsureConsumers for agent, of all six consumers
// when all is set.
func (b *client) ensureConsumersOf(ctx context.Context, agent string, opts []SubscribeOption, all bool) error {
	o := subscribeOptions{concurrency: 1}
	for _, opt := range opts {
		if opt == nil {
			continue // an option left unset: none
		}
		if err := opt(&o); err != nil {
			return err
		}
	}
	if b.isClosed() {
		return ErrClosed
	}
	_, _, err := b.ensureConsumers(ctx, agent, o, all)
	return b.closedBy(err)
}

// consumerSpecs describes the six durable consumers an agent may have (see
// subjects.Scheme.Consumers) and the dispatcher lane each one is: a direct
// consumer is the level of its priority, the broadcast consumer serves
// every level, each broadcast placed by the priority in its subject.
func consumerSpecs(scheme subjects.Scheme, agent string) ([]consumers.Spec, []consumers.Lane, error) {
	cs, err := scheme.Consumers(agent)
	if err != nil {
		return nil, nil, err
	}
	specs := make([]consumers.Spec, len(cs))
	lanes := make([]consumers.Lane, len(cs))
	for i, c := range cs {
		kind, priority, level := "direct", strconv.Itoa(c.Priority), c.Priority-1
		desc := fmt.Sprintf("agentbus direct inbox of %q at priority %d", agent, c.Priority)
		if c.Broadcast {
			kind, priority, level = "broadcast", "all", consumers.AnyLevel
			desc = fmt.Sprintf("agentbus broadcasts to %q", agent)
		}
		specs[i] = consumers.Spec{
			Name:          c.Name,
			FilterSubject: c.Filter,
			NewOnly:       c.Broadcast,
			Description:   desc,
			Metadata: map[string]string{
				"agentbus_agent":    agent,
				"agentbus_priority": priority,
				"agentbus_kind":     kind,
			},
		}
		lanes[i] = consumers.Lane{Consumer: c.Name, Level: level}
	}
	return specs, lanes, nil
}

// levelOf is the dispatcher level of a broadcast: its priority's, or the
// lowest for a subject without one (the handler dead-letters it).
func (b *Bus) levelOf(subject string) int {
	if p := b.opts.scheme.PriorityOf(subject); p > 0 {
		return p - 1
	}
	return subjects.LowestPriority - 1
}
