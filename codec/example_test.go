package codec_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
)

func printHeader(h nats.Header) {
	for _, k := range slices.Sorted(maps.Keys(h)) {
		fmt.Printf("%s: %s\n", k, h[k][0])
	}
}

// exampleMessage is the message of docs/cloudevents.md.
func exampleMessage() *codec.Message {
	m := &codec.Message{
		ID:            "7f3c9a4e-2b1d-4e8f-9a6c-5d4e3f2a1b0c", // usually left "" for SetDefaults
		From:          "build orchestrator",
		To:            "@agent-fullstack-developer",
		Type:          "TASK_ASSIGNMENT",
		Priority:      2,
		CorrelationID: "task-001",
		CausationID:   "msg-122",
		TTL:           90*time.Second + 500*time.Millisecond,
		ContentType:   "application/json",
		Data:          []byte(`{"taskId":"TASK-001","title":"Add OAuth2 with Google"}`),
		Extensions:    map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	m.SetDefaults(time.Date(2024, 1, 1, 12, 0, 0, 250_000_000, time.UTC))
	return m
}

func ExampleBinary_Encode() {
	h, data, err := codec.Binary{}.Encode(exampleMessage())
	if err != nil {
		fmt.Println(err)
		return
	}
	printHeader(h)
	fmt.Printf("\n%s\n", data)
	// Output:
	// ce-causationid: msg-122
	// ce-correlationid: task-001
	// ce-datacontenttype: application/json
	// ce-expirytime: 2024-01-01T12:01:30.75Z
	// ce-id: 7f3c9a4e-2b1d-4e8f-9a6c-5d4e3f2a1b0c
	// ce-priority: 2
	// ce-source: /agents/build%2520orchestrator
	// ce-specversion: 1.0
	// ce-time: 2024-01-01T12:00:00.25Z
	// ce-to: @agent-fullstack-developer
	// ce-traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// ce-type: TASK_ASSIGNMENT
	//
	// {"taskId":"TASK-001","title":"Add OAuth2 with Google"}
}

func ExampleStructured_Encode() {
	h, data, err := codec.Structured{}.Encode(exampleMessage())
	if err != nil {
		fmt.Println(err)
		return
	}
	printHeader(h)
	fmt.Printf("\n%s\n", data)
	// Output:
	// Content-Type: application/cloudevents+json
	//
	// {"specversion":"1.0","id":"7f3c9a4e-2b1d-4e8f-9a6c-5d4e3f2a1b0c","source":"/agents/build%20orchestrator","type":"TASK_ASSIGNMENT","time":"2024-01-01T12:00:00.25Z","datacontenttype":"application/json","correlationid":"task-001","causationid":"msg-122","priority":2,"to":"@agent-fullstack-developer","expirytime":"2024-01-01T12:01:30.75Z","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","data":{"taskId":"TASK-001","title":"Add OAuth2 with Google"}}
}

// Decoding what Encode wrote gives the message back.
func ExampleDecode_roundTrip() {
	m := exampleMessage()
	h, data, _ := codec.Binary{}.Encode(m)
	got, err := codec.Decode(h, data)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(got.From, got.To, got.Priority, got.TTL, got.ExpiresAt().Format(time.RFC3339Nano), got.Expired(got.Time))
	// Output:
	// build orchestrator @agent-fullstack-developer 2 1m30.5s 2024-01-01T12:01:30.75Z false
}

// Decode reads either content mode, and what other CloudEvents producers
// write: header names in any case, raw UTF-8, a plain content-type header.
func ExampleDecode() {
	h := nats.Header{
		"Ce-Specversion": {"1.0"},
		"Ce-Id":          {"A234-1234-1234"},
		"Ce-Source":      {"https://example.com/orders"}, // not an agentbus sender
		"Ce-Type":        {"order.created"},
		"Ce-To":          {"billing"},
		"Ce-Priority":    {"1"},
		"Ce-Time":        {"2018-04-05T17:31:00Z"},
		"Ce-Note":        {"Euro%20%E2%82%AC"},
		"content-type":   {"text/plain"},
	}
	m, err := codec.Decode(h, []byte("hello"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.ID, m.From, m.To, m.Type, m.Priority, m.Time, m.ContentType, m.Extensions["note"], string(m.Data))

	// A raw NATS publish is not a CloudEvent.
	_, err = codec.Decode(nil, []byte("hello"))
	fmt.Println(err)
	// Output:
	// A234-1234-1234 https://example.com/orders billing order.created 1 2018-04-05 17:31:00 +0000 UTC text/plain Euro € hello
	// codec: malformed event: not a CloudEvent (no ce-specversion header, not structured mode)
}

// A producer that is not a CloudEvents one, an OpenTelemetry NATS
// instrumentation say, sends its trace context as plain W3C headers, in the
// spelling it likes; the event's own is its traceparent extension.
func ExampleDecodeWithTraceHeaders() {
	h := nats.Header{
		"ce-specversion": {"1.0"},
		"ce-id":          {"1"},
		"ce-source":      {"/agents/planner"},
		"ce-type":        {"PLAN"},
		"Traceparent":    {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	m, th, err := codec.DecodeWithTraceHeaders(h, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("extension %q\nheader %q\n", m.Extensions["traceparent"], th.TraceParent)
	// Output:
	// extension ""
	// header "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
}

func ExampleFieldError() {
	h := nats.Header{
		"ce-specversion": {"1.0"},
		"ce-id":          {"1"},
		"ce-source":      {"/agents/a"},
		"ce-type":        {"T"},
		"ce-priority":    {"9"},
	}
	_, err := codec.Decode(h, nil)
	var fe *codec.FieldError
	if errors.As(err, &fe) {
		fmt.Println(fe.Field, fe.Value, errors.Is(err, codec.ErrMalformed))
	}
	// Output:
	// priority 9 true
}

// NewID makes the ID SetDefaults gives a message without one: a UUID of
// version 7, so IDs sort in the order they were made.
func ExampleNewID() {
	first, second := codec.NewID(), codec.NewID()
	u, err := uuid.Parse(first)
	fmt.Println(u.Version(), err, first < second)
	// Output: VERSION_7 <nil> true
}

// ValidateID refuses an ID no message can have before a lookup asks the
// server for it.
func ExampleValidateID() {
	for _, id := range []string{"01a21b4e-b56a-72b3-b663-a13c8446949c", "", "a\nb"} {
		err := codec.ValidateID("ID", id)
		fmt.Println(err == nil, errors.Is(err, codec.ErrInvalidMessage), err)
	}
	// Output:
	// true false <nil>
	// false true codec: invalid message: ID: must not be empty
	// false true codec: invalid message: ID "a\nb": has a control character
}
