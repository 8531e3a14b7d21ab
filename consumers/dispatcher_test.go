package consumers_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every wait in these tests; generous for -race on a
// loaded 2-core machine.
const testTimeout = 20 * time.Second

// stream is the stream of these tests. Each consumer c reads "s.c.>".
const stream = "S"

// setup starts a server with the stream and creates one consumer per name,
// filtering "s.<name>.>".
func setup(t *testing.T, names ...string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := embeddedtest.Connect(t, embeddedtest.RunServer(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	specs := make([]consumers.Spec, len(names))
	for i, name := range names {
		specs[i] = consumers.Spec{Name: name, FilterSubject: "s." + name + ".>"}
	}
	if _, err := consumers.Ensure(ctx, js, stream, specs, consumers.Settings{}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// publish publishes one message to each consumer named in order, and
// returns their stream sequences.
func publish(t *testing.T, js jetstream.JetStream, order ...string) []uint64 {
	t.Helper()
	seqs := make([]uint64, len(order))
	for i, name := range order {
		ack, err := js.Publish(t.Context(), "s."+name+".m", []byte(name))
		if err != nil {
			t.Fatal(err)
		}
		seqs[i] = ack.Sequence
	}
	return seqs
}

// publishTo is publish for consumers that nobody reads and that have
// nothing pending. It returns once every consumer counts its messages as
// pending: the server tells consumers of new messages in the background, and
// until then answers a no_wait pull request as if they were not there.
func publishTo(t *testing.T, js jetstream.JetStream, order ...string) []uint64 {
	t.Helper()
	seqs := publish(t, js, order...)
	want := make(map[string]uint64)
	for _, name := range order {
		want[name]++
	}
	embeddedtest.WaitFor(t, testTimeout, fmt.Sprintf("pending %v", want), func() (bool, string) {
		got := make(map[string]uint64)
		for name := range want {
			got[name] = consumerInfo(t, js, name).NumPending
		}
		return maps.Equal(got, want), fmt.Sprint(got)
	})
	return seqs
}

// consumerInfo returns the server's current information on the consumer.
func consumerInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(t.Context(), stream, name)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo()
}

// record keeps what a dispatcher handled, in the order the handlers started.
type record struct {
	mu   sync.Mutex
	seqs []uint64
	gate chan struct{} // handlers wait for it to close; nil means no wait
}

func (r *record) handle(ctx context.Context, m *consumers.Msg) {
	r.mu.Lock()
	r.seqs = append(r.seqs, m.Metadata.StreamSeq)
	r.mu.Unlock()
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return // given back unsettled
		}
	}
	m.Ack()
}

func (r *record) handled() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs)
}

// lanesOf returns the lanes of levels, which lists the consumers of each
// level, highest first.
func lanesOf(levels [][]string) []consumers.Lane {
	var lanes []consumers.Lane
	for i, names := range levels {
		for _, name := range names {
			lanes = append(lanes, consumers.Lane{Consumer: name, Level: i})
		}
	}
	return lanes
}

// run starts a dispatcher over levels with one handler slot, waits until r
// has handled n messages and stops it.
func run(t *testing.T, nc *nats.Conn, levels [][]string, r *record, n int, opts consumers.Options) {
	t.Helper()
	opts.OnError = func(err error) { t.Errorf("dispatcher: %v", err) }
	d, err := consumers.Start(nc, stream, len(levels), lanesOf(levels), r.handle, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	if r.gate != nil {
		want := make([]int, len(levels))
		for i := range levels {
			want[i] = len(levels[i]) * opts.Prefetch
		}
		// Every lane is full and one message is running: the next picks
		// choose among everything in memory.
		embeddedtest.WaitFor(t, testTimeout, fmt.Sprintf("buffers %v", want), func() (bool, string) {
			got := d.Buffered()
			return slices.Equal(got, want), fmt.Sprint(got)
		})
		close(r.gate)
	}
	embeddedtest.WaitFor(t, testTimeout, fmt.Sprintf("%d messages handled", n), func() (bool, string) {
		got := r.handled()
		return len(got) >= n, fmt.Sprint(got)
	})
}

// TestLanesOfALevelKeepStreamOrder: the direct and broadcast lanes of one
// level come out in stream order, interleaved as they were published, not
// one lane after the other.
func TestLanesOfALevelKeepStreamOrder(t *testing.T) {
	nc, js := setup(t, "direct", "broadcast")
	levels := [][]string{{"direct", "broadcast"}}
	for _, prefetch := range []int{1, 4} {
		t.Run(fmt.Sprintf("prefetch=%d", prefetch), func(t *testing.T) {
			// Several rounds, since which lane answers first is up to the
			// scheduler.
			for round := range 3 {
				want := publishTo(t, js, "broadcast", "direct", "direct", "broadcast", "direct",
					"broadcast", "broadcast", "broadcast", "direct", "broadcast", "direct", "direct")
				r := &record{}
				run(t, nc, levels, r, len(want), consumers.Options{Prefetch: prefetch})
				if got := r.handled(); !slices.Equal(got, want) {
					t.Fatalf("round %d handled %v, want stream order %v", round, got, want)
				}
			}
		})
	}
}

// TestStrictLevelsWithLanes: with two lanes per level and the lower level's
// backlog published first, Strict starts every message of the higher level
// first, each level in stream order, also while the lanes' buffers are still
// filling; Buffered reports each level's lanes together.
func TestStrictLevelsWithLanes(t *testing.T) {
	nc, js := setup(t, "high-d", "high-b", "low-d", "low-b")
	levels := [][]string{{"high-d", "high-b"}, {"low-d", "low-b"}}
	for _, prefetch := range []int{1, 2} {
		t.Run(fmt.Sprintf("prefetch=%d", prefetch), func(t *testing.T) {
			for round := range 3 {
				low := publishTo(t, js, "low-d", "low-b", "low-b", "low-d", "low-d", "low-b", "low-d", "low-b")
				high := publishTo(t, js, "high-b", "high-d", "high-b", "high-d", "high-d", "high-b", "high-b", "high-d")
				want := append(high, low...)
				r := &record{gate: make(chan struct{})}
				run(t, nc, levels, r, len(want), consumers.Options{Prefetch: prefetch})
				if got := r.handled(); !slices.Equal(got, want) {
					t.Fatalf("round %d handled %v, want %v: the higher level first, each in stream order", round, got, want)
				}
			}
		})
	}
}

// TestEnsureNarrowsMultiFilterConsumer: a consumer created with two filter
// subjects, as agentbus did before it gave direct messages and broadcasts a
// consumer each, is updated in place to one filter. It keeps its acks, so
// nothing it delivered comes again; the new broadcast consumer starts from
// the stream's beginning and so delivers the retained broadcasts once more.
// The single-filter create request carries the filter in its subject.
func TestEnsureNarrowsMultiFilterConsumer(t *testing.T) {
	nc, js := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	direct, broadcast := "s.agent.a.p1.>", "s.all.p1.>"
	old, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "a_p1", FilterSubjects: []string{direct, broadcast}, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"s.agent.a.p1.x.t", "s.all.p1.x.t", "s.agent.a.p1.x.t"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := old.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Error(); err != nil {
		t.Fatal(err)
	}

	creates := make(chan *nats.Msg, 4)
	spy, err := nc.ChanSubscribe("$JS.API.CONSUMER.CREATE."+stream+".>", creates)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Unsubscribe()
	levels := []consumers.Spec{
		{Name: "a_p1", FilterSubject: direct},
		{Name: "a_b1", FilterSubject: broadcast},
	}
	if _, err := consumers.Ensure(ctx, js, stream, levels, consumers.Settings{}); err != nil {
		t.Fatalf("Ensure over a two-filter consumer: %v", err)
	}
	var subjects []string
	for range levels {
		select {
		case m := <-creates:
			subjects = append(subjects, m.Subject)
		case <-ctx.Done():
			t.Fatalf("saw create requests %v, want %d", subjects, len(levels))
		}
	}
	slices.Sort(subjects)
	want := []string{
		"$JS.API.CONSUMER.CREATE.S.a_b1." + broadcast,
		"$JS.API.CONSUMER.CREATE.S.a_p1." + direct,
	}
	if !slices.Equal(subjects, want) {
		t.Errorf("create requests on %q, want %q", subjects, want)
	}

	for _, tt := range []struct {
		name                 string
		filter               string
		ackFloor, numPending uint64
	}{
		{"a_p1", direct, 3, 0},
		{"a_b1", broadcast, 0, 1},
	} {
		info := consumerInfo(t, js, tt.name)
		if info.Config.FilterSubject != tt.filter || len(info.Config.FilterSubjects) != 0 ||
			info.AckFloor.Stream != tt.ackFloor || info.NumPending != tt.numPending {
			t.Errorf("%s: filter %q %q, ack floor %d, pending %d; want filter %q, ack floor %d, pending %d",
				tt.name, info.Config.FilterSubject, info.Config.FilterSubjects, info.AckFloor.Stream, info.NumPending,
				tt.filter, tt.ackFloor, tt.numPending)
		}
	}
}

// TestStrictWaitsForARefilledLane: a lane whose waiting pull request was
// filled may have more at the server, so Strict does not pass over it for a
// lower level until it has asked again.
func TestStrictWaitsForARefilledLane(t *testing.T) {
	nc, js := setup(t, "high", "low")
	r := &record{gate: make(chan struct{})}
	d, err := consumers.Start(nc, stream, 2, lanesOf([][]string{{"high"}, {"low"}}), r.handle, consumers.Options{
		Prefetch: 1,
		OnError:  func(err error) { t.Errorf("dispatcher: %v", err) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	embeddedtest.WaitFor(t, testTimeout, "both lanes drained, a request waiting at the server for each", func() (bool, string) {
		h, l := consumerInfo(t, js, "high").NumWaiting, consumerInfo(t, js, "low").NumWaiting
		return h == 1 && l == 1, fmt.Sprintf("waiting high %d, low %d", h, l)
	})
	want := publish(t, js, "low")
	embeddedtest.WaitFor(t, testTimeout, "the low message running", func() (bool, string) {
		return len(r.handled()) == 1, fmt.Sprint(r.handled())
	})
	// high-1 fills the waiting request of the high lane; high-2 stays at
	// the server until the lane asks again.
	more := publish(t, js, "high", "high", "low")
	want = append(want, more...)
	embeddedtest.WaitFor(t, testTimeout, "high-1 and low-2 in memory, high-2 at the server", func() (bool, string) {
		b, pending := d.Buffered(), consumerInfo(t, js, "high").NumPending
		return slices.Equal(b, []int{1, 1}) && pending == 1, fmt.Sprintf("buffered %v, high pending %d", b, pending)
	})
	close(r.gate)
	embeddedtest.WaitFor(t, testTimeout, "4 messages handled", func() (bool, string) {
		return len(r.handled()) == 4, fmt.Sprint(r.handled())
	})
	if got := r.handled(); !slices.Equal(got, want) {
		t.Errorf("handled %v, want %v: both high messages before the second low", got, want)
	}
}

// TestAnyLevelLane: the messages of a lane that serves every level, as an
// agent's broadcast consumer does, compete at the level LevelOf gives each
// one: under Strict every higher-level message, from either lane, starts
// before any lower-level one, each level in stream order.
func TestAnyLevelLane(t *testing.T) {
	nc, js := setup(t, "high", "low", "mixed")
	ctx := t.Context()
	var want [2][]uint64 // by level
	for _, subj := range []string{"s.low.m", "s.mixed.1", "s.mixed.0", "s.low.m", "s.high.m", "s.mixed.1", "s.mixed.0", "s.high.m"} {
		ack, err := js.Publish(ctx, subj, nil)
		if err != nil {
			t.Fatal(err)
		}
		level := 0
		if strings.HasSuffix(subj, ".1") || strings.HasPrefix(subj, "s.low.") {
			level = 1
		}
		want[level] = append(want[level], ack.Sequence)
	}
	embeddedtest.WaitFor(t, testTimeout, "messages pending", func() (bool, string) {
		h, l, m := consumerInfo(t, js, "high").NumPending, consumerInfo(t, js, "low").NumPending, consumerInfo(t, js, "mixed").NumPending
		return h == 2 && l == 2 && m == 4, fmt.Sprintf("pending high %d, low %d, mixed %d", h, l, m)
	})
	r := &record{gate: make(chan struct{})}
	levelOf := func(subject string) int {
		if strings.HasSuffix(subject, ".1") {
			return 1
		}
		return 0
	}
	d, err := consumers.Start(nc, stream, 2, []consumers.Lane{
		{Consumer: "high", Level: 0}, {Consumer: "low", Level: 1}, {Consumer: "mixed", Level: consumers.AnyLevel},
	}, r.handle, consumers.Options{Prefetch: 4, LevelOf: levelOf, OnError: func(err error) { t.Errorf("dispatcher: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	// Everything is in memory but the one message running: the picks
	// choose among all of it.
	embeddedtest.WaitFor(t, testTimeout, "all buffered", func() (bool, string) {
		got := d.Buffered()
		return got[0]+got[1] == 7, fmt.Sprint(got)
	})
	close(r.gate)
	embeddedtest.WaitFor(t, testTimeout, "8 handled", func() (bool, string) {
		got := r.handled()
		return len(got) == 8, fmt.Sprint(got)
	})
	// Strict starts nothing before every lane has told what it holds, so
	// even the first start is the highest level's oldest message.
	got := r.handled()
	wantOrder := append(slices.Clone(want[0]), want[1]...)
	if !slices.Equal(got, wantOrder) {
		t.Errorf("handled %v, want level 0 %v then level 1 %v", got, want[0], want[1])
	}
}

// TestEnsureLeavesAnIdenticalConsumer: a second Ensure with the same
// settings reads the consumers and sends no create or update request, which
// would rewrite each configuration on the server's disk.
func TestEnsureLeavesAnIdenticalConsumer(t *testing.T) {
	nc, js := setup(t, "a", "b")
	creates := make(chan *nats.Msg, 4)
	spy, err := nc.ChanSubscribe("$JS.API.CONSUMER.CREATE."+stream+".>", creates)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Unsubscribe()
	specs := []consumers.Spec{{Name: "a", FilterSubject: "s.a.>"}, {Name: "b", FilterSubject: "s.b.>"}}
	if _, err := consumers.Ensure(t.Context(), js, stream, specs, consumers.Settings{}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-creates:
		t.Errorf("Ensure of identical consumers sent %s", m.Subject)
	default:
	}
	// Other settings update the consumer in place.
	if _, err := consumers.Ensure(t.Context(), js, stream, specs[:1], consumers.Settings{MaxDeliver: 9}); err != nil {
		t.Fatal(err)
	}
	if got := consumerInfo(t, js, "a").Config.MaxDeliver; got != 9 {
		t.Errorf("MaxDeliver after update = %d, want 9", got)
	}
}

// TestEnsureNeverLowersAckWaitOrMaxDeliver: an existing consumer keeps a
// longer ack wait and a higher delivery limit than Ensure asks for: the
// agent's other processes keep their messages alive at the pace of theirs.
// Before, a process with WithAckWait(500ms) had the server redeliver
// another's running message (found by a helper session).
func TestEnsureNeverLowersAckWaitOrMaxDeliver(t *testing.T) {
	_, js := setup(t, "a")
	spec := []consumers.Spec{{Name: "a", FilterSubject: "s.a.>"}}
	ensure := func(s consumers.Settings) jetstream.ConsumerConfig {
		t.Helper()
		if _, err := consumers.Ensure(t.Context(), js, stream, spec, s); err != nil {
			t.Fatal(err)
		}
		return consumerInfo(t, js, "a").Config
	}
	ensure(consumers.Settings{AckWait: time.Minute, MaxDeliver: 9})
	if c := ensure(consumers.Settings{AckWait: time.Second, MaxDeliver: 3, MaxAckPending: 7}); c.AckWait != time.Minute || c.MaxDeliver != 9 || c.MaxAckPending != 7 {
		t.Errorf("after an Ensure asking for less: ack wait %v, max deliver %d, max ack pending %d; want 1m, 9, 7", c.AckWait, c.MaxDeliver, c.MaxAckPending)
	}
	ensure(consumers.Settings{MaxDeliver: -1})
	if c := ensure(consumers.Settings{MaxDeliver: 4}); c.MaxDeliver != -1 {
		t.Errorf("max deliver %d after unlimited; want -1", c.MaxDeliver)
	}
}

// TestEnsureNewOnly: a NewOnly consumer created after messages were stored
// does not deliver them, only later ones; an update of its settings keeps
// it where it is.
func TestEnsureNewOnly(t *testing.T) {
	_, js := setup(t)
	ctx := t.Context()
	if _, err := js.Publish(ctx, "s.all.m", nil); err != nil {
		t.Fatal(err)
	}
	spec := consumers.Spec{Name: "all", FilterSubject: "s.all.>", NewOnly: true}
	if _, err := consumers.Ensure(ctx, js, stream, []consumers.Spec{spec}, consumers.Settings{}); err != nil {
		t.Fatal(err)
	}
	if n := consumerInfo(t, js, "all").NumPending; n != 0 {
		t.Fatalf("new NewOnly consumer has %d pending, want 0: it was handed a message stored before it existed", n)
	}
	if _, err := js.Publish(ctx, "s.all.m", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := consumers.Ensure(ctx, js, stream, []consumers.Spec{spec}, consumers.Settings{MaxDeliver: 7}); err != nil {
		t.Fatalf("update of a NewOnly consumer: %v", err)
	}
	embeddedtest.WaitFor(t, testTimeout, "one pending", func() (bool, string) {
		info := consumerInfo(t, js, "all")
		return info.NumPending == 1 && info.Config.MaxDeliver == 7, fmt.Sprintf("pending %d, max deliver %d", info.NumPending, info.Config.MaxDeliver)
	})
}

// TestFullAnyLevelLaneDoesNotBlock: a lane that serves every level and
// will not pull, full (prefetch 1) or with less room than it pulls for
// (prefetch 4, one of a backlog started), holds lower-level messages; its
// empty higher-level queue must not keep Strict waiting for news the lane
// does not fetch. With the prefetch of 4 only 1 of 10 was handled before
// 2026-11-28.
func TestFullAnyLevelLaneDoesNotBlock(t *testing.T) {
	for _, prefetch := range []int{1, 4} {
		t.Run(fmt.Sprint("prefetch ", prefetch), func(t *testing.T) {
			nc, js := setup(t, "high", "mixed")
			const n = 10
			for range n {
				if _, err := js.Publish(t.Context(), "s.mixed.1", nil); err != nil {
					t.Fatal(err)
				}
			}
			r := &record{}
			levelOf := func(subject string) int { return int(subject[len(subject)-1] - '0') }
			d, err := consumers.Start(nc, stream, 2, []consumers.Lane{
				{Consumer: "high", Level: 0}, {Consumer: "mixed", Level: consumers.AnyLevel},
			}, r.handle, consumers.Options{Prefetch: prefetch, LevelOf: levelOf, OnError: func(err error) { t.Errorf("dispatcher: %v", err) }})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				d.Stop()
				<-d.Done()
			}()
			embeddedtest.WaitFor(t, testTimeout, "the lower-level messages handled", func() (bool, string) {
				got := r.handled()
				return len(got) == n, fmt.Sprintf("%d handled, buffered %v", len(got), d.Buffered())
			})
		})
	}
}

// TestAdaptivePrefetchGrowthWakesAFullLane: with the adaptive prefetch a
// lane starts holding one message; when the handlers turn out fast the
// prefetch grows, and a lane that was full at the old size must ask again,
// or Strict waits for news from it for good (a broadcast lane holding a
// low-priority message, its high-priority queue empty).
func TestAdaptivePrefetchGrowthWakesAFullLane(t *testing.T) {
	nc, js := setup(t, "high", "mixed")
	ctx := t.Context()
	for _, subj := range []string{"s.mixed.0", "s.mixed.1"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	embeddedtest.WaitFor(t, testTimeout, "two pending", func() (bool, string) {
		n := consumerInfo(t, js, "mixed").NumPending
		return n == 2, fmt.Sprint(n)
	})
	var d *consumers.Dispatcher
	started := make(chan struct{})
	var handled atomic.Int64
	h := func(ctx context.Context, m *consumers.Msg) {
		defer m.Ack()
		if handled.Add(1) == 1 {
			<-started
			// Return once the lane holds the second message: it is then
			// full at the prefetch of one it started with.
			for ctx.Err() == nil {
				if b := d.Buffered(); b[0]+b[1] == 1 {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	levelOf := func(subject string) int { return int(subject[len(subject)-1] - '0') }
	d, err := consumers.Start(nc, stream, 2, []consumers.Lane{
		{Consumer: "high", Level: 0}, {Consumer: "mixed", Level: consumers.AnyLevel},
	}, h, consumers.Options{LevelOf: levelOf, OnError: func(err error) { t.Errorf("dispatcher: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	close(started)
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	embeddedtest.WaitFor(t, testTimeout, "both handled", func() (bool, string) {
		n := handled.Load()
		return n == 2, fmt.Sprintf("%d handled, buffered %v", n, d.Buffered())
	})
}

// TestAdaptivePrefetchLearnsFromHandlers: a dispatcher with an adaptive
// prefetch times its handlers (fast ones one in eight, the first
// included): after one fast handling a lane pulls what its handlers start
// in PrefetchWindow, up to MaxPrefetch, where it held one, the
// concurrency, before. The test asks for learnedAtLeast: a first handling
// timed under 3 ms, which a loaded machine can stretch a handler of
// microseconds to (three runs at once under -race held 237, not 256).
func TestAdaptivePrefetchLearnsFromHandlers(t *testing.T) {
	const learnedAtLeast = 32
	nc, js := setup(t, "work")
	const n = consumers.MaxPrefetch + 20
	for i := range n {
		js.PublishAsync("s.work.m", []byte(fmt.Sprint(i))) //nolint:errcheck // checked by the count below
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(testTimeout):
		t.Fatal("publishes not acknowledged")
	}
	gate := make(chan struct{})
	var handled atomic.Int64
	h := func(ctx context.Context, m *consumers.Msg) {
		defer m.Ack()
		if handled.Add(1) == 2 { // the first returned at once
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
	}
	d, err := consumers.Start(nc, stream, 1, []consumers.Lane{{Consumer: "work", Level: 0}}, h,
		consumers.Options{OnError: func(err error) { t.Errorf("dispatcher: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	embeddedtest.WaitFor(t, testTimeout, fmt.Sprintf("at least %d buffered behind the blocked handler", learnedAtLeast), func() (bool, string) {
		b := d.Buffered()[0]
		return b >= learnedAtLeast, fmt.Sprintf("%d buffered, %d handled", b, handled.Load())
	})
	if b := d.Buffered()[0]; b > consumers.MaxPrefetch {
		t.Errorf("%d buffered, more than MaxPrefetch %d", b, consumers.MaxPrefetch)
	}
	close(gate)
	embeddedtest.WaitFor(t, testTimeout, "every message handled", func() (bool, string) {
		return handled.Load() == n, fmt.Sprint(handled.Load())
	})
}

// TestHandlerSettles: the handler settles its message once (a second
// settlement is ErrSettled); a message returned unsettled, or whose handler
// panics, is given back and delivered again at once, and reported.
func TestHandlerSettles(t *testing.T) {
	nc, js := setup(t, "a")
	publish(t, js, "a")
	var mu sync.Mutex
	var deliveries []uint64
	var second error
	var reported []error
	h := func(_ context.Context, m *consumers.Msg) {
		mu.Lock()
		deliveries = append(deliveries, m.Metadata.Deliveries)
		n := len(deliveries)
		mu.Unlock()
		switch n {
		case 1: // returned unsettled
		case 2:
			panic("boom")
		default:
			m.Ack()
			err := m.Nak(0)
			mu.Lock()
			second = err
			mu.Unlock()
		}
	}
	d, err := consumers.Start(nc, stream, 1, []consumers.Lane{{Consumer: "a"}}, h, consumers.Options{
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.Stop()
		<-d.Done()
	}()
	embeddedtest.WaitFor(t, testTimeout, "acked on the third delivery", func() (bool, string) {
		info := consumerInfo(t, js, "a")
		mu.Lock()
		defer mu.Unlock()
		return info.AckFloor.Stream == 1 && len(deliveries) == 3, fmt.Sprintf("deliveries %v, ack floor %d", deliveries, info.AckFloor.Stream)
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(deliveries, []uint64{1, 2, 3}) {
		t.Errorf("deliveries %v, want 1 2 3", deliveries)
	}
	if !errors.Is(second, consumers.ErrSettled) {
		t.Errorf("second settlement: %v, want ErrSettled", second)
	}
	if len(reported) != 2 || !errors.Is(reported[1], consumers.ErrHandlerPanic) {
		t.Errorf("reported %v, want the unsettled message and the panic", reported)
	}
}

// startLow starts a dispatcher of two levels over the lanes "low" (level
// 1) and "any" (AnyLevel, which serves both levels as an agent's broadcast
// lane does, so that it starts without a lane of level 0), with one
// handler slot, r's handler and a prefetch of 4, and waits until the first
// message runs. It is stopped when t ends.
func startLow(t *testing.T, nc *nats.Conn, r *record, onError func(error)) *consumers.Dispatcher {
	t.Helper()
	d, err := consumers.Start(nc, stream, 2, []consumers.Lane{{Consumer: "low", Level: 1}, {Consumer: "any", Level: consumers.AnyLevel}}, r.handle,
		consumers.Options{Prefetch: 4, LevelOf: func(string) int { return 1 }, OnError: onError})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		<-d.Done()
	})
	embeddedtest.WaitFor(t, testTimeout, "the first low message running", func() (bool, string) {
		got := r.handled()
		return len(got) == 1, fmt.Sprint(got)
	})
	return d
}

// wantHandled waits until r has handled len(want) messages and checks
// that they were want, in that order.
func wantHandled(t *testing.T, r *record, want []uint64, why string) {
	t.Helper()
	embeddedtest.WaitFor(t, testTimeout, fmt.Sprintf("%d messages handled", len(want)), func() (bool, string) {
		got := r.handled()
		return len(got) == len(want), fmt.Sprint(got)
	})
	if got := r.handled(); !slices.Equal(got, want) {
		t.Errorf("handled %v, want %v: %s", got, want, why)
	}
}

// TestAddLane: a lane added to a running dispatcher delivers its consumer's
// messages, those stored before it was added included, and Strict puts
// them ahead of a lower level's backlog (one handler slot, the low message
// running when the lane is added). AddLane refuses a level out of range, a
// consumer read already, and any lane once the dispatcher stops.
func TestAddLane(t *testing.T) {
	nc, js := setup(t, "high", "low", "any")
	low := publishTo(t, js, "low", "low", "low")
	high := publishTo(t, js, "high", "high")
	r := &record{gate: make(chan struct{})}
	d := startLow(t, nc, r, func(err error) { t.Errorf("dispatcher: %v", err) })
	for _, tt := range []struct {
		name string
		lane consumers.Lane
	}{
		{"level out of range", consumers.Lane{Consumer: "high", Level: 2}},
		{"consumer read already", consumers.Lane{Consumer: "low", Level: 0}},
		{"no consumer", consumers.Lane{Level: 0}},
	} {
		if err := d.AddLane(tt.lane); !errors.Is(err, consumers.ErrInvalidOption) {
			t.Errorf("AddLane, %s: %v, want ErrInvalidOption", tt.name, err)
		}
	}
	if err := d.AddLane(consumers.Lane{Consumer: "high", Level: 0}); err != nil {
		t.Fatal(err)
	}
	embeddedtest.WaitFor(t, testTimeout, "the high lane's messages held", func() (bool, string) {
		got := d.Buffered()
		return got[0] == 2, fmt.Sprint(got)
	})
	close(r.gate)
	wantHandled(t, r, append([]uint64{low[0]}, append(high, low[1:]...)...), "the added higher level before the rest of the lower one")
	d.Stop()
	<-d.Done()
	if err := d.AddLane(consumers.Lane{Consumer: "other", Level: 0}); !errors.Is(err, consumers.ErrStopped) {
		t.Errorf("AddLane after Stop: %v, want ErrStopped", err)
	}
}

// TestAddLaneCreatesConsumer: a lane added with Create has its consumer
// created before it pulls, and while that is under way Strict starts no
// message of a lower level: the one running when the lane was added
// finishes, and the added level's messages, published before its
// consumer existed, start next. A failed creation is reported and tried
// again.
func TestAddLaneCreatesConsumer(t *testing.T) {
	nc, js := setup(t, "low", "any")
	low := publishTo(t, js, "low", "low", "low")
	high := publish(t, js, "high", "high") // no consumer reads them yet
	r := &record{gate: make(chan struct{})}
	var failures atomic.Int32
	d := startLow(t, nc, r, func(error) { failures.Add(1) })
	create, retried := make(chan struct{}), make(chan struct{})
	attempts := 0
	err := d.AddLane(consumers.Lane{Consumer: "high", Level: 0, Create: func(ctx context.Context) error {
		if attempts++; attempts == 1 {
			return errors.New("first attempt fails")
		}
		close(retried)
		select {
		case <-create:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := consumers.Ensure(ctx, js, stream, []consumers.Spec{{Name: "high", FilterSubject: "s.high.>"}}, consumers.Settings{})
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-retried:
	case <-time.After(testTimeout):
		t.Fatal("the failed creation was not tried again")
	}
	if n := failures.Load(); n != 1 {
		t.Errorf("%d errors reported, want the failed creation's", n)
	}
	close(r.gate) // the low message finishes while the consumer is being created
	embeddedtest.WaitFor(t, testTimeout, "the first low message acknowledged", func() (bool, string) {
		info := consumerInfo(t, js, "low")
		return info.AckFloor.Stream >= low[0], fmt.Sprint(info.AckFloor)
	})
	close(create)
	wantHandled(t, r, append([]uint64{low[0]}, append(high, low[1:]...)...), "nothing of the lower level while the higher one's consumer was created")
}

// TestLaneWithoutConsumerYet: a lane whose consumer does not exist gets
// 503 (no responders) for its pulls; the dispatcher keeps asking, reports
// it once it lasts (a consumer another process has just created may not
// take requests for a few milliseconds, which is not worth an error), and
// delivers the consumer's messages once it exists.
func TestLaneWithoutConsumerYet(t *testing.T) {
	nc, js := setup(t)
	seqs := publish(t, js, "late", "late")
	r := &record{}
	errs := startReporting(t, nc, 1, []consumers.Lane{{Consumer: "late"}}, r)
	select {
	case err := <-errs:
		if !errors.Is(err, consumers.ErrPull) || !strings.Contains(err.Error(), "503") {
			t.Errorf("reported %v, want a pull failure with status 503", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("pulls from a missing consumer never reported")
	}
	if _, err := consumers.Ensure(t.Context(), js, stream, []consumers.Spec{{Name: "late", FilterSubject: "s.late.>"}}, consumers.Settings{}); err != nil {
		t.Fatal(err)
	}
	wantHandled(t, r, seqs, "the consumer's messages once it exists")
}

// TestFailingLaneDoesNotHoldStrict: a lane whose pulls keep failing (its
// consumer was deleted) counts as empty between attempts, once its failure
// is reported, so Strict goes on with the levels below it rather than wait
// for it forever.
func TestFailingLaneDoesNotHoldStrict(t *testing.T) {
	nc, js := setup(t, "low")
	low := publishTo(t, js, "low", "low")
	r := &record{}
	errs := startReporting(t, nc, 2, []consumers.Lane{{Consumer: "gone", Level: 0}, {Consumer: "low", Level: 1}}, r)
	wantHandled(t, r, low, "the level below a lane without a consumer")
	select {
	case err := <-errs:
		if !errors.Is(err, consumers.ErrPull) {
			t.Errorf("reported %v, want a pull failure", err)
		}
	default:
		t.Error("the failing lane's pulls were not reported")
	}
}

// startReporting starts a dispatcher of lanes over levels, recording into
// r, and returns the channel its first errors go to (the rest are
// dropped). It stops the dispatcher when t ends.
func startReporting(t *testing.T, nc *nats.Conn, levels int, lanes []consumers.Lane, r *record) <-chan error {
	t.Helper()
	errs := make(chan error, 16)
	d, err := consumers.Start(nc, stream, levels, lanes, r.handle, consumers.Options{OnError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		<-d.Done()
	})
	return errs
}

// TestStoredLaneHoldsStrict: a lane made because a message was found for
// it (Lane.Stored) holds the levels below it even when its consumer says
// at first that it has nothing, as one led from a replica that has not
// stored the message yet does: the message that comes a moment later
// still starts before the level below.
func TestStoredLaneHoldsStrict(t *testing.T) {
	defer consumers.SetStoredWait(testTimeout)()
	nc, js := setup(t, "high", "low")
	low := publishTo(t, js, "low", "low")
	r := &record{}
	errs := startReporting(t, nc, 2, []consumers.Lane{{Consumer: "high", Level: 0, Stored: true}, {Consumer: "low", Level: 1}}, r)
	embeddedtest.WaitFor(t, testTimeout, "the high lane told it has nothing, a request waiting at the server", func() (bool, string) {
		n := consumerInfo(t, js, "high").NumWaiting
		return n == 1, fmt.Sprintf("waiting %d", n)
	})
	if got := r.handled(); len(got) > 0 {
		t.Fatalf("handled %v while the stored lane's message had not come", got)
	}
	want := append(publish(t, js, "high"), low...)
	wantHandled(t, r, want, "the stored lane's message before the level below")
	select {
	case err := <-errs:
		t.Errorf("reported %v", err)
	default:
	}
}

// TestStoredLaneWaitIsBounded: a stored lane whose message never comes
// (another process took it) holds Strict only for StoredWait.
func TestStoredLaneWaitIsBounded(t *testing.T) {
	defer consumers.SetStoredWait(100 * time.Millisecond)()
	nc, js := setup(t, "high", "low")
	low := publishTo(t, js, "low", "low")
	r := &record{}
	startReporting(t, nc, 2, []consumers.Lane{{Consumer: "high", Level: 0, Stored: true}, {Consumer: "low", Level: 1}}, r)
	wantHandled(t, r, low, "the level below, once the stored lane's wait passed")
}
