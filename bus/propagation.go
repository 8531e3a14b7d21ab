package bus

import (
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/agentbus/agentbus/codec"
)

// The trace context travels as the CloudEvents Distributed Tracing
// extension: the attributes traceparent and tracestate, so ce-traceparent
// and ce-tracestate headers in binary mode and members of the event in
// structured mode. A producer that is not a CloudEvents one may instead
// write the plain W3C traceparent header (as nats.go and OpenTelemetry's
// NATS instrumentations do): the bus reads that when the event has none.

// traceContext is the W3C Trace Context propagator: the bus always
// propagates traceparent and tracestate, whatever the global propagator.
var traceContext propagation.TraceContext

// extensionCarrier adapts a message's extension attributes to
// propagation.TextMapCarrier, to write the trace context into a message
// about to be encoded.
type extensionCarrier map[string]string

// Get returns the extension key.
func (c extensionCarrier) Get(key string) string { return c[key] }

// Set sets the extension key.
func (c extensionCarrier) Set(key, value string) { c[key] = value }

// Keys returns the extension names.
func (c extensionCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// traceParentKey is the W3C traceparent field: the extension attribute
// and the plain header.
const traceParentKey = "traceparent"

// noExtensions stands for the extensions of a decoded message that has
// none, so that incomingCarrier tells it from an undecodable one. It is
// only read.
var noExtensions = map[string]string{}

// incomingCarrier reads the trace context of a delivered message: the
// event's distributed tracing extension if it has one (ext, the decoded
// extensions; or, for a message that could not be decoded, its ce-
// headers), else the plain W3C headers (plain, read while decoding).
// Headers match in any case: nats.Header is case-sensitive, and other
// clients write "Traceparent" or "CE-TraceParent".
type incomingCarrier struct {
	h     nats.Header
	ext   map[string]string  // nil when the message could not be decoded
	plain codec.TraceHeaders // from codec.DecodeWithTraceHeadersInto
}

// Get returns the value of key, from the extension first.
func (c incomingCarrier) Get(key string) string {
	if c.ext != nil {
		if v := c.ext[key]; v != "" {
			return v
		}
		// A decoded event's ce- headers are in ext already.
	} else if v := headerValue(c.h, codecHeaderPrefix+key); v != "" {
		return v
	}
	switch key {
	case traceParentKey:
		return c.plain.TraceParent
	case extTraceState:
		return c.plain.TraceState
	}
	return headerValue(c.h, key)
}

// Set does nothing: the carrier is read only.
func (incomingCarrier) Set(string, string) {}

// Keys returns the header keys.
func (c incomingCarrier) Keys() []string {
	out := make([]string, 0, len(c.h))
	for k := range c.h {
		out = append(out, k)
	}
	return out
}

// codecHeaderPrefix is the CloudEvents NATS binding's attribute header
// prefix.
const codecHeaderPrefix = "ce-"

// headerValue returns the first value of key, an ASCII header name, in h,
// matched case-insensitively. Names of another length are passed over
// before they are compared: ASCII folds byte for byte.
func headerValue(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(k) == len(key) && len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// extTraceState is the distributed tracing extension's tracestate
// attribute; the bus replaces a caller's with its own span's.
const extTraceState = "tracestate"
