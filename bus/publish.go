package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// PubAck is the server's receipt for a published message.
type PubAck struct {
	// ID is the message ID, generated when the message had none.
	ID string
	// Subject is the subject the message was stored under.
	Subject string
	// Stream is the stream that stored it.
	Stream string
	// Sequence is its stream sequence; for a duplicate, the sequence of the
	// copy stored first.
	Sequence uint64
	// Duplicate reports that a message with the same ID was already stored
	// within the duplicate window; this copy was dropped. It is not an error:
	// the message is on the bus once.
	Duplicate bool
}

// Publish sends m and waits for the server to store it. Empty fields get
// their defaults (see codec.Message.SetDefaults); From must be empty or the
// bus's agent. The message ID becomes the JetStream Nats-Msg-Id, so
// publishing the same ID again, for example on a retry, stores it once and
// reports Duplicate. A TTL sets Nats-TTL, in whole seconds rounded up, and
// the expirytime attribute.
//
// Inside a Handler, pass the handler's ctx: the message then continues the
// handled message's conversation (see ContextWithDelivery) and its span is a
// child of the handler's. Publish writes the W3C trace context into the
// traceparent and tracestate headers; docs/observability.md describes the
// spans and metrics.
//
// Errors: ErrInvalidMessage (errors.As to *codec.FieldError names the
// field), ErrInvalidAgentID, ErrPayloadTooLarge, ErrNotProvisioned,
// ErrClosed, or the server's error.
func (b *Bus) Publish(ctx context.Context, m Message) (PubAck, error) {
	inherit(ctx, &m)
	msg, err := b.prepare(&m)
	if err != nil {
		return PubAck{}, err
	}
	op := b.tel.startSend(ctx, &m, msg)
	ack, err := b.js.PublishMsg(ctx, msg) // adds a default deadline if ctx has none
	if err != nil {
		err = b.publishError(m.ID, err)
		op.end(b.tel, ctx, err, false)
		return PubAck{}, err
	}
	op.end(b.tel, ctx, nil, ack.Duplicate)
	return PubAck{ID: m.ID, Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// PublishFuture is the pending result of PublishAsync.
type PublishFuture struct {
	id      string
	subject string
	f       jetstream.PubAckFuture
	b       *Bus
}

// ID is the ID of the published message.
func (f *PublishFuture) ID() string { return f.id }

// Wait blocks until the server acknowledged the message, or failed to, or
// ctx ended.
func (f *PublishFuture) Wait(ctx context.Context) (PubAck, error) {
	select {
	case ack := <-f.f.Ok():
		return PubAck{ID: f.id, Subject: f.subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
	case err := <-f.f.Err():
		return PubAck{}, f.b.publishError(f.id, err)
	case <-ctx.Done():
		return PubAck{}, ctx.Err()
	}
}

// PublishAsync sends m without waiting for the server's ack; Wait on the
// returned future for it. At most WithMaxAsyncPending publishes are in
// flight: past that PublishAsync waits briefly, then fails with
// jetstream.ErrTooManyStalledMsgs, so a slow server never grows memory
// without bound. It validates and encodes m like Publish.
//
// ctx carries the conversation (inside a Handler, pass the handler's ctx, as
// for Publish) and the caller's span; it does not bound the call. The span
// ends when the message is handed to the connection, not at the server's
// ack. A future whose ack does not arrive within WithPublishAsyncTimeout
// (30 s) resolves with an error.
func (b *Bus) PublishAsync(ctx context.Context, m Message) (*PublishFuture, error) {
	inherit(ctx, &m)
	msg, err := b.prepare(&m)
	if err != nil {
		return nil, err
	}
	op := b.tel.startSend(ctx, &m, msg)
	f, err := b.js.PublishMsgAsync(msg)
	if err != nil {
		err = b.publishError(m.ID, err)
		op.end(b.tel, ctx, err, false)
		return nil, err
	}
	op.end(b.tel, ctx, nil, false)
	return &PublishFuture{id: m.ID, subject: msg.Subject, f: f, b: b}, nil
}

// PublishAsyncComplete is closed when every asynchronous publish made so far
// has been acknowledged or has failed.
func (b *Bus) PublishAsyncComplete() <-chan struct{} { return b.js.PublishAsyncComplete() }

// prepare fills m's defaults, checks it and encodes it as a NATS message.
func (b *Bus) prepare(m *Message) (*nats.Msg, error) {
	if b.isClosed() {
		return nil, ErrClosed
	}
	if m.From == "" {
		m.From = b.agent
	} else if m.From != b.agent {
		return nil, &codec.FieldError{Field: "From", Value: m.From, Err: fmt.Errorf("%w: a bus publishes as its own agent %q", ErrInvalidMessage, b.agent)}
	}
	m.SetDefaults(time.Now())
	h, data, err := b.opts.codec.Encode(m) // validates every field
	if err != nil {
		return nil, err
	}
	var subject string
	if m.To == subjects.Broadcast {
		subject, err = b.opts.scheme.Broadcast(m.From, m.Type, m.Priority)
	} else {
		subject, err = b.opts.scheme.Direct(m.To, m.From, m.Type, m.Priority)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	// The keys are canonical already; assigning skips Set's canonicalizing.
	h[jetstream.MsgIDHeader] = []string{m.ID}
	if m.TTL > 0 {
		h[jetstream.MsgTTLHeader] = []string{ttlSeconds(m.TTL)}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}, nil
}

// ttlSeconds renders d for Nats-TTL: whole seconds, rounded up so the server
// never removes a message before its expirytime, and at least the server's
// minimum of one second.
func ttlSeconds(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	return strconv.FormatInt(int64(max(s, 1)), 10) + "s"
}

func (b *Bus) publishError(id string, err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("publish %s: %w: %w", id, ErrPayloadTooLarge, err)
	case errors.Is(err, nats.ErrConnectionClosed) && b.isClosed():
		return ErrClosed
	}
	return fmt.Errorf("publish %s: %w", id, b.notProvisioned(err))
}
