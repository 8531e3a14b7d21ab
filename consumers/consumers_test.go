package consumers

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestSettingsValidate(t *testing.T) {
	tests := []struct {
		name    string
		s       Settings
		wantErr error
	}{
		{"zero is defaults", Settings{}, nil},
		{"explicit", Settings{AckWait: time.Second, MaxDeliver: -1, MaxAckPending: 10}, nil},
		{"negative ack wait", Settings{AckWait: -time.Second}, ErrInvalidOption},
		{"tiny ack wait", Settings{AckWait: time.Millisecond}, ErrInvalidOption},
		{"max deliver -2", Settings{MaxDeliver: -2}, ErrInvalidOption},
		{"negative max ack pending", Settings{MaxAckPending: -1}, ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.s.Validate(); !errors.Is(err, tt.wantErr) {
				t.Errorf("Validate() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestConsumerConfigDefaults(t *testing.T) {
	c := Settings{}.ConsumerConfig(Spec{Name: "a_p1", FilterSubject: "x.>"})
	if c.Durable != "a_p1" || c.AckWait != DefaultAckWait || c.MaxDeliver != DefaultMaxDeliver ||
		c.MaxAckPending != DefaultMaxAckPending || c.AckPolicy != jetstream.AckExplicitPolicy ||
		c.DeliverPolicy != jetstream.DeliverAllPolicy || c.FilterSubject != "x.>" || c.FilterSubjects != nil {
		t.Errorf("config %+v", c)
	}
	if c := (Settings{}).ConsumerConfig(Spec{Name: "a_b", FilterSubject: "x.>", NewOnly: true}); c.DeliverPolicy != jetstream.DeliverNewPolicy {
		t.Errorf("NewOnly: deliver policy %v, want new", c.DeliverPolicy)
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	nc := &nats.Conn{} // never used: Start fails before any I/O
	one := []Lane{{Consumer: "a_p1"}, {Consumer: "a_b"}}
	two := []Lane{{Consumer: "a_p1"}, {Consumer: "a_p2", Level: 1}}
	anyLane := []Lane{{Consumer: "a_p1"}, {Consumer: "a_b", Level: AnyLevel}}
	levelOf := func(string) int { return 0 }
	tests := []struct {
		name   string
		nc     *nats.Conn
		levels int
		lanes  []Lane
		h      Handler
		opts   Options
	}{
		{"nil connection", nil, 1, one, nopHandler, Options{}},
		{"no consumers", nc, 1, nil, nopHandler, Options{}},
		{"no levels", nc, 0, one, nopHandler, Options{}},
		{"empty level", nc, 3, two, nopHandler, Options{}},
		{"level out of range", nc, 1, two, nopHandler, Options{}},
		{"negative level", nc, 1, []Lane{{Consumer: "a_p1", Level: -2}}, nopHandler, Options{}},
		{"no consumer name", nc, 1, []Lane{{}}, nopHandler, Options{}},
		{"consumer twice", nc, 2, []Lane{{Consumer: "a_p1"}, {Consumer: "a_p1", Level: 1}}, nopHandler, Options{}},
		{"any level without LevelOf", nc, 2, anyLane, nopHandler, Options{}},
		{"nil handler", nc, 1, one, nil, Options{}},
		{"negative concurrency", nc, 1, one, nopHandler, Options{Concurrency: -1}},
		{"negative prefetch", nc, 1, one, nopHandler, Options{Prefetch: -1}},
		{"unknown policy", nc, 1, one, nopHandler, Options{Policy: 7}},
		{"weights count", nc, 2, two, nopHandler, Options{Weights: []int{1}}},
		{"zero weight", nc, 1, one, nopHandler, Options{Weights: []int{0}}},
		{"short pull expiry", nc, 1, one, nopHandler, Options{PullExpiry: time.Millisecond}},
		{"any level, weights count", nc, 2, anyLane, nopHandler, Options{LevelOf: levelOf, Weights: []int{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Start(tt.nc, "S", tt.levels, tt.lanes, tt.h, tt.opts); !errors.Is(err, ErrInvalidOption) {
				t.Errorf("Start() = %v, want ErrInvalidOption", err)
			}
		})
	}
}

func nopHandler(context.Context, *Msg) {}

func TestParseMetadata(t *testing.T) {
	tests := []struct {
		name    string
		reply   string
		want    Metadata
		wantErr error
	}{
		{"v1", "$JS.ACK.AGENTBUS.a_p1.2.17.5.1700000000000000000.3",
			Metadata{Stream: "AGENTBUS", Consumer: "a_p1", Deliveries: 2, StreamSeq: 17, ConsumerSeq: 5, Timestamp: time.Unix(0, 1700000000000000000).UTC(), NumPending: 3}, nil},
		{"v2 with domain", "$JS.ACK.hub.ACCHASH.AGENTBUS.a_p1.1.9.9.1700000000000000000.0.tok",
			Metadata{Domain: "hub", Stream: "AGENTBUS", Consumer: "a_p1", Deliveries: 1, StreamSeq: 9, ConsumerSeq: 9, Timestamp: time.Unix(0, 1700000000000000000).UTC()}, nil},
		{"v2 no domain", "$JS.ACK._.ACCHASH.S.c.1.1.1.1.0.tok",
			Metadata{Stream: "S", Consumer: "c", Deliveries: 1, StreamSeq: 1, ConsumerSeq: 1, Timestamp: time.Unix(0, 1).UTC()}, nil},
		{"not an ack subject", "_INBOX.x", Metadata{}, ErrNotJetStreamMsg},
		{"too few tokens", "$JS.ACK.S.c.1.2", Metadata{}, ErrNotJetStreamMsg},
		{"not a number", "$JS.ACK.S.c.x.1.1.1.0", Metadata{}, ErrNotJetStreamMsg},
		{"largest pending, leading zeros", "$JS.ACK.S.c.01.1.1.1.18446744073709551615",
			Metadata{Stream: "S", Consumer: "c", Deliveries: 1, StreamSeq: 1, ConsumerSeq: 1, Timestamp: time.Unix(0, 1).UTC(), NumPending: math.MaxUint64}, nil},
		{"overflows", "$JS.ACK.S.c.1.1.1.1.18446744073709551616", Metadata{}, ErrNotJetStreamMsg},
		{"empty", "", Metadata{}, ErrNotJetStreamMsg},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetadata(tt.reply)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ParseMetadata error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseMetadata = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseMetadata(f *testing.F) {
	f.Add("$JS.ACK.AGENTBUS.a_p1.2.17.5.1700000000000000000.3")
	f.Add("$JS.ACK.hub.ACCHASH.AGENTBUS.a_p1.1.9.9.1700000000000000000.0.tok")
	f.Add("$JS.ACK....")
	f.Fuzz(func(t *testing.T, reply string) {
		md, err := ParseMetadata(reply)
		if err != nil && md != (Metadata{}) {
			t.Errorf("error %v with non-zero metadata %+v", err, md)
		}
		want, werr := parseMetadataBySplit(reply)
		if (err == nil) != (werr == nil) || md != want {
			t.Errorf("ParseMetadata(%q) = %+v, %v; splitting it gives %+v, %v", reply, md, err, want, werr)
		}
	})
}

// parseMetadataBySplit is ParseMetadata written the plain way, with
// strings.Split, which the fuzz target checks it against.
func parseMetadataBySplit(reply string) (Metadata, error) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return Metadata{}, ErrNotJetStreamMsg
	}
	tok := strings.Split(rest, ".")
	var md Metadata
	switch {
	case len(tok) == 7:
	case len(tok) >= 9:
		if tok[0] != "_" {
			md.Domain = tok[0]
		}
		tok = tok[2:]
	default:
		return Metadata{}, ErrNotJetStreamMsg
	}
	md.Stream, md.Consumer = tok[0], tok[1]
	var nums [5]uint64
	for i := range nums {
		n, err := strconv.ParseUint(tok[2+i], 10, 64)
		if err != nil {
			return Metadata{}, err
		}
		nums[i] = n
	}
	md.Deliveries, md.StreamSeq, md.ConsumerSeq = nums[0], nums[1], nums[2]
	md.Timestamp = time.Unix(0, int64(nums[3])).UTC()
	md.NumPending = nums[4]
	return md, nil
}
