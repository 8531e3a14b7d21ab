package bus

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
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
// request this way also carries its deadline (ExtReplyBy), as a Reply does.
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
	if by, ok := d.Extensions[ExtReplyBy]; ok && m.CausationID == d.ID {
		setExtension(m, ExtReplyBy, by)
	}
	if by, ok := d.Extensions[ExtConversationBy]; ok && m.CorrelationID == conversationOf(&d.Message) {
		setExtension(m, ExtConversationBy, by)
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
	d        *Delivery
	replied  atomic.Bool  // Reply answered d
	progress atomic.Int64 // progress updates sent on d, before this delivery too
	// seedProgress reads, once, how many updates earlier deliveries sent.
	seedProgress sync.Once
	// cancel cancels the handler's context, canceled says Cancel did.
	cancel   context.CancelCauseFunc
	canceled atomic.Bool
	lastAt   atomic.Int64 // when the last of them was sent, Unix nanoseconds
	slot     int          // its index in cancels.running while it runs
}
