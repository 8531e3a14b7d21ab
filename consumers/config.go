package consumers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults for [Settings]. They are documented in docs/architecture.md.
const (
	DefaultAckWait       = 30 * time.Second
	DefaultMaxDeliver    = 5
	DefaultMaxAckPending = 1000
)

// ErrInvalidSettings is wrapped by every error [Settings.Validate] returns.
var ErrInvalidSettings = errors.New("consumers: invalid settings")

// Level names one durable consumer of an agent's priority level: its direct
// or its broadcast queue at one priority, a lane of that level for [Start].
type Level struct {
	// Priority is the level's priority, 1 (highest) to 5 (lowest).
	Priority int
	// Name is the durable consumer name.
	Name string
	// FilterSubject is the one subject the consumer selects from the
	// stream. With a single filter the consumer is created on
	// $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>, so server
	// permissions can pin which filter an agent may create a consumer with.
	FilterSubject string
	// Description is stored with the consumer for operators; may be empty.
	Description string
	// Metadata is stored with the consumer; may be nil.
	Metadata map[string]string
}

// Settings are the server-side consumer settings shared by an agent's
// consumers.
type Settings struct {
	// AckWait is how long the server waits for an ack before redelivering.
	// Zero means DefaultAckWait. Handlers that run longer are kept alive with
	// in-progress acks, so AckWait bounds the time to notice a crashed
	// subscriber, not the time a handler may take.
	AckWait time.Duration
	// MaxDeliver is how many times a message is delivered before it is given
	// up. Zero means DefaultMaxDeliver; -1 means without limit.
	MaxDeliver int
	// MaxAckPending bounds the messages delivered and not yet acknowledged per
	// consumer, across every process of the agent. Zero means
	// DefaultMaxAckPending.
	MaxAckPending int
}

// withDefaults returns s with zero fields set to their defaults.
func (s Settings) withDefaults() Settings {
	if s.AckWait == 0 {
		s.AckWait = DefaultAckWait
	}
	if s.MaxDeliver == 0 {
		s.MaxDeliver = DefaultMaxDeliver
	}
	if s.MaxAckPending == 0 {
		s.MaxAckPending = DefaultMaxAckPending
	}
	return s
}

// Validate reports whether s can be sent to the server.
func (s Settings) Validate() error {
	switch {
	case s.AckWait < 0:
		return fmt.Errorf("%w: ack wait %v is negative", ErrInvalidSettings, s.AckWait)
	case s.AckWait > 0 && s.AckWait < 100*time.Millisecond:
		return fmt.Errorf("%w: ack wait %v is under 100ms", ErrInvalidSettings, s.AckWait)
	case s.MaxDeliver < -1:
		return fmt.Errorf("%w: max deliver %d must be -1, 0 or positive", ErrInvalidSettings, s.MaxDeliver)
	case s.MaxAckPending < 0:
		return fmt.Errorf("%w: max ack pending %d is negative", ErrInvalidSettings, s.MaxAckPending)
	}
	return nil
}

// ConsumerConfig returns the JetStream configuration of one consumer.
func (s Settings) ConsumerConfig(l Level) jetstream.ConsumerConfig {
	s = s.withDefaults()
	return jetstream.ConsumerConfig{
		Durable:       l.Name,
		Description:   l.Description,
		FilterSubject: l.FilterSubject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: s.MaxAckPending,
		Metadata:      l.Metadata,
	}
}

// Ensure creates the durable consumer of every level on stream, or updates it
// in place when it exists with other settings, filters included: a consumer
// created with several filter subjects keeps its name, its acks and its place
// in the stream when it is updated to one. It is idempotent.
func Ensure(ctx context.Context, js jetstream.JetStream, stream string, levels []Level, s Settings) ([]jetstream.Consumer, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	// The consumers are independent: create them at once, one round trip
	// in all rather than one per consumer.
	out := make([]jetstream.Consumer, len(levels))
	errs := make([]error, len(levels))
	var wg sync.WaitGroup
	for i, l := range levels {
		wg.Go(func() {
			c, err := js.CreateOrUpdateConsumer(ctx, stream, s.ConsumerConfig(l))
			if err != nil {
				errs[i] = fmt.Errorf("ensure consumer %s on stream %s: %w", l.Name, stream, err)
			}
			out[i] = c
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
