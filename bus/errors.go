package bus

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Errors a caller can act on. Test for them with errors.Is; each is wrapped
// with the detail of what went wrong.
var (
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("bus: closed")
	// ErrInvalidOption is wrapped by errors from options with bad values.
	ErrInvalidOption = errors.New("bus: invalid option")
	// ErrUnsupportedServer means the server lacks a feature agentbus needs,
	// such as per-message TTL (nats-server 2.11 or later) or JetStream.
	ErrUnsupportedServer = errors.New("bus: unsupported server")
	// ErrNotProvisioned means the bus's stream does not exist on the server:
	// run Provision or `agentbus provision`.
	ErrNotProvisioned = errors.New("bus: stream not provisioned")
	// ErrShardCount means a process was given another number of shards
	// than the installation was provisioned with (StreamConfig.Shards,
	// agentbus provision --shards), or a shard's root that is not its
	// agent's shard: its messages would wait on shards where their
	// recipients have no consumers. Every process must use the
	// installation's number.
	ErrShardCount = errors.New("bus: number of shards differs from the installation's")
	// ErrUnavailable means the stream exists but did not answer, for
	// example a replicated stream without a leader while it lost its
	// quorum; retrying later (with the same message ID) is safe.
	ErrUnavailable = errors.New("bus: stream unavailable")
	// ErrPayloadTooLarge means the encoded message exceeds the server's
	// maximum payload, or the stream's (StreamConfig.MaxMsgSize).
	ErrPayloadTooLarge = errors.New("bus: message too large")
	// ErrSenderMismatch is the reason a message is dead-lettered, unhandled,
	// when its CloudEvents source names another agent than the sender in its
	// subject (a raw publisher, a misconfiguration, an impersonation).
	ErrSenderMismatch = errors.New("bus: sender does not match subject")
	// ErrAttributeMismatch is reported to the error handler when a
	// delivered event's to or priority attribute disagrees with the subject
	// it arrived on; the subject wins: the Delivery carries the subject's
	// recipient and priority, and the message is handled.
	ErrAttributeMismatch = errors.New("bus: event attributes disagree with the subject")
	// ErrMalformedSubject is the reason a message stored on a subject
	// that is not one of the scheme's (a priority outside 1..5, a token
	// too many or too few) is dead-lettered as malformed instead of
	// handled.
	ErrMalformedSubject = errors.New("bus: malformed subject")
	// ErrExpired is the reason a message whose expiry passed before delivery
	// is terminated instead of handed to the handler.
	ErrExpired = errors.New("bus: message expired")
	// ErrRequestTimeout is returned by Request when no reply came before
	// its context ended. The reply is not lost if it comes later: it
	// reaches the agent's handler, marked Late.
	ErrRequestTimeout = errors.New("bus: no reply before the request timed out")
	// ErrNoStatus means neither the stream nor the status bucket holds the
	// message for the caller: it was never published on this bus, it is
	// older than the retention, or lifecycle tracking was off
	// (WithoutLifecycle) when it moved. A lookup that could not read the
	// stream (it timed out, the server refused a consumer for lack of
	// room) and found no record returns that error instead.
	ErrNoStatus = errors.New("bus: no status recorded")
	// ErrPermissionDenied means the server refused the agent's credentials
	// the subject a call needs, such as a publish as another sender
	// (docs/security.md). It wraps nats.ErrPermissionViolation with the
	// server's message. Retrying does not help.
	ErrPermissionDenied = errors.New("bus: permission denied")
	// ErrHandlerPanic is wrapped by the error that stands for a panic in a
	// handler; the message is settled as if the handler failed.
	ErrHandlerPanic = errors.New("bus: handler panicked")

	// ErrInvalidMessage is wrapped by errors for messages that cannot be
	// sent; errors.As to *codec.FieldError tells which field.
	ErrInvalidMessage = codec.ErrInvalidMessage
	// ErrInvalidAgentID is wrapped by errors for agent IDs that cannot be
	// used; see docs/subjects.md for the rules.
	ErrInvalidAgentID = subjects.ErrInvalidAgentID
)

// isAPIError reports whether err is the server's JetStream API error code.
func isAPIError(err error, code jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == code
}
