package codec_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/codec"
)

// fixedNow is the clock of every test that calls SetDefaults.
var fixedNow = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

// sample returns a message with every field set, defaults applied.
func sample() *codec.Message {
	m := &codec.Message{
		ID:            "0b5c5a6e-8f0e-4c1a-9d8e-3f2b1a0c9d8e",
		From:          "planner",
		To:            "coder-1",
		Type:          "TASK_ASSIGNMENT",
		Priority:      2,
		CorrelationID: "task-001",
		CausationID:   "msg-122",
		TTL:           90 * time.Second,
		ContentType:   "application/json",
		DataSchema:    "https://agentbus.dev/schemas/task.json",
		Data:          []byte(`{"taskId":"TASK-001","title":"Add OAuth2"}`),
		Extensions:    map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	m.SetDefaults(fixedNow)
	return m
}

// diff describes how two messages differ, or returns "" when they are the
// same: times compared with Equal, nil and empty Data or Extensions alike.
func diff(want, got *codec.Message) string {
	if want == nil || got == nil {
		if want == got {
			return ""
		}
		return fmt.Sprintf("want %v, got %v", want, got)
	}
	var d []string
	str := func(field, w, g string) {
		if w != g {
			d = append(d, fmt.Sprintf("%s: want %q, got %q", field, w, g))
		}
	}
	str("ID", want.ID, got.ID)
	str("From", want.From, got.From)
	str("To", want.To, got.To)
	str("Type", want.Type, got.Type)
	str("CorrelationID", want.CorrelationID, got.CorrelationID)
	str("CausationID", want.CausationID, got.CausationID)
	str("ContentType", want.ContentType, got.ContentType)
	str("DataSchema", want.DataSchema, got.DataSchema)
	if want.Priority != got.Priority {
		d = append(d, fmt.Sprintf("Priority: want %d, got %d", want.Priority, got.Priority))
	}
	if !want.Time.Equal(got.Time) {
		d = append(d, fmt.Sprintf("Time: want %v, got %v", want.Time, got.Time))
	}
	if want.TTL != got.TTL {
		d = append(d, fmt.Sprintf("TTL: want %v, got %v", want.TTL, got.TTL))
	}
	if !bytes.Equal(want.Data, got.Data) {
		d = append(d, fmt.Sprintf("Data: want %q, got %q", want.Data, got.Data))
	}
	if len(want.Extensions) != len(got.Extensions) {
		d = append(d, fmt.Sprintf("Extensions: want %q, got %q", want.Extensions, got.Extensions))
	} else {
		for k, w := range want.Extensions {
			if g, ok := got.Extensions[k]; !ok || g != w {
				d = append(d, fmt.Sprintf("Extensions[%q]: want %q, got %q (present %v)", k, w, g, ok))
			}
		}
	}
	return strings.Join(d, "; ")
}

// roundTrip encodes m with c, decodes it and fails t unless the result is m.
func roundTrip(t testing.TB, c codec.Codec, m *codec.Message) {
	t.Helper()
	h, data, err := c.Encode(m)
	if err != nil {
		t.Fatalf("%T.Encode: %v", c, err)
	}
	got, err := codec.Decode(h, data)
	if err != nil {
		t.Fatalf("%T: Decode(Encode(m)): %v\nheaders %q\npayload %q", c, err, h, data)
	}
	if d := diff(m, got); d != "" {
		t.Fatalf("%T: Decode(Encode(m)) != m: %s\nheaders %q\npayload %q", c, d, h, data)
	}
}

// binaryHeader returns a binary-mode header with the four required
// attributes, then sets each pair of kv (an empty value deletes the key).
func binaryHeader(kv ...string) nats.Header {
	h := nats.Header{
		"ce-specversion": {"1.0"},
		"ce-id":          {"m-1"},
		"ce-source":      {"/agents/planner"},
		"ce-type":        {"PING"},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(h, kv[i])
			continue
		}
		h[kv[i]] = []string{kv[i+1]}
	}
	return h
}
