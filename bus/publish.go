package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus/internal/asyncpub"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// PubAck is the server's receipt for a published message.
type PubAck struct {
	// ID is the message ID, generated when the message had none.
	ID string
	// Subject is the subject the message was stored under.
	Subject string
	// Stream is the stream that stored it.
	Stream string
	// Sequence is its stream sequence; for a duplicate, the sequence of the
	// copy stored first.
	Sequence uint64
	// Duplicate reports that a message with the same ID was already stored
	// within the duplicate window; this copy was dropped. It is not an error:
	// the message is on the bus once.
	Duplicate bool
}

// Publish sends m and waits for the server to store it. Empty fields get
// their defaults (see codec.Message.SetDefaults); From must be empty or the
// bus's agent. The message ID becomes the JetStream Nats-Msg-Id, so
// publishing the same ID again, for example on a retry, stores it once and
// reports Duplicate; an ID with a space at either end, which that header
// cannot carry, is refused (ErrInvalidMessage). A TTL sets the expirytime attribute (Time + TTL) and
// Nats-TTL, the time left until then in whole seconds, rounded up; a
// request (it carries ExtReplyBy) sent with lifecycle tracking gets no
// Nats-TTL: it stays in the stream, and its recipient drops it unread past
// its expiry (see Request).
//
// Transient failures (no answer in time, no responders during a leader
// election, JetStream error 10158) are retried with the same message ID,
// up to WithPublishAttempts tries in all (3 by default), each bounded by
// 5 seconds and by ctx. The message's lifecycle record starts pending (see
// Status).
//
// Inside a Handler, pass the handler's ctx: the message then continues the
// handled message's conversation (see ContextWithDelivery) and its span is a
// child of the handler's. With tracing on, Publish writes the span's W3C
// trace context as the CloudEvents distributed tracing extension
// (ce-traceparent and ce-tracestate in binary mode); docs/observability.md
// describes the spans and metrics.
//
// Errors: ErrInvalidMessage (errors.As to *codec.FieldError names the
// field), ErrInvalidAgentID, ErrPayloadTooLarge, ErrNotProvisioned,
// ErrClosed, or the server's error.
func (b *Bus) Publish(ctx context.Context, m Message) (PubAck, error) {
	if b.shards != nil {
		return b.shards.publish(ctx, m)
	}
	return b.publishHere(ctx, m)
}

// publishHere is Publish on this bus's own root.
func (b *Bus) publishHere(ctx context.Context, m Message) (PubAck, error) {
	inherit(ctx, &m)
	msg, op, err := b.prepare(ctx, &m)
	if err != nil {
		return PubAck{}, err
	}
	ack, err := b.send(ctx, msg)
	if err != nil {
		err = b.publishError(b.opts.scheme.Stream(), msg, m.ID, err)
		op.end(b.tel, ctx, err, false)
		b.recordUnsent(&m, err)
		return PubAck{}, err
	}
	// A message that needs a pending record (needsPendingRecord) has it
	// written after the message, so that the record holds its stream
	// sequence, by which a lookup finds the recipient's progress, and by
	// the tracker's writer (writeLater), so that the caller waits neither
	// for the record nor for the work of writing it. A recipient's state
	// written in between wins: pending is only ever created, never
	// overwrites. Held until it is under way, the record is what Flush and
	// Close wait for and what a lookup from this process waits to read
	// (tracker.written).
	if b.status != nil && needsPendingRecord(&m, b.selfIndexed()) {
		b.status.hold(statusOf(&m, m.To, StatePending, b.agent))
		b.status.writeLater(msg, ack)
	}
	op.end(b.tel, ctx, nil, ack.Duplicate)
	return PubAck{ID: m.ID, Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// PublishFuture is the pending result of PublishAsync.
type PublishFuture struct {
	id      string
	subject string
	f       *asyncpub.Future
	b       *Bus
}

// ID is the ID of the published message.
func (f *PublishFuture) ID() string { return f.id }

// Wait blocks until the server acknowledged the message, or failed to, or
// ctx ended.
func (f *PublishFuture) Wait(ctx context.Context) (PubAck, error) {
	select {
	case <-f.f.Done():
	case <-ctx.Done():
		return PubAck{}, ctx.Err()
	}
	ack, err := f.f.Result()
	if err != nil {
		return PubAck{}, f.b.publishError(f.b.opts.scheme.Stream(), nil, f.id, err)
	}
	return PubAck{ID: f.id, Subject: f.subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// PublishAsync sends m without waiting for the server's ack; Wait on the
// returned future for it. At most WithMaxAsyncPending publishes are in
// flight: past that PublishAsync waits briefly, then fails with
// jetstream.ErrTooManyStalledMsgs, so a slow server never grows memory
// without bound. It validates and encodes m like Publish.
//
// ctx carries the conversation (inside a Handler, pass the handler's ctx, as
// for Publish) and the caller's span; it does not bound the call. The span
// ends when the message is handed to the connection, not at the server's
// ack. A future whose ack does not arrive within WithPublishAsyncTimeout
// (30 s) resolves with an error wrapping jetstream.ErrAsyncPublishTimeout,
// at most an eighth of the timeout later.
func (b *Bus) PublishAsync(ctx context.Context, m Message) (*PublishFuture, error) {
	if b.shards != nil {
		return b.shards.publishAsync(ctx, m)
	}
	return b.publishAsyncHere(ctx, m)
}

// publishAsyncHere is PublishAsync on this bus's own root.
func (b *Bus) publishAsyncHere(ctx context.Context, m Message) (*PublishFuture, error) {
	inherit(ctx, &m)
	msg, op, err := b.prepare(ctx, &m)
	if err != nil {
		return nil, err
	}
	// Held before the message goes out, so the ack finds it: the pending
	// record of a message that needs one (needsPendingRecord) is written
	// once the ack gives the stream sequence, as in Publish. Any other
	// message is not held; should its publish fail, its failed record is
	// made from the message (tracker.unsent).
	if b.status != nil && needsPendingRecord(&m, b.selfIndexed()) {
		b.status.hold(statusOf(&m, m.To, StatePending, b.agent))
	}
	f, err := b.pub.Publish(msg)
	if err != nil {
		b.status.release(msg)
		err = b.publishError(b.opts.scheme.Stream(), msg, m.ID, err)
		op.end(b.tel, ctx, err, false)
		b.recordUnsent(&m, err)
		return nil, err
	}
	op.end(b.tel, ctx, nil, false)
	return &PublishFuture{id: m.ID, subject: msg.Subject, f: f, b: b}, nil
}

// PublishAsyncComplete is closed when every asynchronous publish made so far
// has been acknowledged or has failed.
// The Bus of a Shards waits for the publishes of every shard it sent on.
func (b *Bus) PublishAsyncComplete() <-chan struct{} {
	if b.shards != nil {
		return b.shards.publishAsyncComplete()
	}
	return b.pub.Complete()
}

// Flush waits until the server has acknowledged, or the bus has given up
// on, every asynchronous publish and every lifecycle record this bus has
// sent so far, or until ctx ends, and returns ctx's error then. Lifecycle
// records are written asynchronously so that they never slow down the
// messages they describe; Flush is how a program makes sure they are
// stored, before it reads them back or before it exits.
//
// The Bus of a Shards flushes every shard it sent on.
func (b *Bus) Flush(ctx context.Context) error {
	if b.shards != nil {
		return b.shards.flush(ctx)
	}
	return b.flushHere(ctx)
}

// flushHere is Flush on this handle's own root.
func (c *client) flushHere(ctx context.Context) error {
	select {
	case <-c.pub.Complete():
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.status.flush(ctx)
}

// prepare fills m's defaults, starts its send span, which puts the trace
// context in m, and checks and encodes m as a NATS message. On error there
// is no span to end.
func (b *Bus) prepare(ctx context.Context, m *Message) (*nats.Msg, sendOp, error) {
	now := time.Now()
	return b.prepareAt(ctx, m, now, now)
}

// prepareAt is prepare, at now, for a message that leaves at start: now, or
// when its schedule fires; a conversation's deadline counts from then. A
// zero start (a recurring schedule) gives it no deadline. The clock is read
// once per message, by the caller: now is its default time and when its
// send began.
func (b *Bus) prepareAt(ctx context.Context, m *Message, now, start time.Time) (*nats.Msg, sendOp, error) {
	if b.isClosed() {
		return nil, sendOp{}, ErrClosed
	}
	if m.From == "" {
		m.From = b.agent
	} else if m.From != b.agent {
		return nil, sendOp{}, &codec.FieldError{Field: "From", Value: m.From, Err: fmt.Errorf("%w: a bus publishes as its own agent %q", ErrInvalidMessage, b.agent)}
	}
	m.SetDefaults(now)
	if !start.IsZero() {
		b.limitToConversation(ctx, m, start)
	}
	op := b.tel.startSend(ctx, m, now)
	msg, err := b.encode(m)
	if err != nil {
		op.abandon(err)
		return nil, sendOp{}, err
	}
	op.describe(b.opts.scheme, m, msg)
	return msg, op, nil
}

// encode checks m and encodes it as a NATS message.
func (b *client) encode(m *Message) (*nats.Msg, error) {
	var (
		h    nats.Header
		data []byte
		err  error
	)
	// Encode validates every field. The default codec is called directly:
	// through the interface m would escape to the heap, an allocation per
	// message; another codec gets a copy.
	if _, ok := b.opts.codec.(codec.Binary); ok {
		h, data, err = codec.Binary{}.Encode(m)
	} else {
		c := *m
		h, data, err = b.opts.codec.Encode(&c)
	}
	if err != nil {
		return nil, err
	}
	if id := m.ID; id[0] == ' ' || id[len(id)-1] == ' ' {
		// The server trims a header value's spaces: " a" and "a" would
		// deduplicate as one ID, and the second be dropped.
		return nil, &codec.FieldError{Field: "ID", Value: id,
			Err: fmt.Errorf("%w: a space at either end, which JetStream's Nats-Msg-Id header drops (the ID would deduplicate as another)", ErrInvalidMessage)}
	}
	subject, err := b.subjectOf(m)
	if err != nil {
		return nil, err
	}
	// The message and its Nats-Msg-Id value are one allocation. The keys
	// are canonical already; assigning skips Set's canonicalizing.
	out := &encoded{Msg: nats.Msg{Subject: subject, Header: h, Data: data}, id: [1]string{m.ID}}
	h[jetstream.MsgIDHeader] = out.id[:]
	if m.TTL > 0 && !expiresAtRecipient(m, b.indexed()) { // the time left: Time may lie in the past
		h[jetstream.MsgTTLHeader] = []string{ttlSeconds(time.Until(m.ExpiresAt()))}
	}
	return &out.Msg, nil
}

// encoded is a message encode made, with the value of its Nats-Msg-Id
// header.
type encoded struct {
	nats.Msg
	id [1]string
}

// indexed reports whether c sends direct messages on indexed subjects:
// with lifecycle tracking, unless WithoutIndex.
func (c *client) indexed() bool {
	return c.status != nil && c.opts.index
}

// selfIndexed reports whether the direct messages c sends are their own
// index (needsPendingRecord): on indexed subjects (indexed), and in binary
// mode, whose headers a lookup reads the message's status from without
// its data (pendingOf). A structured event's headers carry none of it:
// before 2026-11-28 such a message sent with no record read "no status"
// once another of its subject's window was stored, and History left it
// out.
func (c *client) selfIndexed() bool {
	_, structured := c.opts.codec.(codec.Structured)
	return c.indexed() && !structured
}

// subjectOf returns the subject c publishes m on: a broadcast's, or a
// direct message's; indexed, naming its ID and conversation so that a
// status lookup finds it in the stream (docs/subjects.md), if c tracks the
// lifecycle (indexed). A sender without lifecycle tracking sends plain
// direct subjects: each indexed message costs the server a subject-index
// entry of its own, in memory for as long as the stream keeps the message,
// and a fifth to a third of its publish rate (docs/performance-journal.md), which
// nobody who looks its messages up pays for.
func (c *client) subjectOf(m *Message) (string, error) {
	var (
		subject string
		err     error
	)
	switch s := c.opts.scheme; {
	case m.To == subjects.Broadcast:
		subject, err = s.Broadcast(m.From, m.Type, m.Priority)
	case c.indexed():
		subject, err = s.IndexedDirect(m.To, m.From, m.Type, m.Priority, m.ID, conversationOf(m))
	default:
		subject, err = c.directs.of(s, m.To, m.From, m.Type, m.Priority)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return subject, nil
}

// directSubjects remembers the plain direct subjects a client built, so
// that a sender without lifecycle tracking, which sends on them, checks and
// builds the subject of each recipient, type and priority once, not for
// every message: about 0.1 µs of its publish path (docs/performance-journal.md).
// It forgets them all when it holds maxDirectSubjects.
type directSubjects struct {
	m  sync.Map // directKey -> string; read without mu
	mu sync.Mutex
	n  int // subjects stored since m was last cleared, at least len(m)
}

type directKey struct {
	to, from, typ string
	priority      int
}

// maxDirectSubjects bounds a directSubjects: about 200 B each.
const maxDirectSubjects = 256

// of returns s.Direct(to, from, typ, priority).
func (d *directSubjects) of(s subjects.Scheme, to, from, typ string, priority int) (string, error) {
	k := directKey{to: to, from: from, typ: typ, priority: priority}
	if v, ok := d.m.Load(k); ok {
		return v.(string), nil
	}
	subject, err := s.Direct(to, from, typ, priority)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == maxDirectSubjects {
		d.m.Clear()
		d.n = 0
	}
	d.n++
	d.m.Store(k, subject)
	return subject, nil
}

// headerSize is the size of h on the wire: "NATS/1.0\r\n", a line
// "key: value\r\n" per value, and the closing "\r\n".
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// publishAttemptTimeout bounds one publish attempt when ctx allows longer.
// An attempt also ends when the connection reconnects: its ack, if the
// server sent it while the connection was down, never comes.
var publishAttemptTimeout = 5 * time.Second // a variable for the tests

// errCodeDuplicateInProcess is JetStream's "duplicate message id is in
// process": a copy with the same ID is being stored, as when a retry
// overtakes an attempt a new stream leader still works on.
const errCodeDuplicateInProcess jetstream.ErrorCode = 10158

// send publishes msg, retrying transient failures; every attempt carries
// the same Nats-Msg-Id, so the stream stores it once.
func (b *Bus) send(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	for attempt := 1; ; attempt++ {
		actx, stopWatching := ctx, func() {}
		if b.refusals != nil {
			actx, stopWatching = b.refusals.watch(ctx, msg.Subject)
		}
		actx, cancel := context.WithTimeout(actx, publishAttemptTimeout)
		watched := b.reconnects.watch(cancel)
		ack, err := b.js.PublishMsg(actx, msg)
		refused := context.Cause(actx)
		reconnected := watched.end()
		cancel()
		stopWatching()
		if err != nil && errors.Is(refused, ErrPermissionDenied) {
			return nil, refused
		}
		if err != nil && transient(err) {
			if denied := b.deniedPublish(msg.Subject); denied != nil {
				return nil, denied
			}
		}
		if err == nil || attempt >= b.opts.publishAttempts || ctx.Err() != nil || !transient(err) && !reconnected {
			return ack, err
		}
		b.opts.logger.Debug("publish retry", "subject", msg.Subject, "attempt", attempt, "error", err)
		t := time.NewTimer(publishBackoff(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// deniedPublish returns an error wrapping ErrPermissionDenied if the
// server's last error on the connection refused a publish to subject: how
// a bus on a connection it did not make (New) learns of a refusal, once
// the attempt has timed out (see refusals).
func (b *Bus) deniedPublish(subject string) error {
	if err := b.nc.LastError(); refusesPublish(err, subject) {
		return fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	}
	return nil
}

// transient reports whether a publish that failed with err may succeed if
// tried again.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == errCodeDuplicateInProcess || apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// recordUnsent records a message whose publish failed as failed, with the
// reason, so that the sender's Status says what became of it.
func (b *Bus) recordUnsent(m *Message, err error) {
	s := statusOf(m, m.To, StateFailed, b.agent)
	s.Reason = err.Error()
	b.status.record(s, true) // create only: a lost ack's message may be stored, and its recipient's record stands
}

// ttlSeconds renders d for Nats-TTL: whole seconds, rounded up so the server
// never removes a message before its expirytime, and at least the server's
// minimum of one second.
func ttlSeconds(d time.Duration) string {
	s := d / time.Second // rounded up below: d + time.Second - 1 overflowed near the longest d
	if d%time.Second > 0 {
		s++
	}
	return strconv.FormatInt(int64(max(s, 1)), 10) + "s"
}

// publishError says what became of the publish of msg (nil when only the
// ID is known), message id, to stream, that failed with err. An oversize
// message is measured here, on the error path, rather than before every
// publish: nats.go checks the size anyway.
func (b *Bus) publishError(stream string, msg *nats.Msg, id string, err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload) && msg != nil:
		hn := headerSize(msg.Header)
		return fmt.Errorf("publish %s: %w: %d bytes (data %d, headers %d), more than the server's max_payload of %d: %w",
			id, ErrPayloadTooLarge, hn+len(msg.Data), len(msg.Data), hn, b.nc.MaxPayload(), err)
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("publish %s: %w: %w", id, ErrPayloadTooLarge, err)
	case isAPIError(err, jetstream.JSErrCodeStreamMessageExceedsMaximum):
		return fmt.Errorf("publish %s: %w: more than stream %s's MaxMsgSize: %w", id, ErrPayloadTooLarge, stream, err)
	case isAPIError(err, jsErrCodeHeaderExceedsMaximum):
		return fmt.Errorf("publish %s: %w: headers over the server's 64 KiB: %w", id, ErrPayloadTooLarge, err)
	case errors.Is(err, nats.ErrConnectionClosed) && b.isClosed():
		return ErrClosed
	}
	return fmt.Errorf("publish %s: %w", id, b.streamMissing(stream, err))
}
