package consumers

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// ErrInvalidOption is wrapped by every error [Settings.Validate] returns,
// and by those [Start] returns for bad Options.
var ErrInvalidOption = errors.New("consumers: invalid option")

// Spec names one durable consumer of an agent: its name, its one filter,
// and where a new one starts reading.
type Spec struct {
	// Name is the durable consumer name.
	Name string
	// FilterSubject is the one subject the consumer selects from the
	// stream. With a single filter the consumer is created on
	// $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>, so server
	// permissions can pin which filter an agent may create a consumer with.
	FilterSubject string
	// NewOnly makes a consumer created now start with the next message
	// stored, instead of the first one the stream holds: an agent's
	// broadcast consumer, so that a new agent is not handed the broadcasts
	// retained from before it existed. An existing consumer keeps its place.
	NewOnly bool
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
		return fmt.Errorf("%w: ack wait %v is negative", ErrInvalidOption, s.AckWait)
	case s.AckWait > 0 && s.AckWait < 100*time.Millisecond:
		return fmt.Errorf("%w: ack wait %v is under 100ms", ErrInvalidOption, s.AckWait)
	case s.MaxDeliver < -1:
		return fmt.Errorf("%w: max deliver %d must be -1, 0 or positive", ErrInvalidOption, s.MaxDeliver)
	case s.MaxAckPending < 0:
		return fmt.Errorf("%w: max ack pending %d is negative", ErrInvalidOption, s.MaxAckPending)
	}
	return nil
}

// ConsumerConfig returns the JetStream configuration of one consumer.
func (s Settings) ConsumerConfig(l Spec) jetstream.ConsumerConfig {
	s = s.withDefaults()
	deliver := jetstream.DeliverAllPolicy
	if l.NewOnly {
		deliver = jetstream.DeliverNewPolicy
	}
	return jetstream.ConsumerConfig{
		Durable:       l.Name,
		Description:   l.Description,
		FilterSubject: l.FilterSubject,
		DeliverPolicy: deliver,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: s.MaxAckPending,
		Metadata:      l.Metadata,
	}
}

// Ensure makes sure the durable consumer of every spec exists on stream
// with settings s. It asks the server to create each one, which is a no-op
// when an identical consumer exists; only a consumer that exists with other
// settings is updated in place, filters included (a consumer updated from
// several filter subjects to one keeps its name, its acks and its place in
// the stream). A consumer's starting point (NewOnly) is never changed once
// it exists. The consumers are independent, so their requests go out at
// once: one round trip in all rather than one per consumer. It is
// idempotent.
func Ensure(ctx context.Context, js jetstream.JetStream, stream string, specs []Spec, s Settings) ([]jetstream.Consumer, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	out := make([]jetstream.Consumer, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			c, err := ensure(ctx, js, stream, s.ConsumerConfig(spec))
			if err != nil {
				errs[i] = fmt.Errorf("ensure consumer %s on stream %s: %w", spec.Name, stream, err)
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

// ensure makes the consumer cfg describes exist. It reads the consumer
// first: an existing one with the same settings is left as it is (a create
// request would rewrite its configuration on the server's disk), one with
// other settings is updated keeping its starting point, and its ack wait
// and delivery limit where they are larger, and a missing one is created.
func ensure(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := js.Consumer(ctx, stream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = js.CreateConsumer(ctx, stream, cfg)
		if !errors.Is(err, jetstream.ErrConsumerExists) { // lost a race with another process
			return c, err
		}
		c, err = js.Consumer(ctx, stream, cfg.Durable)
	}
	if err != nil {
		return nil, err
	}
	old := c.CachedInfo().Config
	// The consumer is shared by the agent's processes, each of which keeps
	// the messages it handles alive at the pace of its own ack wait and
	// counts deliveries against its own limit: one asking for a shorter
	// ack wait or fewer deliveries would have the server redeliver, or give
	// up, a message another still handles. The longer and the more stay.
	cfg.AckWait = max(cfg.AckWait, old.AckWait)
	if old.MaxDeliver == -1 || cfg.MaxDeliver != -1 && old.MaxDeliver > cfg.MaxDeliver {
		cfg.MaxDeliver = old.MaxDeliver
	}
	if sameSettings(old, cfg) {
		return c, nil
	}
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = old.DeliverPolicy, old.OptStartSeq, old.OptStartTime
	return js.UpdateConsumer(ctx, stream, cfg)
}

// sameSettings reports whether the consumer configured as have has the
// settings want asks for, ignoring where it started and the metadata the
// server adds itself ("_nats." keys).
func sameSettings(have, want jetstream.ConsumerConfig) bool {
	if have.Description != want.Description || have.FilterSubject != want.FilterSubject ||
		len(have.FilterSubjects) > 0 || have.AckPolicy != want.AckPolicy || have.AckWait != want.AckWait ||
		have.MaxDeliver != want.MaxDeliver || have.MaxAckPending != want.MaxAckPending {
		return false
	}
	n := 0
	for k, v := range have.Metadata {
		if strings.HasPrefix(k, "_nats.") {
			continue
		}
		if w, ok := want.Metadata[k]; !ok || w != v {
			return false
		}
		n++
	}
	return n == len(want.Metadata)
}
