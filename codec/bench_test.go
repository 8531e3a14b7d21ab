package codec_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/agentbus/agentbus/codec"
)

// benchMessage is a typical message with 1 KiB of JSON data.
func benchMessage() *codec.Message {
	m := sample()
	m.DataSchema, m.CausationID, m.Extensions = "", "", nil
	m.Data = []byte(`{"payload":"` + strings.Repeat("x", 1024-14) + `"}`)
	return m
}

func BenchmarkBinaryEncode(b *testing.B) {
	m := benchMessage()
	b.ReportAllocs()
	b.SetBytes(int64(len(m.Data)))
	for b.Loop() {
		if _, _, err := (codec.Binary{}).Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBinaryDecode(b *testing.B) {
	h, data, err := codec.Binary{}.Encode(benchMessage())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := codec.Decode(h, data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStructuredEncode(b *testing.B) {
	m := benchMessage()
	b.ReportAllocs()
	b.SetBytes(int64(len(m.Data)))
	for b.Loop() {
		if _, _, err := (codec.Structured{}).Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStructuredDecode(b *testing.B) {
	h, data, err := codec.Structured{}.Encode(benchMessage())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(benchMessage().Data)))
	for b.Loop() {
		if _, err := codec.Decode(h, data); err != nil {
			b.Fatal(err)
		}
	}
}

// The sdk-go JSON event format on the same message, for comparison.
func BenchmarkSDKJSONMarshal(b *testing.B) {
	e, err := codec.ToEvent(benchMessage())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(e.Data())))
	for b.Loop() {
		if _, err := json.Marshal(e); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSDKJSONUnmarshal(b *testing.B) {
	data, err := codec.MarshalJSON(benchMessage())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(benchMessage().Data)))
	for b.Loop() {
		var e event.Event
		if err := json.Unmarshal(data, &e); err != nil {
			b.Fatal(err)
		}
	}
}
