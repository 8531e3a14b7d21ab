package codec_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

var structuredHeader = nats.Header{"Content-Type": {codec.ContentTypeStructured}}

func TestStructuredEncode(t *testing.T) {
	m := sample()
	m.Extensions["subject"] = "orders/1"
	h, data, err := codec.Structured{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 1 || h.Get("Content-Type") != "application/cloudevents+json" {
		t.Errorf("headers = %q, want only Content-Type", h)
	}
	const want = `{"specversion":"1.0","id":"0b5c5a6e-8f0e-4c1a-9d8e-3f2b1a0c9d8e","source":"/agents/planner",` +
		`"type":"TASK_ASSIGNMENT","time":"2025-03-14T15:09:26.535897932Z","datacontenttype":"application/json",` +
		`"dataschema":"https://agentbus.dev/schemas/task.json","correlationid":"task-001","causationid":"msg-122",` +
		`"priority":2,"to":"coder-1","expirytime":"2025-03-14T15:10:56.535897932Z","subject":"orders/1",` +
		`"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",` +
		`"data":{"taskId":"TASK-001","title":"Add OAuth2"}}`
	if string(data) != want {
		t.Errorf("payload\n got %s\nwant %s", data, want)
	}
	if !json.Valid(data) {
		t.Error("payload is not valid JSON")
	}
	b, err := codec.MarshalJSON(m)
	if err != nil || string(b) != string(data) {
		t.Errorf("MarshalJSON = %s, %v; want the Encode payload", b, err)
	}
}

func TestStructuredData(t *testing.T) {
	tests := []struct {
		name, ct string
		data     string
		want     string // the data member as written
	}{
		{"JSON kept byte for byte", "application/json", `{ "b" : [1, 2.50, "\u00e9"],"a":null }`, `"data":{ "b" : [1, 2.50, "\u00e9"],"a":null }`},
		{"JSON string", "application/json", `"just a string"`, `"data":"just a string"`},
		{"JSON null", "application/json", `null`, `"data":null`},
		{"no content type, JSON", "", `[1,2]`, `"data":[1,2]`},
		{"+json", "application/vnd.agentbus.task+json; charset=utf-8", `{"a":1}`, `"data":{"a":1}`},
		{"JSON with white space around", "application/json", " {}\n", `"data_base64":"IHt9Cg=="`},
		{"invalid JSON", "application/json", `{"a":`, `"data_base64":"eyJhIjo="`},
		{"no content type, not JSON", "", "hello", `"data_base64":"aGVsbG8="`},
		{"text", "text/plain", "hé \"there\"\n\x01", `"data":"hé \"there\"\n\u0001"`},
		{"text in UTF-8", "text/markdown; charset=UTF-8", "# hi", `"data":"# hi"`},
		{"text in Latin-1", "text/plain; charset=iso-8859-1", "caf\xe9", `"data_base64":"Y2Fm6Q=="`},
		{"text not UTF-8", "text/plain", "\xff", `"data_base64":"/w=="`},
		{"binary", "application/octet-stream", "\x00\x01", `"data_base64":"AAE="`},
		{"XML", "application/xml", "<a/>", `"data_base64":"PGEvPg=="`},
		{"empty", "text/plain", "", `"expirytime":"2025-03-14T15:10:56.535897932Z"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := sample()
			m.Extensions = nil
			m.ContentType, m.Data = tc.ct, []byte(tc.data)
			_, payload, err := codec.Structured{}.Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(string(payload), ","+tc.want+"}") && !strings.HasSuffix(string(payload), ","+tc.want) {
				t.Errorf("payload %s\ndoes not end with %s", payload, tc.want)
			}
			roundTrip(t, codec.Structured{}, m)
			roundTrip(t, codec.Binary{}, m)
		})
	}
}

func TestStructuredRoundTrip(t *testing.T) {
	for name, edit := range map[string]func(m *codec.Message){
		"sample":         func(m *codec.Message) {},
		"no optional":    func(m *codec.Message) { *m = codec.Message{ID: "1", From: "a", To: "b", Type: "T", Priority: 1} },
		"odd strings":    func(m *codec.Message) { m.ID, m.From, m.Type = "\"\\/\u2028 é 😀", "a\"b\\c", "x\u00a0y" },
		"foreign source": func(m *codec.Message) { m.From = "urn:uuid:123" },
		"max TTL":        func(m *codec.Message) { m.TTL = 1<<63 - 1 },
		"many extensions": func(m *codec.Message) {
			m.Extensions = map[string]string{"a": "1", "b": "", "subject": "s", "z9": "é"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := sample()
			edit(m)
			roundTrip(t, codec.Structured{}, m)
		})
	}
}

func TestDecodeStructuredLenient(t *testing.T) {
	tests := []struct {
		name    string
		h       nats.Header
		payload string
		check   func(m *codec.Message) bool
	}{
		{"content type in any case with parameters", nats.Header{"content-TYPE": {"Application/CloudEvents+JSON; charset=utf-8"}},
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "1" && m.From == "a" }},
		{"bare application/cloudevents", nats.Header{"Content-Type": {"application/cloudevents"}},
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "1" }},
		{"ce- headers ignored in structured mode", nats.Header{"Content-Type": {codec.ContentTypeStructured}, "ce-id": {"2"}},
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "1" }},
		{"headerless structured event", nil,
			` {"specversion":"1.0","id":"1","source":"/agents/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "1" }},
		{"integers as numbers or strings", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","priority":"4","count":-12,"flag":true}`,
			func(m *codec.Message) bool {
				return m.Priority == 4 && m.Extensions["count"] == "-12" && m.Extensions["flag"] == "true"
			}},
		{"priority as number", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","priority":1}`,
			func(m *codec.Message) bool { return m.Priority == 1 }},
		{"nulls are absent", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","subject":null,"time":null,"x":null,"data_base64":null,"to":null}`,
			func(m *codec.Message) bool {
				return len(m.Extensions) == 0 && m.Time.IsZero() && m.Data == nil && m.To == ""
			}},
		{"escapes", structuredHeader,
			`{"specversion":"1.0","id":"\u0045uro \u20ac \ud83d\ude00","source":"\/agents\/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "Euro € 😀" && m.From == "a" }},
		{"escaped member name", structuredHeader,
			`{"specversion":"1.0","\u0069d":"1","source":"/agents/a","type":"T"}`,
			func(m *codec.Message) bool { return m.ID == "1" }},
		{"data_base64 without padding", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","data_base64":"aGk"}`,
			func(m *codec.Message) bool { return string(m.Data) == "hi" }},
		{"text data as string", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","datacontenttype":"application/xml","data":"<much wow=\"xml\"/>"}`,
			func(m *codec.Message) bool { return string(m.Data) == `<much wow="xml"/>` }},
		{"data before datacontenttype", structuredHeader,
			`{"data":"hi","specversion":"1.0","id":"1","source":"/agents/a","type":"T","datacontenttype":"text/plain"}`,
			func(m *codec.Message) bool { return string(m.Data) == "hi" }},
		{"JSON string data kept as JSON", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","data":"I'm just a string"}`,
			func(m *codec.Message) bool { return string(m.Data) == `"I'm just a string"` }},
		{"expirytime", structuredHeader,
			`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","time":"2025-01-01T00:00:00Z","expirytime":"2025-01-01T00:00:05Z"}`,
			func(m *codec.Message) bool { return m.TTL == 5*time.Second }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := codec.Decode(tc.h, []byte(tc.payload))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !tc.check(m) {
				t.Errorf("Decode = %+v", m)
			}
		})
	}
}

func TestDecodeStructuredErrors(t *testing.T) {
	const base = `"specversion":"1.0","id":"1","source":"/agents/a","type":"T"`
	tests := []struct {
		name      string
		payload   string
		wantErr   error
		wantField string
	}{
		{"not JSON", `{"specversion":"1.0",`, codec.ErrMalformed, ""},
		{"not JSON at all", `hello`, codec.ErrMalformed, ""},
		{"empty", ``, codec.ErrMalformed, ""},
		{"array", `[{` + base + `}]`, codec.ErrMalformed, ""},
		{"missing specversion", `{"id":"1","source":"/agents/a","type":"T"}`, codec.ErrMalformed, "specversion"},
		{"missing id", `{"specversion":"1.0","source":"/agents/a","type":"T"}`, codec.ErrMalformed, "id"},
		{"missing source", `{"specversion":"1.0","id":"1","type":"T"}`, codec.ErrMalformed, "source"},
		{"missing type", `{"specversion":"1.0","id":"1","source":"/agents/a"}`, codec.ErrMalformed, "type"},
		{"null id", `{"specversion":"1.0","id":null,"source":"/agents/a","type":"T"}`, codec.ErrMalformed, "id"},
		{"specversion 0.3", `{"specversion":"0.3","id":"1","source":"/agents/a","type":"T"}`, codec.ErrMalformed, "specversion"},
		{"specversion number", `{"specversion":1.0,"id":"1","source":"/agents/a","type":"T"}`, codec.ErrMalformed, "specversion"},
		{"id number", `{"specversion":"1.0","id":1,"source":"/agents/a","type":"T"}`, codec.ErrMalformed, "id"},
		{"duplicate member", `{` + base + `,"id":"2"}`, codec.ErrMalformed, "id"},
		{"duplicate extension", `{` + base + `,"x":"1","x":"2"}`, codec.ErrMalformed, "x"},
		{"priority 1.5", `{` + base + `,"priority":1.5}`, codec.ErrMalformed, "priority"},
		{"priority 3.0", `{` + base + `,"priority":3.0}`, codec.ErrMalformed, "priority"},
		{"priority 6", `{` + base + `,"priority":6}`, subjects.ErrInvalidPriority, "priority"},
		{"priority true", `{` + base + `,"priority":true}`, subjects.ErrInvalidPriority, "priority"},
		{"extension float", `{` + base + `,"x":1e3}`, codec.ErrMalformed, "x"},
		{"extension object", `{` + base + `,"x":{}}`, codec.ErrMalformed, "x"},
		{"extension name upper case", `{` + base + `,"X":"1"}`, codec.ErrMalformed, "X"},
		{"extension name with underscore", `{` + base + `,"foo_bar":"1"}`, codec.ErrMalformed, "foo_bar"},
		{"to number", `{` + base + `,"to":5}`, codec.ErrMalformed, "to"},
		{"bad time", `{` + base + `,"time":"2025-13-01T00:00:00Z"}`, codec.ErrMalformed, "time"},
		{"invalid UTF-8", `{` + base + `,"x":"a` + "\xc0\xa0" + `"}`, codec.ErrMalformed, "x"},
		{"lone surrogate", `{` + base + `,"x":"\ud800"}`, codec.ErrMalformed, "x"},
		{"escaped LF", `{` + base + `,"correlationid":"a\nb"}`, codec.ErrMalformed, "correlationid"},
		{"data and data_base64", `{` + base + `,"data":1,"data_base64":"AA=="}`, codec.ErrMalformed, "data_base64"},
		{"bad base64", `{` + base + `,"data_base64":"!!"}`, codec.ErrMalformed, "data_base64"},
		{"data_base64 number", `{` + base + `,"data_base64":1}`, codec.ErrMalformed, "data_base64"},
		{"two data members", `{` + base + `,"data":1,"data":2}`, codec.ErrMalformed, "data"},
		{"bad source token", `{"specversion":"1.0","id":"1","source":"/agents/%zz","type":"T"}`, subjects.ErrInvalidToken, "source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, decode := range []func([]byte) (*codec.Message, error){
				func(b []byte) (*codec.Message, error) { return codec.Decode(structuredHeader, b) },
				codec.UnmarshalJSON,
			} {
				m, err := decode([]byte(tc.payload))
				if err == nil {
					t.Fatalf("decode = %+v, want an error", m)
				}
				if !errors.Is(err, codec.ErrMalformed) || !errors.Is(err, tc.wantErr) {
					t.Fatalf("decode error %v, want ErrMalformed and %v", err, tc.wantErr)
				}
				if tc.wantField != "" {
					var fe *codec.FieldError
					if !errors.As(err, &fe) || fe.Field != tc.wantField {
						t.Errorf("decode error %v, want a FieldError on %q", err, tc.wantField)
					}
				}
			}
		})
	}
}

// A headerless payload is structured only when it is a JSON object with a
// specversion member; anything else is not a CloudEvent.
func TestDecodeHeaderless(t *testing.T) {
	for _, payload := range []string{``, `hello`, `{"a":1}`, `{"data":{"specversion":"1.0"}}`, `[{"specversion":"1.0"}]`, `{"specversion":`, `{"X":1,"data":{"specversion":"1.0"}}`} {
		if _, err := codec.Decode(nil, []byte(payload)); !errors.Is(err, codec.ErrNotCloudEvent) {
			t.Errorf("Decode(nil, %q) = %v, want ErrNotCloudEvent", payload, err)
		}
	}
	_, err := codec.Decode(nil, []byte(`{"specversion":"0.3","id":"1","source":"/agents/a","type":"T"}`))
	var fe *codec.FieldError
	if !errors.As(err, &fe) || fe.Field != "specversion" {
		t.Errorf("Decode of a 0.3 event = %v, want a FieldError on specversion", err)
	}
}

// TestStructuredJSONDataNotUTF8GoesAsBase64: JSON data holding bytes that
// are not UTF-8 inside a string is sent as data_base64, so the event stays
// valid JSON text (RFC 8259 8.1). Before, json.Valid, which does not check
// UTF-8, let it be embedded raw in "data", and the event was not UTF-8.
func TestStructuredJSONDataNotUTF8GoesAsBase64(t *testing.T) {
	for _, data := range []string{"\"caf\xe9\"", "{\"a\":\"\xff\"}", "[\"\xed\xa0\x80\"]"} { // Latin-1 é, FF, a surrogate
		m := sample()
		m.ContentType, m.Data = "application/json", []byte(data)
		b, err := codec.MarshalJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(b) || !strings.Contains(string(b), `"data_base64":`) {
			t.Errorf("data %q written as %q, want data_base64 in valid UTF-8", data, b)
		}
		roundTrip(t, codec.Structured{}, m)
	}
}
