package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// TestRequestDoBy: a request with a do-by deadline gives its handler a
// context that ends there; the requester gets a *DeadlineError at that
// moment, and the handler's failure after it is not retried: the record
// ends expired.
func TestRequestDoBy(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	runs := make(chan time.Time, 4)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		dl, ok := ctx.Deadline()
		if !ok {
			return errors.New("no deadline on the handler's context")
		}
		runs <- dl
		<-ctx.Done()
		return ctx.Err()
	})
	doBy := time.Now().Add(1500 * time.Millisecond)
	_, err := orch.Request(testContext(t), bus.Message{ID: "doby-1", To: "worker", Type: "SLOW"}, bus.DoBy(doBy))
	var de *bus.DeadlineError
	if !errors.As(err, &de) || de.Kind != "do-by" || !de.Deadline.Equal(doBy) ||
		!errors.Is(err, bus.ErrRequestTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Request error %v, want a do-by *DeadlineError at %v", err, doBy)
	}
	if dl := <-runs; !dl.Equal(doBy.Truncate(0)) && dl.Sub(doBy).Abs() > time.Millisecond {
		t.Errorf("handler deadline %v, want %v", dl, doBy)
	}
	// A lookup between the worker's settlement and its record's write
	// reads expired from the consumer, with a reason of its own; the
	// worker's record, naming the do-by, follows.
	waitFor(t, "doby-1 expired, its reason naming the do-by", func() (bool, string) {
		st := waitState(t, orch, "doby-1", bus.StateExpired)
		return strings.Contains(st.Reason, "do-by"), st.Reason
	})
	select {
	case <-runs:
		t.Error("the request ran again after its do-by")
	default:
	}
}

// TestRequestExpiresWhileWorkerOffline: a request whose reply-by passes
// while its worker is away fails with a reply-by *DeadlineError at its
// deadline, expires on the server, ends expired, and is never handed to
// the worker when it comes back.
func TestRequestExpiresWhileWorkerOffline(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	// The worker's consumers exist (it was here before), and it is away.
	sub := subscribe(t, worker, func(context.Context, *bus.Delivery) error { return nil })
	sub.Stop()
	<-sub.Done()

	ctx, cancel := context.WithTimeout(testContext(t), time.Second)
	defer cancel()
	_, err := orch.Request(ctx, bus.Message{ID: "away-1", To: "worker", Type: "REVIEW"})
	var de *bus.DeadlineError
	if !errors.As(err, &de) || de.Kind != "reply-by" {
		t.Fatalf("Request error %v, want a reply-by *DeadlineError", err)
	}
	waitState(t, orch, "away-1", bus.StateExpired)
	r := newRecorder()
	subscribe(t, worker, r.handle)
	publish(t, orch, bus.Message{To: "worker", Type: "AFTER"})
	if got := r.waitCount(t, 1); got[0].Type != "AFTER" {
		t.Errorf("the worker got %s first, want the expired request never handed over", got[0].Type)
	}
	if got := r.types(); len(got) != 1 {
		t.Errorf("the worker got %v", got)
	}
}

// TestRequestIdleTimeout: each progress update resets the idle timeout;
// silence past it ends the Request with an idle *DeadlineError, and the
// abandoned request is canceled, which ends its handler's context.
func TestRequestIdleTimeout(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	const updates = 5
	stopped := make(chan error, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for i := 0; i < updates; i++ {
			if err := d.Progress(ctx, bus.Progress{Message: "still here"}); err != nil {
				return err
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		<-ctx.Done() // stuck
		stopped <- context.Cause(ctx)
		return ctx.Err()
	})
	seen := 0
	_, err := orch.Request(testContext(t), bus.Message{ID: "idle-1", To: "worker", Type: "STUCK"},
		bus.IdleTimeout(time.Second), bus.OnProgress(func(*bus.Delivery) { seen++ }))
	var de *bus.DeadlineError
	if !errors.As(err, &de) || de.Kind != "idle" || de.Idle != time.Second {
		t.Fatalf("Request error %v, want an idle *DeadlineError", err)
	}
	if seen != updates {
		t.Errorf("saw %d updates before the idle timeout, want %d", seen, updates)
	}
	if cause := <-stopped; !errors.Is(cause, bus.ErrCanceled) {
		t.Errorf("the handler's context ended with %v, want ErrCanceled", cause)
	}
	waitState(t, orch, "idle-1", bus.StateCanceled)
}

// TestRequestIdleTimeoutAndQuestions: a question starts the idle timeout
// again as a progress update does, also for a Request without OnInput
// (its handler answers), and the time the Request's own OnInput takes does
// not count as the worker's silence. Both Requests ended idle: a question
// taken by no OnInput or OnProgress was not news, and the timeout ran on
// while OnInput ran.
func TestRequestIdleTimeoutAndQuestions(t *testing.T) {
	s := newServer(t)
	orch, worker := newBus(t, s, "orchestrator"), newBus(t, s, "worker")
	const idle = 2 * time.Second
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "SLOW" {
			select { // silent for most of the idle timeout
			case <-time.After(idle * 6 / 10):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := d.AskInput(ctx, bus.Message{Data: []byte("which branch?")}); err != nil {
			return err
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	subscribe(t, orch, func(ctx context.Context, d *bus.Delivery) error {
		if _, ok := d.IsInputRequest(); !ok {
			return nil
		}
		select { // the question is answered after most of the idle timeout
		case <-time.After(idle * 6 / 10):
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := d.Reply(ctx, bus.Message{Type: bus.TypeInputAnswer, Data: []byte("main")})
		return err
	})
	if _, err := orch.Request(testContext(t), bus.Message{To: "worker", Type: "SLOW"}, bus.IdleTimeout(idle)); err != nil {
		t.Errorf("Request whose question came within the idle timeout, and the reply within it after the question: %v", err)
	}
	slowAnswer := bus.OnInput(func(ctx context.Context, q *bus.Delivery) (bus.Message, error) {
		select { // a person, taking longer than the idle timeout
		case <-time.After(idle * 3 / 2):
		case <-ctx.Done():
		}
		return bus.Message{Data: []byte("main")}, nil
	})
	if _, err := orch.Request(testContext(t), bus.Message{To: "worker", Type: "ASK"}, bus.IdleTimeout(idle), slowAnswer); err != nil {
		t.Errorf("Request whose OnInput took longer than the idle timeout: %v", err)
	}
}

// TestRequestProtocolTimeout: a request in a protocol waits as long as its
// document says when its context has no deadline (basemessage: 5
// minutes), which the request carries as its reply-by and expiry.
func TestRequestProtocolTimeout(t *testing.T) {
	s := newServer(t)
	p := profile(t, "basemessage")
	task, err := profiles.Prepare(p, readFile(t, "../codec/profiles/testdata/basemessage/task_assignment.json"), profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	orch := newBus(t, s, task.From)
	worker := newBus(t, s, task.To)
	got := make(chan *bus.Delivery, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		got <- d
		_, err := d.Reply(ctx, bus.Message{Type: "ACK"})
		return err
	})
	sent := time.Now()
	if _, err := orch.Request(context.Background(), *task); err != nil {
		t.Fatal(err)
	}
	d := <-got
	by, err := time.Parse(time.RFC3339Nano, d.Extensions[bus.ExtReplyBy])
	if err != nil {
		t.Fatal(err)
	}
	want := p.Defaults().RequestTimeout
	if wait := by.Sub(sent); wait < want-time.Minute || wait > want+time.Minute {
		t.Errorf("reply-by %v after sending, want the protocol's %v", wait, want)
	}
	if exp := d.ExpiresAt(); !exp.Equal(by) {
		t.Errorf("expiry %v, want the reply-by %v", exp, by)
	}
	conv, err := time.Parse(time.RFC3339Nano, d.Extensions[bus.ExtConversationBy])
	if want := p.Defaults().CorrelationTimeout; err != nil || conv.Sub(sent) < want-time.Minute || conv.Sub(sent) > want+time.Minute {
		t.Errorf("conversation deadline %v (%v) after sending, want the protocol's %v", conv.Sub(sent), err, want)
	}
}

// TestConversationTimeout: a conversation's deadline travels with its
// messages and cuts their expiry; a Request still waiting at it fails
// with a "conversation" *DeadlineError, the request still queued ends
// expired, and its sender gets one TypeConversationExpired event.
func TestConversationTimeout(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator", bus.WithConversationTimeout(2*time.Second))
	events := newRecorder()
	subscribe(t, orch, events.handle)
	worker := newBus(t, s, "worker")

	// In the conversation, the handler's messages carry the deadline.
	sent := make(chan *bus.Delivery, 1)
	sub := subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "ACK"})
		return err
	})
	reply, err := orch.Request(testContext(t), bus.Message{To: "worker", Type: "FIRST"})
	if err != nil {
		t.Fatal(err)
	}
	by, err := time.Parse(time.RFC3339Nano, reply.Extensions[bus.ExtConversationBy])
	if err != nil || reply.ExpiresAt().After(by) || time.Until(by) > 2*time.Second {
		t.Errorf("reply's conversation deadline %v (%v), expiry %v", by, err, reply.ExpiresAt())
	}
	close(sent)
	sub.Stop()
	<-sub.Done()

	// The worker is away: the next request waits for the deadline.
	_, err = orch.Request(testContext(t), bus.Message{ID: "conv-late", To: "worker", Type: "SECOND"})
	var de *bus.DeadlineError
	if !errors.As(err, &de) || de.Kind != "conversation" {
		t.Fatalf("Request error %v, want a conversation *DeadlineError", err)
	}
	waitState(t, orch, "conv-late", bus.StateExpired)
	ev := events.waitCount(t, 1)[0]
	if ev.Type != bus.TypeConversationExpired || ev.CorrelationID != "conv-late" {
		t.Errorf("event %+v", ev.Message)
	}
}

// TestRequestCanceledWhileWaiting: a Request ends with a *CanceledError
// as soon as its request is canceled, by its recipient, by an operator or
// by another process of its own agent, and the record names who did. The
// requester's subscription takes the stored copy of the notice without a
// word to the error handler: it reported the notice as forged, reading
// the record of a message to itself.
func TestRequestCanceledWhileWaiting(t *testing.T) {
	s := newServer(t)
	var orchErrs errorTally
	orch := newBus(t, s, "orchestrator", bus.WithErrorHandler(orchErrs.add))
	subscribe(t, orch, func(context.Context, *bus.Delivery) error { return nil })
	worker := newBus(t, s, "worker")
	admin := adminOf(t, s)
	started := make(chan string, 2)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		started <- d.ID
		<-ctx.Done()
		return ctx.Err()
	})
	for _, tt := range []struct {
		id, by string
		cancel func(ctx context.Context, id string) (bus.Status, error)
	}{
		{"by-recipient", "worker", worker.Cancel},
		{"by-operator", "agentbus", admin.Cancel},
		// Before, no notice went to the sender when it canceled, and the
		// Request waited out its context.
		{"by-another-process-of-the-sender", "orchestrator", newBus(t, s, "orchestrator").Cancel},
	} {
		t.Run(tt.id, func(t *testing.T) {
			requested := make(chan error, 1)
			go func() {
				_, err := orch.Request(testContext(t), bus.Message{ID: tt.id, To: "worker", Type: "LONG"})
				requested <- err
			}()
			<-started
			// The sender writes the request's record just after the
			// publish, and the handler can start before it is stored.
			waitFor(t, "the request's record", func() (bool, string) {
				_, err := admin.Status(testContext(t), tt.id)
				return err == nil, fmt.Sprint(err)
			})
			if _, err := tt.cancel(testContext(t), tt.id); err != nil {
				t.Errorf("Cancel: %v", err)
			}
			err := <-requested
			var ce *bus.CanceledError
			if !errors.As(err, &ce) || ce.By != tt.by || ce.ID != tt.id || !errors.Is(err, bus.ErrCanceled) {
				t.Fatalf("Request error %v, want a *CanceledError by %s", err, tt.by)
			}
			waitState(t, orch, tt.id, bus.StateCanceled)
			waitFor(t, "the notice to the orchestrator taken", func() (bool, string) {
				info, err := consumerInfo(t, orch, "orchestrator_p1")
				return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream > 0, fmt.Sprint(info, err)
			})
			if orchErrs.total() != 0 {
				t.Errorf("the orchestrator's background errors: %v", &orchErrs)
			}
		})
	}
}

// TestCancelRacingCompletion: a cancel sent while the handler finishes
// ends one way only. Either the cancel came first (Cancel succeeds, the
// Request fails with *CanceledError) or the reply did (Cancel says
// ErrFinal or that the record changed, the Request has the reply); the
// record ends final, and no request runs twice.
func TestCancelRacingCompletion(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	runs := make(map[string]int)
	ran := make(chan string, 64)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		ran <- d.ID
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	const rounds = 20
	replied, canceled := 0, 0
	for i := range rounds {
		id := fmt.Sprintf("race-%d", i)
		cancelErr := make(chan error, 1)
		go func() {
			// The record must exist before it can be canceled.
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			_, err := orch.Cancel(testContext(t), id)
			cancelErr <- err
		}()
		d, rerr := orch.Request(testContext(t), bus.Message{ID: id, To: "worker", Type: "QUICK"})
		cerr := <-cancelErr
		switch {
		case rerr == nil && d.Type == "DONE":
			replied++
			if cerr == nil {
				// The cancel was recorded between the reply and its record
				// or before the handler ran; then the Request must not have
				// been told, as it has its reply. Allowed only if the
				// record ends final.
				t.Logf("%s: replied and canceled", id)
			}
		case errors.Is(rerr, bus.ErrCanceled):
			canceled++
			if cerr != nil {
				t.Errorf("%s: Request canceled but Cancel failed: %v", id, cerr)
			}
		case errors.Is(cerr, bus.ErrNoStatus):
			t.Logf("%s: canceled before its record existed", id)
		default:
			t.Errorf("%s: Request %v, %v; Cancel %v", id, d, rerr, cerr)
		}
		waitFor(t, "a final record of "+id, func() (bool, string) {
			sts, err := orch.Status(testContext(t), id)
			if err != nil {
				return false, err.Error()
			}
			return sts[0].State.Final(), string(sts[0].State)
		})
	}
	for len(ran) > 0 {
		id := <-ran
		if runs[id]++; runs[id] > 1 {
			t.Errorf("%s ran %d times", id, runs[id])
		}
	}
	t.Logf("%d replied, %d canceled of %d", replied, canceled, rounds)
}
