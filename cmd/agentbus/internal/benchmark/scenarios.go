package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
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
	t, err := r.publishThroughput(ctx, e, e.sender, true)
	r.report.Async = t
	return err
}

// asyncUntracked is async with lifecycle tracking off on the bus side.
func (r *runner) asyncUntracked(ctx context.Context, e *env) error {
	sender, err := e.newBus(e.admin, senderAgent, bus.WithoutLifecycle())
	if err != nil {
		return err
	}
	t, err := r.publishThroughput(ctx, e, sender, false)
	r.report.AsyncUntracked = t
	return err
}

// publishThroughput measures async publish throughput of sender against
// raw nats.go, bare and with the bus's headers on the subjects sender
// uses: indexed (lifecycle tracking) or not.
func (r *runner) publishThroughput(ctx context.Context, e *env, sender *bus.Bus, indexed bool) (*Throughput, error) {
	n := r.cfg.Messages
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return nil, err
	}
	next, err := busMessages(r.payload, subject, indexed)
	if err != nil {
		return nil, err
	}
	rates, cpu, err := balanced(n,
		func(k int) error {
			return publishBusAsync(ctx, sender, k, func(int) bus.Message { return r.message(receiverAgent, 0) })
		},
		func(k int) error {
			return publishRawAsync(ctx, e.js, k, func(int) *nats.Msg { return &nats.Msg{Subject: subject, Data: r.payload} })
		},
		func(k int) error { return publishRawAsync(ctx, e.js, k, func(int) *nats.Msg { return next() }) })
	if err != nil {
		return nil, err
	}
	return newThroughput(n, rates, cpu), nil
}

// newThroughput returns the throughput of n messages a side at rates, with
// the CPU per message cpu (nil where it was not read): each the bus's,
// raw's and raw+headers', in that order.
func newThroughput(n int, rates, cpu []float64) *Throughput {
	busRate, rawRate, headersRate := rates[0], rates[1], rates[2]
	t := &Throughput{
		Messages: n, BusMsgsPerSec: busRate, RawMsgsPerSec: rawRate, RawHeadersMsgsPerSec: &headersRate,
		RatioBusRaw: Ratio(busRate, rawRate), RatioBusRawHeaders: Ratio(busRate, headersRate),
	}
	if cpu != nil {
		t.CPU = &CPUPerMessage{BusMicros: cpu[0], RawMicros: cpu[1], RawHeadersMicros: cpu[2],
			RatioBusRaw: Ratio(cpu[0], cpu[1]), RatioBusRawHeaders: Ratio(cpu[0], cpu[2])}
	}
	return t
}

// sync compares the latency of synchronous publishes, one after another:
// the bus's Publish, raw nats.go's PublishMsg of the bare payload, and of
// the bus's headers on the subject the bus uses (indexed), each timed from
// making its message to its ack, taking turns (interleaved).
func (r *runner) sync(ctx context.Context, e *env) error {
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	next, err := busMessages(r.payload, subject, true)
	if err != nil {
		return err
	}
	lat, err := interleaved(r.cfg.Messages,
		func(int) error { _, err := e.sender.Publish(ctx, r.message(receiverAgent, 0)); return err },
		func(int) error {
			_, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: r.payload})
			return err
		},
		func(int) error { _, err := e.js.PublishMsg(ctx, next()); return err })
	if err != nil {
		return err
	}
	r.report.Sync = newLatency(r.cfg.Messages, 0, lat[0], lat[1]).withRawHeaders(lat[2])
	return nil
}

// consume compares how fast a subscriber handles and acks a backlog of
// Messages, from the first message handled to the last, with a prefetch of
// ConsumePrefetch.
func (r *runner) consume(ctx context.Context, e *env) error {
	t, err := r.consumeThroughput(ctx, e, nil, bus.WithPrefetch(ConsumePrefetch))
	r.report.Consume = t
	return err
}

// consumeDefaults is consume with a Subscribe without options.
func (r *runner) consumeDefaults(ctx context.Context, e *env) error {
	t, err := r.consumeThroughput(ctx, e, nil)
	r.report.ConsumeDefaults = t
	return err
}

// consumeUntracked is consume with lifecycle tracking off on the bus side,
// for the sender of the backlog and for the subscriber.
func (r *runner) consumeUntracked(ctx context.Context, e *env) error {
	t, err := r.consumeThroughput(ctx, e, []bus.Option{bus.WithoutLifecycle()}, bus.WithPrefetch(ConsumePrefetch))
	r.report.ConsumeUntracked = t
	return err
}

// consumeThroughput measures how fast a bus subscriber of receiverAgent
// (a bus with busOpts, subscribed with opts) drains a backlog, against a
// raw consumer of the bare payload and a raw consumer of messages with the
// bus's headers that decodes each event. Each side drains two backlogs, of
// half of Messages each (mirrored), every one published just before it.
func (r *runner) consumeThroughput(ctx context.Context, e *env, busOpts []bus.Option, opts ...bus.SubscribeOption) (*Throughput, error) {
	n := r.cfg.Messages
	sender := e.sender
	if len(busOpts) > 0 {
		var err error
		if sender, err = e.newBus(e.admin, senderAgent, busOpts...); err != nil {
			return nil, err
		}
	}
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return nil, err
	}
	// The backlog with headers goes to another raw agent, so that its
	// consumer does not see the bare one, on the subjects the bus's
	// backlog has.
	headersSubject, err := e.raw.Direct(otherReceiverAgent, senderAgent, messageType, subjects.DefaultPriority)
	if err != nil {
		return nil, err
	}
	next, err := busMessages(r.payload, headersSubject, len(busOpts) == 0)
	if err != nil {
		return nil, err
	}
	headersFilter, err := e.raw.AgentFilter(otherReceiverAgent)
	if err != nil {
		return nil, err
	}
	var undecodable atomic.Int64
	rates, cpu, err := drained(n,
		func(k int) (*tally, error) {
			if err := publishBusAsync(ctx, sender, k, func(int) bus.Message { return r.message(receiverAgent, 0) }); err != nil {
				return nil, fmt.Errorf("backlog: %w", err)
			}
			return e.drainBus(ctx, k, func(*bus.Delivery) int64 { return 0 }, busOpts, opts...)
		},
		func(k int) (*tally, error) {
			if err := publishRawAsync(ctx, e.js, k, func(int) *nats.Msg { return &nats.Msg{Subject: subject, Data: r.payload} }); err != nil {
				return nil, fmt.Errorf("backlog: %w", err)
			}
			return e.drainRaw(ctx, "bench-consume", e.rawFilter(), k, func(jetstream.Msg) int64 { return 0 })
		},
		func(k int) (*tally, error) {
			if err := publishRawAsync(ctx, e.js, k, func(int) *nats.Msg { return next() }); err != nil {
				return nil, fmt.Errorf("backlog: %w", err)
			}
			return e.drainRaw(ctx, "bench-consume-headers", headersFilter, k, func(m jetstream.Msg) int64 {
				if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
					undecodable.Add(1)
				}
				return 0
			})
		})
	if err != nil {
		return nil, err
	}
	if k := undecodable.Load(); k > 0 {
		return nil, fmt.Errorf("raw+headers: %d of %d messages did not decode", k, n)
	}
	return newThroughput(n, rates, cpu), nil
}

// e2e compares the time from the publish call to the handler's start, at
// a fixed publish rate, with a subscriber of default settings waiting;
// each side subscribes anew for each of its halves (mirrored).
func (r *runner) e2e(ctx context.Context, e *env) error {
	subject, err := e.rawSubject(subjects.DefaultPriority)
	if err != nil {
		return err
	}
	l, err := mirroredLatency(r.cfg.endToEndMessages(), r.cfg.Rate,
		func(k int) ([]time.Duration, error) {
			return r.endToEnd(ctx, k,
				func(t *tally) (func(), error) {
					return e.subscribeBus(ctx, receiverAgent, t, func(d *bus.Delivery) int64 { return int64(since(r.epoch, d.Data)) }, nil)
				},
				func(int) error {
					_, err := unstalled(ctx, e.sender.PublishAsyncComplete, func() (*bus.PublishFuture, error) {
						return e.sender.PublishAsync(ctx, bus.Message{To: receiverAgent, Type: messageType, Data: stamp(r.epoch, r.cfg.Size)})
					})
					return err
				})
		},
		func(k int) ([]time.Duration, error) {
			return r.endToEnd(ctx, k,
				func(t *tally) (func(), error) {
					return e.consumeRaw(ctx, "bench-e2e", e.rawFilter(), t, func(m jetstream.Msg) int64 { return int64(since(r.epoch, m.Data())) })
				},
				func(int) error {
					_, err := unstalled(ctx, e.js.PublishAsyncComplete, func() (jetstream.PubAckFuture, error) {
						return e.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: stamp(r.epoch, r.cfg.Size)})
					})
					return err
				})
		})
	r.report.E2E = l
	return err
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

// request compares the round trip of a request and its reply, one after
// another: bus Request to an agent whose handler answers with Reply, both
// agents subscribed with defaults, against raw nats.go doing the same hops
// (rawRoundTrips). Both sides' agents are set up first; then the round
// trips are made in two halves a side (mirrored).
func (r *runner) request(ctx context.Context, e *env) error {
	busTrips, err := e.busRoundTrips(ctx, r.payload)
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawTrips, err := e.rawRoundTrips(ctx, r.payload, nil)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	read, err := e.recordRead(ctx)
	if err != nil {
		return fmt.Errorf("raw+read: %w", err)
	}
	floorTrips, err := e.rawRoundTrips(ctx, r.payload, read)
	if err != nil {
		return fmt.Errorf("raw+read: %w", err)
	}
	n := r.cfg.requests()
	lat, err := mirrored(n, requestSides, busTrips, rawTrips, floorTrips)
	if err != nil {
		return err
	}
	r.report.Request = newLatency(n, 0, bothHalves(lat[0]), bothHalves(lat[1])).withFloor(bothHalves(lat[2]))
	return nil
}

// busRoundTrips subscribes requesterAgent and responderAgent on the bus
// side and returns trips, which makes k requests of payload from the one
// to the other and returns how long each took.
func (e *env) busRoundTrips(ctx context.Context, payload []byte) (trips func(k int) ([]time.Duration, error), err error) {
	subscribe := func(agent string, h func(b *bus.Bus) bus.Handler) (*bus.Bus, error) {
		nc, err := e.connect()
		if err != nil {
			return nil, err
		}
		b, err := e.newBus(nc, agent)
		if err != nil {
			return nil, err
		}
		sub, err := b.Subscribe(ctx, h(b))
		if err != nil {
			return nil, fmt.Errorf("subscribe %s: %w", agent, err)
		}
		e.onClose(func() { sub.Stop(); <-sub.Done() })
		return b, nil
	}
	if _, err := subscribe(responderAgent, func(b *bus.Bus) bus.Handler {
		return func(ctx context.Context, d *bus.Delivery) error {
			_, err := d.Reply(ctx, bus.Message{Type: replyType, Data: d.Data})
			return err
		}
	}); err != nil {
		return nil, err
	}
	// The requester is an agent like any other, subscribed to its inbox;
	// the stored copy of each reply reaches it too.
	requester, err := subscribe(requesterAgent, func(*bus.Bus) bus.Handler {
		return func(context.Context, *bus.Delivery) error { return nil }
	})
	if err != nil {
		return nil, err
	}
	trip := func(int) error {
		ctx, cancel := context.WithTimeout(ctx, stallTimeout)
		defer cancel()
		_, err := requester.Request(ctx, bus.Message{To: responderAgent, Type: requestType, Data: payload})
		return err
	}
	return func(k int) ([]time.Duration, error) { return latencies(k, trip) }, nil
}

// rawRoundTrips starts the raw side's responder and requester consumers
// and returns trips, which makes k round trips of payload, each the hops of
// a bus Request and Reply done with raw nats.go: the requester publishes
// the request, an event with the bus's headers and a unique Nats-Msg-Id,
// to the stream; the responder reads it with a durable pull consumer,
// decodes it, publishes the reply to the stream and acks; the requester
// reads the reply from a durable pull consumer of its own, decodes it and
// acks. Both consumers have the bus's consumer settings. With read (not
// nil), the responder also reads the request's record before it answers,
// the lifecycle I/O of the bus's floor. trips returns how long each round
// trip took.
func (e *env) rawRoundTrips(ctx context.Context, payload []byte, read *recordRead) (trips func(k int) ([]time.Duration, error), err error) {
	requester, responder := requesterAgent, responderAgent
	if read != nil {
		// Agents of their own: each side's consumers are its own.
		requester, responder = requesterAgent+"-read", responderAgent+"-read"
	}
	replySubject, err := e.raw.Direct(requester, responder, replyType, subjects.DefaultPriority)
	if err != nil {
		return nil, err
	}
	requestSubject, err := e.raw.Direct(responder, requester, requestType, subjects.DefaultPriority)
	if err != nil {
		return nil, err
	}
	var failures atomic.Int64 // replies the responder failed to send
	if err := e.consumeEvents(ctx, responder, func(js jetstream.JetStream, req *codec.Message) {
		if read != nil {
			if err := read.read(req); err != nil {
				failures.Add(1)
				return
			}
		}
		reply := &codec.Message{From: responder, To: req.From, Type: replyType, CausationID: req.ID, CorrelationID: req.CorrelationID, Data: req.Data}
		m, err := encodeEvent(replySubject, reply)
		if err == nil {
			_, err = js.PublishMsg(ctx, m)
		}
		if err != nil {
			failures.Add(1)
		}
	}); err != nil {
		return nil, err
	}
	replies := make(chan *codec.Message, 16)
	if err := e.consumeEvents(ctx, requester, func(_ jetstream.JetStream, m *codec.Message) { replies <- m }); err != nil {
		return nil, err
	}
	timeout := time.NewTimer(time.Hour)
	e.onClose(func() { timeout.Stop() })
	trip := func(int) error {
		req := &codec.Message{From: requester, To: responder, Type: requestType, Data: payload}
		m, err := encodeEvent(requestSubject, req)
		if err != nil {
			return err
		}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			return err
		}
		timeout.Reset(stallTimeout)
		for {
			select {
			case reply := <-replies:
				if reply.CausationID == req.ID {
					return nil
				}
			case <-timeout.C:
				return fmt.Errorf("no reply to request %s in %v (%d replies or record reads failed)", req.ID, stallTimeout, failures.Load())
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return func(k int) ([]time.Duration, error) { return latencies(k, trip) }, nil
}

// recordRead is the lifecycle I/O of a request that the bus's tracked
// round trip cannot do without, done with raw nats.go on a bucket
// configured as the bus's status bucket (docs/performance.md explains why
// only this): the responder's read of the request's record before it
// handles the request, which keeps Cancel's promise. Raw round trips with
// it are the floor of the bus's.
type recordRead struct {
	nc     *nats.Conn // the responder's, which reads
	scheme subjects.Scheme
}

// recordRead creates the raw side's status bucket and returns the read.
func (e *env) recordRead(ctx context.Context) (*recordRead, error) {
	cfg, err := bus.StreamConfig{Root: e.raw.Root()}.StatusBucketConfig()
	if err != nil {
		return nil, err
	}
	if _, err := e.js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return nil, fmt.Errorf("create raw status bucket: %w", err)
	}
	nc, err := e.connect()
	if err != nil {
		return nil, err
	}
	return &recordRead{nc: nc, scheme: e.raw}, nil
}

// read reads request m's record, as the responder's bus does before its
// handler runs, and decodes it; no record (the common case) is no error.
func (r *recordRead) read(m *codec.Message) error {
	key, err := subjects.StatusKey(m.ID, m.ID, m.From, m.To)
	if err != nil {
		return err
	}
	resp, err := r.nc.Request(r.scheme.StatusDirectGetPrefix()+key, nil, stallTimeout)
	if err != nil {
		return err
	}
	switch code := resp.Header.Get("Status"); code {
	case "":
		var st bus.Status
		return json.Unmarshal(resp.Data, &st)
	case "404":
		return nil
	default:
		return fmt.Errorf("read record of %s: %s %s", m.ID, code, resp.Header.Get("Description"))
	}
}

// consumeEvents consumes agent's direct messages at the default priority on
// the raw side, on a connection of its own, with the consumer the bus
// would create for them; it decodes each and passes it to f, with the
// connection's JetStream, before the ack. The consumption stops when the
// env closes.
func (e *env) consumeEvents(ctx context.Context, agent string, f func(jetstream.JetStream, *codec.Message)) error {
	cfgs, err := rawConsumers(e.raw, agent)
	if err != nil {
		return err
	}
	cs, _ := e.raw.Consumers(agent) // agent is valid: rawConsumers succeeded
	var cfg *jetstream.ConsumerConfig
	for i, c := range cs {
		if c.Priority == subjects.DefaultPriority && !c.Broadcast {
			cfg = &cfgs[i]
		}
	}
	if cfg == nil {
		return fmt.Errorf("no direct consumer of %s at priority %d", agent, subjects.DefaultPriority)
	}
	nc, err := e.connect()
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("raw consumer of %s: %w", agent, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, e.raw.Stream(), *cfg)
	if err != nil {
		return fmt.Errorf("create raw consumer %s: %w", cfg.Durable, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		msg, err := codec.Decode(m.Headers(), m.Data())
		if err != nil {
			_ = m.Term()
			return
		}
		f(js, msg)
		_ = m.Ack()
	})
	if err != nil {
		return fmt.Errorf("consume raw consumer %s: %w", cfg.Durable, err)
	}
	e.onClose(func() { cc.Stop(); <-cc.Closed() })
	return nil
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
	busT, err := e.drainBus(ctx, n, func(d *bus.Delivery) int64 { return int64(d.Priority) }, nil)
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
	rawT, err := e.drainRaw(ctx, "bench-priority", e.rawFilter(), n, func(m jetstream.Msg) int64 {
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

// setup compares the time to set up the consumers of Agents agents and,
// when Config.Memory is set, the memory that takes per agent, measured
// while every agent is set up.
func (r *runner) setup(ctx context.Context, e *env) error {
	agents := make([]string, r.cfg.Agents)
	for i := range agents {
		agents[i] = fmt.Sprintf("bench-agent-%d", i)
	}
	busTime, busMem, err := r.measureSetup(func() (time.Duration, func(), error) { return e.setupBus(ctx, agents) })
	if err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	rawTime, rawMem, err := r.measureSetup(func() (time.Duration, func(), error) {
		d, err := e.setupRaw(ctx, agents)
		return d, func() {}, err
	})
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
	s := &SetupTime{
		Agents: len(agents), BusConsumers: busConsumers, RawConsumers: rawConsumers,
		BusMillis: busMs, RawMillis: rawMs, RatioBusRaw: Ratio(busMs, rawMs),
	}
	if r.cfg.Memory != nil {
		perAgent := func(bytes float64) *float64 { v := bytes / 1024 / float64(len(agents)); return &v }
		s.Memory = r.cfg.MemoryName
		s.BusKiBPerAgent, s.RawKiBPerAgent = perAgent(busMem), perAgent(rawMem)
		s.RatioMemoryBusRaw = Ratio(*s.BusKiBPerAgent, *s.RawKiBPerAgent)
	}
	r.report.Setup = s
	return nil
}

// measureSetup runs setup, which returns how long it took and how to undo
// what it set up, and returns that time and, with Config.Memory, how much
// the memory grew between before setup and after it, before the undo.
func (r *runner) measureSetup(setup func() (time.Duration, func(), error)) (time.Duration, float64, error) {
	mem := func() (float64, error) {
		if r.cfg.Memory == nil {
			return 0, nil
		}
		m, err := r.cfg.Memory()
		if err != nil {
			return 0, fmt.Errorf("measure memory: %w", err)
		}
		return float64(m), nil
	}
	before, err := mem()
	if err != nil {
		return 0, 0, err
	}
	d, undo, err := setup()
	if err != nil {
		return 0, 0, err
	}
	defer undo()
	after, err := mem()
	if err != nil {
		return 0, 0, err
	}
	return d, after - before, nil
}

// rawFilter returns the filter of every direct message to receiverAgent on
// the raw side.
func (e *env) rawFilter() string {
	f, _ := e.raw.AgentFilter(receiverAgent) // a valid constant ID
	return f
}

// drainBus subscribes receiverAgent on the bus side, a bus with busOpts,
// with opts, waits until its handler ran n times, recording value of each
// delivery, and stops.
func (e *env) drainBus(ctx context.Context, n int, value func(*bus.Delivery) int64, busOpts []bus.Option, opts ...bus.SubscribeOption) (*tally, error) {
	t := newTally(n)
	stop, err := e.subscribeBus(ctx, receiverAgent, t, value, busOpts, opts...)
	if err != nil {
		return nil, err
	}
	defer stop()
	return t, t.wait(ctx)
}

// drainRaw consumes the messages filter selects on the raw side with one
// durable consumer called name, waits until its handler ran n times,
// recording value of each message, and stops.
func (e *env) drainRaw(ctx context.Context, name, filter string, n int, value func(jetstream.Msg) int64) (*tally, error) {
	t := newTally(n)
	stop, err := e.consumeRaw(ctx, name, filter, t, value)
	if err != nil {
		return nil, err
	}
	defer stop()
	return t, t.wait(ctx)
}

// setupBus makes the bus of every agent and subscribes it, on one
// connection, one agent after another, and returns how long that took and
// stop, which stops the subscriptions; their durable consumers stay. On
// error it stops them itself.
func (e *env) setupBus(ctx context.Context, agents []string) (_ time.Duration, stop func(), err error) {
	nc, err := e.connect()
	if err != nil {
		return 0, nil, err
	}
	subs := make([]*bus.Subscription, 0, len(agents))
	stop = func() { stopAll(subs) }
	start := time.Now()
	for _, a := range agents {
		b, err := e.newBus(nc, a)
		if err != nil {
			stop()
			return 0, nil, err
		}
		sub, err := b.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
		if err != nil {
			stop()
			return 0, nil, fmt.Errorf("subscribe %s: %w", a, err)
		}
		subs = append(subs, sub)
	}
	return time.Since(start), stop, nil
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
// for each new agent that subscribes, one agent after another and each
// agent's consumers at once, as the bus does, and returns how long that
// took: its broadcast consumer, the last of rawConsumers (a direct
// consumer comes with the first message at its priority).
func (e *env) setupRaw(ctx context.Context, agents []string) (time.Duration, error) {
	start := time.Now()
	for _, a := range agents {
		cfgs, err := rawConsumers(e.raw, a)
		if err != nil {
			return 0, err
		}
		cfgs = cfgs[len(cfgs)-1:]
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
// s.Consumers with the settings package consumers gives every bus consumer
// by default, so that they follow the bus's choices when those change.
func rawConsumers(s subjects.Scheme, agent string) ([]jetstream.ConsumerConfig, error) {
	cs, err := s.Consumers(agent)
	if err != nil {
		return nil, err
	}
	out := make([]jetstream.ConsumerConfig, len(cs))
	for i, c := range cs {
		out[i] = consumers.Settings{}.ConsumerConfig(consumers.Spec{Name: c.Name, FilterSubject: c.Filter, NewOnly: c.Broadcast})
	}
	return out, nil
}

// millis returns d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
