package bus

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbus/agentbus/bus/internal/asyncpub"
)

// conversationOf returns the conversation a message belongs to: its
// correlation ID, or its own ID if it has none.
func conversationOf(m *Message) string {
	if m.CorrelationID != "" {
		return m.CorrelationID
	}
	return m.ID
}

// deliveryKey is the context key of the *handling of the Delivery being
// handled.
type deliveryKey struct{}

// ContextWithDelivery returns ctx carrying d as the message being handled.
// The context a Handler receives carries its Delivery, so that a message
// published with it continues d's conversation: Publish gives it d's
// correlation ID and, as CausationID (causationid), d's ID, unless the message
// sets them. ContextWithDelivery(ctx, nil) drops the Delivery, for a handler
// that starts an unrelated conversation.
func ContextWithDelivery(ctx context.Context, d *Delivery) context.Context {
	var h *handling
	if d != nil {
		h = &handling{d: d}
	}
	return context.WithValue(ctx, deliveryKey{}, h)
}

// DeliveryFromContext returns the Delivery ctx carries, if any.
func DeliveryFromContext(ctx context.Context) (*Delivery, bool) {
	if h := handlingOf(ctx); h != nil {
		return h.d, true
	}
	return nil, false
}

// handlingOf returns the handling ctx carries, or nil.
func handlingOf(ctx context.Context) *handling {
	h, _ := ctx.Value(deliveryKey{}).(*handling)
	return h
}

// inherit fills m's correlation ID and CausationID from the Delivery ctx
// carries, where m leaves them empty. A message that answers a Request's
// request this way, sent to the requester, also carries its deadline
// (ExtReplyBy), as a Reply does. A message the handler sends a third agent
// does not: it is no answer, and would reach that agent Late, its replies
// taken for answers to a Request (before 2026-11-28 it did).
func inherit(ctx context.Context, m *Message) {
	d, ok := DeliveryFromContext(ctx)
	if !ok {
		return
	}
	if m.CorrelationID == "" {
		m.CorrelationID = conversationOf(&d.Message)
	}
	if m.CausationID == "" {
		m.CausationID = d.ID
	}
	if by, ok := d.Extensions[ExtReplyBy]; ok && m.CausationID == d.ID && m.To == d.From {
		setExtension(m, ExtReplyBy, by)
	}
	if by, ok := d.Extensions[ExtConversationBy]; ok && m.CorrelationID == conversationOf(&d.Message) {
		setExtension(m, ExtConversationBy, by)
	}
}

// withoutExtensions removes the extensions names from m without changing
// the map m was given with, which the caller may share.
func withoutExtensions(m *Message, names ...string) {
	for _, name := range names {
		if _, ok := m.Extensions[name]; ok {
			m.Extensions = maps.Clone(m.Extensions)
			for _, name := range names {
				delete(m.Extensions, name)
			}
			return
		}
	}
}

// setExtension sets extension name of m to v without changing the map m
// was given with, which the caller may share.
func setExtension(m *Message, name, v string) {
	if m.Extensions[name] == v {
		return
	}
	m.Extensions = maps.Clone(m.Extensions)
	if m.Extensions == nil {
		m.Extensions = make(map[string]string, 1)
	}
	m.Extensions[name] = v
}

// handling is what a handler's context carries (ContextWithDelivery): the
// Delivery being handled, and what the subscription and Reply share about
// it.
type handling struct {
	d *Delivery
	// mu orders the records of d's work (recordWork) and its reply
	// (sendReply): a work record is written before the reply is sent, or
	// not at all once d is replied to.
	mu       sync.Mutex
	replied  atomic.Bool  // Reply answered d; set under mu
	replyID  string       // the reply's ID, under mu
	progress atomic.Int64 // progress updates sent on d, before this delivery too
	// seedProgress reads, once, how many updates earlier deliveries sent.
	seedProgress sync.Once
	// ctx is the handler's context, which Cancel cancels; canceled says
	// it did. Nil for a handling ContextWithDelivery made.
	ctx      *handlerContext
	canceled atomic.Bool
	lastAt   atomic.Int64 // when the last of them was sent, Unix nanoseconds
	// progressRecord is the write of the last work record (working or
	// input-required, with the count of updates), written under mu,
	// with the count), which the reply and the settlement wait for.
	progressRecord atomic.Pointer[asyncpub.Future]
	slot           int // its index in cancels.running while it runs
	// replyFound says a lookup of d finds its reply by the derived ID, so
	// that Reply writes no record (findsReply).
	replyFound bool
}

// progressCount returns the number of progress updates sent on h's
// request and when the last was sent, for its records; 0 and the zero time
// when none was.
func (h *handling) progressCount() (int, time.Time) {
	n := h.progress.Load()
	if n == 0 {
		return 0, time.Time{}
	}
	return int(n), time.Unix(0, h.lastAt.Load()).UTC()
}

// awaitProgressRecord waits until the last work record of h (recordWork)
// is stored, or its write failed, or ctx ends. The reply and the
// settlement of the request come after it: a lookup that finds the reply,
// or the consumer's ack floor past the request, derives the final state
// from the record and writes it back, and must read the record with every
// update counted. Written after the final state, the update's record
// would read working again until the next lookup. Nothing to wait for
// unless the handler sent progress.
func (h *handling) awaitProgressRecord(ctx context.Context) {
	f := h.progressRecord.Load()
	if f == nil {
		return
	}
	select {
	case <-f.Done(): // a failure went to the error handler
	case <-ctx.Done():
	}
}

// sendReply sends the reply to h's request (send), whose ID is id, after
// its last work record is stored, and marks the request replied if it went
// out. No work record is written while it does (mu), nor after. The same
// reply again is sent (the server drops it, PubAck.Duplicate); another is
// ErrFinal.
func (h *handling) sendReply(ctx context.Context, id string, send func() (PubAck, error)) (PubAck, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.replied.Load() && id != h.replyID {
		// A second answer would reach the requester's handler unasked,
		// and the request's record would name it (before 2026-11-28).
		return PubAck{}, fmt.Errorf("%w: request %s is replied to already, with %s: one reply each", ErrFinal, h.d.ID, h.replyID)
	}
	h.awaitProgressRecord(ctx)
	ack, err := send()
	if err == nil {
		h.replyID = id
		h.replied.Store(true)
	}
	return ack, err
}

// handlerContext is the context a handler runs under: its parent (the
// subscription's), with the handling as the value of deliveryKey, as
// context.WithValue would make it, and a cancellation of its own for
// Cancel and for the handler's return. That cancellation, a
// context.WithCancelCause of the parent, is made only when something asks
// for it: Done (a select on it, a child context), or a cancel. Until then
// Err and Value are the parent's, which is what the cancel context would
// answer too. A handler that never watches its context then costs no
// cancel context, no registration with the parent and no release: two
// allocations and a locked map insert and delete, for every message (a few
// tenths of a µs of the client's CPU in a running subscription,
// docs/performance-journal.md).
type handlerContext struct {
	context.Context // the parent
	h               *handling

	mu       sync.Mutex
	inner    context.Context // the cancel context, once made
	cancel   context.CancelCauseFunc
	released bool // the handler returned: the context is canceled
}

// own returns the cancel context, made now if not yet: canceled at once,
// as context.Canceled, when the handler has returned already.
func (c *handlerContext) own() (context.Context, context.CancelCauseFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.cancel = context.WithCancelCause(c.Context)
		if c.released {
			c.cancel(nil)
		}
	}
	return c.inner, c.cancel
}

// current returns the cancel context if it was made or the handler has
// returned, else the parent.
func (c *handlerContext) current() context.Context {
	c.mu.Lock()
	inner, released := c.inner, c.released
	c.mu.Unlock()
	switch {
	case inner != nil:
		return inner
	case released:
		inner, _ = c.own()
		return inner
	}
	return c.Context
}

func (c *handlerContext) Done() <-chan struct{} {
	inner, _ := c.own()
	return inner.Done()
}

func (c *handlerContext) Err() error { return c.current().Err() }

// Value answers deliveryKey itself. Other keys, the context package's own
// included (context.Cause finds the cancel context through one), go to the
// cancel context once it exists and to the parent before.
func (c *handlerContext) Value(key any) any {
	if _, ok := key.(deliveryKey); ok {
		return c.h
	}
	return c.current().Value(key)
}

// cancelWith cancels the context with cause.
func (c *handlerContext) cancelWith(cause error) {
	_, cancel := c.own()
	cancel(cause)
}

// release cancels the context once the handler has returned, as
// context.Canceled, freeing the cancel context if one was made; one made
// later is made canceled.
func (c *handlerContext) release() {
	c.mu.Lock()
	c.released = true
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
}
