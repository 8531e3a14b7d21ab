package asyncpub

import (
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// parseAck reads a publish's ack. The server writes a successful one in a
// fixed shape, {"stream":"S","seq":N} with "domain" before "seq" in a
// domain and ,"duplicate": true after it for a duplicate, which is read
// here without encoding/json (it cost nats.go's handler 0.8 µs and eight
// allocations per ack); anything else (an API error, a counter's value, a
// batch) goes through encoding/json, giving what nats.go gives.
func parseAck(data []byte) (*jetstream.PubAck, error) {
	if ack, ok := parseCommonAck(data); ok {
		return ack, nil
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, jetstream.ErrInvalidJSAck
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if resp.PubAck == nil || resp.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return resp.PubAck, nil
}

// parseCommonAck reads an ack of the fixed shape parseAck describes, and
// reports whether data had it. Names with other than printable ASCII or an
// escape are left to encoding/json.
func parseCommonAck(data []byte) (*jetstream.PubAck, bool) {
	r := ackReader{data: data}
	ack := &jetstream.PubAck{}
	var ok bool
	if !r.literal(`{"stream":`) {
		return nil, false
	}
	if ack.Stream, ok = r.plainString(); !ok || ack.Stream == "" {
		return nil, false
	}
	if r.literal(`,"domain":`) {
		if ack.Domain, ok = r.plainString(); !ok {
			return nil, false
		}
	}
	if !r.literal(`,"seq":`) {
		return nil, false
	}
	if ack.Sequence, ok = r.uint(); !ok {
		return nil, false
	}
	if r.literal(`,"duplicate": true`) || r.literal(`,"duplicate":true`) {
		ack.Duplicate = true
	}
	if !r.literal(`}`) || r.i != len(data) {
		return nil, false
	}
	return ack, true
}

// ackReader reads an ack from the front.
type ackReader struct {
	data []byte
	i    int
}

// literal consumes s if the data goes on with it.
func (r *ackReader) literal(s string) bool {
	if len(r.data)-r.i < len(s) || string(r.data[r.i:r.i+len(s)]) != s {
		return false
	}
	r.i += len(s)
	return true
}

// plainString consumes a JSON string of printable ASCII with no escapes,
// and returns its text.
func (r *ackReader) plainString() (string, bool) {
	if r.i >= len(r.data) || r.data[r.i] != '"' {
		return "", false
	}
	for j := r.i + 1; j < len(r.data); j++ {
		switch c := r.data[j]; {
		case c == '"':
			s := string(r.data[r.i+1 : j])
			r.i = j + 1
			return s, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return "", false
		}
	}
	return "", false
}

// uint consumes a JSON number that is a uint64 without a sign, exponent or
// fraction.
func (r *ackReader) uint() (uint64, bool) {
	j := r.i
	for j < len(r.data) && r.data[j] >= '0' && r.data[j] <= '9' {
		j++
	}
	if j == r.i || (j-r.i > 1 && r.data[r.i] == '0') {
		return 0, false
	}
	n, err := strconv.ParseUint(string(r.data[r.i:j]), 10, 64)
	if err != nil {
		return 0, false
	}
	r.i = j
	return n, true
}
