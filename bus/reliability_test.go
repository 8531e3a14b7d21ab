package bus_test

// Failure scenarios of issue 5, section 2: each test drives real servers
// from package embedded through one failure and counts, at the end, that
// every acknowledged publish was delivered and how often. The figures
// (pauses, memory, counts) are logged with t.Logf; run with -v to see them:
//
//	go test -race -v -run 'TestReliability|TestCrash' ./bus/

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// errorKinds names the sentinels a publisher can meet when a server goes
// away, in the order errorKind tries them: the most specific first.
var errorKinds = []struct {
	name string
	err  error
}{
	{"bus.ErrNotProvisioned", bus.ErrNotProvisioned},
	{"bus.ErrClosed", bus.ErrClosed},
	{"jetstream.ErrTooManyStalledMsgs", jetstream.ErrTooManyStalledMsgs},
	{"jetstream.ErrAsyncPublishTimeout", jetstream.ErrAsyncPublishTimeout},
	{"jetstream.ErrNoStreamResponse", jetstream.ErrNoStreamResponse},
	{"jetstream.ErrStreamNotFound", jetstream.ErrStreamNotFound},
	{"nats.ErrNoResponders", nats.ErrNoResponders},
	{"nats.ErrReconnectBufExceeded", nats.ErrReconnectBufExceeded},
	{"nats.ErrDisconnected", nats.ErrDisconnected},
	{"nats.ErrConnectionClosed", nats.ErrConnectionClosed},
	{"nats.ErrConnectionReconnecting", nats.ErrConnectionReconnecting},
	{"nats.ErrTimeout", nats.ErrTimeout},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
	{"context.Canceled", context.Canceled},
}

// errorKind names err by the first sentinel of errorKinds it matches with
// errors.Is, or by the API error code the server sent.
func errorKind(err error) string {
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("*jetstream.APIError(code %d, err_code %d)", apiErr.Code, apiErr.ErrorCode)
	}
	return fmt.Sprintf("unclassified %T", err)
}

// errorTally counts errors by errorKind and keeps one example of each.
type errorTally struct {
	mu      sync.Mutex
	counts  map[string]int
	example map[string]string
}

func (e *errorTally) add(err error) {
	k := errorKind(err)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts, e.example = make(map[string]int), make(map[string]string)
	}
	e.counts[k]++
	if _, ok := e.example[k]; !ok {
		e.example[k] = err.Error()
	}
}

func (e *errorTally) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.counts {
		n += c
	}
	return n
}

func (e *errorTally) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.counts) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(e.counts)) {
		parts = append(parts, fmt.Sprintf("%s x%d (e.g. %q)", k, e.counts[k], e.example[k]))
	}
	return strings.Join(parts, "; ")
}

// retryPublisher publishes a numbered sequence, retrying each message with
// the same ID until the server acknowledges it, the way a careful user
// would: an error says nothing about whether the server stored the message,
// so only the same ID makes the retry safe.
type retryPublisher struct {
	b       *bus.Bus
	to      string
	prefix  string        // IDs are prefix + n
	attempt time.Duration // deadline of one Publish call
	giveUp  time.Duration // deadline of all attempts at one message

	// holdAt, with hold, has the publisher wait before message holdAt
	// until hold is closed: a test that stops the server there knows the
	// publisher has not finished meanwhile.
	holdAt int
	hold   chan struct{}

	errs errorTally

	mu         sync.Mutex
	acked      []string    // IDs in ack order
	ackTimes   []time.Time // when each was acked
	duplicates int         // acks with Duplicate set: a retry of a stored message
	failed     error       // the message given up on, which stopped the run
}

// publishOne publishes message n until it is acknowledged or giveUp passes.
func (p *retryPublisher) publishOne(ctx context.Context, n int) error {
	id := fmt.Sprintf("%s%d", p.prefix, n)
	m := bus.Message{ID: id, To: p.to, Type: "seq", Data: []byte(id)}
	ctx, cancel := context.WithTimeout(ctx, p.giveUp)
	defer cancel()
	retry := time.NewTimer(0)
	defer retry.Stop()
	<-retry.C
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, p.attempt)
		ack, err := p.b.Publish(actx, m)
		acancel()
		if err == nil {
			if ack.ID != id {
				return fmt.Errorf("ack for %s names %s", id, ack.ID)
			}
			now := time.Now()
			p.mu.Lock()
			p.acked = append(p.acked, id)
			p.ackTimes = append(p.ackTimes, now)
			if ack.Duplicate {
				p.duplicates++
			}
			p.mu.Unlock()
			return nil
		}
		p.errs.add(err)
		if ctx.Err() != nil {
			return fmt.Errorf("publish %s: gave up after %d attempts: %w", id, attempt, err)
		}
		// A short pause between attempts, not a wait for a condition: the
		// next attempt is the check.
		retry.Reset(50 * time.Millisecond)
		select {
		case <-retry.C:
		case <-ctx.Done():
		}
	}
}

// run publishes messages 0, 1, ... until stop is closed or max were acked.
func (p *retryPublisher) run(ctx context.Context, stop <-chan struct{}, max int) {
	for n := range max {
		select {
		case <-stop:
			return
		default:
		}
		if p.hold != nil && n == p.holdAt {
			select {
			case <-p.hold:
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		}
		if err := p.publishOne(ctx, n); err != nil {
			p.mu.Lock()
			p.failed = err
			p.mu.Unlock()
			return
		}
	}
}

func (p *retryPublisher) ackedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acked)
}

func (p *retryPublisher) numAcked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

func (p *retryPublisher) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// longestGap returns the longest time between consecutive acks, and the
// longest of those that ended after at, the moment of the failure.
func (p *retryPublisher) longestGap(at time.Time) (overall, after time.Duration, afterEnd time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 1; i < len(p.ackTimes); i++ {
		g := p.ackTimes[i].Sub(p.ackTimes[i-1])
		overall = max(overall, g)
		if p.ackTimes[i].After(at) && g > after {
			after, afterEnd = g, p.ackTimes[i]
		}
	}
	return overall, after, afterEnd
}

// ledger records every delivery by message ID.
type ledger struct {
	mu    sync.Mutex
	got   map[string][]int // ID -> Deliveries of each delivery
	times []time.Time      // of every delivery, in order
}

func newLedger() *ledger { return &ledger{got: make(map[string][]int)} }

func (l *ledger) handle(_ context.Context, d *bus.Delivery) error {
	l.mu.Lock()
	l.got[d.ID] = append(l.got[d.ID], d.Deliveries)
	l.times = append(l.times, time.Now())
	l.mu.Unlock()
	return nil
}

// missing returns the IDs of ids never delivered.
func (l *ledger) missing(ids []string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, id := range ids {
		if len(l.got[id]) == 0 {
			out = append(out, id)
		}
	}
	return out
}

// counts returns the deliveries in all, the redeliveries (Deliveries > 1,
// which at-least-once delivery allows), the duplicates (an ID delivered as a
// first delivery more than once: the same message stored twice) and the
// IDs delivered that were never published by this test.
func (l *ledger) counts(published []string) (deliveries, redeliveries int, duplicates, strangers []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	known := make(map[string]bool, len(published))
	for _, id := range published {
		known[id] = true
	}
	for id, ds := range l.got {
		if !known[id] {
			strangers = append(strangers, id)
		}
		firsts := 0
		for _, n := range ds {
			deliveries++
			if n > 1 {
				redeliveries++
			} else {
				firsts++
			}
		}
		if firsts > 1 {
			duplicates = append(duplicates, id)
		}
	}
	slices.Sort(duplicates)
	slices.Sort(strangers)
	return deliveries, redeliveries, duplicates, strangers
}

// longestPause returns the longest time between consecutive deliveries.
func (l *ledger) longestPause() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out time.Duration
	for i := 1; i < len(l.times); i++ {
		out = max(out, l.times[i].Sub(l.times[i-1]))
	}
	return out
}

// waitDelivered waits until every ID of ids was delivered at least once.
func (l *ledger) waitDelivered(t *testing.T, ids []string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("all %d acknowledged messages delivered", len(ids)), func() (bool, string) {
		miss := l.missing(ids)
		return len(miss) == 0, fmt.Sprintf("%d missing, first %v", len(miss), miss[:min(len(miss), 10)])
	})
}

// streamMsgs returns how many messages the bus's stream holds.
func streamMsgs(t *testing.T, b *bus.Bus) uint64 {
	t.Helper()
	js, err := jetstream.New(b.Conn())
	if err != nil {
		t.Fatal(err)
	}
	var msgs uint64
	waitFor(t, "stream info", func() (bool, string) {
		s, err := js.Stream(testContext(t), b.Subjects().Stream())
		if err != nil {
			return false, err.Error()
		}
		msgs = s.CachedInfo().State.Msgs
		return true, ""
	})
	return msgs
}

// TestReliabilityServerRestart: the server is shut down and restarted on
// the same store while a publisher (retrying on the same IDs) and a
// subscriber run over TCP. Both reconnect on their own, the subscription
// resumes without user action, and every acknowledged publish is delivered;
// the stream holds each message once.
func TestReliabilityServerRestart(t *testing.T) {
	start := time.Now()
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	url := s.ClientURL()

	sender := dialBus(t, url, "sender")
	agent := dialBus(t, url, "agent")
	l := newLedger()
	sub := subscribe(t, agent, l.handle, bus.WithAckWait(time.Second), bus.WithConcurrency(4), bus.WithPrefetch(16))
	// Stop it while the restarted server still runs: the cleanups would
	// stop the server first, and a subscription stopped while its server
	// is unreachable takes 10s to end (consumers closeLevels waits out
	// nats.go's Flush on each level's Drain).
	defer func() {
		sub.Stop()
		<-sub.Done()
	}()

	const total, restartAt = 400, 100
	p := &retryPublisher{b: sender, to: "agent", prefix: "restart-", attempt: time.Second, giveUp: 15 * time.Second,
		holdAt: restartAt, hold: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, stop, total) })
	defer wg.Wait()
	defer close(stop)

	waitFor(t, fmt.Sprintf("%d acks before the restart", restartAt), func() (bool, string) {
		return p.numAcked() >= restartAt || p.err() != nil, fmt.Sprint(p.numAcked(), " acked")
	})
	opts := s.Options()
	down := time.Now()
	s.Shutdown()
	close(p.hold)
	// Stay down long enough for the publisher to fail twice: its
	// unanswered attempts wait in the reconnect buffer meanwhile.
	waitFor(t, "the publisher to fail while the server is down", func() (bool, string) {
		return p.errs.total() >= 2 || p.err() != nil, p.errs.String()
	})
	startAgain(t, opts)
	up := time.Now()

	waitFor(t, "publisher to finish", func() (bool, string) {
		return p.numAcked() == total || p.err() != nil, fmt.Sprint(p.numAcked(), " acked")
	})
	if err := p.err(); err != nil {
		t.Fatalf("publisher stopped: %v", err)
	}
	ids := p.ackedIDs()
	l.waitDelivered(t, ids)
	deliveries, redeliveries, dups, strangers := l.counts(ids)
	overall, afterRestart, _ := p.longestGap(down)
	stored := streamMsgs(t, sender)

	t.Logf("server down for %v; %d published, %d acked (%d acks were Duplicate: retries of stored messages), stream holds %d",
		up.Sub(down).Round(time.Millisecond), total, len(ids), p.duplicates, stored)
	t.Logf("publish errors while retrying: %s", &p.errs)
	t.Logf("deliveries %d, redeliveries %d, duplicates after dedup %d; longest publish pause %v (around the restart %v), longest delivery pause %v; run time %v",
		deliveries, redeliveries, len(dups), overall.Round(time.Millisecond), afterRestart.Round(time.Millisecond),
		l.longestPause().Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	if len(dups) > 0 {
		t.Errorf("%d messages delivered twice as first deliveries (stored twice): %v", len(dups), dups[:min(len(dups), 10)])
	}
	if len(strangers) > 0 {
		t.Errorf("delivered IDs never published: %v", strangers)
	}
	if stored != uint64(total) {
		t.Errorf("stream holds %d messages, want %d: each ID stored once", stored, total)
	}
	waitAllInState(t, sender, bus.StateCompleted, ids)
}

// waitAllInState waits until the lifecycle of every direct message of ids,
// sent by b, reads state.
func waitAllInState(t *testing.T, b *bus.Bus, state bus.State, ids []string) {
	t.Helper()
	left := slices.Clone(ids)
	waitFor(t, "every message "+string(state), func() (bool, string) {
		var states []string
		left = slices.DeleteFunc(left, func(id string) bool {
			sts, err := b.Status(testContext(t), id)
			if err == nil && len(sts) == 1 && sts[0].State == state {
				return true
			}
			if len(states) < 10 {
				states = append(states, fmt.Sprintf("%s: %+v %v", id, sts, err))
			}
			return false
		})
		return len(left) == 0, fmt.Sprintf("%d not %s, e.g. %v", len(left), state, states)
	})
}

// TestReliabilityClusterLeaderFailover: on a 3-node cluster with a
// 3-replica stream, the stream leader is stopped while a publisher sends a
// continuous numbered sequence (retrying on the same IDs). The clients are
// connected to the leader's node first, so they fail over too. A new leader
// takes over, every acknowledged message is delivered, and no message is
// stored twice. The failover pause is logged.
func TestReliabilityClusterLeaderFailover(t *testing.T) {
	start := time.Now()
	c := embeddedtest.RunCluster(t, 3)
	admin := embeddedtest.ConnectCluster(t, c)
	info, err := newAdmin(t, admin).Provision(testContext(t), bus.StreamConfig{Replicas: 3})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	stream := info.Config.Name
	leader, err := c.WaitForStreamLeader(testContext(t), "", stream)
	if err != nil {
		t.Fatal(err)
	}
	leaderIdx := c.Index(leader)

	// Connect both clients to the leader's node first: the worst case, in
	// which the connection, the stream leader and perhaps consumer leaders
	// all move at once.
	urls := c.ClientURLs()
	ordered := append([]string{urls[leaderIdx]}, slices.Delete(slices.Clone(urls), leaderIdx, leaderIdx+1)...)
	clusterURL := strings.Join(ordered, ",")
	sender := dialBus(t, clusterURL, "planner", bus.WithNATSOptions(nats.DontRandomize()))
	receiver := dialBus(t, clusterURL, "builder", bus.WithNATSOptions(nats.DontRandomize()))
	if got, want := sender.Conn().ConnectedUrl(), urls[leaderIdx]; got != want {
		t.Fatalf("sender connected to %s, want the leader's %s", got, want)
	}
	l := newLedger()
	subscribe(t, receiver, l.handle, bus.WithAckWait(time.Second), bus.WithConcurrency(4), bus.WithPrefetch(16))

	const before, after, limit = 200, 200, 100_000
	// The attempt deadline bounds how long a publisher waits for an ack
	// lost with the stopped node, so it is part of the measured pause.
	p := &retryPublisher{b: sender, to: "builder", prefix: "seq-", attempt: 500 * time.Millisecond, giveUp: 15 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*testTimeout)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, stop, limit) })
	stopped := false
	stopPublisher := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopPublisher()

	waitFor(t, fmt.Sprintf("%d acks before the failover", before), func() (bool, string) {
		return p.numAcked() >= before || p.err() != nil, fmt.Sprint(p.numAcked(), " acked")
	})
	ackedAtStop := p.numAcked()
	stopAt := time.Now()
	if err := c.StopServer(leaderIdx); err != nil {
		t.Fatal(err)
	}
	newLeader, err := c.WaitForStreamLeader(testContext(t), "", stream)
	if err != nil {
		t.Fatal(err)
	}
	elected := time.Since(stopAt)
	if newLeader == leader {
		t.Fatalf("stream leader still %s after it was stopped", leader)
	}
	waitFor(t, fmt.Sprintf("%d more acks after the failover", after), func() (bool, string) {
		return p.numAcked() >= ackedAtStop+after || p.err() != nil, fmt.Sprint(p.numAcked(), " acked")
	})
	stopPublisher()
	if err := p.err(); err != nil {
		t.Fatalf("publisher stopped: %v", err)
	}

	ids := p.ackedIDs()
	l.waitDelivered(t, ids)
	deliveries, redeliveries, dups, strangers := l.counts(ids)
	overall, pause, resumed := p.longestGap(stopAt)
	stored := streamMsgs(t, sender)

	t.Logf("stopped stream leader %s (node %d) after %d acks; new leader %s elected after %v",
		leader, leaderIdx+1, ackedAtStop, newLeader, elected.Round(time.Millisecond))
	t.Logf("failover pause (longest gap between consecutive publish acks after the stop, publish attempt deadline %v): %v, ending %v after the stop; longest gap in the whole run %v",
		p.attempt, pause.Round(time.Millisecond), resumed.Sub(stopAt).Round(time.Millisecond), overall.Round(time.Millisecond))
	t.Logf("%d acked (%d acks were Duplicate: retries of stored messages), stream holds %d; publish errors while retrying: %s",
		len(ids), p.duplicates, stored, &p.errs)
	t.Logf("deliveries %d, redeliveries %d, duplicates after dedup %d, longest delivery pause %v; run time %v",
		deliveries, redeliveries, len(dups), l.longestPause().Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	if len(dups) > 0 {
		t.Errorf("%d messages delivered twice as first deliveries (stored twice): %v", len(dups), dups[:min(len(dups), 10)])
	}
	if len(strangers) > 0 {
		t.Errorf("delivered IDs never published: %v", strangers)
	}
	if stored != uint64(len(ids)) {
		t.Errorf("stream holds %d messages, want %d: each ID stored once", stored, len(ids))
	}
	waitAllInState(t, sender, bus.StateCompleted, ids)
}

// TestReliabilityOfflineAgentCatchesUp: an agent that subscribed once and
// runs no subscriber now gets everything queued meanwhile when it comes
// back, highest priority first and in publish order within a priority,
// though none of its direct consumers existed when the messages were sent
// (each is created with its priority's first message).
func TestReliabilityOfflineAgentCatchesUp(t *testing.T) {
	s := newServer(t)
	agent := newBus(t, s, "offline")
	first, err := agent.Subscribe(testContext(t), newRecorder().handle)
	if err != nil {
		t.Fatal(err)
	}
	first.Stop()
	<-first.Done()

	sender := newBus(t, s, "sender")
	const n = 50
	want := make([][]string, 6) // by priority
	for i := range n {
		p := 5 - (i*3)%5 // 5, 2, 4, 1, 3, 5, ...: every level, interleaved
		typ := fmt.Sprintf("p%d-%02d", p, i)
		publish(t, sender, bus.Message{To: "offline", Type: typ, Priority: p})
		want[p] = append(want[p], typ)
	}
	for p := 1; p <= 5; p++ {
		if _, err := consumerInfo(t, agent, fmt.Sprintf("offline_p%d", p)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatalf("consumer offline_p%d before the agent came back: %v, want not found", p, err)
		}
	}
	backlog, err := adminOf(t, s).Backlog(testContext(t), "offline")
	if err != nil {
		t.Fatal(err)
	}
	queued := 0
	for p := 1; p <= 5; p++ {
		if backlog[p-1] != uint64(len(want[p])) {
			t.Errorf("backlog at p%d %d, want %d", p, backlog[p-1], len(want[p]))
		}
		queued += int(backlog[p-1])
	}

	r := newRecorder()
	subscribe(t, agent, r.handle, bus.WithConcurrency(1))
	r.waitCount(t, n)
	got := r.types()
	wantOrder := slices.Concat(want...)
	if !slices.Equal(got, wantOrder) {
		t.Errorf("handled\n%v\nwant\n%v", got, wantOrder)
	}
	for _, d := range r.deliveries() {
		if d.Deliveries != 1 {
			t.Errorf("%s delivered %d times", d.Type, d.Deliveries)
		}
	}
	t.Logf("%d messages queued while offline across p1..p5, %d handled after the return, in priority order", queued, len(got))
}

// TestReliabilitySlowConsumer: a subscriber whose handler takes ~20ms
// faces 2000 asynchronous publishes. PublishAsync never blocks for long
// (a stall surfaces as jetstream.ErrTooManyStalledMsgs, which is retried),
// the server never has more unacknowledged messages out than
// WithMaxAckPending allows, the subscriber never holds more than its
// prefetch, and the heap stays bounded.
func TestReliabilitySlowConsumer(t *testing.T) {
	start := time.Now()
	s := newServer(t)
	sender := newBus(t, s, "producer")
	agent := newBus(t, s, "slow")
	const (
		total         = 2000
		handlerTime   = 20 * time.Millisecond
		concurrency   = 8
		prefetch      = 16
		maxAckPending = 16 // below concurrency + prefetch, so the server's bound is the one that holds
		callBound     = 5 * time.Second
	)
	var handled atomic.Int64
	handler := func(ctx context.Context, d *bus.Delivery) error {
		timer := time.NewTimer(handlerTime)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		handled.Add(1)
		return nil
	}
	sub := subscribe(t, agent, handler, bus.WithConcurrency(concurrency), bus.WithPrefetch(prefetch),
		bus.WithMaxAckPending(maxAckPending), bus.WithAckWait(5*time.Second))

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapInuse

	// The publisher: PublishAsync with the default in-flight bound.
	var (
		maxCall   atomic.Int64 // nanoseconds
		stalls    atomic.Int64
		pubErr    atomic.Pointer[error]
		futures   = make([]*bus.PublishFuture, 0, total)
		published = make(chan struct{})
	)
	go func() {
		defer close(published)
		for i := range total {
			m := bus.Message{ID: fmt.Sprintf("slow-%d", i), To: "slow", Type: "work", Data: make([]byte, 256)}
			for attempt := 1; ; attempt++ {
				t0 := time.Now()
				f, err := sender.PublishAsync(context.Background(), m)
				d := time.Since(t0)
				if cur := maxCall.Load(); int64(d) > cur {
					maxCall.Store(int64(d))
				}
				if err == nil {
					futures = append(futures, f)
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || attempt == 100 {
					err = fmt.Errorf("PublishAsync %s, attempt %d: %w", m.ID, attempt, err)
					pubErr.Store(&err)
					return
				}
				stalls.Add(1)
			}
		}
	}()

	// Watch the server and the subscriber until everything is handled.
	var maxPending, maxBuffered int
	heapPeak := heapBefore
	samples := 0
	deadline := time.Now().Add(3 * testTimeout)
	// Sample every 20ms until everything is handled.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; handled.Load() < total; <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("handled %d of %d before the deadline", handled.Load(), total)
		}
		if err := pubErr.Load(); err != nil {
			t.Fatal(*err)
		}
		info, err := consumerInfo(t, agent, "slow_p3")
		if errors.Is(err, jetstream.ErrConsumerNotFound) && handled.Load() == 0 {
			continue // created when the first message comes
		}
		if err != nil {
			t.Fatalf("consumer info: %v", err)
		}
		maxPending = max(maxPending, info.NumAckPending)
		if info.NumAckPending > maxAckPending {
			t.Errorf("server has %d messages unacknowledged, over WithMaxAckPending(%d)", info.NumAckPending, maxAckPending)
		}
		for _, b := range sub.Buffered() {
			maxBuffered = max(maxBuffered, b)
		}
		if samples%5 == 0 {
			runtime.ReadMemStats(&ms)
			heapPeak = max(heapPeak, ms.HeapInuse)
		}
		samples++
	}
	select {
	case <-published:
	case <-time.After(testTimeout):
		t.Fatal("publisher still blocked after every message was handled")
	}
	if err := pubErr.Load(); err != nil {
		t.Fatal(*err)
	}
	for _, f := range futures {
		if _, err := f.Wait(testContext(t)); err != nil {
			t.Fatalf("future %s: %v", f.ID(), err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapAfter := ms.HeapInuse

	const mib = 1 << 20
	t.Logf("%d messages of 256 bytes, handler %v, concurrency %d, prefetch %d, max ack pending %d; run time %v",
		total, handlerTime, concurrency, prefetch, maxAckPending, time.Since(start).Round(time.Millisecond))
	t.Logf("publisher: longest PublishAsync call %v, %d ErrTooManyStalledMsgs retried (default bound %d in flight)",
		time.Duration(maxCall.Load()).Round(time.Microsecond), stalls.Load(), bus.DefaultMaxAsyncPending)
	t.Logf("server: max NumAckPending seen %d (bound %d) over %d samples; subscriber: max buffered per level %d (prefetch %d)",
		maxPending, maxAckPending, samples, maxBuffered, prefetch)
	t.Logf("heap in use (server and clients in one process): before %.1f MiB, peak %.1f MiB, after %.1f MiB",
		float64(heapBefore)/mib, float64(heapPeak)/mib, float64(heapAfter)/mib)

	if d := time.Duration(maxCall.Load()); d > callBound {
		t.Errorf("a PublishAsync call blocked for %v, want it to return or fail within %v", d, callBound)
	}
	if maxBuffered > prefetch {
		t.Errorf("subscriber held %d messages at one level, over its prefetch %d", maxBuffered, prefetch)
	}
	// A generous bound: the messages are 0.5 MB in all; the heap must not
	// grow with anything like the backlog times a per-message overhead.
	if growth := int64(heapPeak) - int64(heapBefore); growth > 128*mib {
		t.Errorf("heap grew by %.1f MiB while a slow consumer worked off %d messages", float64(growth)/mib, total)
	}
}

// TestReliabilityEveryCallWhileServerDown: with the server down, every call
// of a Bus or an Admin that needs the server fails by the time its context
// ends, with an error wrapping context.DeadlineExceeded (or saying the
// connection is reconnecting): none waits past its context, and none
// blames the server or the installation for what it cannot know
// (ErrUnsupportedServer, ErrNotProvisioned). A Bus made on the connection
// meanwhile fails with nats.ErrConnectionReconnecting. Once the server is
// back, Schedule (which waits for the connection to know the server's
// version) and Subscribe work on the same Bus.
func TestReliabilityEveryCallWhileServerDown(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	b := dialBus(t, s.ClientURL(), "caller")
	other := dialBus(t, s.ClientURL(), "other")
	subscribe(t, other, func(context.Context, *bus.Delivery) error { return nil })
	sent := publish(t, b, bus.Message{To: "other", Type: "TASK"})
	if err := b.JoinGroup(testContext(t), "crew"); err != nil {
		t.Fatal(err)
	}
	a := newAdmin(t, b.Conn())
	opts := s.Options()
	s.Shutdown()
	waitFor(t, "the caller to notice the server is gone", func() (bool, string) {
		return !b.Conn().IsConnected(), b.Conn().Status().String()
	})

	down := func(t *testing.T, err error) {
		switch {
		case errors.Is(err, bus.ErrUnsupportedServer), errors.Is(err, bus.ErrNotProvisioned):
			t.Errorf("with the server down: %v; it blames what it cannot know", err)
		case !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrConnectionReconnecting):
			t.Errorf("with the server down: %v; want an error wrapping context.DeadlineExceeded", err)
		}
	}
	eachCall(t, busCalls(b, sent.ID), 200*time.Millisecond, down)
	eachCall(t, adminCalls(a, sent.ID), 200*time.Millisecond, down)
	if _, err := bus.New(b.Conn(), "latecomer"); !errors.Is(err, nats.ErrConnectionReconnecting) {
		t.Errorf("New on a reconnecting connection: %v, want nats.ErrConnectionReconnecting", err)
	}

	startAgain(t, opts)
	if _, err := b.Schedule(testContext(t), bus.Message{To: "other", Type: "LATER"}, bus.In(time.Hour)); err != nil {
		t.Errorf("Schedule once the server is back: %v", err)
	}
	subscribe(t, b, func(context.Context, *bus.Delivery) error { return nil })
}

// TestReliabilityPublishWhileServerDown: with the server down, Publish
// fails within its context's deadline (or the default one) instead of
// hanging or succeeding, a PublishAsync future does not resolve as a
// success, and a bus whose connection does not buffer while reconnecting
// fails at once. After the restart, publishing works, the futures resolve,
// and retrying the failed publishes with the same IDs stores each message
// once.
func TestReliabilityPublishWhileServerDown(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	url := s.ClientURL()
	buffered := dialBus(t, url, "buffered")
	unbuffered := dialBus(t, url, "unbuffered", bus.WithNATSOptions(nats.ReconnectBufSize(-1)))
	for _, b := range []*bus.Bus{buffered, unbuffered} {
		publish(t, b, bus.Message{To: "inbox", Type: "before", ID: "before-" + b.Agent()})
	}

	opts := s.Options()
	s.Shutdown()
	for _, b := range []*bus.Bus{buffered, unbuffered} {
		waitFor(t, b.Agent()+" to notice the server is gone", func() (bool, string) {
			return !b.Conn().IsConnected(), b.Conn().Status().String()
		})
	}

	// failed is a publish that returned an error, to retry after the
	// restart with the same ID.
	type failed struct {
		b *bus.Bus
		m bus.Message
	}
	var (
		seen  []string // what users see, for the report
		retry []failed
	)
	tests := []struct {
		name    string
		b       *bus.Bus
		timeout time.Duration // of the Publish context; 0: none, the default applies
		bound   time.Duration // Publish must return within this
	}{
		{"buffered, 500ms deadline", buffered, 500 * time.Millisecond, 5 * time.Second},
		{"buffered, no deadline", buffered, 0, 20 * time.Second},
		{"unbuffered, 500ms deadline", unbuffered, 500 * time.Millisecond, 5 * time.Second},
	}
	for i, tt := range tests {
		m := bus.Message{ID: fmt.Sprintf("down-%d", i), To: "inbox", Type: "during"}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if tt.timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, tt.timeout)
		}
		t0 := time.Now()
		ack, err := tt.b.Publish(ctx, m)
		took := time.Since(t0)
		cancel()
		if err == nil {
			t.Errorf("%s: Publish succeeded with the server down: %+v", tt.name, ack)
			continue
		}
		if took > tt.bound {
			t.Errorf("%s: Publish took %v to fail, want at most %v", tt.name, took, tt.bound)
		}
		seen = append(seen, fmt.Sprintf("Publish %s: %s after %v (%q)", tt.name, errorKind(err), took.Round(time.Millisecond), err))
		retry = append(retry, failed{tt.b, m})
	}

	// PublishAsync: the call itself, then the future.
	type pending struct {
		b *bus.Bus
		m bus.Message
		f *bus.PublishFuture
	}
	var futures []pending
	for _, b := range []*bus.Bus{buffered, unbuffered} {
		m := bus.Message{ID: "async-" + b.Agent(), To: "inbox", Type: "during"}
		f, err := b.PublishAsync(context.Background(), m)
		if err != nil {
			seen = append(seen, fmt.Sprintf("PublishAsync on %s: the call fails: %s (%q)", b.Agent(), errorKind(err), err))
			retry = append(retry, failed{b, m})
			continue
		}
		if b == unbuffered {
			t.Errorf("PublishAsync on a connection without a reconnect buffer accepted a message with the server down")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		ack, err := f.Wait(ctx)
		cancel()
		if err == nil {
			t.Errorf("PublishAsync on %s: the future resolved as a success with the server down: %+v", b.Agent(), ack)
			continue
		}
		seen = append(seen, fmt.Sprintf("PublishAsync on %s: the call succeeds, Wait(500ms) fails: %s (%q)", b.Agent(), errorKind(err), err))
		futures = append(futures, pending{b, m, f})
	}

	s2 := startAgain(t, opts)
	for _, b := range []*bus.Bus{buffered, unbuffered} {
		waitFor(t, b.Agent()+" to reconnect", func() (bool, string) {
			return b.Conn().IsConnected(), b.Conn().Status().String()
		})
	}

	// A future taken while the server was down resolves once it is back:
	// the message waited in the reconnect buffer and was stored, or the
	// future fails. Either way it is not left pending for ever.
	for _, p := range futures {
		ack, err := p.f.Wait(testContext(t))
		if err != nil {
			seen = append(seen, fmt.Sprintf("future %s after the restart: %s (%q)", p.f.ID(), errorKind(err), err))
			retry = append(retry, failed{p.b, p.m})
			continue
		}
		seen = append(seen, fmt.Sprintf("future %s after the restart: stored at sequence %d", p.f.ID(), ack.Sequence))
	}

	// Retry everything that failed, with the same IDs.
	for _, r := range retry {
		var ack bus.PubAck
		waitFor(t, "retry of "+r.m.ID+" to be acknowledged", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var err error
			ack, err = r.b.Publish(ctx, r.m)
			return err == nil, fmt.Sprint(err)
		})
		seen = append(seen, fmt.Sprintf("retry of %s after the restart: Duplicate=%v (true: the failed publish had been stored after all)", r.m.ID, ack.Duplicate))
	}
	for _, b := range []*bus.Bus{buffered, unbuffered} {
		publish(t, b, bus.Message{To: "inbox", Type: "after", ID: "after-" + b.Agent()})
	}
	for _, line := range seen {
		t.Log(line)
	}

	// Every message once: before, the ones during the outage, after.
	l := newLedger()
	subscribe(t, newBus(t, s2, "inbox"), l.handle)
	ids := []string{"before-buffered", "before-unbuffered", "after-buffered", "after-unbuffered", "async-buffered", "async-unbuffered"}
	for i := range tests {
		ids = append(ids, fmt.Sprintf("down-%d", i))
	}
	l.waitDelivered(t, ids)
	deliveries, _, dups, strangers := l.counts(ids)
	if len(dups) > 0 || len(strangers) > 0 || deliveries != len(ids) {
		t.Errorf("%d deliveries of %d messages; duplicates %v, unknown %v", deliveries, len(ids), dups, strangers)
	}
	if stored := streamMsgs(t, buffered); stored != uint64(len(ids)) {
		t.Errorf("stream holds %d messages, want %d", stored, len(ids))
	}
}

// TestServerRestartLosesNothing: the server restarts on the same store
// while a subscriber is connected; messages published before and after are
// all delivered and the subscription resumes on its own.
func TestServerRestartLosesNothing(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	url := s.ClientURL()
	sender := dialBus(t, url, "sender")
	agent := dialBus(t, url, "agent")
	r := newRecorder()
	subscribe(t, agent, r.handle, bus.WithAckWait(time.Second))

	publish(t, sender, bus.Message{To: "agent", Type: "before"})
	r.waitCount(t, 1)
	publish(t, newBus(t, s, "queuer"), bus.Message{To: "offline", Type: "queued"})

	opts := s.Options()
	s.Shutdown()
	s2 := startAgain(t, opts)

	waitFor(t, "sender reconnected", func() (bool, string) {
		return sender.Conn().IsConnected(), sender.Conn().Status().String()
	})
	publish(t, sender, bus.Message{To: "agent", Type: "after"})
	r.waitCount(t, 2)
	if got := r.types(); !slices.Equal(got, []string{"before", "after"}) {
		t.Errorf("handled %v, want [before after]", got)
	}

	offline := newBus(t, s2, "offline")
	r2 := newRecorder()
	subscribe(t, offline, r2.handle)
	if d := r2.waitCount(t, 1)[0]; d.Type != "queued" {
		t.Errorf("offline agent got %q, want queued", d.Type)
	}
}
