package consumers

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
		{"negative ack wait", Settings{AckWait: -time.Second}, ErrInvalidSettings},
		{"tiny ack wait", Settings{AckWait: time.Millisecond}, ErrInvalidSettings},
		{"max deliver -2", Settings{MaxDeliver: -2}, ErrInvalidSettings},
		{"negative max ack pending", Settings{MaxAckPending: -1}, ErrInvalidSettings},
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
	c := Settings{}.ConsumerConfig(Level{Priority: 1, Name: "a_p1", FilterSubjects: []string{"x.>", "y.>"}})
	if c.Durable != "a_p1" || c.AckWait != DefaultAckWait || c.MaxDeliver != DefaultMaxDeliver ||
		c.MaxAckPending != DefaultMaxAckPending || c.AckPolicy != jetstream.AckExplicitPolicy ||
		c.DeliverPolicy != jetstream.DeliverAllPolicy || len(c.FilterSubjects) != 2 {
		t.Errorf("config %+v", c)
	}
}

func TestExponentialBackoff(t *testing.T) {
	b := ExponentialBackoff(100*time.Millisecond, time.Second)
	for delivery, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 5: time.Second, 50: time.Second} {
		got := b(delivery)
		if got < want || got > want+want/5 {
			t.Errorf("backoff(%d) = %v, want %v plus at most 20%%", delivery, got, want)
		}
	}
}

func TestPermanent(t *testing.T) {
	base := errors.New("bad input")
	err := fmt.Errorf("handler: %w", Permanent(base))
	if !IsPermanent(err) || !errors.Is(err, base) {
		t.Errorf("IsPermanent(%v) = false or base lost", err)
	}
	if IsPermanent(base) || Permanent(nil) != nil {
		t.Error("plain error permanent, or Permanent(nil) not nil")
	}
}

func TestStartRejectsBadOptions(t *testing.T) {
	var c jetstream.Consumer // never used: Start fails before any I/O
	tests := []struct {
		name string
		cons []jetstream.Consumer
		h    Handler
		opts Options
	}{
		{"no consumers", nil, nopHandler, Options{}},
		{"nil handler", []jetstream.Consumer{c}, nil, Options{}},
		{"negative concurrency", []jetstream.Consumer{c}, nopHandler, Options{Concurrency: -1}},
		{"negative prefetch", []jetstream.Consumer{c}, nopHandler, Options{Prefetch: -1}},
		{"unknown policy", []jetstream.Consumer{c}, nopHandler, Options{Policy: 7}},
		{"weights count", []jetstream.Consumer{c, c}, nopHandler, Options{Weights: []int{1}}},
		{"zero weight", []jetstream.Consumer{c}, nopHandler, Options{Weights: []int{0}}},
		{"short pull expiry", []jetstream.Consumer{c}, nopHandler, Options{PullExpiry: time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Start(tt.cons, tt.h, tt.opts); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("Start() = %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func nopHandler(context.Context, jetstream.Msg) error { return nil }
