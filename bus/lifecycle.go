package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/subjects"
)

// State is where a message is in its lifecycle. A message starts pending,
// becomes delivered when a recipient receives it, and ends replied,
// completed, expired or dead_lettered; failed is a delivery whose handler
// failed and that will be delivered again. docs/reliability.md draws the
// diagram.
type State string

// The lifecycle states.
const (
	// StatePending: published, not yet handled. The sender writes it once
	// the message is sent, and only if no record exists, so it never
	// overwrites a recipient's state.
	StatePending State = "pending"
	// StateDelivered: a recipient's handler has been working on it for
	// DeliveredAfter and has not finished.
	StateDelivered State = "delivered"
	// StateReplied: the recipient answered it with Reply.
	StateReplied State = "replied"
	// StateCompleted: the recipient's handler succeeded without replying,
	// or a Request took it as its reply.
	StateCompleted State = "completed"
	// StateFailed: the handler failed; the message will be delivered again
	// after a backoff. Reason says why.
	StateFailed State = "failed"
	// StateExpired: its TTL passed before it was handled. The server removes
	// such messages without a trace; the bus writes this state when a
	// recipient meets one, or when a lookup finds a pending message past its
	// expiry.
	StateExpired State = "expired"
	// StateDeadLettered: it was moved to the dead-letter stream; Reason says
	// why.
	StateDeadLettered State = "dead_lettered"
)

// Final reports whether s is an end state: nothing moves a message out of
// it except a replay from the dead-letter stream or a later Reply.
func (s State) Final() bool {
	switch s {
	case StateReplied, StateCompleted, StateExpired, StateDeadLettered:
		return true
	}
	return false
}

// Status is the lifecycle record of one message at one recipient, as kept
// in the status bucket (subjects.Scheme.StatusBucket). A direct message has
// one record; a broadcast has the sender's (To is Broadcast, State stays
// pending) and one per recipient that received it.
type Status struct {
	ID            string    `json:"id"`
	From          string    `json:"from"`
	To            string    `json:"to"`
	Type          string    `json:"type"`
	Priority      int       `json:"priority"`
	CorrelationID string    `json:"correlationId"`
	ReplyTo       string    `json:"replyTo,omitempty"`
	State         State     `json:"state"`
	Time          time.Time `json:"time"`                 // the message's time
	ExpiresAt     time.Time `json:"expiresAt,omitzero"`   // Time + TTL
	Updated       time.Time `json:"updated"`              // when State was written
	By            string    `json:"by"`                   // the agent that wrote State
	Stream        string    `json:"stream,omitempty"`     // where the recipient got it
	Sequence      uint64    `json:"sequence,omitempty"`   // its stream sequence
	Deliveries    int       `json:"deliveries,omitempty"` // deliveries so far
	Reason        string    `json:"reason,omitempty"`     // why it failed or was dead-lettered
	ReplyID       string    `json:"replyId,omitempty"`    // the reply, for StateReplied
	ReplyBy       time.Time `json:"replyBy,omitzero"`     // a Request's deadline (ExtReplyBy)
}

// Message returns the message s records, as far as Reply needs it: ID,
// sender, recipient, type, priority, conversation, causation and the
// requester's deadline. The CLI's "reply --to-message" answers a message
// found by Status this way.
func (s Status) Message() Message {
	m := Message{ID: s.ID, From: s.From, To: s.To, Type: s.Type, Priority: s.Priority,
		CorrelationID: s.CorrelationID, ReplyTo: s.ReplyTo, Time: s.Time}
	if !s.ReplyBy.IsZero() {
		m.Extensions = map[string]string{ExtReplyBy: s.ReplyBy.Format(time.RFC3339Nano)}
	}
	return m
}

// statusOf returns the record of m in state s, written by agent by.
func statusOf(m *Message, to string, s State, by string) Status {
	st := Status{
		ID: m.ID, From: m.From, To: to, Type: m.Type, Priority: m.Priority,
		CorrelationID: conversationOf(m), ReplyTo: m.ReplyTo,
		State: s, Time: m.Time, ExpiresAt: m.ExpiresAt(), Updated: time.Now().UTC(), By: by,
	}
	if v, ok := m.Extensions[ExtReplyBy]; ok {
		st.ReplyBy, _ = time.Parse(time.RFC3339Nano, v)
	}
	return st
}

// withDelivery fills in where d came from.
func (s Status) withDelivery(d *Delivery) Status {
	s.Stream, s.Sequence, s.Deliveries = d.Stream, d.Sequence, d.NumDelivered
	return s
}

// statusHistory is how many states the bucket keeps per record.
const statusHistory = 10

// StatusBucketConfig returns the KeyValue bucket Provision creates for the
// lifecycle status: named by subjects.Scheme.StatusBucket, records kept as
// long as messages (MaxAge), the last ten states of each.
func (c StreamConfig) StatusBucketConfig() (jetstream.KeyValueConfig, error) {
	main, err := c.JetStream()
	if err != nil {
		return jetstream.KeyValueConfig{}, err
	}
	s, _ := subjects.New(c.Root)
	return jetstream.KeyValueConfig{
		Bucket:      s.StatusBucket(),
		Description: "agentbus message lifecycle under " + s.Root(),
		History:     statusHistory,
		TTL:         main.MaxAge,
		Storage:     main.Storage,
		Replicas:    main.Replicas,
	}, nil
}

// tracker writes the lifecycle states. Writes are asynchronous and never
// slow down or fail the message they describe; a failed write goes to the
// error handler. A nil *tracker tracks nothing.
type tracker struct {
	bucket    string
	prefix    string // "$KV.<bucket>."
	directGet string // "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", then the key
	nc        *nats.Conn
	js        jetstream.JetStream
	onError   func(error)
	missing   atomic.Bool // the bucket was found missing and reported once
}

func newTracker(nc *nats.Conn, o *options) (*tracker, error) {
	t := &tracker{bucket: o.scheme.StatusBucket(), nc: nc, onError: o.onError}
	t.prefix = "$KV." + t.bucket + "."
	t.directGet = "$JS.API.DIRECT.GET.KV_" + t.bucket + "." + t.prefix
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(o.maxAsyncPending),
		jetstream.WithPublishAsyncTimeout(o.asyncTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			t.failed(m.Subject, err)
		}),
	)
	if err != nil {
		return nil, err
	}
	t.js = js
	return t, nil
}

// failed reports a failed write, except a pending record that lost to a
// later state (the create found the key taken), and a missing bucket after
// the first report.
func (t *tracker) failed(subject string, err error) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		if t.missing.Swap(true) {
			return
		}
		err = fmt.Errorf("%w: status bucket %s: %w (run Provision, or use WithoutLifecycle)", ErrNotProvisioned, t.bucket, err)
	}
	t.onError(fmt.Errorf("record status %s: %w", subject, err))
}

// record writes s. With create it is written only if the record does not
// exist yet, so a sender's pending never overwrites a recipient's state.
func (t *tracker) record(s Status, create bool) {
	if t == nil {
		return
	}
	key, err := subjects.StatusKey(s.CorrelationID, s.ID, s.From, s.To)
	if err != nil {
		t.onError(fmt.Errorf("record status of %s: %w", s.ID, err))
		return
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.onError(fmt.Errorf("record status of %s: %w", s.ID, err))
		return
	}
	m := &nats.Msg{Subject: t.prefix + key, Data: data}
	if create {
		m.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}
	}
	if _, err := t.js.PublishMsgAsync(m); err != nil {
		t.failed(m.Subject, err)
	}
}

// get returns the record under the exact key of m's status at recipient
// to. It asks the bucket's stream for the key's last message directly, by
// a request whose subject names the key: an agent's server permissions
// allow exactly the keys that name it, and it needs no stream information,
// which would list every key (docs/security.md).
func (t *tracker) get(ctx context.Context, m *Message, to string) (Status, error) {
	key, err := subjects.StatusKey(conversationOf(m), m.ID, m.From, to)
	if err != nil {
		return Status{}, err
	}
	resp, err := t.nc.RequestWithContext(ctx, t.directGet+key, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return Status{}, fmt.Errorf("%w: status bucket %s", ErrNotProvisioned, t.bucket)
	}
	if err != nil {
		return Status{}, fmt.Errorf("status %s: %w", key, err)
	}
	switch code := resp.Header.Get("Status"); code {
	case "":
	case "404":
		return Status{}, fmt.Errorf("%w: %s", ErrNoStatus, m.ID)
	default:
		return Status{}, fmt.Errorf("status %s: server answered %s %s", key, code, resp.Header.Get("Description"))
	}
	if resp.Header.Get("KV-Operation") != "" { // a delete or purge marker
		return Status{}, fmt.Errorf("%w: %s", ErrNoStatus, m.ID)
	}
	var s Status
	if err := json.Unmarshal(resp.Data, &s); err != nil {
		return Status{}, fmt.Errorf("status %s: %w", key, err)
	}
	return s, nil
}

// read returns the current record of every key matching one of filters,
// each read with its own ordered consumer (a single filter, so that server
// permissions can pin it). Records past their expiry while still pending
// or failed are returned, and written back, as expired.
func (t *tracker) read(ctx context.Context, filters ...string) ([]Status, error) {
	var out []Status
	seen := make(map[string]bool) // an agent's two filters meet on a message to itself
	for _, f := range filters {
		c, err := t.js.OrderedConsumer(ctx, "KV_"+t.bucket, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{t.prefix + f},
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("%w: status bucket %s", ErrNotProvisioned, t.bucket)
			}
			return nil, fmt.Errorf("read status %s: %w", f, err)
		}
		err = readAll(ctx, c, func(key string, s Status) {
			if !seen[key] {
				seen[key] = true
				out = append(out, s)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("read status %s: %w", f, err)
		}
	}
	now := time.Now()
	for i, s := range out {
		if (s.State == StatePending && s.To != Broadcast || s.State == StateFailed) && !s.ExpiresAt.IsZero() && now.After(s.ExpiresAt) {
			s.State, s.Updated, s.Reason = StateExpired, now.UTC(), "TTL passed before it was handled"
			t.record(s, false)
			out[i] = s
		}
	}
	slices.SortFunc(out, func(a, b Status) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.ID, b.ID), cmp.Compare(a.To, b.To))
	})
	return out, nil
}

// readAll fetches what an ordered consumer has pending now and passes each
// record to add with its subject.
func readAll(ctx context.Context, c jetstream.Consumer, add func(subject string, s Status)) error {
	pending := c.CachedInfo().NumPending
	for pending > 0 {
		batch, err := c.Fetch(int(min(pending, 256)), jetstream.FetchContext(ctx))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			pending = md.NumPending
			if op := m.Headers().Get("KV-Operation"); op != "" {
				continue // a delete or purge marker
			}
			var s Status
			if err := json.Unmarshal(m.Data(), &s); err != nil {
				return fmt.Errorf("record %s: %w", m.Subject(), err)
			}
			add(m.Subject(), s)
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%d records pending, none delivered: %w", pending, context.DeadlineExceeded)
		}
	}
	return nil
}

// Status returns the lifecycle records of message id that name this bus's
// agent, as sender or recipient: for a direct message its one record, for a
// broadcast the sender's and every recipient's (to the sender) or the
// agent's own (to a recipient). These are the records an agent's server
// permissions let it read (docs/security.md). It returns ErrNoStatus when
// there are none.
func (b *Bus) Status(ctx context.Context, id string) ([]Status, error) {
	filters, err := subjects.StatusKeysOfAgent(id, b.agent)
	if err != nil {
		return nil, err
	}
	return b.lookup(ctx, id, filters...)
}

// StatusAll returns every lifecycle record of message id, whoever sent or
// received it. It needs read access to the whole status bucket, which an
// operator has and an agent does not.
func (b *Bus) StatusAll(ctx context.Context, id string) ([]Status, error) {
	return b.lookup(ctx, id, subjects.StatusKeysOfMessage(id))
}

func (b *Bus) lookup(ctx context.Context, id string, filters ...string) ([]Status, error) {
	if b.status == nil {
		return nil, fmt.Errorf("%w: lifecycle tracking is off", ErrInvalidOption)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	out, err := b.status.read(ctx, filters...)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoStatus, id)
	}
	return out, nil
}

// Conversation returns the lifecycle record of every message of the
// conversation correlationID names, in the order the messages were created.
// It reads only the conversation's keys, which share a prefix, so its cost
// grows with the conversation, not with the bucket (docs/observability.md).
// Like StatusAll it needs operator read access.
func (b *Bus) Conversation(ctx context.Context, correlationID string) ([]Status, error) {
	if b.status == nil {
		return nil, fmt.Errorf("%w: lifecycle tracking is off", ErrInvalidOption)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return b.status.read(ctx, subjects.StatusKeysOfConversation(correlationID))
}
