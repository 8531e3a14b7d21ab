package codec_test

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// formatHeader writes h as "name:value" lines, the form FuzzDecodeBinary
// takes headers in.
func formatHeader(h nats.Header) string {
	var lines []string
	for k, vs := range h {
		for _, v := range vs {
			lines = append(lines, k+":"+v)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// parseHeader reverses formatHeader for any input: each line is a name up
// to the first ':' and a value after it.
func parseHeader(s string) nats.Header {
	h := nats.Header{}
	for _, line := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(line, ":")
		h.Add(k, v)
	}
	return h
}

// checkDecoded asserts what every successful decode must give: a message
// that, with a recipient, passes Validate and survives both codecs.
func checkDecoded(t *testing.T, m *codec.Message) {
	t.Helper()
	m2 := *m
	if m2.To == "" { // no to extension: Encode needs one
		m2.To = subjects.Broadcast
	}
	if err := m2.Validate(); err != nil {
		t.Fatalf("decoded message does not validate: %v\n%+v", err, m)
	}
	roundTrip(t, codec.Binary{}, &m2)
	roundTrip(t, codec.Structured{}, &m2)
}

func seedMessages() []*codec.Message {
	a := sample()
	b := sample()
	b.ID, b.From, b.To, b.Type = "Euro € 😀", "agent €", "*", "a.b"
	b.ContentType, b.Data = "text/plain", []byte("hi\n")
	b.Extensions = map[string]string{"subject": "x", "n": `"q" 100%`}
	c := &codec.Message{ID: "1", From: "a", To: "b", Type: "T", Priority: 5}
	d := sample()
	d.ContentType, d.Data, d.TTL = "application/octet-stream", []byte{0, 1, 2}, 0
	return []*codec.Message{a, b, c, d}
}

func FuzzDecodeBinary(f *testing.F) {
	for _, m := range seedMessages() {
		h, data, err := codec.Binary{}.Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(formatHeader(h), data)
		h, data, err = codec.Structured{}.Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(formatHeader(h), data)
	}
	f.Add("CE-SPECVERSION:1.0\nCe-Id:\"a \\\"b\\\"\"\nce-source:/agents/a%2520b\nce-type:%50ING\ncontent-type:text/plain", []byte("x"))
	f.Add("ce-specversion:1.0\nce-id:%C0%A0\nce-source:x\nce-type:T", []byte(nil))
	f.Add("ce-specversion:1.0\nce-id:1\nce-source:x\nce-type:T\nce-time:2025-01-01T00:00:00Z\nce-expirytime:2025-01-01T00:00:01.5+01:00", []byte(nil))
	f.Add("Nats-Msg-Id:1", []byte(`{"specversion":"1.0","id":"1","source":"s","type":"T"}`))
	f.Add("ce-specversion:1.0\nce-id:1\nce-source:x\nce-type:T\nTraceparent:a\nTRACEPARENT:b\ntracestate:c", []byte(nil))
	f.Add("content-type:application/cloudevents+json\nTraceParent:a", []byte(`{"specversion":"1.0","id":"1","source":"s","type":"T"}`))
	f.Fuzz(func(t *testing.T, hdr string, data []byte) {
		h := parseHeader(hdr)
		m, err := codec.Binary{}.Decode(h, data)
		// DecodeWithTraceHeaders decodes alike and finds what
		// ReadTraceHeaders finds.
		m2, th, err2 := codec.DecodeWithTraceHeaders(h, data)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("Decode error %v, DecodeWithTraceHeaders error %v", err, err2)
		}
		if want := codec.ReadTraceHeaders(h); th != want {
			t.Fatalf("DecodeWithTraceHeaders found %+v, ReadTraceHeaders %+v", th, want)
		}
		// DecodeWithTraceHeadersInto decodes alike into a message that
		// held another: nothing of it is left.
		m3 := codec.Message{ID: "left", Extensions: map[string]string{"left": "over"}, TTL: time.Hour}
		th3, err3 := codec.DecodeWithTraceHeadersInto(&m3, h, data)
		if (err == nil) != (err3 == nil) || th3 != th {
			t.Fatalf("DecodeWithTraceHeadersInto: error %v, trace headers %+v; want error %v, %+v", err3, th3, err, th)
		}
		if err != nil {
			return
		}
		if d := diff(m, m2); d != "" {
			t.Fatalf("Decode and DecodeWithTraceHeaders differ: %s", d)
		}
		if d := diff(m, &m3); d != "" {
			t.Fatalf("Decode and DecodeWithTraceHeadersInto differ: %s", d)
		}
		checkDecoded(t, m)
	})
}

func FuzzDecodeStructured(f *testing.F) {
	for _, m := range seedMessages() {
		b, err := codec.MarshalJSON(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"specversion":"1.0","id":"\u0031","source":"/agents/a","type":"T","priority":"4","x":-1,"y":true,"data":null}`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"T","datacontenttype":"text/xml","data":"<a/>"}`))
	f.Add([]byte(`{"specversion":"1.0","id":"1","source":"s","type":"T","data_base64":"aGk"}`))
	f.Add([]byte(`{"specversion":"1.0","id":"\ud800","source":"s","type":"T"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := codec.UnmarshalJSON(data)
		m2, err2 := codec.Structured{}.Decode(structuredHeader, data)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("UnmarshalJSON error %v, Decode error %v", err, err2)
		}
		if err != nil {
			return
		}
		if d := diff(m, m2); d != "" {
			t.Fatalf("UnmarshalJSON and Decode differ: %s", d)
		}
		checkDecoded(t, m)
	})
}

func FuzzRoundTrip(f *testing.F) {
	for _, m := range seedMessages() {
		var name, value string
		for k, v := range m.Extensions {
			name, value = k, v
		}
		f.Add(m.ID, m.From, m.To, m.Type, m.Priority, m.CorrelationID, m.CausationID, m.ContentType, m.DataSchema,
			name, value, int64(m.TTL), int64(m.Time.Sub(fixedNow)), m.Data)
	}
	f.Add("", "a", "*", "T", 0, "", "", "", "", "", "", int64(0), int64(0), []byte(nil))
	f.Fuzz(func(t *testing.T, id, from, to, typ string, priority int, corr, reply, ct, schema, extName, extValue string,
		ttl, offset int64, data []byte) {
		m := &codec.Message{
			ID: id, From: from, To: to, Type: typ, Priority: priority, CorrelationID: corr, CausationID: reply,
			Time: fixedNow.Add(time.Duration(offset)), TTL: time.Duration(ttl), ContentType: ct, DataSchema: schema, Data: data,
		}
		if extName != "" {
			m.Extensions = map[string]string{extName: extValue}
		}
		m.SetDefaults(fixedNow)
		if m.Validate() != nil {
			return
		}
		roundTrip(t, codec.Binary{}, m)
		roundTrip(t, codec.Structured{}, m)

		_, payload, _ := codec.Structured{}.Encode(m)
		if b, err := codec.MarshalJSON(m); err != nil || string(b) != string(payload) {
			t.Fatalf("MarshalJSON = %s, %v; want the Structured payload %s", b, err, payload)
		}

		e, err := codec.ToEvent(m)
		if err != nil {
			t.Fatalf("ToEvent: %v", err)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("event.Validate: %v", err)
		}
		back, err := codec.FromEvent(e)
		if err != nil {
			t.Fatalf("FromEvent(ToEvent(m)): %v", err)
		}
		if d := diff(m, back); d != "" {
			t.Fatalf("FromEvent(ToEvent(m)) != m: %s", d)
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("json.Marshal(ToEvent(m)): %v", err)
		}
		fromSDK, err := codec.UnmarshalJSON(b)
		if err != nil {
			t.Fatalf("UnmarshalJSON(json.Marshal(ToEvent(m))): %v\n%s", err, b)
		}
		if d := diff(m, fromSDK); d != "" {
			t.Fatalf("UnmarshalJSON(json.Marshal(ToEvent(m))) != m: %s\n%s", d, b)
		}
	})
}
