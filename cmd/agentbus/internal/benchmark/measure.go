package benchmark

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// tally records what the handlers of one side receive: one value per call,
// in the order of the calls, up to n calls, and when the first and the
// n-th call started, with the process's CPU time then. It is safe for
// concurrent use.
type tally struct {
	mu                sync.Mutex
	n                 int
	values            []int64
	first, last       time.Time
	firstCPU, lastCPU time.Duration
	cpuRead           bool          // both CPU times were read (processCPU)
	done              chan struct{} // closed at the n-th call
}

func newTally(n int) *tally {
	return &tally{n: n, values: make([]int64, 0, n), done: make(chan struct{})}
}

// add records one handler call with its value.
func (t *tally) add(v int64) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.values) == t.n {
		return // a redelivery after the count was reached
	}
	t.values = append(t.values, v)
	if len(t.values) == 1 {
		t.first = now
		t.firstCPU, t.cpuRead = processCPU()
	}
	if len(t.values) == t.n {
		t.last = now
		var ok bool
		t.lastCPU, ok = processCPU()
		t.cpuRead = t.cpuRead && ok
		close(t.done)
	}
}

func (t *tally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.values)
}

// wait returns once n calls were recorded. It fails when ctx ends or when
// no call arrives for stallTimeout.
func (t *tally) wait(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, since := -1, time.Now()
	for {
		select {
		case <-t.done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d messages: %w", t.count(), t.n, ctx.Err())
		case now := <-tick.C:
			if c := t.count(); c != last {
				last, since = c, now
			} else if now.Sub(since) > stallTimeout {
				return fmt.Errorf("received %d of %d messages, then nothing for %v", c, t.n, stallTimeout)
			}
		}
	}
}

// span returns the calls after the first, n-1, and the time between the
// first call and the n-th.
func (t *tally) span() (int, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n - 1, t.last.Sub(t.first)
}

// spanCPU returns the process's CPU time between the first and the n-th
// call, and whether it was read.
func (t *tally) spanCPU() (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastCPU - t.firstCPU, t.cpuRead
}

// snapshot returns the values recorded so far.
func (t *tally) snapshot() []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]int64(nil), t.values...)
}

// sideNames name the sides of a scenario, in the order mirrored takes
// them: the bus, raw nats.go and, where there is one, raw+headers.
var sideNames = []string{"bus", "raw", "raw+headers"}

// requestSides name the sides of the request scenario: the bus, raw
// nats.go and raw nats.go with the record read of the bus's floor.
var requestSides = []string{"bus", "raw", "raw+read"}

// mirrored runs each of sides, which measures k messages and returns what
// it measured, for n messages in all, in two halves and mirrored order (A B
// C, then C B A), and returns each side's two measures. Run one after
// another in full, the first side would meet the process and the server
// cold (a small heap the collector runs through often, a stream without
// blocks) and the last one warm. It stops at the first error, which it
// prefixes with the side's name in names.
func mirrored[T any](n int, names []string, sides ...func(k int) (T, error)) ([][2]T, error) {
	out := make([][2]T, len(sides))
	for pass := range 2 {
		k := n / 2
		if pass == 1 {
			k = n - n/2
		}
		for j := range sides {
			i := j
			if pass == 1 {
				i = len(sides) - 1 - j
			}
			v, err := sides[i](k)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", names[i], err)
			}
			out[i][pass] = v
		}
	}
	return out, nil
}

// balanced runs sides, publishers of k messages, with mirrored and
// returns each side's rate: n divided by the seconds its two halves took.
// It also returns each side's process CPU per message in microseconds,
// or nil where the system's CPU time is not read (processCPU): a figure
// that varies less from run to run than a rate on a busy machine, which
// shows a small change in the work per message.
func balanced(n int, sides ...func(k int) error) (rates, cpuMicros []float64, _ error) {
	timed := make([]func(int) ([2]time.Duration, error), len(sides))
	cpuRead := true
	for i, side := range sides {
		timed[i] = func(k int) ([2]time.Duration, error) {
			cpu0, ok0 := processCPU()
			start := time.Now()
			err := side(k)
			took := time.Since(start)
			cpu1, ok1 := processCPU()
			cpuRead = cpuRead && ok0 && ok1
			return [2]time.Duration{took, cpu1 - cpu0}, err
		}
	}
	took, err := mirrored(n, sideNames, timed...)
	if err != nil {
		return nil, nil, err
	}
	rates = make([]float64, len(sides))
	cpuMicros = make([]float64, len(sides))
	for i, d := range took {
		rates[i] = float64(n) / max(d[0][0]+d[1][0], time.Nanosecond).Seconds()
		cpuMicros[i] = float64((d[0][1] + d[1][1]).Microseconds()) / float64(n)
	}
	if !cpuRead {
		cpuMicros = nil
	}
	return rates, cpuMicros, nil
}

// drained runs sides, which each drain a backlog of k messages and return
// the tally of its handler, with mirrored and returns each side's rate:
// the calls after the first of each half per second between the half's
// first call and its last. It is finite even if the clock did not advance
// between them. It also returns each side's process CPU time per message
// over the same calls, in microseconds, or nil where the system's CPU time
// is not read (see balanced).
func drained(n int, sides ...func(k int) (*tally, error)) (rates, cpuMicros []float64, _ error) {
	tallies, err := mirrored(n, sideNames, sides...)
	if err != nil {
		return nil, nil, err
	}
	rates = make([]float64, len(sides))
	cpuMicros = make([]float64, len(sides))
	cpuRead := true
	for i, t := range tallies {
		c0, d0 := t[0].span()
		c1, d1 := t[1].span()
		rates[i] = float64(c0+c1) / max(d0+d1, time.Nanosecond).Seconds()
		cpu0, ok0 := t[0].spanCPU()
		cpu1, ok1 := t[1].spanCPU()
		cpuRead = cpuRead && ok0 && ok1
		cpuMicros[i] = float64((cpu0 + cpu1).Microseconds()) / float64(max(c0+c1, 1))
	}
	if !cpuRead {
		cpuMicros = nil
	}
	return rates, cpuMicros, nil
}

// mirroredLatency runs the bus side and the raw side, which each measure
// the latencies of k messages, with mirrored and summarises the latencies
// of both halves of each; n and rate are the scenario's.
func mirroredLatency(n int, rate float64, bus, raw func(k int) ([]time.Duration, error)) (*Latency, error) {
	lat, err := mirrored(n, sideNames, bus, raw)
	if err != nil {
		return nil, err
	}
	return newLatency(n, rate, bothHalves(lat[0]), bothHalves(lat[1])), nil
}

// bothHalves returns the latencies of a side's two halves (mirrored) as one.
func bothHalves(lat [2][]time.Duration) []time.Duration { return append(lat[0], lat[1]...) }

// interleaved calls each of sides n times, taking turns: one call of each
// per round, the order rotating from round to round, and returns how long
// each side's calls took. Latency one call at a time is what a noisy
// machine moves most from one moment to the next; taking turns, every side
// meets the same moments, where mirrored halves would give each its own.
func interleaved(n int, sides ...func(i int) error) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(sides))
	for j := range out {
		out[j] = make([]time.Duration, n)
	}
	for i := range n {
		for k := range sides {
			j := (i + k) % len(sides)
			start := time.Now()
			if err := sides[j](i); err != nil {
				return nil, fmt.Errorf("%s: message %d: %w", sideNames[j], i, err)
			}
			out[j][i] = time.Since(start)
		}
	}
	return out, nil
}

// latencies calls f n times, one after another, and returns how long each
// call took.
func latencies(n int, f func(i int) error) ([]time.Duration, error) {
	out := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if err := f(i); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		out[i] = time.Since(start)
	}
	return out, nil
}

// paced calls send(i) for i in [0, n) at rate calls per second, each on
// its schedule counted from the first call; calls that fall behind are
// made at once, so the average rate holds.
func paced(ctx context.Context, n int, rate float64, send func(i int) error) error {
	interval := time.Duration(float64(time.Second) / rate)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := send(i); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

// stamp returns a payload of size bytes that starts with the time since
// epoch, for since to read at the handler. The clock is monotonic: both
// ends run in this process.
func stamp(epoch time.Time, size int) []byte {
	p := make([]byte, size)
	binary.BigEndian.PutUint64(p, uint64(time.Since(epoch)))
	return p
}

// since returns the time elapsed since p was stamped, or 0 for a payload
// too short to carry a stamp.
func since(epoch time.Time, p []byte) time.Duration {
	if len(p) < 8 {
		return 0
	}
	return time.Since(epoch) - time.Duration(binary.BigEndian.Uint64(p))
}

// unstalled calls publish until it does not fail with
// jetstream.ErrTooManyStalledMsgs, waiting in between for every publish in
// flight to be acknowledged (complete), as a well-behaved producer does
// when the server falls behind.
func unstalled[F any](ctx context.Context, complete func() <-chan struct{}, publish func() (F, error)) (F, error) {
	for {
		f, err := publish()
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		select {
		case <-complete():
		case <-ctx.Done():
			return f, ctx.Err()
		}
	}
}

// publishBusAsync publishes msg(i) for i in [0, n) with b.PublishAsync and
// returns once every publish and every lifecycle record it wrote is
// acknowledged (b.Flush), with the first failure: the time counts all the
// work the publishes gave the server.
func publishBusAsync(ctx context.Context, b *bus.Bus, n int, msg func(i int) bus.Message) error {
	futures := make([]*bus.PublishFuture, n)
	for i := range n {
		f, err := unstalled(ctx, b.PublishAsyncComplete, func() (*bus.PublishFuture, error) { return b.PublishAsync(ctx, msg(i)) })
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		futures[i] = f
	}
	if err := b.Flush(ctx); err != nil {
		return err
	}
	for i, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

// publishRawAsync publishes msg(i) for i in [0, n) with js.PublishMsgAsync
// and returns once every publish is acknowledged, with the first failure.
func publishRawAsync(ctx context.Context, js jetstream.JetStream, n int, msg func(i int) *nats.Msg) error {
	futures := make([]jetstream.PubAckFuture, n)
	for i := range n {
		f, err := unstalled(ctx, js.PublishAsyncComplete, func() (jetstream.PubAckFuture, error) { return js.PublishMsgAsync(msg(i)) })
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		futures[i] = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

// busHeaders returns a function that returns the headers the bus writes
// for a message of payload from senderAgent to receiverAgent, each time
// with a fresh Nats-Msg-Id made as the bus makes it (codec.NewID, a UUID
// version 7, whose time's window an indexed subject names): what raw
// nats.go must send to give the server the same bytes, subjects and
// deduplication work as the bus.
func busHeaders(payload []byte) (func() nats.Header, error) {
	m := &codec.Message{From: senderAgent, To: receiverAgent, Type: messageType, Data: payload}
	m.SetDefaults(time.Now())
	h, _, err := codec.Binary{}.Encode(m)
	if err != nil {
		return nil, fmt.Errorf("encode the bus's headers: %w", err)
	}
	return func() nats.Header {
		c := make(nats.Header, len(h)+1)
		for k, v := range h {
			c[k] = v
		}
		id := codec.NewID()
		c["ce-id"] = []string{id}
		c[jetstream.MsgIDHeader] = []string{id}
		return c
	}, nil
}

// busMessages returns a function that makes the next raw message doing
// the bus's job: payload with the bus's headers (busHeaders) on the direct
// subject direct, followed, if indexed, by the index that names the
// message, as a bus with lifecycle tracking sends it.
func busMessages(payload []byte, direct string, indexed bool) (func() *nats.Msg, error) {
	headers, err := busHeaders(payload)
	if err != nil {
		return nil, err
	}
	return func() *nats.Msg {
		h := headers()
		subject := direct
		if indexed {
			subject = withIndex(direct, h.Get(jetstream.MsgIDHeader), "")
		}
		return &nats.Msg{Subject: subject, Header: h, Data: payload}
	}, nil
}

// withIndex returns the direct subject direct followed by the index of
// message id in the conversation correlationID names (the message's own
// when empty), as subjects.Scheme.IndexedDirect writes it.
func withIndex(direct, id, correlationID string) string {
	if correlationID == "" {
		correlationID = id
	}
	return direct + "." + subjects.IndexToken(id) + "." + subjects.ConversationToken(correlationID)
}

// encodeEvent encodes m, after setting its defaults, as a bus with
// lifecycle tracking does: the CloudEvents headers, its ID as the
// Nats-Msg-Id, and the direct subject direct followed by its index.
func encodeEvent(direct string, m *codec.Message) (*nats.Msg, error) {
	m.SetDefaults(time.Now())
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		return nil, fmt.Errorf("encode event: %w", err)
	}
	h[jetstream.MsgIDHeader] = []string{m.ID}
	return &nats.Msg{Subject: withIndex(direct, m.ID, m.CorrelationID), Header: h, Data: data}, nil
}

// subscribeBus subscribes agent on the bus side, a bus with busOpts on a
// connection of its own, with opts and a handler that records value(d) in
// t and returns nil. stop ends the subscription and waits until it has.
func (e *env) subscribeBus(ctx context.Context, agent string, t *tally, value func(*bus.Delivery) int64, busOpts []bus.Option, opts ...bus.SubscribeOption) (stop func(), err error) {
	nc, err := e.connect()
	if err != nil {
		return nil, err
	}
	b, err := e.newBus(nc, agent, busOpts...)
	if err != nil {
		return nil, err
	}
	sub, err := b.Subscribe(ctx, func(_ context.Context, d *bus.Delivery) error {
		t.add(value(d))
		return nil
	}, opts...)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", agent, err)
	}
	return func() { sub.Stop(); <-sub.Done() }, nil
}

// consumeRaw creates the durable consumer name with filter on the raw
// stream, as a plain nats.go user would (explicit acks, the server's
// defaults otherwise), and consumes it on a connection of its own with a
// handler that records value(m) in t and acks. stop ends the consumption
// and waits until it has.
func (e *env) consumeRaw(ctx context.Context, name, filter string, t *tally, value func(jetstream.Msg) int64) (stop func(), err error) {
	nc, err := e.connect()
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("raw consumer %s: %w", name, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, e.raw.Stream(), jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: filter,
		AckPolicy:     jetstream.AckExplicitPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create raw consumer %s: %w", name, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		t.add(value(m))
		_ = m.Ack() // as the bus does, a failed ack is left to redelivery
	})
	if err != nil {
		return nil, fmt.Errorf("consume raw consumer %s: %w", name, err)
	}
	return func() {
		cc.Stop()
		<-cc.Closed()
		// The server has the unsubscribe before anything more is
		// published: until then its waiting pull request still takes
		// messages, which go to the gone subscription and come back only
		// after the ack wait, stalling the next drain of the consumer.
		_ = nc.Flush()
	}, nil
}
