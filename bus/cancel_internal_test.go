package bus

import (
	"context"
	"errors"
	"testing"
)

// newHandling returns the handling of a delivery of message id, and its
// handler's context, as Bus.handle makes them.
func newHandling(parent context.Context, id string) (*handling, *handlerContext) {
	f := &inFlight{d: Delivery{Message: Message{ID: id}}}
	f.hs.d, f.hs.ctx = &f.d, &f.ctx
	f.ctx.Context, f.ctx.h = parent, &f.hs
	return &f.hs, &f.ctx
}

// TestCancelsRunning: apply cancels every running handling of its ID and
// sender and no other, done removes a handling whatever its place, and a canceled ID
// is refused at start.
func TestCancelsRunning(t *testing.T) {
	var c cancels
	start := func(id string) (*handling, context.Context) {
		h, ctx := newHandling(context.Background(), id)
		if c.start(h) {
			t.Fatalf("start(%s) reported canceled", id)
		}
		return h, ctx
	}
	a1, ctxA1 := start("a")
	b, ctxB := start("b")
	a2, ctxA2 := start("a")
	other, ctxOther := newHandling(context.Background(), "a")
	other.d.From = "mallory" // another sender's message with the same ID
	if c.start(other) {
		t.Fatal("start of another sender's a reported canceled")
	}
	c.done(b) // from the middle: a later one moves into its place
	if len(c.running) != 3 || c.running[a1.slot] != a1 || c.running[a2.slot] != a2 {
		t.Fatalf("after done(b): running %v, slots %d and %d", c.running, a1.slot, a2.slot)
	}
	c.apply("a", "")
	for i, ctx := range []context.Context{ctxA1, ctxA2} {
		if !errors.Is(context.Cause(ctx), ErrCanceled) {
			t.Errorf("handling %d of a: cause %v, want ErrCanceled", i+1, context.Cause(ctx))
		}
	}
	if !a1.canceled.Load() || !a2.canceled.Load() {
		t.Error("a handling of a not marked canceled")
	}
	if ctxB.Err() != nil || b.canceled.Load() {
		t.Error("b was canceled by a cancel of a")
	}
	if ctxOther.Err() != nil || other.canceled.Load() {
		t.Error("another sender's a was canceled")
	}
	c.done(a1)
	c.done(a2)
	c.done(other)
	if len(c.running) != 0 {
		t.Errorf("%d handlings left running", len(c.running))
	}
	h, _ := newHandling(context.Background(), "a")
	if !c.start(h) {
		t.Error("start of a canceled ID did not report it canceled")
	}
}

// TestHandlerContext: a handler's context carries its handling, leaves
// other values and cancellation to its parent until it is canceled itself
// or watched, and reports the cause of whichever cancellation came.
func TestHandlerContext(t *testing.T) {
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "v")

	t.Run("canceled unwatched", func(t *testing.T) {
		hs, ctx := newHandling(base, "m")
		if d, ok := DeliveryFromContext(ctx); !ok || d != hs.d {
			t.Errorf("DeliveryFromContext = %v, %v", d, ok)
		}
		if ctx.Value(key{}) != "v" || ctx.Err() != nil || context.Cause(ctx) != nil {
			t.Errorf("before: value %v, err %v, cause %v", ctx.Value(key{}), ctx.Err(), context.Cause(ctx))
		}
		ctx.cancelWith(ErrCanceled)
		<-ctx.Done()
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), ErrCanceled) {
			t.Errorf("after: err %v, cause %v", ctx.Err(), context.Cause(ctx))
		}
		if ctx.Value(key{}) != "v" {
			t.Errorf("after: value %v", ctx.Value(key{}))
		}
		ctx.release()
	})
	t.Run("watched, then canceled", func(t *testing.T) {
		_, ctx := newHandling(base, "m")
		child, stop := context.WithCancel(ctx)
		defer stop()
		done := ctx.Done()
		ctx.cancelWith(ErrCanceled)
		<-done
		<-child.Done()
		if !errors.Is(context.Cause(child), ErrCanceled) {
			t.Errorf("child's cause %v, want ErrCanceled", context.Cause(child))
		}
		ctx.release()
	})
	t.Run("parent canceled", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(base)
		_, ctx := newHandling(parent, "m")
		stopped := errors.New("stopped")
		cancel(stopped)
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), stopped) {
			t.Errorf("unwatched: err %v, cause %v", ctx.Err(), context.Cause(ctx))
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), stopped) {
			t.Errorf("watched after: cause %v, want the parent's", context.Cause(ctx))
		}
		ctx.release()
	})
	t.Run("after the handler returned", func(t *testing.T) {
		// Unwatched while it ran, then watched, say by a goroutine the
		// handler left behind: canceled, as an eager cancel context is.
		_, ctx := newHandling(base, "m")
		ctx.release()
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), context.Canceled) {
			t.Errorf("unwatched: err %v, cause %v", ctx.Err(), context.Cause(ctx))
		}
		<-ctx.Done()
		_, watched := newHandling(base, "m")
		done := watched.Done()
		watched.release()
		<-done
		if !errors.Is(watched.Err(), context.Canceled) {
			t.Errorf("watched: err %v", watched.Err())
		}
		if watched.Value(key{}) != "v" {
			t.Errorf("value %v", watched.Value(key{}))
		}
	})
	t.Run("parent canceled while watched", func(t *testing.T) {
		parent, cancel := context.WithCancel(base)
		_, ctx := newHandling(parent, "m")
		done := ctx.Done()
		cancel()
		<-done
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Errorf("err %v", ctx.Err())
		}
		ctx.release()
	})
}
