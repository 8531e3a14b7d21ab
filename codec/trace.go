package codec

import (
	"strings"

	"github.com/nats-io/nats.go"
)

// TraceHeaders is the W3C Trace Context a message carries in plain
// traceparent and tracestate headers, beside the event rather than in it:
// what producers that are not CloudEvents ones write (nats.go's and
// OpenTelemetry's NATS instrumentations). An event's own trace context is
// its distributed tracing extension, Message.Extensions["traceparent"] and
// ["tracestate"] (ce- headers in binary mode).
//
// Header names match in any case, since nats.Header is case-sensitive and
// clients differ ("traceparent", "Traceparent"). Should a message have a
// name in several spellings, the one that sorts last wins, which is the
// one in lower case when it is there; a header's first value is taken.
type TraceHeaders struct {
	TraceParent string
	TraceState  string
}

// traceNotes collects the plain trace headers of a message, header by
// header, with the names the values came from.
type traceNotes struct {
	TraceHeaders
	parentName, stateName string
}

// The plain W3C Trace Context header names.
const (
	headerTraceParent = "traceparent"
	headerTraceState  = "tracestate"
)

// ReadTraceHeaders returns the plain trace headers of h.
func ReadTraceHeaders(h nats.Header) TraceHeaders {
	var tn traceNotes
	for k, vs := range h {
		tn.note(k, vs)
	}
	return tn.TraceHeaders
}

// DecodeWithTraceHeaders is Decode that also returns the message's plain
// trace headers, whether or not it decodes. A binary-mode message, the
// common case, has them found in Decode's own pass over h: a consumer that
// reads them for every message (package bus does) saves a second walk of
// the header map.
func DecodeWithTraceHeaders(h nats.Header, data []byte) (*Message, TraceHeaders, error) {
	return decodeWithTraceHeaders(new(Message), h, data)
}

// DecodeWithTraceHeadersInto is DecodeWithTraceHeaders decoding into m,
// which it overwrites, for a caller that keeps the message in a variable
// of its own: no Message is allocated for a binary-mode event. After an
// error m holds whatever was read.
func DecodeWithTraceHeadersInto(m *Message, h nats.Header, data []byte) (TraceHeaders, error) {
	*m = Message{}
	got, th, err := decodeWithTraceHeaders(m, h, data)
	if err == nil && got != m {
		*m = *got // decoded as structured JSON
	}
	return th, err
}

// decodeWithTraceHeaders is DecodeWithTraceHeaders reading a binary-mode
// event into dst, which it returns; a structured one is a Message of its
// own.
func decodeWithTraceHeaders(dst *Message, h nats.Header, data []byte) (*Message, TraceHeaders, error) {
	var tn traceNotes
	m, mode, err := decodeBinaryInto(dst, h, data, &tn)
	th := tn.TraceHeaders
	if mode == modeStructured {
		// decodeBinary stopped at the Content-Type header.
		th = ReadTraceHeaders(h)
	}
	m, err = decodeMode(m, mode, err, data)
	return m, th, err
}

// note takes header k with values vs if it is a trace header.
func (tn *traceNotes) note(k string, vs []string) {
	if len(vs) == 0 {
		return
	}
	var v, name *string
	switch {
	case len(k) == len(headerTraceParent) && strings.EqualFold(k, headerTraceParent):
		v, name = &tn.TraceParent, &tn.parentName
	case len(k) == len(headerTraceState) && strings.EqualFold(k, headerTraceState):
		v, name = &tn.TraceState, &tn.stateName
	default:
		return
	}
	// Lower case sorts after every other spelling of the same name.
	if k > *name {
		*v, *name = vs[0], k
	}
}
