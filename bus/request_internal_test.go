package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// listenerOf returns b's listener for replies, nil when it has none.
func listenerOf(b *Bus) *nats.Subscription {
	b.req.mu.Lock()
	defer b.req.mu.Unlock()
	return b.req.listener
}

// TestListenerLingers: a loop of Requests subscribes one listener, which
// ends listenerLinger after the last of them; Close ends a lingering one at
// once.
func TestListenerLingers(t *testing.T) {
	s := provisionedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subscribeReplying(t, ctx, benchBus(t, s, "worker"))
	orch := benchBus(t, s, "orchestrator")
	request := func() {
		t.Helper()
		if _, err := orch.Request(ctx, Message{To: "worker", Type: "REQUEST"}); err != nil {
			t.Fatalf("Request: %v", err)
		}
	}

	var first *nats.Subscription
	for i := range 3 {
		request()
		l := listenerOf(orch)
		switch {
		case l == nil || !l.IsValid():
			t.Fatalf("request %d: no listener right after it", i)
		case i == 0:
			first = l
		case l != first:
			t.Fatalf("request %d subscribed a listener of its own", i)
		}
	}
	embeddedtest.WaitFor(t, time.Minute, "the idle listener to end", func() (bool, string) {
		return listenerOf(orch) == nil, "still listening"
	})
	if first.IsValid() {
		t.Error("the ended listener is still subscribed")
	}

	request()
	l := listenerOf(orch)
	if l == nil {
		t.Fatal("no listener after a request")
	}
	if err := orch.Close(); err != nil {
		t.Fatal(err)
	}
	if l.IsValid() || listenerOf(orch) != nil {
		t.Error("Close left the lingering listener subscribed")
	}
	if _, err := orch.Request(ctx, Message{To: "worker", Type: "REQUEST"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Request after Close: %v, want ErrClosed", err)
	}
}

// TestPresences: a reading is fresh for presenceFresh, an offline one is
// not kept, and a full set makes room by dropping stale readings only.
func TestPresences(t *testing.T) {
	var ps presences
	t0 := time.Now()
	online := presenceReading{p: Presence{Status: Online}, interval: time.Second, at: t0}
	ps.note("a", online)
	if r, ok := ps.fresh("a", t0.Add(presenceFresh-time.Millisecond)); !ok || r != online {
		t.Errorf("fresh reading: %+v, %v", r, ok)
	}
	if _, ok := ps.fresh("a", t0.Add(presenceFresh)); ok {
		t.Error("a reading presenceFresh old is still fresh")
	}
	ps.note("a", presenceReading{p: Presence{Status: Offline}, at: t0})
	if _, ok := ps.fresh("a", t0); ok {
		t.Error("an offline reading is trusted later")
	}

	for i := range maxPresences {
		ps.note(fmt.Sprint("agent-", i), presenceReading{p: Presence{Status: Unknown}, at: t0})
	}
	ps.note("late", presenceReading{p: Presence{Status: Unknown}, at: t0})
	if _, ok := ps.fresh("late", t0); ok || len(ps.m) != maxPresences {
		t.Errorf("a full set of fresh readings took another: %d readings", len(ps.m))
	}
	later := t0.Add(presenceFresh)
	ps.note("late", presenceReading{p: Presence{Status: Unknown}, at: later})
	if _, ok := ps.fresh("late", later); !ok || len(ps.m) != 1 {
		t.Errorf("stale readings not dropped for a new one: %d readings", len(ps.m))
	}
}

// TestNewPresenceCheck: a request sent on a reading just taken looks again
// every interval of an online agent and never otherwise; one sent on a
// cached reading looks again when it stops being fresh.
func TestNewPresenceCheck(t *testing.T) {
	now := time.Now()
	if c := newPresenceCheck(presenceReading{p: Presence{Status: Unknown}, at: now}, false); c != nil {
		t.Error("a fresh unknown reading is checked again")
	}
	if c := newPresenceCheck(presenceReading{p: Presence{Status: Online}, at: now}, false); c != nil {
		t.Error("an online reading without an interval is checked again")
	}
	c := newPresenceCheck(presenceReading{p: Presence{Status: Online}, interval: time.Hour, at: now}, false)
	if c == nil || c.interval != time.Hour {
		t.Fatalf("online reading: check %+v, want one every hour", c)
	}
	c.stop()
	c = newPresenceCheck(presenceReading{p: Presence{Status: Unknown}, at: now.Add(-presenceFresh)}, true)
	if c == nil {
		t.Fatal("a cached reading is not checked again")
	}
	defer c.stop()
	select {
	case <-c.C():
	case <-time.After(time.Minute):
		t.Fatal("the check of a stale cached reading is not due")
	}
	c.looked(presenceReading{p: Presence{Status: Unknown}}, nil)
	if c.interval != 0 {
		t.Errorf("after an unknown reading the check repeats every %v", c.interval)
	}
}

// TestRequestOnCachedPresence: a request sent on a fresh reading that says
// online, to an agent gone offline since, fails with its AgentOfflineError
// once the reading stops being fresh.
func TestRequestOnCachedPresence(t *testing.T) {
	s := provisionedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	worker := benchBus(t, s, "worker")
	if err := worker.Register(ctx, AgentCard{}); err != nil {
		t.Fatal(err)
	}
	worker.Close()
	orch := benchBus(t, s, "orchestrator")
	orch.presences.note("worker", presenceReading{p: Presence{Status: Online}, interval: time.Hour, at: time.Now()})
	_, err := orch.Request(ctx, Message{To: "worker", Type: "TASK"})
	var offline *AgentOfflineError
	if !errors.As(err, &offline) || offline.Presence.Reason != ReasonShutdown {
		t.Fatalf("Request: %v, want an AgentOfflineError", err)
	}
	if !strings.HasPrefix(err.Error(), "request ") {
		t.Errorf("Request: %v, want the error of a request sent and then found offline", err)
	}
	if _, ok := orch.presences.fresh("worker", time.Now()); ok {
		t.Error("the offline reading was kept")
	}
}

// TestTakenRecordsPutOff: the record of a reply a Request took is written
// once its wait is over, never when its stored copy came meanwhile, at
// once by the flush at Close, and at once after it.
func TestTakenRecordsPutOff(t *testing.T) {
	var (
		r     requests
		mu    sync.Mutex
		wrote []string
	)
	write := func(d *Delivery) {
		mu.Lock()
		defer mu.Unlock()
		wrote = append(wrote, d.ID)
	}
	written := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(wrote)
	}
	reply := func(id string) *Delivery { return &Delivery{Message: Message{ID: id, CausationID: "request-" + id}} }

	r.deferTaken(reply("waited"), write)
	r.deferTaken(reply("copied"), write)
	if took, again := r.take(reply("copied"), false); !took || !again {
		t.Errorf("the stored copy of a put-off reply: took %v, again %v; want both", took, again)
	}
	embeddedtest.WaitFor(t, time.Minute, "the record whose wait is over", func() (bool, string) {
		got := written()
		return slices.Contains(got, "waited"), fmt.Sprint(got)
	})
	r.deferTaken(reply("flushed"), write)
	r.close()
	r.flushTaken(write)
	r.deferTaken(reply("late"), write)
	if got, want := written(), []string{"waited", "flushed", "late"}; !slices.Equal(got, want) {
		t.Errorf("records written %v, want %v (never the one whose copy came)", got, want)
	}
}

// TestReplyIDOf: the derived reply ID is the same for the same request; a
// UUID v7 request's is a v7 under the request's milliseconds, in its
// window; any other request's, a v7 of another variant included, is the
// UUIDv5 it always was.
func TestReplyIDOf(t *testing.T) {
	v7 := "019ab1c2-d3e4-7abc-8def-0123456789ab"
	r := replyIDOf(v7)
	u, err := uuid.Parse(r)
	if err != nil || r != replyIDOf(v7) || r == v7 || u.Version() != 7 || u.Variant() != uuid.RFC4122 || r[:13] != v7[:13] {
		t.Errorf("replyIDOf(%s) = %s (%v), want a v7 of the request's milliseconds, the same each time", v7, r, err)
	}
	for _, id := range []string{"norec-1", "019ab1c2-d3e4-4abc-8def-0123456789ab", "019ab1c2-d3e4-7abc-cdef-0123456789ab"} {
		if got, want := replyIDOf(id), uuid.NewSHA1(replySpace, []byte(id)).String(); got != want {
			t.Errorf("replyIDOf(%s) = %s, want the UUIDv5 %s", id, got, want)
		}
	}
}

// TestHeldReplyOfARequestThatGaveUp: a reply the listener heard while its
// Request caught up after a reconnect is taken and held; a Request that
// gives up before the catch-up ends (its deadline) still gets it from its
// reply channel, as it would one handed over as it gave up. It was
// dropped: taken, so that its stored copy reached no handler either.
func TestHeldReplyOfARequestThatGaveUp(t *testing.T) {
	var r requests
	w := &waiter{request: Status{ID: "request", To: "worker"}, reply: make(chan *Delivery, 1),
		ended: make(chan endSignal, 1), news: make(chan struct{}, 1), follow: true}
	r.waiting = map[string]*waiter{"request": w}
	r.lost() // the connection dropped
	reply := &Delivery{Message: Message{ID: "reply", From: "worker", CausationID: "request"}}
	if took, again := r.take(reply, true); !took || again {
		t.Fatalf("the reply heard while catching up: took %v, again %v; want taken", took, again)
	}
	select {
	case d := <-w.reply:
		t.Fatalf("reply %s handed over before the catch-up", d.ID)
	default:
	}
	r.forget("request") // the Request gave up
	select {
	case d := <-w.reply:
		if d != reply {
			t.Errorf("got %s, want the reply", d.ID)
		}
	default:
		t.Error("the held reply was dropped when its Request gave up")
	}
}

// subscribeReplying subscribes b with a handler that replies RESULT to
// every message, until the test ends.
func subscribeReplying(t *testing.T, ctx context.Context, b *Bus) {
	t.Helper()
	sub, err := b.Subscribe(ctx, func(ctx context.Context, d *Delivery) error {
		_, err := d.Reply(ctx, Message{Type: "RESULT"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Done() })
}
