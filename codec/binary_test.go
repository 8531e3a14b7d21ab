package codec_test

import (
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func TestBinaryEncodeHeaders(t *testing.T) {
	m := sample()
	h, data, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce-specversion":     "1.0",
		"ce-id":              m.ID,
		"ce-source":          "/agents/planner",
		"ce-type":            "TASK_ASSIGNMENT",
		"ce-time":            "2025-03-14T15:09:26.535897932Z",
		"ce-datacontenttype": "application/json",
		"ce-dataschema":      "https://agentbus.dev/schemas/task.json",
		"ce-correlationid":   "task-001",
		"ce-causationid":     "msg-122",
		"ce-priority":        "2",
		"ce-to":              "coder-1",
		"ce-expirytime":      "2025-03-14T15:10:56.535897932Z",
		"ce-traceparent":     m.Extensions["traceparent"],
	}
	if len(h) != len(want) {
		t.Errorf("got %d headers, want %d: %q", len(h), len(want), h)
	}
	for k, v := range want {
		if got := h[k]; len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want [%q]", k, got, v)
		}
	}
	if string(data) != string(m.Data) {
		t.Errorf("payload = %q, want Data %q", data, m.Data)
	}

	// Optional attributes are left out.
	min := &codec.Message{ID: "1", From: "a", To: "*", Type: "T"}
	min.Priority = 3
	h, _, err = codec.Binary{}.Encode(min)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 6 {
		t.Errorf("minimal message has headers %q, want specversion id source type priority to", h)
	}
}

func TestBinarySourceFollowsSender(t *testing.T) {
	// The encoder keeps the last sender's source; each message still gets
	// its own sender's, from any goroutine.
	froms := []string{"alpha", "beta", "alpha", "beta-2", "beta"}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				for _, from := range froms {
					m := codec.Message{ID: "1", From: from, To: "x", Type: "t", Priority: 3}
					h, _, err := codec.Binary{}.Encode(&m)
					if err != nil {
						t.Error(err)
						return
					}
					if d, err := codec.Decode(h, nil); err != nil || d.From != from {
						t.Errorf("a message from %q came back from %v (ce-source %q, err %v)", from, d, h.Get("ce-source"), err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// The example of the CloudEvents HTTP binding, section 3.1.3.2.
func TestPercentEncoding(t *testing.T) {
	m := sample()
	m.ID = "Euro € 😀"
	m.From = "agent €"
	m.Extensions = map[string]string{"note": `100% "quoted"`}
	m.Extensions["subject"] = "~!#$&'()*+,/:;<=>?@[\\]^`{|}"
	h, _, err := codec.Binary{}.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"ce-id":      "Euro%20%E2%82%AC%20%F0%9F%98%80",
		"ce-source":  "/agents/agent%2520%25E2%2582%25AC", // the token's '%' is encoded too
		"ce-note":    "100%25%20%22quoted%22",
		"ce-subject": "~!#$&'()*+,/:;<=>?@[\\]^`{|}", // printable ASCII stays
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	roundTrip(t, codec.Binary{}, m)
}

func TestBinaryRoundTrip(t *testing.T) {
	for name, edit := range map[string]func(m *codec.Message){
		"sample":         func(m *codec.Message) {},
		"no optional":    func(m *codec.Message) { *m = codec.Message{ID: "1", From: "a", To: "b", Type: "T", Priority: 1} },
		"broadcast":      func(m *codec.Message) { m.To = subjects.Broadcast },
		"no data":        func(m *codec.Message) { m.Data = nil },
		"binary data":    func(m *codec.Message) { m.ContentType, m.Data = "application/octet-stream", []byte{0, 0xff, '\n'} },
		"odd IDs":        func(m *codec.Message) { m.From, m.To, m.Type = "/agents/x", "a.b c*", "*" },
		"foreign source": func(m *codec.Message) { m.From = "https://example.com/orders" },
		"zero time":      func(m *codec.Message) { m.Time, m.TTL = time.Time{}, 0 },
		"time in a zone": func(m *codec.Message) { m.Time = m.Time.In(time.FixedZone("X", -7*3600)) },
		"nanosecond TTL": func(m *codec.Message) { m.TTL = time.Nanosecond },
		"max TTL":        func(m *codec.Message) { m.TTL = 1<<63 - 1 },
		"many extensions": func(m *codec.Message) {
			m.Extensions = map[string]string{"a": "1", "b": "", "subject": "s", "z9": "é"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := sample()
			edit(m)
			roundTrip(t, codec.Binary{}, m)
		})
	}
}

func TestDecodeBinaryErrors(t *testing.T) {
	tests := []struct {
		name      string
		h         nats.Header
		wantErr   error
		wantField string // checked with errors.As when not ""
	}{
		{"no headers", nil, codec.ErrNotCloudEvent, ""},
		{"raw publish with headers", nats.Header{"Nats-Msg-Id": {"1"}, "Content-Type": {"text/plain"}}, codec.ErrNotCloudEvent, ""},
		{"missing specversion", binaryHeader("ce-specversion", ""), codec.ErrNotCloudEvent, ""},
		{"missing id", binaryHeader("ce-id", ""), codec.ErrMalformed, "id"},
		{"missing source", binaryHeader("ce-source", ""), codec.ErrMalformed, "source"},
		{"missing type", binaryHeader("ce-type", ""), codec.ErrMalformed, "type"},
		{"specversion 0.3", binaryHeader("ce-specversion", "0.3"), codec.ErrMalformed, "specversion"},
		{"specversion 2.0", binaryHeader("ce-specversion", "2.0"), codec.ErrMalformed, "specversion"},
		{"empty id", binaryHeader("ce-id", `""`), codec.ErrMalformed, "id"},
		{"priority 0", binaryHeader("ce-priority", "0"), subjects.ErrInvalidPriority, "priority"},
		{"priority 6", binaryHeader("ce-priority", "6"), subjects.ErrInvalidPriority, "priority"},
		{"priority x", binaryHeader("ce-priority", "x"), subjects.ErrInvalidPriority, "priority"},
		{"priority 1.5", binaryHeader("ce-priority", "1.5"), subjects.ErrInvalidPriority, "priority"},
		{"priority -1", binaryHeader("ce-priority", "-1"), subjects.ErrInvalidPriority, "priority"},
		{"bad time", binaryHeader("ce-time", "yesterday"), codec.ErrMalformed, "time"},
		{"time without zone", binaryHeader("ce-time", "2025-03-14T15:09:26"), codec.ErrMalformed, "time"},
		{"bad expirytime", binaryHeader("ce-time", "2025-03-14T15:09:26Z", "ce-expirytime", "soon"), codec.ErrMalformed, "expirytime"},
		{"expirytime without time", binaryHeader("ce-expirytime", "2025-03-14T15:09:26Z"), codec.ErrMalformed, "expirytime"},
		{"expirytime before time", binaryHeader("ce-time", "2025-03-14T15:09:26Z", "ce-expirytime", "2025-03-14T15:09:25Z"), codec.ErrMalformed, "expirytime"},
		{"expirytime equal to time", binaryHeader("ce-time", "2025-03-14T15:09:26Z", "ce-expirytime", "2025-03-14T15:09:26Z"), codec.ErrMalformed, "expirytime"},
		{"expiry beyond a Duration", binaryHeader("ce-time", "0001-01-02T00:00:00Z", "ce-expirytime", "9999-01-01T00:00:00Z"), codec.ErrMalformed, "expirytime"},
		{"time past year 9999 in UTC", binaryHeader("ce-time", "9999-12-31T23:00:00-05:00"), codec.ErrMalformed, "time"},
		{"overlong UTF-8", binaryHeader("ce-id", "a%C0%A0"), codec.ErrMalformed, "id"},
		{"byte FF", binaryHeader("ce-id", "%FF"), codec.ErrMalformed, "id"},
		{"raw invalid UTF-8", binaryHeader("ce-type", "a\xffb"), codec.ErrMalformed, "type"},
		{"truncated escape", binaryHeader("ce-id", "a%4"), codec.ErrMalformed, "id"},
		{"bad hex", binaryHeader("ce-id", "a%G1"), codec.ErrMalformed, "id"},
		{"LF", binaryHeader("ce-id", "a%0Ab"), codec.ErrMalformed, "id"},
		{"CR in correlationid", binaryHeader("ce-correlationid", "a%0D"), codec.ErrMalformed, "correlationid"},
		{"raw CR in extension", binaryHeader("ce-note", "a\rb"), codec.ErrMalformed, "note"},
		{"bad quoted string", binaryHeader("ce-id", `"a"b"`), codec.ErrMalformed, "id"},
		{"quoted string ends in backslash", binaryHeader("ce-id", `"a\"`), codec.ErrMalformed, "id"},
		{"extension name with underscore", binaryHeader("ce-foo_bar", "x"), codec.ErrMalformed, "foo_bar"},
		{"extension name with dash", binaryHeader("ce-trace-parent", "x"), codec.ErrMalformed, "trace-parent"},
		{"empty extension name", binaryHeader("ce-", "x"), codec.ErrMalformed, ""},
		{"data header", binaryHeader("ce-data", "x"), codec.ErrMalformed, "data"},
		{"same attribute twice", binaryHeader("CE-ID", "m-2"), codec.ErrMalformed, "id"},
		{"two values", func() nats.Header { h := binaryHeader(); h.Add("ce-type", "PONG"); return h }(), codec.ErrMalformed, "type"},
		{"source prefix with bad token", binaryHeader("ce-source", "/agents/a.b"), subjects.ErrInvalidToken, "source"},
		{"source prefix with empty token", binaryHeader("ce-source", "/agents/"), subjects.ErrInvalidToken, "source"},
		{"foreign source too long", binaryHeader("ce-source", "https://example.com/"+strings.Repeat("x/", 60)), subjects.ErrInvalidAgentID, "source"},
		{"to empty", binaryHeader("ce-to", `""`), subjects.ErrInvalidAgentID, "to"},
		{"to with control", binaryHeader("ce-to", "a%07"), subjects.ErrInvalidAgentID, "to"},
		{"bad datacontenttype", binaryHeader("ce-datacontenttype", "json"), codec.ErrMalformed, "datacontenttype"},
		{"bad content-type fallback", binaryHeader("content-type", "a b"), codec.ErrMalformed, "datacontenttype"},
		{"relative dataschema", binaryHeader("ce-dataschema", "schema.json"), codec.ErrMalformed, "dataschema"},
		{"reserved extension via header case", binaryHeader("Ce-Priority", "2", "ce-priority", "2"), codec.ErrMalformed, "priority"},
		{"blank subject", binaryHeader("ce-subject", "%20"), codec.ErrMalformed, "subject"},
		{"batch content type", nats.Header{"Content-Type": {"application/cloudevents-batch+json"}}, codec.ErrMalformed, "content-type"},
		{"xml event format", nats.Header{"content-type": {"application/cloudevents+xml"}}, codec.ErrMalformed, "content-type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, c := range []codec.Codec{codec.Binary{}, codec.Structured{}} {
				m, err := c.Decode(tc.h, []byte("payload"))
				if err == nil {
					t.Fatalf("%T.Decode = %+v, want an error", c, m)
				}
				if !errors.Is(err, codec.ErrMalformed) || !errors.Is(err, tc.wantErr) {
					t.Fatalf("%T.Decode error %v, want ErrMalformed and %v", c, err, tc.wantErr)
				}
				if errors.Is(err, codec.ErrInvalidMessage) {
					t.Errorf("%T.Decode error %v is ErrInvalidMessage too", c, err)
				}
				if tc.wantField != "" {
					var fe *codec.FieldError
					if !errors.As(err, &fe) || fe.Field != tc.wantField {
						t.Errorf("%T.Decode error %v, want a FieldError on %q", c, err, tc.wantField)
					}
				}
			}
		})
	}
}

func TestDecodeBinaryLenient(t *testing.T) {
	tests := []struct {
		name  string
		h     nats.Header
		check func(m *codec.Message) bool
	}{
		{"upper-case header names", nats.Header{"CE-SPECVERSION": {"1.0"}, "CE-ID": {"m-1"}, "Ce-Source": {"/agents/planner"}, "Ce-Type": {"PING"}},
			func(m *codec.Message) bool { return m.ID == "m-1" && m.From == "planner" && m.Type == "PING" }},
		{"upper-case extension name", binaryHeader("Ce-TraceParent", "x"),
			func(m *codec.Message) bool { return m.Extensions["traceparent"] == "x" }},
		{"raw UTF-8", binaryHeader("ce-id", "Euro € 😀", "ce-to", "agent €"),
			func(m *codec.Message) bool { return m.ID == "Euro € 😀" && m.To == "agent €" }},
		{"quoted value", binaryHeader("ce-id", `"a \"quoted\" \\ id"`),
			func(m *codec.Message) bool { return m.ID == `a "quoted" \ id` }},
		{"quoted and encoded", binaryHeader("ce-id", `"Euro%20%E2%82%AC"`),
			func(m *codec.Message) bool { return m.ID == "Euro €" }},
		{"lower-case hex", binaryHeader("ce-id", "Euro%20%e2%82%ac%20%f0%9f%98%80"),
			func(m *codec.Message) bool { return m.ID == "Euro € 😀" }},
		{"needlessly encoded", binaryHeader("ce-type", "%50%49%4E%47"),
			func(m *codec.Message) bool { return m.Type == "PING" }},
		{"sdk-go content-type", binaryHeader("content-type", "application/json"),
			func(m *codec.Message) bool { return m.ContentType == "application/json" }},
		{"ce-datacontenttype wins", binaryHeader("Content-Type", "text/plain", "ce-datacontenttype", "application/json"),
			func(m *codec.Message) bool { return m.ContentType == "application/json" }},
		{"no priority", binaryHeader(),
			func(m *codec.Message) bool { return m.Priority == subjects.DefaultPriority }},
		{"priority with leading zero", binaryHeader("ce-priority", "05"),
			func(m *codec.Message) bool { return m.Priority == 5 }},
		{"no to", binaryHeader(),
			func(m *codec.Message) bool { return m.To == "" }},
		{"broadcast", binaryHeader("ce-to", "*"),
			func(m *codec.Message) bool { return m.Broadcast() }},
		{"foreign source", binaryHeader("ce-source", "https://example.com/orders"),
			func(m *codec.Message) bool { return m.From == "https://example.com/orders" }},
		{"encoded agent source", binaryHeader("ce-source", "/agents/agent%2520%25E2%2582%25AC"),
			func(m *codec.Message) bool { return m.From == "agent €" }},
		{"time with offset", binaryHeader("ce-time", "2025-03-14T16:09:26.5+01:00"),
			func(m *codec.Message) bool {
				return m.Time.Equal(time.Date(2025, 3, 14, 15, 9, 26, 5e8, time.UTC)) && m.Time.Location() == time.UTC
			}},
		{"expirytime", binaryHeader("ce-time", "2025-03-14T15:09:26Z", "ce-expirytime", "2025-03-14T15:10:26.000000001Z"),
			func(m *codec.Message) bool { return m.TTL == time.Minute+1 }},
		{"other headers ignored", binaryHeader("Nats-Msg-Id", "x", "Nats-TTL", "5s", "X-Trace", "y"),
			func(m *codec.Message) bool { return len(m.Extensions) == 0 }},
		{"empty value list ignored", func() nats.Header { h := binaryHeader(); h["ce-x"] = []string{}; return h }(),
			func(m *codec.Message) bool { return len(m.Extensions) == 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := codec.Decode(tc.h, []byte("data"))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !tc.check(m) {
				t.Errorf("Decode = %+v", m)
			}
			if string(m.Data) != "data" {
				t.Errorf("Data = %q, want the payload", m.Data)
			}
		})
	}
}

// TestTraceHeaders: the plain trace headers are found in any case, the
// lower-case spelling wins over another, and a structured or undecodable
// message has them too.
func TestTraceHeaders(t *testing.T) {
	event := nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"x"}, "ce-type": {"T"}}
	with := func(h nats.Header, kv ...string) nats.Header {
		out := maps.Clone(h)
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = []string{kv[i+1]}
		}
		return out
	}
	for _, c := range []struct {
		name        string
		h           nats.Header
		data        []byte
		parent      string
		state       string
		wantDecoded bool
	}{
		{"none", event, nil, "", "", true},
		{"lower case", with(event, "traceparent", "p", "tracestate", "s"), nil, "p", "s", true},
		{"another case", with(event, "TraceParent", "p", "TRACESTATE", "s"), nil, "p", "s", true},
		{"lower case wins", with(event, "Traceparent", "other", "traceparent", "p"), nil, "p", "", true},
		{"the extension is not a plain header", with(event, "ce-traceparent", "ext"), nil, "", "", true},
		{"structured", nats.Header{"content-type": {"application/cloudevents+json"}, "Traceparent": {"p"}},
			[]byte(`{"specversion":"1.0","id":"1","source":"x","type":"T"}`), "p", "", true},
		{"undecodable", with(event, "ce-id", "", "traceparent", "p"), nil, "p", "", false},
	} {
		m, th, err := codec.DecodeWithTraceHeaders(c.h, c.data)
		if (err == nil) != c.wantDecoded {
			t.Errorf("%s: error %v, want decoded %v", c.name, err, c.wantDecoded)
		}
		if err == nil && m == nil {
			t.Errorf("%s: no message and no error", c.name)
		}
		if th.TraceParent != c.parent || th.TraceState != c.state {
			t.Errorf("%s: found %q, %q; want %q, %q", c.name, th.TraceParent, th.TraceState, c.parent, c.state)
		}
		if want := codec.ReadTraceHeaders(c.h); th != want {
			t.Errorf("%s: DecodeWithTraceHeaders %+v, ReadTraceHeaders %+v", c.name, th, want)
		}
	}
}

// TestTimeLowerCaseTAndZ: time and expirytime with a lower-case "t" or "z",
// which RFC 3339 section 5.6 allows, are read as the same instant in both
// content modes. Before, time.Parse refused them as not RFC 3339.
func TestTimeLowerCaseTAndZ(t *testing.T) {
	want := time.Date(2025, 3, 14, 15, 9, 26, 5e8, time.UTC)
	for _, v := range []string{"2025-03-14t15:09:26.5z", "2025-03-14t15:09:26.5Z", "2025-03-14T15:09:26.5z", "2025-03-14t16:09:26.5+01:00"} {
		m, err := codec.Decode(binaryHeader("ce-time", v, "ce-expirytime", strings.Replace(v, ":09:", ":10:", 1)), nil)
		if err != nil {
			t.Errorf("binary ce-time %q: %v", v, err)
			continue
		}
		if !m.Time.Equal(want) || m.Time.Location() != time.UTC || m.TTL != time.Minute {
			t.Errorf("binary ce-time %q: Time %v TTL %v, want %v and 1m", v, m.Time, m.TTL, want)
		}
		m, err = codec.UnmarshalJSON([]byte(`{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","time":"` + v + `"}`))
		if err != nil || !m.Time.Equal(want) {
			t.Errorf("structured time %q: %v, %v; want %v", v, m, err, want)
		}
	}
}

// TestTimeCommaFractionRefused: a time with ',' before the fractional
// seconds, which RFC 3339 does not allow (time-secfrac is "." 1*DIGIT), is
// malformed like any other time that is not RFC 3339, as are the other
// spellings time.Parse lets through. Before, time.Parse accepted them.
func TestTimeCommaFractionRefused(t *testing.T) {
	for _, v := range []string{
		"2025-03-14T15:09:26,5Z",      // comma fraction
		"2025-03-14T15:09:26,5+01:00", // comma fraction and offset
		"2025-03-14T5:09:26Z",         // one-digit hour
		"2025-03-14T15:09:26+24:00",   // offset hour out of range
		"2025-03-14T15:09:26.Z",       // fraction without digits
		"2025-03-14 15:09:26Z",        // space for T
	} {
		for _, attr := range []string{"time", "expirytime"} {
			h := binaryHeader("ce-time", "2025-03-13T00:00:00Z", "ce-"+attr, v)
			_, err := codec.Decode(h, nil)
			var fe *codec.FieldError
			if !errors.Is(err, codec.ErrMalformed) || !errors.As(err, &fe) || fe.Field != attr {
				t.Errorf("binary ce-%s %q: err = %v, want a malformed %s", attr, v, err, attr)
			}
			event := `{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","time":"` + v + `"}`
			if attr == "expirytime" {
				event = `{"specversion":"1.0","id":"1","source":"/agents/a","type":"T","time":"2025-03-13T00:00:00Z","expirytime":"` + v + `"}`
			}
			_, err = codec.UnmarshalJSON([]byte(event))
			if !errors.Is(err, codec.ErrMalformed) || !errors.As(err, &fe) || fe.Field != attr {
				t.Errorf("structured %s %q: err = %v, want a malformed %s", attr, v, err, attr)
			}
		}
	}
}
