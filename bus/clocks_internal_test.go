package bus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestLookupOnAClockAheadLeavesAQueuedRequestLive: an operator whose clock
// runs two minutes ahead looks up a request still queued for a busy
// worker, within its reply-by. The lookup answers expired, by its clock,
// but does not write it: the worker, whose clock agrees with the
// requester's, still handles the request. Before 2026-11-28 the lookup
// wrote expired, and the worker dropped the request unhandled as settled.
func TestLookupOnAClockAheadLeavesAQueuedRequestLive(t *testing.T) {
	s := provisionedServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	orch, worker := benchBus(t, s, "orchestrator"), benchBus(t, s, "worker")
	admin, err := NewAdmin(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })

	id := codec.NewID()
	replied := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := orch.Request(rctx, Message{ID: id, To: "worker", Type: "REQUEST"})
		replied <- err
	}()
	var sts []Status
	embeddedtest.WaitFor(t, 20*time.Second, "the request pending", func() (bool, string) {
		sts, err = admin.Status(ctx, id)
		return err == nil && len(sts) == 1 && sts[0].State == StatePending, fmt.Sprint(sts, err)
	})

	admin.status.deriveAt(ctx, sts, time.Now().Add(2*time.Minute))
	if sts[0].State != StateExpired {
		t.Errorf("the lookup two minutes ahead read %s, want expired (by its clock)", sts[0].State)
	}
	if err := admin.status.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if now, err := admin.Status(ctx, id); err != nil || len(now) != 1 || now[0].State != StatePending {
		t.Errorf("after the lookup two minutes ahead, the record reads %v, %v; want pending", now, err)
	}

	subscribeReplying(t, ctx, worker)
	if err := <-replied; err != nil {
		t.Errorf("Request: %v; want the worker's reply", err)
	}
}
