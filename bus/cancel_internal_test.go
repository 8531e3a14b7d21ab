package bus

import (
	"context"
	"errors"
	"testing"
)

// TestCancelsRunning: apply cancels every running handling of its ID and
// no other, done removes a handling whatever its place, and a canceled ID
// is refused at start.
func TestCancelsRunning(t *testing.T) {
	var c cancels
	start := func(id string) (*handling, context.Context) {
		ctx, cancel := context.WithCancelCause(context.Background())
		h := &handling{d: &Delivery{Message: Message{ID: id}}, cancel: cancel}
		if c.start(h) {
			t.Fatalf("start(%s) reported canceled", id)
		}
		return h, ctx
	}
	a1, ctxA1 := start("a")
	b, ctxB := start("b")
	a2, ctxA2 := start("a")
	c.done(b) // from the middle: a2 moves into its place
	if len(c.running) != 2 || c.running[a1.slot] != a1 || c.running[a2.slot] != a2 {
		t.Fatalf("after done(b): running %v, slots %d and %d", c.running, a1.slot, a2.slot)
	}
	c.apply("a")
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
	c.done(a1)
	c.done(a2)
	if len(c.running) != 0 {
		t.Errorf("%d handlings left running", len(c.running))
	}
	if !c.start(&handling{d: &Delivery{Message: Message{ID: "a"}}}) {
		t.Error("start of a canceled ID did not report it canceled")
	}
}

// TestHandlerContext: a handler's context carries its handling, leaves
// other values and cancellation to its parent, and reports the cause a
// cancel gave.
func TestHandlerContext(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	hs := &handling{d: &Delivery{Message: Message{ID: "m"}}, cancel: cancel}
	ctx := &handlerContext{Context: parent, h: hs}
	if d, ok := DeliveryFromContext(ctx); !ok || d.ID != "m" {
		t.Errorf("DeliveryFromContext = %v, %v", d, ok)
	}
	if ctx.Value(key{}) != "v" {
		t.Errorf("Value(key) = %v, want the parent's v", ctx.Value(key{}))
	}
	child, stop := context.WithCancel(ctx)
	defer stop()
	hs.cancel(ErrCanceled)
	<-child.Done()
	if !errors.Is(context.Cause(ctx), ErrCanceled) || !errors.Is(context.Cause(child), ErrCanceled) {
		t.Errorf("causes %v and %v, want ErrCanceled", context.Cause(ctx), context.Cause(child))
	}
}
