// Package codec turns agentbus messages into CloudEvents on NATS and back.
//
// Every agentbus message is a [Message]: who sent it (From), to whom (To, or
// "*" for every agent), what it is (Type), how urgent (Priority 1..5), which
// conversation it belongs to (CorrelationID), what it answers (CausationID), how
// long it lives (TTL) and an opaque payload (Data). On the wire a Message is
// a CloudEvent 1.0 following the CloudEvents NATS protocol binding;
// docs/cloudevents.md is the full mapping and the contract for producers in
// other languages.
//
// # Sending
//
// Fill in what you know, let SetDefaults add an ID, the time, the default
// priority and the correlation ID, and encode:
//
//	m := &codec.Message{
//		From:        "planner",
//		To:          "coder-1",
//		Type:        "TASK_ASSIGNMENT",
//		ContentType: "application/json",
//		Data:        []byte(`{"taskId":"TASK-001"}`),
//		TTL:         5 * time.Minute,
//	}
//	m.SetDefaults(time.Now())
//	h, data, err := codec.Binary{}.Encode(m)
//	if err != nil { // errors.Is(err, codec.ErrInvalidMessage)
//		return err
//	}
//	msg := &nats.Msg{Subject: subject, Header: h, Data: data}
//
// Encode validates first (see [Message.Validate]) and never changes m. Two
// codecs implement [Codec]:
//
//   - [Binary], the default, puts each attribute in a ce- header
//     (ce-id, ce-source, ce-priority, ...) and Data, untouched, in the
//     payload. It is the fast one: no JSON, no copy of the data.
//   - [Structured] puts the whole event in the payload as CloudEvents JSON,
//     for consumers that want one self-contained document.
//     [MarshalJSON] gives the same bytes without the header.
//
// # Receiving
//
// [Decode] takes the headers and payload of any NATS message and returns
// the Message, whichever mode and whichever producer wrote it:
//
//	m, err := codec.Decode(msg.Header, msg.Data)
//	switch {
//	case errors.Is(err, codec.ErrNotCloudEvent):
//		// a raw publish: not for us
//	case err != nil:
//		var fe *codec.FieldError
//		errors.As(err, &fe) // fe.Field names the attribute at fault
//	case m.Expired(time.Now()):
//		// too late to act on
//	}
//
// The decoder is lenient where real producers differ (header names in any
// case, unencoded UTF-8, quoted values, sdk-go's plain content-type header,
// a source that is not an agentbus agent) and strict where it matters
// (specversion "1.0", the required attributes, priority 1..5, RFC 3339
// times, valid UTF-8, no control characters). A decoded Message passes
// Validate, except that To is "" when the event had no to extension, so it
// can be forwarded as it is. Decoding never panics; fuzz tests hold it to
// that and to Decode(Encode(m)) == m.
//
// An event's trace context is its distributed tracing extension
// (Extensions["traceparent"]). Producers that are not CloudEvents ones
// write plain W3C traceparent and tracestate headers instead;
// [DecodeWithTraceHeaders] returns those too, found in the same pass over
// the headers, and [ReadTraceHeaders] reads them alone.
// [DecodeWithTraceHeadersInto] decodes into a Message the caller has, such
// as a variable on its stack, so that a consumer allocates none per
// message (package bus does).
//
// # sdk-go
//
// [ToEvent] and [FromEvent] convert to and from the CloudEvents Go SDK's
// event.Event, for code that already speaks it; UnmarshalJSON reads the
// JSON that sdk-go's json.Marshal of an event writes.
package codec
