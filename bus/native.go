package bus

import (
	"context"
	"fmt"

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
	return b.Publish(ctx, *m)
}
