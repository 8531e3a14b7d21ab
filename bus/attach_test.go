package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
)

// TestAttachPastTheReplyBy: a handler still running past its request's
// reply-by may reply late, and Attach takes that reply: waiting for it
// until a deadline of the caller's, or, without one, reading it if it is
// stored and failing with a *DeadlineError if not. Attach failed at once
// with a deadline (the lookup reads such a request expired), and without
// one failed to read the stored reply ("context deadline exceeded": the
// passed reply-by was the read's deadline).
func TestAttachPastTheReplyBy(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead, worker := newBus(t, s, "lead"), newBus(t, s, "worker")
	release := make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		<-release
		_, err := d.Reply(ctx, bus.Message{Type: "DONE", Data: []byte("late")})
		return err
	})
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	m := bus.Message{ID: "late", To: "worker", Type: "JOB"}
	if _, err := lead.Request(rctx, m); !errors.Is(err, bus.ErrRequestTimeout) {
		t.Fatalf("Request = %v; want its reply-by to pass", err)
	}
	var de *bus.DeadlineError
	if _, err := lead.Attach(context.Background(), m.ID); !errors.As(err, &de) || de.Kind != "reply-by" {
		t.Fatalf("Attach without a deadline, no reply stored = %v; want a reply-by *DeadlineError", err)
	}

	attached := make(chan error, 1)
	go func() {
		d, err := lead.Attach(ctx, m.ID)
		if err == nil && string(d.Data) != "late" {
			err = errors.New("reply " + string(d.Data))
		}
		attached <- err
	}()
	close(release)
	if err := <-attached; err != nil {
		t.Fatalf("Attach with a deadline to the running request = %v; want the late reply", err)
	}
	d, err := lead.Attach(context.Background(), m.ID)
	if err != nil || string(d.Data) != "late" {
		t.Errorf("Attach without a deadline to the request replied late = %+v, %v; want the reply", d, err)
	}
}

// TestAttachToAMessageNotARequest: a plain message has no reply to
// attach to: ErrInvalidMessage at once. Attach waited for a reply, up to
// the caller's deadline or the request timeout (5 minutes).
func TestAttachToAMessageNotARequest(t *testing.T) {
	s := newServer(t)
	lead := newBus(t, s, "lead")
	ack := publish(t, lead, bus.Message{To: "worker", Type: "NOTE"})
	if _, err := lead.Attach(testContext(t), ack.ID); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("Attach to a plain message = %v; want ErrInvalidMessage", err)
	}
}

// TestAttachProgressMayReadTheHistory: Attach hands the progress updates
// read from the stream to OnProgress after the read, so that OnProgress
// may read the conversation's History. It ran them under the bus's history
// lock, which History waits for: a History call from OnProgress waited
// out its context.
func TestAttachProgressMayReadTheHistory(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead, worker := newBus(t, s, "lead"), newBus(t, s, "worker")
	release := make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for range 2 {
			if err := d.Progress(ctx, bus.Progress{Message: "step"}); err != nil {
				return err
			}
		}
		<-release
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	m := bus.Message{ID: "attached", To: "worker", Type: "JOB"}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := lead.Request(rctx, m, bus.OnProgress(func(*bus.Delivery) {})); !errors.Is(err, bus.ErrRequestTimeout) {
		t.Fatalf("Request = %v; want its reply-by to pass", err)
	}
	var errs []error
	d, err := lead.Attach(ctx, m.ID, bus.OnProgress(func(u *bus.Delivery) {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := lead.History(hctx, m.ID, bus.HistoryQuery{})
		errs = append(errs, err)
		if len(errs) == 2 {
			close(release)
		}
	}))
	if err != nil || d.Type != "DONE" {
		t.Fatalf("Attach = %+v, %v", d, err)
	}
	if len(errs) != 2 || errs[0] != nil || errs[1] != nil {
		t.Errorf("History read from OnProgress: %v; want 2 reads, no error", errs)
	}
}
