package codec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/agentbus/agentbus/subjects"
)

// Errors returned by the codecs and by [Message.Validate]. Test for them with
// errors.Is; the attribute or field at fault is in a [*FieldError], found
// with errors.As.
var (
	// ErrMalformed: a NATS message or an event could not be decoded into a
	// valid Message. Every error from Decode, the codecs' Decode methods,
	// UnmarshalJSON and FromEvent wraps it.
	ErrMalformed = errors.New("codec: malformed event")

	// ErrNotCloudEvent: a message has no ce-specversion header and is not in
	// structured mode, as when something publishes raw bytes on an agentbus
	// subject. It wraps ErrMalformed.
	ErrNotCloudEvent = fmt.Errorf("%w: not a CloudEvent (no ce-specversion header, not structured mode)", ErrMalformed)

	// ErrInvalidMessage: a Message breaks one of the rules of
	// [Message.Validate], so it cannot be encoded. Every error from Validate,
	// the codecs' Encode methods, MarshalJSON and ToEvent wraps it.
	ErrInvalidMessage = errors.New("codec: invalid message")
)

// FieldError reports the attribute or field that made a decode or a
// validation fail. Decoders name the CloudEvents attribute ("priority",
// "source", an extension name); [Message.Validate] names the Message field
// ("Priority", "From", "Extensions").
//
// errors.Is(err, ErrMalformed) holds for a FieldError from a decoder and
// errors.Is(err, ErrInvalidMessage) for one from Validate; Unwrap returns Err,
// so a subjects sentinel such as [subjects.ErrInvalidAgentID] is found too
// when it is the cause.
type FieldError struct {
	// Field is the CloudEvents attribute or the Message field at fault.
	Field string
	// Value is the offending value as received or set; "" when the value
	// is missing.
	Value string
	// Err is the rule that Value breaks.
	Err error

	kind error // ErrMalformed or ErrInvalidMessage; nil if built by a caller
}

// maxErrorValue bounds how much of a FieldError's Value its message quotes.
const maxErrorValue = 64

// Error returns "<sentinel>: <field> <quoted value>: <rule>".
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.kind != nil {
		b.WriteString(e.kind.Error())
		b.WriteString(": ")
	}
	b.WriteString(e.Field)
	if e.Value != "" {
		v := e.Value
		if len(v) > maxErrorValue {
			v = v[:maxErrorValue] + "..."
		}
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(v))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Is reports whether target is ErrMalformed for a decode error or
// ErrInvalidMessage for a validation error.
func (e *FieldError) Is(target error) bool { return e.kind != nil && target == e.kind }

func malformed(field, value string, rule error) error {
	return &FieldError{Field: field, Value: value, Err: rule, kind: ErrMalformed}
}

func invalid(field, value string, rule error) error {
	return &FieldError{Field: field, Value: value, Err: rule, kind: ErrInvalidMessage}
}

// The rules a FieldError's Err names when no subjects sentinel applies.
var (
	errMissing   = errors.New("required attribute is missing")
	errDuplicate = errors.New("given more than once")
	errEmpty     = errors.New("must not be empty")
	errBlank     = errors.New("must not be only white space")
	errUTF8      = errors.New("not valid UTF-8")
	errControl   = errors.New("has a control character")
	// ErrTooLong is wrapped by the error for an attribute longer than its
	// limit (MaxIDLen and the others); the message says the length and the
	// limit.
	ErrTooLong     = errors.New("too long")
	errSpecVersion = errors.New(`unsupported specversion, want "1.0"`)
	errPriority    = fmt.Errorf("%w: must be an integer 1..5", subjects.ErrInvalidPriority)
	errTimestamp   = errors.New("not an RFC 3339 timestamp")
	errYear        = errors.New("year outside 0000..9999")
	errTTLNegative = errors.New("must not be negative")
	errTTLNoTime   = errors.New("an expiry needs a time")
	errExpiryOrder = errors.New("must be later than time")
	errExpiryRange = errors.New("too far after time")
	errAttrName    = errors.New("not a CloudEvents attribute name (lower-case a-z and 0-9)")
	errReserved    = errors.New("reserved: a core attribute or one that Message maps to a field")
	errMediaType   = errors.New("not an RFC 2046 media type")
	errURI         = errors.New("not an absolute URI in canonical form")
	errPercent     = errors.New("bad percent-encoding")
	errQuoted      = errors.New("bad quoted string")
	errValueType   = errors.New("wrong type for this attribute")
	errJSONInteger = errors.New("JSON number is not an integer")
	errDataTwice   = errors.New("data and data_base64 are mutually exclusive")
	errBase64      = errors.New("not base64")
	errBatch       = errors.New("batch mode is not supported")
	errEventFormat = errors.New("unsupported event format, want application/cloudevents+json")
)

// malformedPayload returns an error about a whole payload that wraps ErrMalformed.
func malformedPayload(text string) error { return fmt.Errorf("%w: %s", ErrMalformed, text) }
