package bus

import (
	"context"
	"errors"
	"testing"
	"time"

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
	worker := benchBus(t, s, "worker")
	sub, err := worker.Subscribe(ctx, func(ctx context.Context, d *Delivery) error {
		_, err := d.Reply(ctx, Message{Type: "RESULT"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sub.Stop(); <-sub.Done() }()
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
