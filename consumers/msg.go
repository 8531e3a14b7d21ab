package consumers

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrNotJetStreamMsg is returned by ParseMetadata for a reply subject that
// is not a JetStream ack subject.
var ErrNotJetStreamMsg = errors.New("consumers: not a JetStream message")

// Msg is one message delivered by a consumer.
type Msg struct {
	// Subject is the subject the message was published on.
	Subject string
	// Header holds the message headers.
	Header nats.Header
	// Data is the payload.
	Data []byte
	// Metadata describes the delivery.
	Metadata Metadata

	reply   string // the ack subject
	d       *Dispatcher
	settled bool
}

// ErrSettled is returned by a second settlement of one message.
var ErrSettled = errors.New("consumers: message already settled")

// Ack acknowledges m: the server will not deliver it again.
func (m *Msg) Ack() error { return m.settle(ackBody, false) }

// Nak gives m back to the server, to be delivered again after delay (at
// once for zero); the delivery counts towards the consumer's MaxDeliver.
func (m *Msg) Nak(delay time.Duration) error {
	if delay <= 0 {
		return m.settle(nakBody, true)
	}
	return m.settle(nakDelayBody(delay), true)
}

// Term terminates m: the server will not deliver it again, and reports
// reason (cut to 256 bytes) in its advisory.
func (m *Msg) Term(reason string) error {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen]
	}
	return m.settle(termBody(reason), false)
}

// settle sends body, the acknowledgement protocol's message, for m, once.
// A give-back (a nak) while the dispatcher stops waits until its
// subscriptions are gone (Dispatcher.deferGiveBack).
func (m *Msg) settle(body []byte, giveBack bool) error {
	if m.settled {
		return ErrSettled
	}
	m.settled = true
	if giveBack && m.d.deferGiveBack(m.Subject, m.reply, body) {
		return nil
	}
	return m.d.nc.Publish(m.reply, body)
}

// Metadata describes one delivery, as JetStream encodes it in the ack
// subject.
type Metadata struct {
	// Stream and Consumer name where the message came from.
	Stream, Consumer string
	// Domain is the JetStream domain; empty for the default.
	Domain string
	// Deliveries counts the deliveries of this message, 1 for the first.
	Deliveries uint64
	// StreamSeq is the message's sequence in the stream.
	StreamSeq uint64
	// ConsumerSeq is the delivery's sequence in the consumer.
	ConsumerSeq uint64
	// Timestamp is when the message was stored.
	Timestamp time.Time
	// NumPending counts messages left for the consumer after this one.
	NumPending uint64
}

// ParseMetadata reads the metadata JetStream encodes in a delivery's reply
// subject, in either of its forms:
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>
//	$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>.<token>
func ParseMetadata(reply string) (Metadata, error) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return Metadata{}, fmt.Errorf("%w: reply subject %q", ErrNotJetStreamMsg, reply)
	}
	// Split without allocating: this runs for every message delivered.
	// Tokens past the twelfth are counted, not kept: neither form reads
	// them.
	var tok [12]string
	n := 0
	for {
		i := strings.IndexByte(rest, '.')
		field := rest
		if i >= 0 {
			field = rest[:i]
		}
		if n < len(tok) {
			tok[n] = field
		}
		n++
		if i < 0 {
			break
		}
		rest = rest[i+1:]
	}
	var md Metadata
	t := tok[:min(n, len(tok))]
	switch {
	case n == 7:
	case n >= 9:
		if t[0] != "_" {
			md.Domain = t[0]
		}
		t = t[2:]
	default:
		return Metadata{}, fmt.Errorf("%w: reply subject %q has %d tokens", ErrNotJetStreamMsg, reply, n+2)
	}
	md.Stream, md.Consumer = t[0], t[1]
	var nums [5]uint64
	for i := range nums {
		v, ok := parseDecimal(t[2+i])
		if !ok {
			return Metadata{}, fmt.Errorf("%w: reply subject %q: token %q is not a number", ErrNotJetStreamMsg, reply, t[2+i])
		}
		nums[i] = v
	}
	md.Deliveries, md.StreamSeq, md.ConsumerSeq = nums[0], nums[1], nums[2]
	md.Timestamp = time.Unix(0, int64(nums[3])).UTC()
	md.NumPending = nums[4]
	return md, nil
}

// parseDecimal parses s, one or more decimal digits, as a uint64. It does
// strconv.ParseUint(s, 10, 64)'s job without its generality (bases,
// underscores, an error to build), at a third of its cost: it runs five
// times for every message delivered.
func parseDecimal(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := uint64(s[i] - '0')
		if c > 9 || v > (math.MaxUint64-c)/10 { // not a digit, or overflows
			return 0, false
		}
		v = v*10 + c
	}
	return v, true
}

// The acknowledgement bodies of the JetStream protocol.
var (
	ackBody      = []byte("+ACK")
	nakBody      = []byte("-NAK")
	progressBody = []byte("+WPI")
)

func nakDelayBody(d time.Duration) []byte {
	b := make([]byte, 0, 32)
	b = append(b, `-NAK {"delay": `...)
	b = strconv.AppendInt(b, d.Nanoseconds(), 10)
	return append(b, '}')
}

func termBody(reason string) []byte {
	return append([]byte("+TERM "), reason...)
}
