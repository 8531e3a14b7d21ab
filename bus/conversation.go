package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/agentbus/agentbus/codec/profiles"
)

// ExtConversationBy is the CloudEvents extension that carries a
// conversation's deadline, RFC 3339. When a conversation timeout applies
// (WithConversationTimeout, or the protocol's: 30 minutes for basemessage)
// a message sent outside the handler of a message in its conversation gets
// one, now plus the timeout; every message a handler sends in the
// conversation carries it on. No message of the conversation outlives it:
// each expires by then at the latest (its TTL is cut to it), so one still
// queued at the deadline ends expired, a Request waiting then fails with a
// *DeadlineError of Kind "conversation", and the sender gets one
// TypeConversationExpired event (from its Request, or from the recipient
// that meets its message expired).
const ExtConversationBy = "conversationby"

// TypeConversationExpired is the type of the event a message's sender gets
// when a recipient meets the message expired by its conversation's
// deadline: its data names the conversation and the deadline. It is sent
// once per conversation and sender (its ID is derived from both).
const TypeConversationExpired = "agentbus.conversation.expired"

// conversationBy returns the conversation deadline m carries, if any.
func conversationBy(m *Message) (time.Time, bool) {
	v, ok := m.Extensions[ExtConversationBy]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// conversationTimeout is the timeout of a conversation m starts.
func (b *Bus) conversationTimeout(m *Message) time.Duration {
	if b.opts.conversationTTL > 0 {
		return b.opts.conversationTTL
	}
	if m.DataSchema == "" {
		return 0
	}
	if p, ok := profiles.ForDataSchema(m.DataSchema); ok {
		return p.Defaults().CorrelationTimeout
	}
	return 0
}

// limitToConversation gives m, defaulted and about to be sent with ctx,
// its conversation's deadline: the one it carries (inherited from the
// message being handled), or, for a message sent outside the handler of a
// message in its conversation, now plus the conversation timeout; and cuts
// m's expiry to it. It returns the deadline, zero if none applies.
func (b *Bus) limitToConversation(ctx context.Context, m *Message, now time.Time) time.Time {
	by, ok := conversationBy(m)
	if !ok {
		if d, inside := DeliveryFromContext(ctx); inside && conversationOf(&d.Message) == m.CorrelationID {
			return time.Time{} // a conversation without a deadline
		}
		d := b.conversationTimeout(m)
		if d <= 0 {
			return time.Time{}
		}
		by = now.Add(d)
		setExtension(m, ExtConversationBy, by.UTC().Format(time.RFC3339Nano))
	}
	if exp := m.ExpiresAt(); exp.IsZero() || exp.After(by) {
		m.TTL = max(by.Sub(m.Time), time.Nanosecond) // expired already: the recipient drops it
	}
	return by
}

// conversationExpired tells the sender of m, met expired by its
// conversation's deadline by, with one event per conversation and sender.
func (b *Bus) conversationExpired(ctx context.Context, m *Message, by time.Time) {
	if m.Broadcast() || m.From == "" {
		return
	}
	ev := Message{
		ID:            uuid.NewSHA1(conversationEventSpace, []byte(m.CorrelationID+"\x00"+m.From)).String(),
		To:            m.From,
		Type:          TypeConversationExpired,
		Priority:      2,
		CorrelationID: m.CorrelationID,
		CausationID:   m.ID,
		ContentType:   "application/json",
		Data:          fmt.Appendf(nil, `{"correlationId":%q,"deadline":%q}`, m.CorrelationID, by.UTC().Format(time.RFC3339Nano)),
	}
	if _, err := b.Publish(context.WithoutCancel(ctx), ev); err != nil {
		b.opts.onError(fmt.Errorf("conversation %s expired: tell %s: %w", m.CorrelationID, m.From, err))
	}
}

// conversationEventSpace names the IDs of TypeConversationExpired events.
var conversationEventSpace = uuid.MustParse("6f1c2a52-9a1e-4c41-8d0e-2f5b8f0f7a11")
