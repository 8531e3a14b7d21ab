package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
)

func TestZZCloseMidHandling(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	started := make(chan struct{}, 4)
	w1 := newBus(t, s, "worker")
	subscribe(t, w1, func(ctx context.Context, d *bus.Delivery) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	orch := newBus(t, s, "orch")
	type res struct {
		d   *bus.Delivery
		err error
	}
	done := make(chan res, 1)
	go func() {
		d, err := orch.Request(ctx, bus.Message{To: "worker", Type: "T"}, bus.OnProgress(func(*bus.Delivery) {}))
		done <- res{d, err}
	}()
	<-started
	w2 := newBus(t, s, "worker")
	subscribe(t, w2, func(ctx context.Context, d *bus.Delivery) error {
		t.Logf("w2 got it, deliveries %d", d.Deliveries)
		_, err := d.Reply(ctx, bus.Message{Type: "R"})
		return err
	})
	start := time.Now()
	w1.Close()
	r := <-done
	t.Logf("reply %v err %v after %v", r.d != nil, r.err, time.Since(start))
	if r.d != nil {
		st, _ := orch.Status(ctx, r.d.CausationID)
		t.Logf("status %+v", st)
	}
}
