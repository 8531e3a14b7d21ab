package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
)

// PublishNative publishes a message in one of the agent protocols of
// package profiles (docs/protocols.md), as it is: the native bytes are the
// event's data, unchanged, and the receiver gets them back byte for byte.
// Addressing, type, priority, correlation and reply-to come from the native
// fields where the protocol has them, and from addr otherwise (addr.From
// defaults to the bus's agent; an explicit addr.Priority overrides).
//
// The protocol's rules decide what happens to an invalid message: a strict
// profile's is refused with an error wrapping ErrInvalidMessage and the
// *profiles.ValidationError that lists the findings; a lenient one's
// (coordination) is sent with the findings attached (profiles.AttachedFindings).
// A native sender other than the bus's agent is refused.
//
// Inside a handler, pass the handler's ctx: the message joins the handled
// message's conversation, as with Publish.
//
// A native message whose replyTo (pipeline, basemessage) names a message
// this agent received, and that goes back to
// that message's sender, is sent as Reply sends it: in the conversation of
// the message it answers (unless it names its own), which is recorded
// replied. The message is found as the handled one (pass the handler's ctx)
// or by its lifecycle record, so it may still be queued; when it is not
// found the native message is published as it is, its reply-to kept as the
// causation ID.
//
// To set what addr does not
// cover, such as a TTL or the correlation ID of a format that carries none
// (frontmatter, swarm), call profiles.Prepare, set the fields on the
// Message it returns, and Publish that.
func (b *Bus) PublishNative(ctx context.Context, p profiles.Profile, native []byte, addr profiles.Addressing) (PubAck, error) {
	if addr.From == "" {
		addr.From = b.agent
	}
	m, err := profiles.Prepare(p, native, addr)
	if err != nil {
		return PubAck{}, fmt.Errorf("%w: %s message: %w", ErrInvalidMessage, p.Name(), err)
	}
	if m.From != b.agent {
		return PubAck{}, &codec.FieldError{Field: "From", Value: m.From,
			Err: fmt.Errorf("%w: the %s message is from %q, but this bus publishes as %q", ErrInvalidMessage, p.Name(), m.From, b.agent)}
	}
	return b.PublishAnswer(ctx, *m)
}

// PublishAnswer publishes m, and when m answers a message this agent
// received (its CausationID names that message, found by Received, and it goes
// back to that message's sender) sends it as Reply does: in the
// conversation of the message it answers unless m names its own, and
// recorded replied. Otherwise it is Publish. PublishNative sends native
// messages this way, so that a protocol's own reply field (pipeline's
// replyTo) threads the conversation; use it for a message prepared with
// profiles.Prepare.
func (b *Bus) PublishAnswer(ctx context.Context, m Message) (PubAck, error) {
	if m.CausationID != "" {
		if req, err := b.Received(ctx, m.CausationID); err == nil && req.From == m.To {
			return b.Reply(ctx, &req, m)
		}
	}
	return b.Publish(ctx, m)
}

// Received returns the message id sent to this agent, as far as Reply needs
// it (see Status.Message): the one the handler of ctx is handling, or the
// one a status lookup finds (Status), so a message still queued is found by
// its indexed subject (Go agents send on one) or its sender's pending record
// (docs/foreign-agents.md says how others do either). "agentbus reply"
// answers a message found this way.
//
// Errors: ErrNoStatus when no record of the message to this agent exists,
// ErrFinal (with the message) when it expired, was canceled or
// dead-lettered, ErrInvalidOption with lifecycle tracking off, or Status's.
func (b *Bus) Received(ctx context.Context, id string) (Message, error) {
	if h := handlingOf(ctx); h != nil && h.d.ID == id {
		return h.d.Message, nil
	}
	sts, err := b.Status(ctx, id)
	if err != nil {
		return Message{}, err
	}
	for _, st := range sts {
		if st.To != b.agent {
			continue
		}
		switch st.State {
		case StateExpired, StateCanceled, StateDeadLettered: // nobody waits for an answer
			return st.Message(), fmt.Errorf("%w: %s to %s is %s", ErrFinal, id, b.agent, st.State)
		}
		return st.Message(), nil
	}
	return Message{}, fmt.Errorf("%w: %s to %s", ErrNoStatus, id, b.agent)
}

// ErrInvalidNative is the reason a message of a strict protocol profile that
// breaks the protocol's rules is dead-lettered instead of handled. Such a
// message can only come from a publisher that bypassed PublishNative.
var ErrInvalidNative = errors.New("bus: invalid protocol message")

// checkNative validates a delivered message whose DataSchema names a strict
// protocol profile. An invalid one is dead-lettered; when the protocol
// answers invalid messages (a profiles.Rejecter: basemessage's
// MESSAGE_ERROR) the sender also gets that answer.
func (b *Bus) checkNative(ctx context.Context, m *Message) error {
	p, ok := profiles.ForDataSchema(m.DataSchema)
	if !ok || !p.Strict() {
		return nil
	}
	verr := p.Validate(m.Data)
	if verr == nil {
		return nil
	}
	err := fmt.Errorf("%w: %s: %w", ErrInvalidNative, p.Name(), verr)
	if r, ok := p.(profiles.Rejecter); ok && m.From != b.agent {
		// A copy, so that m, which a delivery keeps on its stack, does not
		// escape through the protocol's interface on this rare path.
		mc := *m
		if rerr := b.sendRejection(ctx, r, &mc, verr); rerr != nil {
			b.opts.onError(fmt.Errorf("%s rejection of %s: %w", p.Name(), m.ID, rerr))
		}
	}
	return err
}

// reportFindings shows the rules of a lenient protocol that m broke, which
// its publisher attached (profiles.AttachedFindings): the message is
// handled all the same, as the protocol asks, and each finding goes to the
// logger (Warn), to the agentbus.protocol.findings counter and, when the
// message is traced, to its span as an event.
func (b *Bus) reportFindings(ctx context.Context, m *Message) {
	fs, err := profiles.AttachedFindings(m)
	if err != nil || len(fs) == 0 {
		return
	}
	name := "unknown"
	if p, ok := profiles.ForDataSchema(m.DataSchema); ok {
		name = p.Name()
	}
	n := profiles.CountFindings(fs) // not len(fs): the last may count those left out
	b.tel.findings.Add(ctx, int64(n), metric.WithAttributes(attrAgent.String(b.agent), attrProtocol.String(name)))
	span := trace.SpanFromContext(ctx)
	for _, f := range fs {
		b.opts.logger.Warn("protocol finding", "protocol", name, "message", m.ID, "from", m.From,
			"field", f.Field, "rule", f.Rule, "finding", f.Message)
		if span.IsRecording() {
			span.AddEvent("protocol.finding", trace.WithAttributes(attrProtocol.String(name),
				attribute.String("agentbus.finding.field", f.Field), attribute.String("agentbus.finding.rule", f.Rule),
				attribute.String("agentbus.finding.message", f.Message)))
		}
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("agentbus.protocol.findings", n))
	}
}

// sendRejection sends protocol r's answer to m, which failed validation
// with verr, to m's sender.
func (b *Bus) sendRejection(ctx context.Context, r profiles.Rejecter, m *Message, verr error) error {
	reply, err := r.Rejection(m, verr, b.agent, time.Now())
	if err != nil {
		return err
	}
	_, err = b.PublishNative(ContextWithDelivery(ctx, nil), r, reply, profiles.Addressing{To: m.From})
	return err
}
