package bus_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestProgressAcrossWorkerCrash: a worker that crashes mid-task after two
// updates leaves the request to the next instance, which numbers its
// updates on from there and replies once; the requester sees every update
// in order and exactly one reply, and no copy of the reply reaches its
// handler.
func TestProgressAcrossWorkerCrash(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	copies := newRecorder()
	subscribe(t, orch, copies.handle)

	nc := embeddedtest.Connect(t, s)
	first, err := bus.New(nc, "worker")
	if err != nil {
		t.Fatal(err)
	}
	crashed := make(chan struct{})
	sub, err := first.Subscribe(testContext(t), func(ctx context.Context, d *bus.Delivery) error {
		for i := 1; i <= 2; i++ {
			if err := d.Progress(ctx, bus.Progress{Message: fmt.Sprintf("first %d", i)}); err != nil {
				return err
			}
		}
		close(crashed)
		<-ctx.Done()
		return ctx.Err()
	}, bus.WithAckWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}

	var got []string
	replied := make(chan error, 1)
	go func() {
		d, err := orch.Request(testContext(t), bus.Message{ID: "crash-1", To: "worker", Type: "BUILD"}, bus.OnProgress(func(u *bus.Delivery) {
			p, n, _ := u.ProgressUpdate()
			got = append(got, fmt.Sprintf("%d %s", n, p.Message))
		}))
		if err == nil && d.Type != "DONE" {
			err = fmt.Errorf("reply %s", d.Type)
		}
		replied <- err
	}()
	<-crashed
	// The records of both updates are stored before the crash: the next
	// instance numbers on from them.
	waitFor(t, "two updates recorded", func() (bool, string) {
		sts, err := orch.Status(testContext(t), "crash-1")
		return err == nil && sts[0].Progress == 2, fmt.Sprintf("%+v %v", sts, err)
	})
	nc.Close() // the worker crashes: no ack, no nak
	sub.Stop()
	<-sub.Done()
	first.Close()

	runs := 0
	subscribe(t, newBus(t, s, "worker"), func(ctx context.Context, d *bus.Delivery) error {
		runs++
		for i := 1; i <= 3; i++ {
			if err := d.Progress(ctx, bus.Progress{Message: fmt.Sprintf("second %d", i)}); err != nil {
				return err
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	}, bus.WithAckWait(300*time.Millisecond))
	if err := <-replied; err != nil {
		t.Fatal(err)
	}
	want := []string{"1 first 1", "2 first 2", "3 second 1", "4 second 2", "5 second 3"}
	if !slices.Equal(got, want) {
		t.Errorf("updates %q, want %q", got, want)
	}
	st := waitState(t, orch, "crash-1", bus.StateReplied)
	if st.Progress != 5 || st.Deliveries != 2 || runs != 1 {
		t.Errorf("record %+v after %d runs, want replied after 5 updates on delivery 2, one run", st, runs)
	}
	// Nothing of the exchange reaches the requester's handler: a marker
	// sent after it is the first thing there.
	publish(t, newBus(t, s, "worker"), bus.Message{To: "orchestrator", Type: "MARKER"})
	if d := copies.waitCount(t, 1)[0]; d.Type != "MARKER" {
		t.Errorf("the requester's handler got %s %+v", d.Type, d.Message)
	}
}

// TestCancelQueuedAcrossWorkerRestart: a message canceled while its worker
// is away is never handed to it when it comes back; the next one is.
func TestCancelQueuedAcrossWorkerRestart(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	away := newBus(t, s, "worker")
	sub := subscribe(t, away, func(context.Context, *bus.Delivery) error { return nil })
	sub.Stop()
	<-sub.Done()
	away.Close()

	doomed := publish(t, orch, bus.Message{To: "worker", Type: "DOOMED", Priority: 2})
	waitState(t, orch, doomed.ID, bus.StatePending)
	if _, err := orch.Cancel(testContext(t), doomed.ID); err != nil {
		t.Fatal(err)
	}
	publish(t, orch, bus.Message{To: "worker", Type: "NEXT", Priority: 3})

	r := newRecorder()
	subscribe(t, newBus(t, s, "worker"), r.handle)
	if got := r.waitCount(t, 1); got[0].Type != "NEXT" {
		t.Errorf("the worker got %s first, want NEXT", got[0].Type)
	}
	if st := waitState(t, orch, doomed.ID, bus.StateCanceled); st.By != "orchestrator" {
		t.Errorf("record %+v", st)
	}
	if got := r.types(); len(got) != 1 {
		t.Errorf("the worker got %v, want only NEXT", got)
	}
}

// TestProgressTenThousandUpdates: a long stream of updates arrives whole
// and in order before the one reply.
func TestProgressTenThousandUpdates(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	const updates = 10_000
	subscribe(t, newBus(t, s, "worker"), func(ctx context.Context, d *bus.Delivery) error {
		for i := 1; i <= updates; i++ {
			if err := d.Progress(ctx, bus.Progress{Message: "step"}); err != nil {
				return err
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	next := 1
	// 10,000 stored publishes take about 2 s, and 15 s or more under -race:
	// testTimeout, which bounds a wait, would make the request's reply-by
	// deadline pass on a loaded machine (it did, with two test runs and a
	// fuzzer beside it). The test is about order and loss, not speed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*testTimeout)
	defer cancel()
	d, err := orch.Request(ctx, bus.Message{To: "worker", Type: "LONG"}, bus.OnProgress(func(u *bus.Delivery) {
		if _, n, ok := u.ProgressUpdate(); !ok || n != next {
			t.Fatalf("update %d arrived as number %d (%v)", next, n, ok)
		}
		next++
	}))
	if err != nil || d.Type != "DONE" {
		t.Fatalf("Request = %+v, %v", d, err)
	}
	if next-1 != updates {
		t.Errorf("%d updates before the reply, want %d", next-1, updates)
	}
}
