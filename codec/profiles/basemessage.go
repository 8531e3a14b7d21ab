package profiles

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentbus/agentbus/codec"
)

// BaseMessage is the basemessage profile: the JSON messages of
// base-message.md with messageId, correlationId, timestamp, from, to, type,
// version and payload. It is strict.
type BaseMessage struct{}

var _ Profile = BaseMessage{}

// The basemessage error types, the payload.errorType of a MESSAGE_ERROR.
const (
	CodeInvalidFormat = "INVALID_FORMAT"
	CodeUnknownType   = "UNKNOWN_TYPE"
	CodeMissingField  = "MISSING_FIELD"
)

// TypeMessageError is the basemessage type of the reply to an invalid message.
const TypeMessageError = "MESSAGE_ERROR"

// basemessagePriority ranks the types as the document's queue rules do:
// ESCALATION > ERROR > VALIDATION > STATUS. The types it does not rank take
// the middle, subjects.DefaultPriority.
var basemessagePriority = map[string]int{
	"ESCALATION_REQUEST":  1,
	"ERROR_REPORT":        2,
	TypeMessageError:      2,
	"VALIDATION_REQUEST":  3,
	"VALIDATION_RESPONSE": 3,
	"STATUS_UPDATE":       4,
}

// Name returns "basemessage".
func (BaseMessage) Name() string { return "basemessage" }

// Version returns "1.0", the format version the document defines.
func (BaseMessage) Version() string { return "1.0" }

// DataSchema returns "urn:agentbus:profile:basemessage:1.0".
func (p BaseMessage) DataSchema() string { return dataSchema(p.Name(), p.Version()) }

// Strict returns true: the document answers invalid input with MESSAGE_ERROR.
func (BaseMessage) Strict() bool { return true }

// Defaults returns the document's timeouts and queue rules: requests time
// out after 5 minutes, correlations after 30, publishing is tried 3 times
// with exponential backoff, a messageId seen in the last hour is ignored,
// and messages are kept for 30 days.
func (BaseMessage) Defaults() Defaults {
	return Defaults{
		RequestTimeout:     5 * time.Minute,
		CorrelationTimeout: 30 * time.Minute,
		PublishAttempts:    3,
		DedupWindow:        time.Hour,
		Retention:          30 * 24 * time.Hour,
	}
}

// Decode maps messageId to ID, correlationId to CorrelationID, replyTo to
// CausationID, timestamp to Time, from, to ("*" is a broadcast) and type; the
// priority comes from the type (see docs/protocols.md).
func (p BaseMessage) Decode(native []byte, addr Addressing) (*codec.Message, error) {
	o, err := parseObject(p.Name(), native)
	if err != nil {
		return nil, err
	}
	typ := o.str("type")
	if typ == "" {
		return nil, invalid(p.Name(), Finding{Field: "/type", Rule: "required", Message: "a message type is needed to route the message"})
	}
	m := &codec.Message{
		ID:            o.str("messageId"),
		From:          o.str("from"),
		To:            o.str("to"),
		Type:          typ,
		CorrelationID: o.str("correlationId"),
		CausationID:   o.str("replyTo"),
		Time:          o.timestamp("timestamp"),
		ContentType:   ContentTypeJSON,
		DataSchema:    p.DataSchema(),
		Data:          native,
	}
	prio, ok := basemessagePriority[typ]
	if !ok {
		prio = 3
	}
	return finish(p.Name(), m, addr, prio, fieldNames{
		"ID": "/messageId", "From": "/from", "To": "/to", "Type": "/type",
		"CorrelationID": "/correlationId", "CausationID": "/replyTo", "Time": "/timestamp",
	})
}

// Validate checks native against schemas/basemessage.schema.json. Map the
// error to a MESSAGE_ERROR errorType with [ErrorCode].
func (p BaseMessage) Validate(native []byte) error { return validateJSON(p.Name(), native) }

// Rejection returns the MESSAGE_ERROR reply (ErrorReply) to invalid, which
// failed Validate with verr: its errorType is ErrorCode(verr) and its
// details verr's message. BaseMessage is a Rejecter.
func (p BaseMessage) Rejection(invalid *codec.Message, verr error, from string, now time.Time) ([]byte, error) {
	return p.ErrorReply(invalid, ErrorCode(verr), verr.Error(), from, now)
}

var _ Rejecter = BaseMessage{}

// ErrorCode returns the basemessage errorType for an error from
// BaseMessage.Validate or BaseMessage.Decode: UNKNOWN_TYPE when the type is
// not one of the document's, else MISSING_FIELD when a required field is
// missing, else INVALID_FORMAT. It returns "" when err is not a
// *ValidationError.
func ErrorCode(err error) string {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return ""
	}
	if ve.Has("/type", "enum") {
		return CodeUnknownType
	}
	for _, f := range ve.Findings {
		if f.Rule == "required" {
			return CodeMissingField
		}
	}
	return CodeInvalidFormat
}

// ErrorReply builds the MESSAGE_ERROR the document prescribes for an
// invalid message: from the replying agent to the original sender, with
// payload.originalMessageId, the original correlationId, replyTo set to the
// original message ID, errorType code and details detail. The original's
// native fields (orig.Data) are used where they can be read, the event's
// (orig.ID, orig.CorrelationID) otherwise, so that input too broken to
// parse still gets its reply. The reply goes to the event's sender
// (orig.From), whom the bus checked against its subject; the native from
// only when the event names none: a message that claims another sender in
// its native from (or "*") would send that agent (or everyone) the error.
// The reply gets a new random messageId and timestamp now.
//
// A code other than INVALID_FORMAT, UNKNOWN_TYPE and MISSING_FIELD, an
// empty from, or an original with no sender or ID fails with an error
// wrapping ErrInvalid.
func (p BaseMessage) ErrorReply(orig *codec.Message, code, detail, from string, now time.Time) ([]byte, error) {
	switch code {
	case CodeInvalidFormat, CodeUnknownType, CodeMissingField:
	default:
		return nil, fmt.Errorf("%w: error code %q is not %s, %s or %s", ErrInvalid, code, CodeInvalidFormat, CodeUnknownType, CodeMissingField)
	}
	if from == "" {
		return nil, fmt.Errorf("%w: error reply needs a sender", ErrInvalid)
	}
	var o object
	_ = json.Unmarshal(orig.Data, &o) // best effort: the original may be garbage
	pick := func(native, event string) string {
		if v := o.str(native); v != "" {
			return v
		}
		return event
	}
	origID := pick("messageId", orig.ID)
	to := orig.From
	if to == "" {
		to = o.str("from")
	}
	correlation := pick("correlationId", orig.CorrelationID)
	if origID == "" || to == "" {
		return nil, fmt.Errorf("%w: error reply needs the original's message ID and sender", ErrInvalid)
	}
	if correlation == "" {
		correlation = origID
	}
	reply := struct {
		MessageID     string       `json:"messageId"`
		CorrelationID string       `json:"correlationId"`
		ReplyTo       string       `json:"replyTo"`
		Timestamp     string       `json:"timestamp"`
		From          string       `json:"from"`
		To            string       `json:"to"`
		Type          string       `json:"type"`
		Version       string       `json:"version"`
		Payload       errorPayload `json:"payload"`
	}{
		MessageID:     codec.NewID(),
		CorrelationID: correlation,
		ReplyTo:       origID,
		Timestamp:     now.UTC().Format(time.RFC3339Nano),
		From:          from,
		To:            to,
		Type:          TypeMessageError,
		Version:       p.Version(),
		Payload:       errorPayload{OriginalMessageID: origID, ErrorType: code, Details: detail},
	}
	return json.Marshal(reply)
}

type errorPayload struct {
	OriginalMessageID string `json:"originalMessageId"`
	ErrorType         string `json:"errorType"`
	Details           string `json:"details"`
}
