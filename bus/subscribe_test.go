package bus_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestPublishSubscribeRoundTrip(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "build orchestrator")
	worker := newBus(t, s, "@worker-1")

	sent := bus.Message{
		To:          "@worker-1",
		Type:        "TASK_ASSIGNMENT",
		Priority:    2,
		ContentType: "application/json",
		DataSchema:  "https://example.com/task.json",
		Data:        []byte(`{"task":"build"}`),
		Extensions:  map[string]string{"tenant": "acme"},
	}
	ack := publish(t, orch, sent)
	if ack.ID == "" || ack.Sequence == 0 || ack.Duplicate {
		t.Fatalf("ack = %+v, want an ID, a sequence and no duplicate", ack)
	}

	r := newRecorder()
	subscribe(t, worker, r.handle)
	d := r.waitCount(t, 1)[0]

	if d.ID != ack.ID || d.From != "build orchestrator" || d.To != "@worker-1" || d.Type != "TASK_ASSIGNMENT" ||
		d.Priority != 2 || d.CorrelationID != ack.ID || d.ContentType != "application/json" ||
		d.DataSchema != sent.DataSchema || string(d.Data) != string(sent.Data) || d.Extensions["tenant"] != "acme" {
		t.Errorf("delivered %+v, want the published message", d.Message)
	}
	if d.Sequence != ack.Sequence || d.Deliveries != 1 || d.Subject != ack.Subject {
		t.Errorf("delivery info seq=%d delivered=%d subject=%q, want seq=%d delivered=1 subject=%q",
			d.Sequence, d.Deliveries, d.Subject, ack.Sequence, ack.Subject)
	}
	if want := "agentbus.agent.%40worker-1.p2.build%20orchestrator.TASK_ASSIGNMENT." + subjects.IndexToken(ack.ID) + "." + subjects.ConversationToken(ack.ID); ack.Subject != want || !subjects.Windowed(subjects.IndexToken(ack.ID)) {
		t.Errorf("subject = %q, want %q", ack.Subject, want)
	}
}

// TestStrictPriorityMixedBacklog: with a backlog at every level and
// concurrency 1, messages are handled by priority, FIFO within a level.
func TestStrictPriorityMixedBacklog(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")

	var want []string
	byPriority := map[int][]string{}
	for i := range 30 {
		p := []int{5, 3, 1, 4, 2}[i%5]
		typ := fmt.Sprintf("p%d-%02d", p, i)
		publish(t, sender, bus.Message{To: "agent", Type: typ, Priority: p})
		byPriority[p] = append(byPriority[p], typ)
	}
	for p := 1; p <= 5; p++ {
		want = append(want, byPriority[p]...)
	}

	for _, prefetch := range []int{1, 4} {
		t.Run(fmt.Sprintf("prefetch=%d", prefetch), func(t *testing.T) {
			r := newRecorder()
			if prefetch == 4 { // the first run acked the backlog: queue it again
				for _, typ := range slices.Clone(want) {
					p := int(typ[1] - '0')
					publish(t, sender, bus.Message{To: "agent", Type: typ, Priority: p})
				}
			}
			sub := subscribe(t, agent, r.handle, bus.WithPrefetch(prefetch))
			got := r.waitCount(t, len(want))
			sub.Stop()
			<-sub.Done()
			var types []string
			for _, d := range got {
				types = append(types, d.Type)
			}
			if !slices.Equal(types, want) {
				t.Errorf("handled in order\n%v\nwant\n%v", types, want)
			}
		})
	}
}

// TestHighPriorityPreempts: a p1 message that arrives while p5 work runs is
// the next to start, ahead of the queued p5 backlog, though the agent's p1
// consumer is created only by its arrival.
func TestHighPriorityPreempts(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	for i := range 5 {
		publish(t, sender, bus.Message{To: "agent", Type: fmt.Sprintf("low-%d", i), Priority: 5})
	}

	started := make(chan string, 10)
	release := make(chan struct{})
	var order []string
	var mu sync.Mutex
	sub := subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		mu.Lock()
		order = append(order, d.Type)
		mu.Unlock()
		started <- d.Type
		if d.Type == "low-0" {
			<-release
		}
		return nil
	}, bus.WithPrefetch(4))

	if got := <-started; got != "low-0" {
		t.Fatalf("first started %q, want low-0", got)
	}
	if _, err := consumerInfo(t, agent, "agent_p1"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("p1 consumer before a p1 message: %v, want not found", err)
	}
	publish(t, sender, bus.Message{To: "agent", Type: "urgent", Priority: 1})
	// The p1 message must reach this process before low-0 finishes: wait
	// until it is held in memory, then release.
	waitFor(t, "urgent held", func() (bool, string) {
		b := sub.Buffered()
		return b[0] == 1, fmt.Sprint(b)
	})
	close(release)
	if got := <-started; got != "urgent" {
		t.Fatalf("after low-0 started %q, want urgent", got)
	}
	for range 4 {
		<-started
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"low-0", "urgent", "low-1", "low-2", "low-3", "low-4"}
	if !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
}

// TestConsumersCreatedAsNeeded: a new agent's Subscribe creates its
// broadcast consumer only; a priority's direct consumer is created by its
// first message, which is handled; Bus.EnsureConsumers of a new agent
// creates the broadcast consumer only too, and Admin.EnsureConsumers all
// six.
func TestConsumersCreatedAsNeeded(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	exists := func(name string) bool {
		t.Helper()
		_, err := consumerInfo(t, agent, name)
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	existing := func(agent string) []string {
		var out []string
		for _, suffix := range []string{"_p1", "_p2", "_p3", "_p4", "_p5", "_b"} {
			if exists(agent + suffix) {
				out = append(out, agent+suffix)
			}
		}
		return out
	}

	r := newRecorder()
	subscribe(t, agent, r.handle)
	if got, want := existing("agent"), []string{"agent_b"}; !slices.Equal(got, want) {
		t.Errorf("after Subscribe: consumers %v, want %v", got, want)
	}
	publish(t, sender, bus.Message{To: "agent", Type: "first-p2", Priority: 2})
	publish(t, sender, bus.Message{To: "agent", Type: "second-p2", Priority: 2})
	publish(t, sender, bus.Message{To: bus.Broadcast, Type: "all", Priority: 4})
	r.waitCount(t, 3)
	if got, want := existing("agent"), []string{"agent_p2", "agent_b"}; !slices.Equal(got, want) {
		t.Errorf("after two p2 messages: consumers %v, want %v", got, want)
	}
	if got := r.types(); !slices.Contains(got, "first-p2") || !slices.Contains(got, "second-p2") || !slices.Contains(got, "all") {
		t.Errorf("handled %v, want first-p2, second-p2 and all", got)
	}

	if err := newBus(t, s, "self").EnsureConsumers(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if got, want := existing("self"), []string{"self_b"}; !slices.Equal(got, want) {
		t.Errorf("after Bus.EnsureConsumers: consumers %v, want %v", got, want)
	}
	if err := adminOf(t, s).EnsureConsumers(testContext(t), "provisioned"); err != nil {
		t.Fatal(err)
	}
	if got := existing("provisioned"); len(got) != 6 {
		t.Errorf("after Admin.EnsureConsumers: consumers %v, want all six", got)
	}
}

func TestWeightedPolicyServesLowLevels(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	for i := range 20 {
		publish(t, sender, bus.Message{To: "agent", Type: fmt.Sprintf("high-%d", i), Priority: 1})
	}
	for i := range 5 {
		publish(t, sender, bus.Message{To: "agent", Type: fmt.Sprintf("low-%d", i), Priority: 5})
	}
	r := newRecorder()
	gate := make(chan struct{})
	sub := subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		<-gate
		return r.handle(ctx, d)
	}, bus.WithPolicy(bus.Weighted, 2, 1, 1, 1, 1), bus.WithPrefetch(20))
	// Hold the first handler until the low messages are in memory too, so
	// the policy chooses between both levels from the start.
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // runs before the subscription's cleanup
	waitFor(t, "all messages held in memory", func() (bool, string) {
		b := sub.Buffered()
		return b[0]+b[4] == 24, fmt.Sprint(b) // one is already picked
	})
	release()
	got := r.waitCount(t, 25)
	// Strict order would handle the five low messages last (positions
	// 20-24). With weights 2:1 they interleave, one low per two highs; the
	// first message was picked before both levels were in memory.
	lastLow := slices.IndexFunc(got, func(d *bus.Delivery) bool { return d.Type == "low-4" })
	if lastLow < 0 || lastLow > 16 {
		t.Errorf("low-4 at position %d of %v, want at most 16", lastLow, r.types())
	}
}

func TestBroadcastReachesEveryAgentButSender(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "planner")
	recs := map[string]*recorder{}
	for _, name := range []string{"worker-a", "worker-b", "reviewer"} {
		recs[name] = newRecorder()
		subscribe(t, newBus(t, s, name), recs[name].handle)
	}
	own := newRecorder()
	subscribe(t, sender, own.handle)

	publish(t, sender, bus.Message{To: bus.Broadcast, Type: "PLAN_UPDATED", Priority: 2})
	publish(t, sender, bus.Message{To: "planner", Type: "NOTE_TO_SELF"})
	for name, r := range recs {
		d := r.waitCount(t, 1)[0]
		if d.Type != "PLAN_UPDATED" || d.To != bus.Broadcast || d.From != "planner" {
			t.Errorf("%s got %+v", name, d.Message)
		}
	}
	// The sender handles its direct message, never its own broadcast.
	own.waitCount(t, 1)
	if got := own.types(); !slices.Equal(got, []string{"NOTE_TO_SELF"}) {
		t.Errorf("sender handled %v, want only NOTE_TO_SELF", got)
	}
}

func TestOwnBroadcastsOnRequest(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "solo")
	r := newRecorder()
	subscribe(t, b, r.handle, bus.WithOwnBroadcasts())
	publish(t, b, bus.Message{To: bus.Broadcast, Type: "HELLO"})
	if d := r.waitCount(t, 1)[0]; d.Type != "HELLO" {
		t.Errorf("got %q, want HELLO", d.Type)
	}
}

// TestTwoInstancesSplitWork: two processes of one agent, both subscribed
// before its first message (so each adds the consumer that message
// creates), share the work and handle each message once.
func TestTwoInstancesSplitWork(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	var mu sync.Mutex
	seen := map[string]int{}
	perInstance := [2]int{}
	gate := make(chan struct{})
	for i := range 2 {
		b := newBus(t, s, "worker")
		subscribe(t, b, func(ctx context.Context, d *bus.Delivery) error {
			<-gate // both instances start before work flows
			mu.Lock()
			seen[d.ID]++
			perInstance[i]++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // simulated work, so both get a share
			return nil
		})
	}
	const n = 60
	for i := range n {
		publish(t, sender, bus.Message{To: "worker", Type: fmt.Sprintf("job-%d", i)})
	}
	close(gate)
	waitFor(t, "all jobs", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n, fmt.Sprintf("%d distinct, per instance %v", len(seen), perInstance)
	})
	mu.Lock()
	defer mu.Unlock()
	for id, c := range seen {
		if c != 1 {
			t.Errorf("message %s handled %d times", id, c)
		}
	}
	if perInstance[0] == 0 || perInstance[1] == 0 {
		t.Errorf("work per instance %v, want both to take a share", perInstance)
	}
}

func TestHandlerErrorRedeliversThenTerminates(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	publish(t, sender, bus.Message{To: "agent", Type: "poison", Priority: 1})
	publish(t, sender, bus.Message{To: "agent", Type: "flaky", Priority: 1})
	publish(t, sender, bus.Message{To: "agent", Type: "fine", Priority: 1})

	var mu sync.Mutex
	attempts := map[string][]int{}
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		mu.Lock()
		attempts[d.Type] = append(attempts[d.Type], d.Deliveries)
		mu.Unlock()
		switch {
		case d.Type == "poison":
			return errors.New("cannot handle")
		case d.Type == "flaky" && d.Deliveries < 2:
			return errors.New("try again")
		}
		return nil
	}, bus.WithMaxDeliver(3), bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))

	waitFor(t, "poison given up and others done", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts["poison"]) == 3 && len(attempts["flaky"]) == 2 && len(attempts["fine"]) == 1, fmt.Sprint(attempts)
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts["poison"], []int{1, 2, 3}) {
		t.Errorf("poison deliveries %v, want [1 2 3]", attempts["poison"])
	}
	// Terminated, not left pending: nothing is waiting for an ack.
	waitFor(t, "no ack pending", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p1")
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 0 && info.NumRedelivered == 0, fmt.Sprintf("pending=%d redelivered=%d", info.NumAckPending, info.NumRedelivered)
	})
}

func TestPermanentErrorTerminatesAtOnce(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	publish(t, sender, bus.Message{To: "agent", Type: "bad"})
	var calls atomic.Int32
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		calls.Add(1)
		return bus.Permanent(errors.New("never valid"))
	})
	waitFor(t, "terminated", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream == 1 && info.NumAckPending == 0, fmt.Sprintf("%+v", info.AckFloor)
	})
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1", n)
	}
}

func TestHandlerPanicIsAFailure(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	var bgErrs []error
	var mu sync.Mutex
	agent := newBus(t, s, "agent", bus.WithErrorHandler(func(err error) {
		mu.Lock()
		bgErrs = append(bgErrs, err)
		mu.Unlock()
	}))
	publish(t, sender, bus.Message{To: "agent", Type: "boom"})
	var calls atomic.Int32
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		if calls.Add(1) == 1 {
			panic("handler bug")
		}
		return nil
	}, bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))
	waitFor(t, "redelivered after panic", func() (bool, string) {
		return calls.Load() == 2, fmt.Sprint(calls.Load())
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bgErrs) == 0 || !errors.Is(bgErrs[0], bus.ErrHandlerPanic) {
		t.Errorf("background errors %v, want one wrapping ErrHandlerPanic", bgErrs)
	}
}

// TestLongHandlerIsKeptAlive: a handler that runs for several AckWaits is
// not redelivered, and neither is a message waiting in the prefetch buffer.
func TestLongHandlerIsKeptAlive(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")
	publish(t, sender, bus.Message{To: "agent", Type: "slow"})
	publish(t, sender, bus.Message{To: "agent", Type: "waiting"})
	var deliveries []int
	var mu sync.Mutex
	done := make(chan struct{})
	ackWait := time.Second
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		mu.Lock()
		deliveries = append(deliveries, d.Deliveries)
		n := len(deliveries)
		mu.Unlock()
		if d.Type == "slow" {
			// Stay busy for three AckWaits.
			deadline := time.Now().Add(3 * ackWait)
			for time.Now().Before(deadline) {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		if n == 2 {
			close(done)
		}
		return nil
	}, bus.WithAckWait(ackWait), bus.WithPrefetch(2))
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("timed out")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(deliveries, []int{1, 1}) {
		t.Errorf("delivery counts %v, want [1 1]: nothing redelivered", deliveries)
	}
	info, err := consumerInfo(t, agent, "agent_p3")
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("server redelivered %d messages", info.NumRedelivered)
	}
}

// TestRedeliveryAfterConnectionClosedMidHandler: a subscriber whose
// connection dies mid-handler loses nothing; the next instance gets the
// message after AckWait.
func TestRedeliveryAfterConnectionClosedMidHandler(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	publish(t, sender, bus.Message{To: "agent", Type: "job", Data: []byte("payload")})

	nc1 := embeddedtest.Connect(t, s)
	first, err := bus.New(nc1, "agent")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	sub1, err := first.Subscribe(testContext(t), func(ctx context.Context, d *bus.Delivery) error {
		close(started)
		<-ctx.Done() // never finishes on its own
		return ctx.Err()
	}, bus.WithAckWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	nc1.Close() // the process "crashes": no ack, no nak
	sub1.Stop()
	<-sub1.Done()
	first.Close()

	second := newBus(t, s, "agent")
	r := newRecorder()
	subscribe(t, second, r.handle, bus.WithAckWait(300*time.Millisecond))
	d := r.waitCount(t, 1)[0]
	if d.Type != "job" || string(d.Data) != "payload" || d.Deliveries != 2 {
		t.Errorf("redelivered %q %q delivery %d, want job payload delivery 2", d.Type, d.Data, d.Deliveries)
	}
}

// TestExpiredForOfflineAgent: a message whose TTL passes while its receiver
// is offline is never handled; the others are.
func TestExpiredForOfflineAgent(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	short := publish(t, sender, bus.Message{To: "offline", Type: "short-lived", TTL: time.Second})
	publish(t, sender, bus.Message{To: "offline", Type: "durable"})

	// The server removes the message once its TTL passes.
	js, err := jetstream.New(sender.Conn())
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(testContext(t), sender.Subjects().Stream())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "server to remove the expired message", func() (bool, string) {
		_, err := stream.GetMsg(testContext(t), short.Sequence)
		return errors.Is(err, jetstream.ErrMsgNotFound), fmt.Sprint(err)
	})

	r := newRecorder()
	subscribe(t, newBus(t, s, "offline"), r.handle)
	r.waitCount(t, 1)
	if got := r.types(); !slices.Equal(got, []string{"durable"}) {
		t.Errorf("handled %v, want only durable", got)
	}
}

// TestExpiredBeforeDeliveryNotHandled: a message still in the stream whose
// expirytime has passed (a publisher that set no Nats-TTL) is terminated,
// not handled.
func TestExpiredBeforeDeliveryNotHandled(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	m := &codec.Message{From: "raw", To: "agent", Type: "stale", TTL: time.Second}
	m.SetDefaults(time.Now().Add(-time.Minute))
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: "agentbus.agent.agent.p3.raw.stale", Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sender := newBus(t, s, "sender")
	publish(t, sender, bus.Message{To: "agent", Type: "fresh"})

	agent := newBus(t, s, "agent")
	r := newRecorder()
	subscribe(t, agent, r.handle)
	r.waitCount(t, 1)
	waitFor(t, "stale terminated", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 0 && info.AckFloor.Stream == 2, fmt.Sprintf("%+v", info.AckFloor)
	})
	if got := r.types(); !slices.Equal(got, []string{"fresh"}) {
		t.Errorf("handled %v, want only fresh", got)
	}
}

// TestRawNonCloudEventIsTerminated: garbage published straight onto an
// agent's subject never reaches the handler and never blocks the queue.
func TestRawNonCloudEventIsTerminated(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(testContext(t), "agentbus.agent.agent.p1.raw.junk", []byte("not a cloudevent")); err != nil {
		t.Fatal(err)
	}
	sender := newBus(t, s, "sender")
	publish(t, sender, bus.Message{To: "agent", Type: "good", Priority: 1})

	_, bgErrs := handleOnly(t, s, "agent", "good", codec.ErrMalformed)
	if bgErrs.Load() != 1 {
		t.Errorf("%d decode errors reported, want 1", bgErrs.Load())
	}
}

func TestIdleSubscriberDoesNotPoll(t *testing.T) {
	s := newServer(t)
	agent := newBus(t, s, "idle")
	spy := embeddedtest.Connect(t, s)
	var requests atomic.Int32
	sub, err := spy.Subscribe("$JS.API.CONSUMER.MSG.NEXT.>", func(*nats.Msg) { requests.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	subscribe(t, agent, func(context.Context, *bus.Delivery) error { return nil })
	// Observe a fixed window: an idle subscription sends one no-wait and one
	// waiting request per consumer it has, then nothing until the 30s
	// expiry. A new agent has one, its broadcasts' (consumers are created
	// when due).
	time.Sleep(2 * time.Second)
	cs, err := agent.Subjects().Consumers("idle")
	if err != nil {
		t.Fatal(err)
	}
	have := 0
	for _, c := range cs {
		if _, err := consumerInfo(t, agent, c.Name); err == nil {
			have++
		}
	}
	if n := requests.Load(); have != 1 || n > 2*int32(have) {
		t.Errorf("%d pull requests in 2s while idle, for %d consumers; want one consumer and at most 2 requests", n, have)
	}
}

// TestStopGivesBackHeldMessages: messages a stopped subscriber held in
// memory or was handling reach the agent's next process at once, not after
// AckWait (a minute here, longer than the test may wait).
func TestStopGivesBackHeldMessages(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	for i := range 5 {
		publish(t, sender, bus.Message{To: "agent", Type: fmt.Sprintf("job-%d", i)})
	}
	first := newBus(t, s, "agent")
	started := make(chan struct{}, 1)
	sub := subscribe(t, first, func(ctx context.Context, d *bus.Delivery) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}, bus.WithPrefetch(10), bus.WithAckWait(time.Minute))
	<-started
	waitFor(t, "all five held by the first process", func() (bool, string) {
		info, err := consumerInfo(t, first, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 5, fmt.Sprint(info.NumAckPending)
	})
	sub.Stop()
	<-sub.Done()

	r := newRecorder()
	subscribe(t, newBus(t, s, "agent"), r.handle, bus.WithAckWait(time.Minute))
	got := r.waitCount(t, 5)
	var types []string
	for _, d := range got {
		types = append(types, d.Type)
	}
	slices.Sort(types)
	if want := []string{"job-0", "job-1", "job-2", "job-3", "job-4"}; !slices.Equal(types, want) {
		t.Errorf("second process handled %v, want %v", types, want)
	}
}

// TestDrainFinishesInFlight: Drain lets a running handler finish and acks
// its message; nothing is redelivered.
func TestDrainFinishesInFlight(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	publish(t, sender, bus.Message{To: "agent", Type: "long"})
	agent := newBus(t, s, "agent")
	started, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	sub := subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		close(started)
		<-release
		finished.Store(ctx.Err() == nil) // Drain does not cancel the handler
		return nil
	})
	<-started
	drained := make(chan error, 1)
	go func() { drained <- sub.Drain(testContext(t)) }()
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v while the handler was running", err)
	case <-time.After(100 * time.Millisecond): // Drain must still be waiting
	}
	close(release)
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if !finished.Load() {
		t.Error("handler's context was cancelled by Drain")
	}
	// The ack is on its way (acks are not waited for): poll the server.
	waitFor(t, "the message acked", func() (bool, string) {
		info, err := consumerInfo(t, agent, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream == 1 && info.NumAckPending == 0 && info.NumRedelivered == 0,
			fmt.Sprintf("ack floor %d, pending %d, redelivered %d", info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered)
	})
}

// TestNewAgentGetsNoPastBroadcasts: an agent's broadcasts start when its
// consumers are first created: a broadcast sent before that never reaches
// it (an old "stop" would otherwise greet every new agent), while the
// messages sent to it directly before it ever subscribed wait for it, and
// an agent whose consumers exist (EnsureConsumers, or an earlier
// Subscribe) gets the broadcasts sent while it was away.
func TestNewAgentGetsNoPastBroadcasts(t *testing.T) {
	s := newServer(t)
	lead := newBus(t, s, "lead")
	known := newBus(t, s, "known")
	if err := known.EnsureConsumers(testContext(t)); err != nil {
		t.Fatal(err)
	}
	publish(t, lead, bus.Message{To: bus.Broadcast, Type: "STOP", Priority: 1})
	publish(t, lead, bus.Message{To: "newcomer", Type: "WELCOME", Priority: 3})

	newcomer := newBus(t, s, "newcomer")
	r := newRecorder()
	subscribe(t, newcomer, r.handle)
	r.waitCount(t, 1)
	publish(t, lead, bus.Message{To: bus.Broadcast, Type: "LATER", Priority: 5})
	r.waitCount(t, 2)
	if got := r.types(); !slices.Equal(got, []string{"WELCOME", "LATER"}) {
		t.Errorf("newcomer handled %v, want [WELCOME LATER]: no broadcast from before it existed", got)
	}

	k := newRecorder()
	subscribe(t, known, k.handle)
	k.waitCount(t, 2)
	if got := k.types(); !slices.Equal(got, []string{"STOP", "LATER"}) {
		t.Errorf("known agent handled %v, want [STOP LATER]", got)
	}
}

// TestConsumerDueWhileDisconnected: a message sent at a priority the
// subscriber has no consumer for, while its connection is down, reaches
// it once it is back: its watch cannot hear it then, so the subscriber
// looks at the stream when it reconnects (or, at the latest, two seconds
// after it started).
func TestConsumerDueWhileDisconnected(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	agent := dialBus(t, s.ClientURL(), "agent", bus.WithNATSOptions(nats.ReconnectWait(time.Second)))
	r := newRecorder()
	subscribe(t, agent, r.handle)

	opts := s.Options()
	s.Shutdown()
	waitFor(t, "the agent to notice the server is gone", func() (bool, string) {
		return !agent.Conn().IsConnected(), agent.Conn().Status().String()
	})
	s2 := startAgain(t, opts)
	publish(t, newBus(t, s2, "sender"), bus.Message{To: "agent", Type: "while-away", Priority: 2})
	if got := r.waitCount(t, 1); got[0].Type != "while-away" {
		t.Errorf("handled %v, want while-away", r.types())
	}
	if _, err := consumerInfo(t, agent, "agent_p2"); err != nil {
		t.Errorf("p2 consumer after its first message: %v", err)
	}
}

// TestLookWithoutAnswerCreatesNoConsumer: a running subscriber's periodic
// look at the stream that gets no answer (here the stream stops serving
// direct gets) is reported and creates no consumer; the priorities are
// asked about again at the next look. Counting them as holding a message,
// as the looks at the start do, would give the agent every consumer after
// any passing outage.
func TestLookWithoutAnswerCreatesNoConsumer(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	nc := embeddedtest.Connect(t, s)
	var asked atomic.Int32
	spy, err := nc.Subscribe(subjects.Default().StreamDirectGetPrefix()+"agentbus.agent.bob.>", func(*nats.Msg) { asked.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	looks := make(chan error, 100)
	bob := newBus(t, s, "bob", bus.WithErrorHandler(func(err error) {
		if strings.Contains(err.Error(), "look for messages to bob") {
			select {
			case looks <- err:
			default:
			}
		}
	}))
	subscribe(t, bob, func(context.Context, *bus.Delivery) error { return nil }, bus.WithLooks(10*time.Millisecond, 100*time.Millisecond))
	// The look at the start and the late one, which would count a
	// priority without an answer as holding a message, are over once the
	// first periodic look has begun: five direct gets each, one look
	// after another.
	waitFor(t, "the first periodic look", func() (bool, string) {
		return asked.Load() > 10, fmt.Sprint(asked.Load(), " direct gets")
	})
	if err := spy.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the server has dropped the spy's interest
		t.Fatal(err)
	}
	editStream(t, s, bob.Subjects().Stream(), func(cfg *jetstream.StreamConfig) { cfg.AllowDirect = false })
	// A second look comes only if the first added no lane.
	for i := range 2 {
		select {
		case err := <-looks:
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("look reported %v, want no responders", err)
			}
		case <-ctx.Done():
			t.Fatalf("%d looks reported their missing answer, want 2: a look that takes the priorities for due adds their lanes and looks no more", i)
		}
	}
	for p := subjects.HighestPriority; p <= subjects.LowestPriority; p++ {
		if _, err := consumerInfo(t, bob, fmt.Sprintf("bob_p%d", p)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("bob_p%d after looks without an answer: %v, want none", p, err)
		}
	}
}

// TestStopOnTheLastDeliveryGivesBack: the messages a stopping process held,
// on their last delivery allowed (WithMaxDeliver(1): every delivery),
// reach the next process. The server's delivery limit was the
// subscription's, so a message given back on it was never delivered
// again: the next process got none of the four.
func TestStopOnTheLastDeliveryGivesBack(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	for i := range 4 {
		publish(t, sender, bus.Message{To: "agent", Type: fmt.Sprintf("job-%d", i)})
	}
	opts := []bus.SubscribeOption{bus.WithMaxDeliver(1), bus.WithPrefetch(10), bus.WithAckWait(time.Minute)}
	first := newBus(t, s, "agent")
	started := make(chan struct{}, 1)
	sub := subscribe(t, first, func(ctx context.Context, d *bus.Delivery) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}, opts...)
	<-started
	waitFor(t, "all four held by the first process", func() (bool, string) {
		info, err := consumerInfo(t, first, "agent_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 4, fmt.Sprint(info.NumAckPending)
	})
	sub.Stop() // a graceful stop: nothing failed
	<-sub.Done()
	r := newRecorder()
	subscribe(t, newBus(t, s, "agent"), r.handle, opts...)
	r.waitCount(t, 4)
}

// TestGiveBack checks that a message its handler gives back (GiveBack) is
// delivered again at once, is no failure (no failed record, no step
// towards the delivery limit: with WithMaxDeliver(1) it is not
// dead-lettered), and reads completed once handled.
func TestGiveBack(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	ack := publish(t, sender, bus.Message{To: "agent", Type: "job"})
	agent := newBus(t, s, "agent")
	var states []bus.State
	r := newRecorder()
	subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
		if d.Deliveries == 1 {
			return bus.GiveBack(0)
		}
		sts, err := sender.Status(ctx, d.ID)
		if err != nil || len(sts) != 1 {
			return fmt.Errorf("status: %v %v", sts, err)
		}
		states = append(states, sts[0].State)
		return r.handle(ctx, d)
	}, bus.WithMaxDeliver(1))
	if d := r.waitCount(t, 1)[0]; d.ID != ack.ID || d.Deliveries != 2 {
		t.Fatalf("handled %s on delivery %d; want %s on delivery 2", d.ID, d.Deliveries, ack.ID)
	}
	if states[0] != bus.StateDelivered {
		t.Errorf("the redelivery read %s before its handler ran; want delivered (not failed)", states[0])
	}
	waitFor(t, "completed", func() (bool, string) {
		sts, err := sender.Status(testContext(t), ack.ID)
		return err == nil && len(sts) == 1 && sts[0].State == bus.StateCompleted, fmt.Sprint(sts, err)
	})
	if n := len(deadLetters(t, agent)); n != 0 {
		t.Errorf("%d dead letters; want none", n)
	}
}

// TestBroadcastBacklogIsHandled: a backlog or a burst of broadcasts is
// handled in full, and a priority-1 direct message sent meanwhile too.
// Before, once the broadcast consumer's lane held less room than it pulls
// for, the dispatcher waited for news from it that it never asked for: an
// agent with a prefetch of 4 handled 1 of 20 broadcasts and nothing after,
// and with the default prefetch and a 2 ms handler 2 of 600 (found by a
// helper session).
func TestBroadcastBacklogIsHandled(t *testing.T) {
	backlog := func(t *testing.T, n int) (*embedded.Server, *bus.Bus, *bus.Bus) {
		s := newServer(t)
		sender, agent := newBus(t, s, "sender", bus.WithoutLifecycle()), newBus(t, s, "agent")
		if err := agent.EnsureConsumers(testContext(t)); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if _, err := sender.PublishAsync(testContext(t), bus.Message{To: bus.Broadcast, Type: fmt.Sprintf("b-%03d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		<-sender.PublishAsyncComplete()
		return s, sender, agent
	}
	t.Run("backlog, prefetch 4", func(t *testing.T) {
		_, sender, agent := backlog(t, 20)
		r := newRecorder()
		subscribe(t, agent, r.handle, bus.WithPrefetch(4))
		r.waitCount(t, 1)
		publish(t, sender, bus.Message{To: "agent", Type: "direct", Priority: 1})
		r.waitCount(t, 21)
	})
	t.Run("burst, prefetch 4", func(t *testing.T) {
		s := newServer(t)
		sender, agent := newBus(t, s, "sender", bus.WithoutLifecycle()), newBus(t, s, "agent")
		r := newRecorder()
		subscribe(t, agent, r.handle, bus.WithPrefetch(4))
		for i := range 50 {
			if _, err := sender.PublishAsync(testContext(t), bus.Message{To: bus.Broadcast, Type: fmt.Sprintf("b-%02d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		r.waitCount(t, 50)
	})
	t.Run("backlog, default prefetch", func(t *testing.T) {
		_, _, agent := backlog(t, 300)
		r := newRecorder()
		subscribe(t, agent, func(ctx context.Context, d *bus.Delivery) error {
			time.Sleep(2 * time.Millisecond) // the handler's work
			return r.handle(ctx, d)
		})
		r.waitCount(t, 300)
	})
}

// TestHandlerGoexit: a handler that ends its goroutine with runtime.Goexit
// (t.FailNow or t.Fatal called in a handler) fails its delivery like a
// panic: the message is given back and the subscription goes on. Before,
// the worker ended with it and the message stayed in flight, kept alive:
// with the default concurrency of 1 nothing more was handled (found by a
// helper session).
func TestHandlerGoexit(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	publish(t, sender, bus.Message{To: "agent", Type: "exits"})
	publish(t, sender, bus.Message{To: "agent", Type: "next"})
	var exited atomic.Bool
	r := newRecorder()
	subscribe(t, newBus(t, s, "agent"), func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "exits" && !exited.Swap(true) {
			runtime.Goexit()
		}
		return r.handle(ctx, d)
	})
	for _, d := range r.waitCount(t, 2) {
		if d.Type == "exits" && d.Deliveries != 2 {
			t.Errorf("the message whose handler exited was handled on delivery %d, want 2", d.Deliveries)
		}
	}
}

// nilErr is an error type whose Error method reads its receiver, as most
// do: a nil *nilErr returned as an error (Go's typed nil) panics when its
// text is asked for.
type nilErr struct{ msg string }

func (e *nilErr) Error() string { return e.msg }

// TestHandlerReturnsATypedNilError: a handler that returns a nil *T as its
// error fails like any other. Permanent dead-letters it after one
// delivery; a plain one records failed and waits for the backoff. Before,
// the settlement asked the error for its text, panicked, and the message
// was given back at once, again and again, reported as a handler panic,
// never dead-lettered and without a failed record (found by hunt h14).
func TestHandlerReturnsATypedNilError(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	var panics atomic.Int32
	onError := bus.WithErrorHandler(func(err error) {
		if errors.Is(err, bus.ErrHandlerPanic) {
			panics.Add(1)
		}
	})
	var calls atomic.Int32
	worker := newBus(t, s, "worker", onError)
	subscribe(t, worker, func(context.Context, *bus.Delivery) error {
		calls.Add(1)
		var e *nilErr
		return bus.Permanent(e)
	})
	publish(t, sender, bus.Message{To: "worker", Type: "job"})
	dl := waitDeadLetters(t, worker, 1)[0]
	if reason := dl.Header.Get(bus.HeaderDeadLetterReason); reason != string(bus.ReasonRejected) || calls.Load() != 1 || panics.Load() != 0 {
		t.Errorf("Permanent(nil *T): dead letter %q after %d deliveries, %d panics reported; want rejected after 1, none", reason, calls.Load(), panics.Load())
	}

	other := newBus(t, s, "other", onError)
	subscribe(t, other, func(context.Context, *bus.Delivery) error {
		var e *nilErr
		return e
	}, bus.WithBackoff(func(int) time.Duration { return time.Hour }))
	ack := publish(t, sender, bus.Message{To: "other", Type: "job"})
	st := waitState(t, sender, ack.ID, bus.StateFailed)
	if !strings.Contains(st.Reason, "nil *bus_test.nilErr") || panics.Load() != 0 {
		t.Errorf("a nil *T: record %+v, %d panics reported; want failed naming the type, none", st, panics.Load())
	}
}
