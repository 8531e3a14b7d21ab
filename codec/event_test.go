package codec_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
)

// Binary wire message -> sdk-go event: every attribute where sdk-go
// expects it, and the event valid.
func TestToEvent(t *testing.T) {
	m := sample()
	m.From = "agent €" // the source then holds escapes
	m.Extensions["subject"] = "orders/1"
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := codec.Decode(h, data)
	if err != nil {
		t.Fatal(err)
	}
	e, err := codec.ToEvent(got)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("event.Validate: %v", err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"specversion", e.SpecVersion(), "1.0"},
		{"id", e.ID(), m.ID},
		{"source", e.Source(), "/agents/agent%20%E2%82%AC"},
		{"type", e.Type(), m.Type},
		{"subject", e.Subject(), "orders/1"},
		{"datacontenttype", e.DataContentType(), m.ContentType},
		{"dataschema", e.DataSchema(), m.DataSchema},
		{"data", string(e.Data()), string(m.Data)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if !e.Time().Equal(m.Time) {
		t.Errorf("time = %v, want %v", e.Time(), m.Time)
	}
	ext := e.Extensions()
	if p, ok := ext["priority"].(int32); !ok || p != 2 {
		t.Errorf("priority = %#v, want int32(2)", ext["priority"])
	}
	if ts, ok := ext["expirytime"].(types.Timestamp); !ok || !ts.Time.Equal(m.ExpiresAt()) {
		t.Errorf("expirytime = %#v, want a types.Timestamp at %v", ext["expirytime"], m.ExpiresAt())
	}
	for name, want := range map[string]string{"to": "coder-1", "correlationid": "task-001", "causationid": "msg-122", "traceparent": m.Extensions["traceparent"]} {
		if ext[name] != want {
			t.Errorf("extension %s = %#v, want %q", name, ext[name], want)
		}
	}
	back, err := codec.FromEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(m, back); d != "" {
		t.Errorf("FromEvent(ToEvent(m)) != m: %s", d)
	}
}

// An event built with the sdk-go API survives FromEvent, both codecs and
// the way back.
func TestFromEventSDK(t *testing.T) {
	e := event.New()
	e.SetID("evt-1")
	e.SetSource("/agents/reviewer")
	e.SetType("REVIEW_RESULT")
	e.SetTime(time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC))
	e.SetSubject("pr/42")
	e.SetDataSchema("https://agentbus.dev/schemas/review.json")
	if err := e.SetData(event.ApplicationJSON, map[string]any{"approved": true}); err != nil {
		t.Fatal(err)
	}
	e.SetExtension("to", "planner")
	e.SetExtension("priority", 1)
	e.SetExtension("correlationid", "task-7")
	e.SetExtension("causationid", "msg-9")
	e.SetExtension("expirytime", time.Date(2025, 5, 1, 12, 5, 0, 0, time.UTC))
	e.SetExtension("attempt", 2)
	e.SetExtension("urgent", true)
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}

	m, err := codec.FromEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	want := &codec.Message{
		ID: "evt-1", From: "reviewer", To: "planner", Type: "REVIEW_RESULT", Priority: 1,
		CorrelationID: "task-7", CausationID: "msg-9",
		Time: time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC), TTL: 5 * time.Minute,
		ContentType: "application/json", DataSchema: "https://agentbus.dev/schemas/review.json",
		Data:       []byte(`{"approved":true}`),
		Extensions: map[string]string{"subject": "pr/42", "attempt": "2", "urgent": "true"},
	}
	if d := diff(want, m); d != "" {
		t.Fatalf("FromEvent: %s", d)
	}
	roundTrip(t, codec.Binary{}, m)
	roundTrip(t, codec.Structured{}, m)

	// sdk-go's own JSON, read as a structured payload.
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := codec.Decode(nats.Header{"Content-Type": {event.ApplicationCloudEventsJSON}}, b)
	if err != nil {
		t.Fatalf("Decode(json.Marshal(event)): %v\n%s", err, b)
	}
	if d := diff(want, got); d != "" {
		t.Errorf("Decode(json.Marshal(event)): %s\n%s", d, b)
	}
}

// sdk-go reads what the structured codec writes, and the other way round,
// for each way of writing Data.
func TestStructuredSDKInterop(t *testing.T) {
	for _, tc := range []struct{ name, ct, data string }{
		{"json", "application/json", `{"a":[1,2]}`},
		{"no content type", "", `"s"`},
		{"vendor json", "application/vnd.x+json", `{"a":1}`}, // sdk-go wants base64 here
		{"text", "text/plain", "line 1\nline 2"},
		{"binary", "application/octet-stream", "\x00\xff"},
		{"no data", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := sample()
			m.ContentType, m.Data = tc.ct, []byte(tc.data)
			e, err := codec.ToEvent(m)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := codec.UnmarshalJSON(b)
			if err != nil {
				t.Fatalf("UnmarshalJSON(json.Marshal(ToEvent(m))): %v\n%s", err, b)
			}
			if d := diff(m, got); d != "" {
				t.Errorf("UnmarshalJSON(json.Marshal(ToEvent(m))): %s\n%s", d, b)
			}

			if tc.name == "vendor json" {
				return // sdk-go reads only application/json and text/json data as JSON values
			}
			payload, err := codec.MarshalJSON(m)
			if err != nil {
				t.Fatal(err)
			}
			var se event.Event
			if err := json.Unmarshal(payload, &se); err != nil {
				t.Fatalf("sdk-go cannot read %s: %v", payload, err)
			}
			back, err := codec.FromEvent(se)
			if err != nil {
				t.Fatal(err)
			}
			if d := diff(m, back); d != "" {
				t.Errorf("FromEvent(sdk-go reading MarshalJSON(m)): %s", d)
			}
		})
	}
}

func TestFromEventErrors(t *testing.T) {
	valid := func() event.Event {
		e := event.New()
		e.SetID("1")
		e.SetSource("/agents/a")
		e.SetType("T")
		return e
	}
	tests := []struct {
		name      string
		edit      func(e *event.Event)
		wantErr   error
		wantField string
	}{
		{"no context", func(e *event.Event) { e.Context = nil }, codec.ErrNotCloudEvent, ""},
		{"version 0.3", func(e *event.Event) { e.SetSpecVersion(event.CloudEventsVersionV03) }, codec.ErrMalformed, "specversion"},
		{"no id", func(e *event.Event) { e.Context.(*event.EventContextV1).ID = "" }, codec.ErrMalformed, "id"},
		{"priority 9", func(e *event.Event) { e.SetExtension("priority", 9) }, codec.ErrMalformed, "priority"},
		{"priority bool", func(e *event.Event) { e.SetExtension("priority", true) }, codec.ErrMalformed, "priority"},
		{"priority 1.5 string", func(e *event.Event) { e.SetExtension("priority", "1.5") }, codec.ErrMalformed, "priority"},
		{"expirytime not a time", func(e *event.Event) { e.SetTime(time.Now()); e.SetExtension("expirytime", 5) }, codec.ErrMalformed, "expirytime"},
		{"expirytime without time", func(e *event.Event) { e.SetExtension("expirytime", time.Now()) }, codec.ErrMalformed, "expirytime"},
		{"to invalid", func(e *event.Event) { e.SetExtension("to", "a\nb") }, codec.ErrMalformed, "to"},
		{"extension name upper case", func(e *event.Event) {
			e.Context.(*event.EventContextV1).Extensions = map[string]any{"Bad": "x"}
		}, codec.ErrMalformed, "Bad"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := valid()
			tc.edit(&e)
			m, err := codec.FromEvent(e)
			if err == nil {
				t.Fatalf("FromEvent = %+v, want an error", m)
			}
			if !errors.Is(err, codec.ErrMalformed) || !errors.Is(err, tc.wantErr) {
				t.Fatalf("FromEvent error %v, want ErrMalformed and %v", err, tc.wantErr)
			}
			if tc.wantField != "" {
				var fe *codec.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.wantField {
					t.Errorf("FromEvent error %v, want a FieldError on %q", err, tc.wantField)
				}
			}
		})
	}
}
