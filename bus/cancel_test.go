package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/bus"
)

// TestCancelQueued: a message canceled while it waits for its recipient is
// never handed to a handler, and its record ends canceled; the work behind
// it flows.
func TestCancelQueued(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	doomed := publish(t, orch, bus.Message{To: "worker", Type: "DOOMED", Priority: 3})
	publish(t, orch, bus.Message{To: "worker", Type: "KEPT", Priority: 4})
	st, err := orch.Cancel(testContext(t), doomed.ID)
	if err != nil || st.State != bus.StateCanceled || st.By != "orchestrator" {
		t.Fatalf("Cancel = %+v, %v", st, err)
	}
	r := newRecorder()
	subscribe(t, newBus(t, s, "worker"), r.handle)
	r.waitCount(t, 1)
	if got := r.types(); len(got) != 1 || got[0] != "KEPT" {
		t.Errorf("handled %v, want only KEPT", got)
	}
	if st := waitState(t, orch, doomed.ID, bus.StateCanceled); !strings.Contains(st.Reason, "orchestrator") {
		t.Errorf("record %+v", st)
	}
}

// TestCancelQueuedAtPriorityOne: a priority-1 message canceled while its
// recipient was away is not handled when the recipient comes back, under
// the generated permissions and with several handlers. Its notice, also of
// priority 1, is stored after it in the same consumer; the subscriber
// reads the queued notices before it handles anything. Before, it handled
// the canceled message first (and, with handlers running beside each
// other, sometimes one of priority 3 while the notice was being taken).
func TestCancelQueuedAtPriorityOne(t *testing.T) {
	srv := newAuthServer(t, "lead", "worker")
	var workerErrs errorTally
	lead := srv.agentBus(t, "lead", func(error) {})
	away := srv.agentBus(t, "worker", workerErrs.add)
	if err := away.EnsureConsumers(testContext(t)); err != nil {
		t.Fatal(err)
	}
	var doomed []string
	for _, p := range []int{1, 1, 3} {
		ack := publish(t, lead, bus.Message{To: "worker", Type: "DOOMED", Priority: p})
		if _, err := lead.Cancel(testContext(t), ack.ID); err != nil {
			t.Fatal(err)
		}
		doomed = append(doomed, ack.ID)
	}
	kept := publish(t, lead, bus.Message{To: "worker", Type: "KEPT", Priority: 5})

	r := newRecorder()
	subscribe(t, srv.agentBus(t, "worker", workerErrs.add), r.handle, bus.WithConcurrency(4))
	if got := r.waitCount(t, 1); got[0].ID != kept.ID {
		t.Errorf("the worker handled %s %s first, want KEPT", got[0].Type, got[0].ID)
	}
	for _, id := range doomed {
		waitState(t, lead, id, bus.StateCanceled)
	}
	if got := r.types(); len(got) != 1 {
		t.Errorf("the worker handled %v, want only KEPT", got)
	}
	if workerErrs.total() != 0 {
		t.Errorf("the worker's errors: %v", &workerErrs)
	}
}

// TestCancelRunning: canceling a message whose handler runs cancels the
// handler's context with ErrCanceled; what the handler returns is
// recorded, and the message is not delivered again.
func TestCancelRunning(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	started := make(chan struct{})
	returned := make(chan error, 4)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type != "LONG" {
			return nil
		}
		close(started)
		<-ctx.Done()
		err := context.Cause(ctx)
		returned <- err
		return errors.New("stopped half way")
	})
	ack := publish(t, orch, bus.Message{To: "worker", Type: "LONG"})
	<-started
	if _, err := orch.Cancel(testContext(t), ack.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-returned; !errors.Is(err, bus.ErrCanceled) {
		t.Errorf("the handler's context cause %v, want ErrCanceled", err)
	}
	// The canceller's record comes first; the worker's, with what its
	// handler returned, a moment after the handler ends.
	waitFor(t, "the worker's canceled record", func() (bool, string) {
		sts, err := orch.Status(testContext(t), ack.ID)
		if err != nil {
			return false, err.Error()
		}
		st := sts[0]
		return st.State == bus.StateCanceled && st.By == "worker" && strings.Contains(st.Reason, "stopped half way"), fmt.Sprintf("%+v", st)
	})
	// Not delivered again: the next message is the next handled.
	publish(t, orch, bus.Message{To: "worker", Type: "NEXT"})
	waitState(t, worker, ack.ID, bus.StateCanceled)
	select {
	case err := <-returned:
		t.Errorf("the canceled message ran again (%v)", err)
	default:
	}
}

// runUntilCanceled subscribes b with a handler that runs until its context
// ends, and returns when it started and the cause it ended with.
func runUntilCanceled(t *testing.T, b *bus.Bus) (started <-chan struct{}, cause <-chan error) {
	t.Helper()
	start, returned := make(chan struct{}), make(chan error, 1)
	subscribe(t, b, func(ctx context.Context, d *bus.Delivery) error {
		close(start)
		select {
		case <-ctx.Done():
			returned <- context.Cause(ctx)
		case <-time.After(testTimeout):
			returned <- errors.New("never cancelled")
		}
		return nil
	})
	return start, returned
}

// TestCancelRunningWhileDisconnected: a message canceled while its
// recipient's connection is down has its running handler cancelled once
// the connection is back. The live notice is lost with the connection,
// and the stored copy waits behind the handler, which holds the only
// handler slot; the handler ran until it ended by itself.
func TestCancelRunningWhileDisconnected(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	worker := dialBus(t, p.URL(), "worker")
	started, returned := runUntilCanceled(t, worker)
	ack := publish(t, orch, bus.Message{To: "worker", Type: "LONG"})
	<-started
	p.hold()
	waitFor(t, "the worker disconnected", func() (bool, string) {
		st := worker.Conn().Status()
		return !worker.Conn().IsConnected(), st.String()
	})
	if _, err := orch.Cancel(testContext(t), ack.ID); err != nil {
		t.Fatal(err)
	}
	p.release()
	if err := <-returned; !errors.Is(err, bus.ErrCanceled) {
		t.Errorf("the handler's context cause %v, want ErrCanceled", err)
	}
}

// TestReconnectWhileHandlingReportsNothing: a connection that drops and
// comes back while a handler runs makes the bus look whether the message
// was canceled meanwhile (takeMissed), and a message that has no record,
// as a direct message on its indexed subject has none while it runs, was
// not canceled: nothing to report. Before, each reconnect reported "look
// for a cancel of ... bus: no status recorded" for every message running.
func TestReconnectWhileHandlingReportsNothing(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	var errs errorTally
	worker := dialBus(t, p.URL(), "worker", bus.WithErrorHandler(errs.add))
	started, finish := make(chan struct{}), make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		close(started)
		<-finish
		return nil
	})
	ack := publish(t, orch, bus.Message{To: "worker", Type: "LONG"})
	<-started
	reconnected := worker.Conn().StatusChanged(nats.CONNECTED)
	p.hold()
	waitFor(t, "the worker disconnected", func() (bool, string) { return !worker.Conn().IsConnected(), worker.Conn().Status().String() })
	p.release()
	<-reconnected
	if err := worker.Conn().Flush(); err != nil { // the look for a cancel is under way
		t.Fatal(err)
	}
	close(finish)
	waitState(t, orch, ack.ID, bus.StateCompleted)
	if n := errs.total(); n != 0 {
		t.Errorf("%d errors reported: %v", n, &errs)
	}
}

// TestCancelAcrossALostAck: a cancel whose record was stored but whose
// ack was lost with the connection is a cancel all the same: its write,
// sent again on reconnect, finds its own record, and the notice goes out.
// Before, the write sent again failed on its expected revision, the cancel
// read the record again, found it canceled, and returned ErrFinal without
// sending the notice: the handler ran on.
func TestCancelAcrossALostAck(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	started, returned := runUntilCanceled(t, worker)
	p, orch, _ := throughCutProxy(t, s, "orchestrator")
	ack := publish(t, orch, bus.Message{To: "worker", Type: "LONG"})
	<-started
	if err := orch.Flush(testContext(t)); err != nil { // the pending record's ack is in
		t.Fatal(err)
	}
	cut := p.cutOnDelivery(`"stream":"KV_AGENTBUS_STATUS"`)
	st, err := orch.Cancel(testContext(t), ack.ID)
	if err != nil || st.State != bus.StateCanceled || st.By != "orchestrator" {
		t.Fatalf("Cancel = %+v, %v; want canceled by orchestrator", st, err)
	}
	if !wasCut(cut) {
		t.Fatal("the cancel record's ack was not cut: the test tests nothing")
	}
	if err := <-returned; !errors.Is(err, bus.ErrCanceled) {
		t.Errorf("the handler's context cause %v, want ErrCanceled", err)
	}
}

// TestCancelAfterCompletion: a cancel after the message ended changes
// nothing and says how it ended; another agent cannot cancel it at all;
// an operator can cancel a queued one.
func TestCancelAfterCompletion(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	r := newRecorder()
	subscribe(t, worker, r.handle)
	ack := publish(t, orch, bus.Message{To: "worker", Type: "QUICK"})
	r.waitCount(t, 1)
	waitState(t, orch, ack.ID, bus.StateCompleted)
	st, err := orch.Cancel(testContext(t), ack.ID)
	if !errors.Is(err, bus.ErrFinal) || st.State != bus.StateCompleted {
		t.Errorf("Cancel after completion = %+v, %v; want ErrFinal and completed", st, err)
	}

	queued := publish(t, orch, bus.Message{To: "away", Type: "LATER"})
	waitState(t, orch, queued.ID, bus.StatePending) // its record is stored
	if _, err := newBus(t, s, "bystander").Cancel(testContext(t), queued.ID); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("a bystander's Cancel: %v, want ErrNoStatus (it sees no record naming it)", err)
	}
	if st, err := adminOf(t, s).Cancel(testContext(t), queued.ID); err != nil || st.State != bus.StateCanceled || st.By != "agentbus" {
		t.Errorf("Admin.Cancel = %+v, %v", st, err)
	}
}

// TestCancelWhileProgressing: a cancel of a request whose handler records
// a progress update every few milliseconds succeeds, and stops it: the
// record changes between the cancel's lookup and its write, so the cancel
// reads it again; an update recorded just after the cancel can write over
// it, and the recipient and the requester find it among its recent states.
func TestCancelWhileProgressing(t *testing.T) {
	s := newServer(t)
	orch, worker := newBus(t, s, "orchestrator"), newBus(t, s, "worker")
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := d.Progress(ctx, bus.Progress{Message: "busy"}); err != nil && ctx.Err() == nil {
				return err
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	})
	updates := make(chan struct{}, 1)
	canceled := make(chan error, 1)
	go func() {
		<-updates
		_, err := orch.Cancel(testContext(t), "busy-1")
		canceled <- err
	}()
	_, err := orch.Request(testContext(t), bus.Message{ID: "busy-1", To: "worker", Type: "LONG"}, bus.OnProgress(func(u *bus.Delivery) {
		if _, n, _ := u.ProgressUpdate(); n == 20 {
			updates <- struct{}{}
		}
	}))
	if err := <-canceled; err != nil {
		t.Fatalf("Cancel while the handler records progress: %v", err)
	}
	if !errors.Is(err, bus.ErrCanceled) {
		t.Errorf("Request = %v, want ErrCanceled", err)
	}
	waitState(t, orch, "busy-1", bus.StateCanceled)
}
