package bus

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// Defaults of the options.
const (
	// DefaultMaxAsyncPending bounds the asynchronous publishes awaiting an ack.
	DefaultMaxAsyncPending = 4000
	// DefaultPublishAsyncTimeout is how long an asynchronous publish waits
	// for its ack before its future resolves with an error.
	DefaultPublishAsyncTimeout = 30 * time.Second
	// DefaultAckWait is the subscription's ack wait (see WithAckWait).
	DefaultAckWait = consumers.DefaultAckWait
	// DefaultMaxDeliver is the subscription's delivery limit (see WithMaxDeliver).
	DefaultMaxDeliver = consumers.DefaultMaxDeliver
	// DefaultMaxAckPending is the subscription's per-consumer bound on
	// unacked messages (see WithMaxAckPending).
	DefaultMaxAckPending = consumers.DefaultMaxAckPending
	// DefaultPublishAttempts is how many times Publish tries a message
	// when the server does not answer or answers that it cannot yet (see
	// WithPublishAttempts).
	DefaultPublishAttempts = 3
	// DefaultRequestTimeout is how long Request waits for a reply when its
	// context has no deadline.
	DefaultRequestTimeout = 5 * time.Minute
)

// Option configures a Bus. Options that can be invalid return an error
// wrapping ErrInvalidOption from New. A nil Option, one left unset, sets
// nothing; so do nil options of the other kinds (SubscribeOption,
// RequestOption, GatherOption).
type Option func(*options) error

type options struct {
	scheme          subjects.Scheme
	codec           codec.Codec
	logger          *slog.Logger
	onError         func(error)
	provision       *StreamConfig
	maxAsyncPending int
	asyncTimeout    time.Duration
	natsOptions     []nats.Option
	ownsConn        bool
	tracerProvider  trace.TracerProvider
	meterProvider   metric.MeterProvider
	lifecycle       bool
	index           bool // direct subjects name their message (WithoutIndex)
	publishAttempts int
	requestTimeout  time.Duration
	conversationTTL time.Duration // 0: the protocol's, or none
	heartbeat       time.Duration
}

func defaultOptions() options {
	return options{
		scheme:          subjects.Default(),
		codec:           codec.Binary{},
		logger:          slog.New(slog.DiscardHandler),
		onError:         func(error) {},
		maxAsyncPending: DefaultMaxAsyncPending,
		asyncTimeout:    DefaultPublishAsyncTimeout,
		tracerProvider:  otel.GetTracerProvider(),
		meterProvider:   otel.GetMeterProvider(),
		lifecycle:       true,
		index:           true,
		publishAttempts: DefaultPublishAttempts,
		heartbeat:       DefaultHeartbeat,
	}
}

// WithRoot sets the subject root (default "agentbus"); every process of one
// bus must use the same root.
func WithRoot(root string) Option {
	return func(o *options) error {
		s, err := subjects.New(root)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		o.scheme = s
		return nil
	}
}

// WithCodec sets how messages are written: codec.Binary{} (the default,
// attributes in ce- headers) or codec.Structured{} (one JSON document).
// Both are always accepted when reading.
func WithCodec(c codec.Codec) Option {
	return func(o *options) error {
		if c == nil {
			return fmt.Errorf("%w: nil codec", ErrInvalidOption)
		}
		o.codec = c
		return nil
	}
}

// WithLogger sets the logger for debug records. The default discards them;
// the library never prints.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.logger = l
		return nil
	}
}

// WithErrorHandler receives errors that happen in the background and have no
// caller to return to: failed pulls, failed acks, messages that cannot be
// decoded, handler panics. f runs on the bus's goroutines, a handler's
// among them: it returns soon, and closes the bus, if it must, with
// go b.Close() (Close waits for the handlers).
func WithErrorHandler(f func(error)) Option {
	return func(o *options) error {
		if f == nil {
			return fmt.Errorf("%w: nil error handler", ErrInvalidOption)
		}
		o.onError = f
		return nil
	}
}

// WithProvision makes New provision the stream (see Provision) before it
// returns. cfg.Root must be empty or equal to the bus's root.
func WithProvision(cfg StreamConfig) Option {
	return func(o *options) error {
		o.provision = &cfg
		return nil
	}
}

// WithMaxAsyncPending bounds the asynchronous publishes awaiting an ack;
// PublishAsync blocks briefly, then fails, when the bound is reached.
func WithMaxAsyncPending(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("%w: max async pending %d must be > 0", ErrInvalidOption, n)
		}
		o.maxAsyncPending = n
		return nil
	}
}

// WithPublishAsyncTimeout sets how long an asynchronous publish waits for
// the server's ack before its future resolves with an error wrapping
// jetstream.ErrAsyncPublishTimeout (default 30s), so a lost ack never
// leaves a caller waiting forever. One timer checks every publish in flight
// each eighth of d, so the error comes between d and d plus an eighth.
func WithPublishAsyncTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: publish async timeout %v must be > 0", ErrInvalidOption, d)
		}
		o.asyncTimeout = d
		return nil
	}
}

// WithNATSOptions passes options to nats.Connect when Connect dials, such as
// credentials (nats.UserCredentials) or TLS (nats.RootCAs). New ignores them.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(o *options) error {
		o.natsOptions = append(o.natsOptions, opts...)
		return nil
	}
}

// WithTracerProvider sets where the bus's spans go. The default is the
// global TracerProvider (otel.GetTracerProvider) at the time New is called;
// the library never sets up an exporter. See docs/observability.md for the
// spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) error {
		if tp == nil {
			return fmt.Errorf("%w: nil tracer provider", ErrInvalidOption)
		}
		o.tracerProvider = tp
		return nil
	}
}

// WithMeterProvider sets where the bus's metrics go. The default is the
// global MeterProvider (otel.GetMeterProvider) at the time New is called.
// See docs/observability.md for the metrics.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) error {
		if mp == nil {
			return fmt.Errorf("%w: nil meter provider", ErrInvalidOption)
		}
		o.meterProvider = mp
		return nil
	}
}

// WithHeartbeat sets how often a registered agent reports its presence
// (Bus.Register; default DefaultHeartbeat, 10 s). It is found offline three
// intervals after its last heartbeat. At least 1 s: the server's TTLs are
// in whole seconds.
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Second {
			return fmt.Errorf("%w: heartbeat %v is under 1s", ErrInvalidOption, d)
		}
		o.heartbeat = d
		return nil
	}
}

// WithoutLifecycle turns off the lifecycle tracking: the bus then writes no
// status records (see Status and docs/reliability.md) and sends direct
// messages on plain subjects, without the index that lets a lookup find
// them, which saves the server an index entry per stored message and the bus
// a write per broadcast or TTL message sent or handled; Bus.Status,
// Admin.Status and Admin.Conversation return ErrInvalidOption. A reply taken
// by a Request in a process without a subscription can then reach the
// agent's handler again later, marked Late.
func WithoutLifecycle() Option {
	return func(o *options) error {
		o.lifecycle = false
		return nil
	}
}

// WithoutIndex sends direct messages on plain subjects, without the
// message's ID and conversation (docs/subjects.md), and has the sender
// write the pending status record of each instead, as agentbus did before
// the index. It is for a rolling upgrade from such a version, whose agents
// dead-letter a subject they cannot parse (ReasonMalformed,
// ErrMalformedSubject): every process runs with WithoutIndex until none of
// the old version is left, then without it (docs/operations.md). Lifecycle
// tracking is unchanged; with WithoutLifecycle subjects are plain anyway.
func WithoutIndex() Option {
	return func(o *options) error {
		o.index = false
		return nil
	}
}

// WithPublishAttempts sets how many times Publish (and Request, Reply,
// PublishNative) tries a message before it returns the error (default 3).
// Only transient failures are retried: no answer in time, no responders
// while a stream leader is elected, a server that answers it is not ready,
// JetStream error 10158 (the same message ID is being stored). Every
// attempt carries the same message ID, so a retry never stores the message
// twice. 1 turns retries off.
func WithPublishAttempts(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("%w: publish attempts %d must be > 0", ErrInvalidOption, n)
		}
		o.publishAttempts = n
		return nil
	}
}

// WithRequestTimeout sets how long Request waits for a reply when its
// context has no deadline. By default a request in one of the agent
// protocols waits as long as its document says (profiles.Defaults: 5
// minutes for basemessage), any other DefaultRequestTimeout (5 minutes).
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v must be > 0", ErrInvalidOption, d)
		}
		o.requestTimeout = d
		return nil
	}
}

// WithConversationTimeout gives every conversation this agent starts a
// deadline d after its first message (see ExtConversationBy). By default a
// conversation in one of the agent protocols has the timeout its document
// sets (profiles.Defaults.CorrelationTimeout: 30 minutes for basemessage),
// any other none.
func WithConversationTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: conversation timeout %v must be > 0", ErrInvalidOption, d)
		}
		o.conversationTTL = d
		return nil
	}
}

// SubscribeOption configures one subscription.
type SubscribeOption func(*subscribeOptions) error

type subscribeOptions struct {
	concurrency int
	prefetch    int
	policy      Policy
	weights     []int
	// settings are the consumers' server-side settings: ack wait, max
	// deliver, max ack pending.
	settings      consumers.Settings
	backoff       func(delivery int) time.Duration
	ownBroadcasts bool
	// firstLook and lookEvery replace lateLook and lookEvery (lanes.go)
	// when set, which only tests do (export_test.go).
	firstLook, lookEvery time.Duration
}

// WithConcurrency sets how many handlers run at once (default 1). Each is a
// goroutine for as long as the subscription runs. Subscribe refuses more
// than MaxConcurrency: the others could never run.
func WithConcurrency(n int) SubscribeOption {
	return func(o *subscribeOptions) error {
		if n <= 0 {
			return fmt.Errorf("%w: concurrency %d must be > 0", ErrInvalidOption, n)
		}
		o.concurrency = n
		return nil
	}
}

// WithPrefetch sets how many messages per consumer (the agent has six: one
// per priority and one for the broadcasts) this process holds in memory
// ahead of its handlers. By default it adapts: a consumer holds about what
// the handlers start in 100 ms at the speed they have shown so far, at
// least the concurrency and at most 512 (consumers.MaxPrefetch). Fast
// handlers then never wait for a pull round trip to the server, and slow
// ones, an agent working minutes on each task, hold no more than they are
// about to start, leaving the rest of a backlog to the agent's other
// processes. A fixed prefetch trades the same way: more for throughput,
// less for an even split, and memory up to six times the prefetch
// messages. Prefetch never changes the order handlers start in: the
// highest priority held starts first. Held messages are kept alive, so
// waiting in memory never causes a redelivery. docs/performance.md has
// the measurements behind the default.
func WithPrefetch(n int) SubscribeOption {
	return func(o *subscribeOptions) error {
		if n <= 0 {
			return fmt.Errorf("%w: prefetch %d must be > 0", ErrInvalidOption, n)
		}
		o.prefetch = n
		return nil
	}
}

// WithPolicy chooses between priority levels: Strict (the default) or
// Weighted. For Weighted, weights gives each level's share, highest
// priority first (default 16, 8, 4, 2, 1).
func WithPolicy(p Policy, weights ...int) SubscribeOption {
	return func(o *subscribeOptions) error {
		if p != Strict && p != Weighted {
			return fmt.Errorf("%w: unknown policy %v", ErrInvalidOption, p)
		}
		if len(weights) > 0 && len(weights) != subjects.LowestPriority {
			return fmt.Errorf("%w: %d weights, want %d", ErrInvalidOption, len(weights), subjects.LowestPriority)
		}
		o.policy, o.weights = p, weights
		return nil
	}
}

// WithAckWait sets how long the server waits for an ack before it
// redelivers (default 30s): the time to notice a crashed subscriber. Running
// handlers are kept alive, so it does not limit how long a handler may run.
// The agent's consumers are shared by its processes, each keeping its
// messages alive at the pace of its own ack wait: they keep the longest
// any process asked for (a shorter one redelivered the messages another
// handled), and the highest delivery limit.
func WithAckWait(d time.Duration) SubscribeOption {
	return func(o *subscribeOptions) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("%w: ack wait %v must be >= 100ms", ErrInvalidOption, d)
		}
		o.settings.AckWait = d
		return nil
	}
}

// WithMaxDeliver sets how many deliveries a message gets before a failing
// one is terminated (default 5). The server's consumers allow twice as
// many, so that the deliveries a stopping process gives back unhandled,
// or a crash loses, do not end a message (serverSettings): a message
// whose process crashes on every delivery is given up after 2n, and
// dead-lettered as unsettled by WatchDeadLetters.
func WithMaxDeliver(n int) SubscribeOption {
	return func(o *subscribeOptions) error {
		if n <= 0 || n > maxCountOption {
			return fmt.Errorf("%w: max deliver %d must be 1 to %d", ErrInvalidOption, n, maxCountOption)
		}
		o.settings.MaxDeliver = n
		return nil
	}
}

// maxCountOption bounds WithMaxDeliver and WithMaxAckPending, far above
// any useful value, so that what the bus computes from them (twice the
// one for the server, six times the other for MaxConcurrency) cannot
// overflow.
const maxCountOption = 1 << 30

// MaxConcurrency is the most handlers a subscription can run at once, with
// maxAckPending as WithMaxAckPending (0: DefaultMaxAckPending): the
// messages the agent's consumers (subjects.ConsumersPerAgent) hand out
// unacknowledged at once, 6,000 by default.
func MaxConcurrency(maxAckPending int) int {
	return subjects.ConsumersPerAgent * orDefault(maxAckPending, DefaultMaxAckPending)
}

// WithMaxAckPending bounds the messages delivered and not yet acked per
// consumer (one per priority for the direct messages, one for the
// broadcasts), across all processes of the agent (default 1000).
func WithMaxAckPending(n int) SubscribeOption {
	return func(o *subscribeOptions) error {
		if n <= 0 || n > maxCountOption {
			return fmt.Errorf("%w: max ack pending %d must be 1 to %d", ErrInvalidOption, n, maxCountOption)
		}
		o.settings.MaxAckPending = n
		return nil
	}
}

// WithBackoff sets the delay before redelivering a message whose handler
// failed on its delivery-th delivery (default exponential: 1s, 2s, 4s, ...
// up to 1m).
func WithBackoff(f func(delivery int) time.Duration) SubscribeOption {
	return func(o *subscribeOptions) error {
		if f == nil {
			return fmt.Errorf("%w: nil backoff", ErrInvalidOption)
		}
		o.backoff = f
		return nil
	}
}

// WithOwnBroadcasts delivers the agent's own broadcasts to it too; by
// default they are acknowledged and skipped.
func WithOwnBroadcasts() SubscribeOption {
	return func(o *subscribeOptions) error {
		o.ownBroadcasts = true
		return nil
	}
}
