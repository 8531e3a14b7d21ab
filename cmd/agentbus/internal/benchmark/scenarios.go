package benchmark

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

// message returns a bus message of the run's payload to agent to; priority
// 0 is the bus's default.
func (r *runner) message(to string, priority int) bus.Message {
	return bus.Message{To: to, Type: messageType, Priority: priority, Data: r.payload}
}

// rawSubject returns the raw side's subject of a message to receiverAgent
// at priority p: the bus's subject under the raw root.
func (e *env) rawSubject(p int) (string, error) {
	return e.raw.Direct(receiverAgent, senderAgent, messageType, p)
}

// async compares asynchronous publish throughput: Messages published as
// fast as the client allows, until the last is acknowledged.
func (r *runner) async(ctx context.Context, e *env) error {
	n := r.cfg.Messages
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	headers, err := busHeaders(r.payload)
	if err != nil {
		return err
	}
	busRate, err := timed(n, func() error {
		return publishBusAsync(ctx, e.sender, n, func(int) bus.Message { return r.message(receiverAgent, 0) })
	})
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawRate, err := timed(n, func() error {
		return publishRawAsync(ctx, e.js, n, func(int) *nats.Msg { return &nats.Msg{Subject: subject, Data: r.payload} })
	})
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	headersRate, err := timed(n, func() error {
		return publishRawAsync(ctx, e.js, n, func(int) *nats.Msg {
			return &nats.Msg{Subject: subject, Header: headers(), Data: r.payload}
		})
	})
	if err != nil {
		return fmt.Errorf("raw+headers: %w", err)
	}
	r.report.Async = &Throughput{
		Messages: n, BusMsgsPerSec: busRate, RawMsgsPerSec: rawRate, RawHeadersMsgsPerSec: &headersRate,
		RatioBusRaw: Ratio(busRate, rawRate), RatioBusRawHeaders: Ratio(busRate, headersRate),
	}
	return nil
}

// sync compares the latency of synchronous publishes, one after another.
func (r *runner) sync(ctx context.Context, e *env) error {
	n := r.cfg.Messages
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	busLat, err := latencies(n, func(int) error {
		_, err := e.sender.Publish(ctx, r.message(receiverAgent, 0))
		return err
	})
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawLat, err := latencies(n, func(int) error {
		_, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: r.payload})
		return err
	})
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	r.report.Sync = newLatency(n, 0, busLat, rawLat)
	return nil
}

// consume compares how fast a subscriber handles and acks a backlog of
// Messages, from the first message handled to the last.
func (r *runner) consume(ctx context.Context, e *env) error {
	n := r.cfg.Messages
	if err := publishBusAsync(ctx, e.sender, n, func(int) bus.Message { return r.message(receiverAgent, 0) }); err != nil {
		return fmt.Errorf("bus backlog: %w", err)
	}
	busT, err := e.drainBus(ctx, n, func(*bus.Delivery) int64 { return 0 }, bus.WithPrefetch(ConsumePrefetch))
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	if err := publishRawAsync(ctx, e.js, n, func(int) *nats.Msg { return &nats.Msg{Subject: subject, Data: r.payload} }); err != nil {
		return fmt.Errorf("raw backlog: %w", err)
	}
	rawT, err := e.drainRaw(ctx, "bench-consume", n, func(jetstream.Msg) int64 { return 0 })
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	busRate, rawRate := busT.rate(), rawT.rate()
	r.report.Consume = &Throughput{Messages: n, BusMsgsPerSec: busRate, RawMsgsPerSec: rawRate, RatioBusRaw: Ratio(busRate, rawRate)}
	return nil
}

// e2e compares the time from the publish call to the handler's start, at
// a fixed publish rate, with a subscriber of default settings waiting.
func (r *runner) e2e(ctx context.Context, e *env) error {
	n := r.cfg.endToEndMessages()
	busLat, err := r.endToEnd(ctx, n,
		func(t *tally) (func(), error) {
			return e.subscribeBus(ctx, receiverAgent, t, func(d *bus.Delivery) int64 { return int64(since(r.epoch, d.Data)) })
		},
		func(int) error {
			_, err := unstalled(ctx, e.sender.PublishAsyncComplete, func() (*bus.PublishFuture, error) {
				return e.sender.PublishAsync(ctx, bus.Message{To: receiverAgent, Type: messageType, Data: stamp(r.epoch, r.cfg.Size)})
			})
			return err
		})
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	rawLat, err := r.endToEnd(ctx, n,
		func(t *tally) (func(), error) {
			return e.consumeRaw(ctx, "bench-e2e", e.rawFilter(), t, func(m jetstream.Msg) int64 { return int64(since(r.epoch, m.Data())) })
		},
		func(int) error {
			_, err := unstalled(ctx, e.js.PublishAsyncComplete, func() (jetstream.PubAckFuture, error) {
				return e.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: stamp(r.epoch, r.cfg.Size)})
			})
			return err
		})
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	r.report.E2E = newLatency(n, r.cfg.Rate, busLat, rawLat)
	return nil
}

// endToEnd starts a receiver with subscribe, which records each message's
// latency in nanoseconds, sends n messages with send at the run's rate and
// returns the latencies once all arrived.
func (r *runner) endToEnd(ctx context.Context, n int, subscribe func(*tally) (stop func(), err error), send func(i int) error) ([]time.Duration, error) {
	t := newTally(n)
	stop, err := subscribe(t)
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := paced(ctx, n, r.cfg.Rate, send); err != nil {
		return nil, err
	}
	if err := t.wait(ctx); err != nil {
		return nil, err
	}
	values := t.snapshot()
	out := make([]time.Duration, len(values))
	for i, v := range values {
		out[i] = time.Duration(v)
	}
	return out, nil
}

// backlogPriority is the priority of the i-th message of the priority
// scenario's backlog: 5, 4, 3, 2, 1, 5, 4, ... so that in stream order
// every message but the priority-1 ones and the last few has a more urgent
// one behind it.
func backlogPriority(i int) int {
	return subjects.LowestPriority - i%subjects.LowestPriority
}

// priority compares the priority inversions of draining a backlog of mixed
// priorities sent to an agent while it was offline: the bus's Strict
// dispatch against one raw consumer over all of the agent's subjects, which
// delivers in stream order.
func (r *runner) priority(ctx context.Context, e *env) error {
	n := r.cfg.Messages
	if err := publishBusAsync(ctx, e.sender, n, func(i int) bus.Message { return r.message(receiverAgent, backlogPriority(i)) }); err != nil {
		return fmt.Errorf("bus backlog: %w", err)
	}
	busT, err := e.drainBus(ctx, n, func(d *bus.Delivery) int64 { return int64(d.Priority) })
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	var subjectOf [subjects.LowestPriority + 1]string
	for p := subjects.HighestPriority; p <= subjects.LowestPriority; p++ {
		if subjectOf[p], err = e.rawSubject(p); err != nil {
			return err
		}
	}
	if err := publishRawAsync(ctx, e.js, n, func(i int) *nats.Msg { return &nats.Msg{Subject: subjectOf[backlogPriority(i)], Data: r.payload} }); err != nil {
		return fmt.Errorf("raw backlog: %w", err)
	}
	rawT, err := e.drainRaw(ctx, "bench-priority", n, func(m jetstream.Msg) int64 {
		a, _ := e.raw.Parse(m.Subject()) // a subject built above
		return int64(a.Priority)
	})
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	busInv, rawInv := CountInversions(busT.snapshot()), CountInversions(rawT.snapshot())
	r.report.Priority = &Inversions{Messages: n, BusInversions: busInv, RawInversions: rawInv, RatioBusRaw: Ratio(float64(busInv), float64(rawInv))}
	return nil
}

// setup compares the time to set up the consumers of Agents agents.
func (r *runner) setup(ctx context.Context, e *env) error {
	agents := make([]string, r.cfg.Agents)
	for i := range agents {
		agents[i] = fmt.Sprintf("bench-agent-%d", i)
	}
	busTime, err := e.setupBus(ctx, agents)
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawTime, err := e.setupRaw(ctx, agents)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	busConsumers, err := e.consumerCount(ctx, e.bus.Stream())
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawConsumers, err := e.consumerCount(ctx, e.raw.Stream())
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	busMs, rawMs := millis(busTime), millis(rawTime)
	r.report.Setup = &SetupTime{
		Agents: len(agents), BusConsumers: busConsumers, RawConsumers: rawConsumers,
		BusMillis: busMs, RawMillis: rawMs, RatioBusRaw: Ratio(busMs, rawMs),
	}
	return nil
}

// rawFilter returns the filter of every direct message to receiverAgent on
// the raw side.
func (e *env) rawFilter() string {
	f, _ := e.raw.AgentFilter(receiverAgent) // a valid constant ID
	return f
}

// drainBus subscribes receiverAgent on the bus side with opts, waits until
// its handler ran n times, recording value of each delivery, and stops.
func (e *env) drainBus(ctx context.Context, n int, value func(*bus.Delivery) int64, opts ...bus.SubscribeOption) (*tally, error) {
	t := newTally(n)
	stop, err := e.subscribeBus(ctx, receiverAgent, t, value, opts...)
	if err != nil {
		return nil, err
	}
	defer stop()
	return t, t.wait(ctx)
}

// drainRaw consumes every direct message to receiverAgent on the raw side
// with one durable consumer called name, waits until its handler ran n
// times, recording value of each message, and stops.
func (e *env) drainRaw(ctx context.Context, name string, n int, value func(jetstream.Msg) int64) (*tally, error) {
	t := newTally(n)
	stop, err := e.consumeRaw(ctx, name, e.rawFilter(), t, value)
	if err != nil {
		return nil, err
	}
	defer stop()
	return t, t.wait(ctx)
}

// setupBus subscribes every agent on one connection, one agent after
// another, and returns how long that took. It stops the subscriptions
// before it returns; their durable consumers stay.
func (e *env) setupBus(ctx context.Context, agents []string) (time.Duration, error) {
	nc, err := e.connect()
	if err != nil {
		return 0, err
	}
	subs := make([]*bus.Subscription, 0, len(agents))
	defer func() { stopAll(subs) }()
	start := time.Now()
	for _, a := range agents {
		b, err := e.newBus(nc, a)
		if err != nil {
			return 0, err
		}
		sub, err := b.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
		if err != nil {
			return 0, fmt.Errorf("subscribe %s: %w", a, err)
		}
		subs = append(subs, sub)
	}
	return time.Since(start), nil
}

// stopAll stops every subscription at once and waits until all stopped.
func stopAll(subs []*bus.Subscription) {
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Go(func() { s.Stop(); <-s.Done() })
	}
	wg.Wait()
}

// setupRaw creates on the raw side the durable consumers the bus creates
// for each agent (rawConsumers), one agent after another and each agent's
// consumers at once, as the bus does, and returns how long that took.
func (e *env) setupRaw(ctx context.Context, agents []string) (time.Duration, error) {
	start := time.Now()
	for _, a := range agents {
		cfgs, err := rawConsumers(e.raw, a)
		if err != nil {
			return 0, err
		}
		errs := make([]error, len(cfgs))
		var wg sync.WaitGroup
		for i, cfg := range cfgs {
			wg.Go(func() {
				if _, err := e.js.CreateOrUpdateConsumer(ctx, e.raw.Stream(), cfg); err != nil {
					errs[i] = fmt.Errorf("create consumer %s: %w", cfg.Durable, err)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// rawConsumers returns the configurations of the durable consumers the bus
// creates for agent, under the scheme s: the names and filters of
// s.Consumers with the bus's default settings.
func rawConsumers(s subjects.Scheme, agent string) ([]jetstream.ConsumerConfig, error) {
	cs, err := s.Consumers(agent)
	if err != nil {
		return nil, err
	}
	out := make([]jetstream.ConsumerConfig, len(cs))
	for i, c := range cs {
		out[i] = jetstream.ConsumerConfig{
			Durable:       c.Name,
			FilterSubject: c.Filter,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       bus.DefaultAckWait,
			MaxDeliver:    bus.DefaultMaxDeliver,
			MaxAckPending: bus.DefaultMaxAckPending,
		}
	}
	return out, nil
}

// millis returns d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
