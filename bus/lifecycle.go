package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus/internal/asyncpub"
	"github.com/agentbus/agentbus/codec"
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
	// the server stored the message, with its stream sequence, and only if
	// no record exists, so it never overwrites a recipient's state.
	StatePending State = "pending"
	// StateDelivered: a recipient has received it and not finished with
	// it. Nobody writes it: a lookup reads it from the recipient's consumer,
	// which has delivered the message and not had it acknowledged.
	StateDelivered State = "delivered"
	// StateWorking: the recipient is handling it and reporting progress
	// (Delivery.Progress); Status.Progress counts the updates,
	// Status.LastProgress is the latest. A lookup reads completed once the
	// recipient's consumer has it acknowledged without a reply.
	StateWorking State = "working"
	// StateInputRequired: the recipient's handler asked for input
	// (Delivery.AskInput) and waits for the answer; it goes back to working
	// when the answer came.
	StateInputRequired State = "input_required"
	// StateReplied: the recipient answered it with Reply.
	StateReplied State = "replied"
	// StateCompleted: the recipient's handler succeeded without replying,
	// or a Request took it as its reply. For a direct message without a TTL
	// nobody writes it either: a lookup reads it from the recipient's
	// consumer, whose ack floor has passed the message (and then writes it
	// down).
	StateCompleted State = "completed"
	// StateFailed: the handler failed; the message will be delivered again
	// after a backoff. Reason says why.
	StateFailed State = "failed"
	// StateExpired: its TTL passed before it was handled. The server removes
	// such messages without a trace; the bus writes this state when a
	// recipient meets one, or when a lookup finds a pending message past its
	// expiry. A lookup also reads it, without writing it, for a request
	// delivered and not answered by its expiry.
	StateExpired State = "expired"
	// StateDeadLettered: it was moved to the dead-letter stream; Reason says
	// why.
	StateDeadLettered State = "dead_lettered"
	// StateCanceled: its sender, its recipient or an operator canceled it
	// (Bus.Cancel); Reason says who, and what a running handler returned.
	StateCanceled State = "canceled"
	// StateScheduled: stored by the server to be sent later (Bus.Schedule);
	// Status.Schedule says when, Status.FiresAt when next for a message
	// sent once. A lookup reads pending once that time passed. A recurring
	// schedule stays scheduled until canceled; each firing has a record of
	// its own.
	StateScheduled State = "scheduled"
)

// Final reports whether s is an end state: nothing moves a message out of
// it except a replay from the dead-letter stream or a later Reply.
func (s State) Final() bool {
	switch s {
	case StateReplied, StateCompleted, StateExpired, StateDeadLettered, StateCanceled:
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
	CausationID   string    `json:"causationId,omitempty"`
	State         State     `json:"state"`
	Time          time.Time `json:"time"`                  // the message's time
	ExpiresAt     time.Time `json:"expiresAt,omitzero"`    // Time + TTL
	Updated       time.Time `json:"updated"`               // when State was written
	By            string    `json:"by"`                    // the agent that wrote State
	Stream        string    `json:"stream,omitempty"`      // where the recipient got it
	Sequence      uint64    `json:"sequence,omitempty"`    // its stream sequence
	Deliveries    int       `json:"deliveries,omitempty"`  // deliveries so far
	Progress      int       `json:"progress,omitempty"`    // progress updates sent (StateWorking)
	LastProgress  time.Time `json:"lastProgress,omitzero"` // the latest of them
	Reason        string    `json:"reason,omitempty"`      // why it failed or was dead-lettered
	ReplyID       string    `json:"replyId,omitempty"`     // the reply, for StateReplied
	ReplyBy       time.Time `json:"replyBy,omitzero"`      // a Request's deadline (ExtReplyBy)
	Schedule      string    `json:"schedule,omitempty"`    // when a scheduled message fires (When.String)
	FiresAt       time.Time `json:"firesAt,omitzero"`      // when a message scheduled once fires

	revision uint64 // the record's sequence in the bucket when it was read
}

// Message returns the message s records, as far as Reply needs it: ID,
// sender, recipient, type, priority, conversation, causation and the
// requester's deadline. The CLI's "reply --to-message" answers a message
// found by Status this way.
func (s Status) Message() Message {
	m := Message{ID: s.ID, From: s.From, To: s.To, Type: s.Type, Priority: s.Priority,
		CorrelationID: s.CorrelationID, CausationID: s.CausationID, Time: s.Time}
	if !s.ReplyBy.IsZero() {
		m.Extensions = map[string]string{ExtReplyBy: s.ReplyBy.Format(time.RFC3339Nano)}
	}
	return m
}

// statusOf returns the record of m in state s, written by agent by.
func statusOf(m *Message, to string, s State, by string) Status {
	st := Status{
		ID: m.ID, From: m.From, To: to, Type: m.Type, Priority: m.Priority,
		CorrelationID: conversationOf(m), CausationID: m.CausationID,
		State: s, Time: m.Time, ExpiresAt: m.ExpiresAt(), Updated: time.Now().UTC(), By: by,
	}
	if v, ok := m.Extensions[ExtReplyBy]; ok {
		st.ReplyBy, _ = time.Parse(time.RFC3339Nano, v)
	}
	return st
}

// withDelivery fills in where d came from.
func (s Status) withDelivery(d *Delivery) Status {
	s.Stream, s.Sequence, s.Deliveries = d.Stream, d.Sequence, d.Deliveries
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
		Placement:   main.Placement,
	}, nil
}

// tracker writes the lifecycle states. Writes are asynchronous and never
// slow down or fail the message they describe; a failed write goes to the
// error handler. A nil *tracker tracks nothing.
type tracker struct {
	bucket     string
	prefix     string // "$KV.<bucket>."
	directGet  string // "$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.", then the key
	streamGet  string // "$JS.API.DIRECT.GET.<stream>.", then an indexed subject or filter
	nc         *nats.Conn
	reconnects *reconnects // nc's, the client's
	js         jetstream.JetStream
	reads      streamReads
	pub        *asyncpub.Publisher // writes the records
	onError    func(error)
	// live ends when the handle closes: so do the records' resends.
	live context.Context
	// resending counts the records being sent again (resend) after the
	// bucket did not answer, under resendMu, which close sets stopped
	// under; unanswered says that was reported, until a resend is stored.
	resendMu   sync.Mutex
	resending  sync.WaitGroup
	resends    int
	stopped    bool
	unanswered atomic.Bool

	// acking holds the pending records of asynchronous publishes
	// (needsPendingRecord) until the server's ack gives their stream
	// sequence and the record is written, by message ID. ackingDone is
	// closed when acking empties, for flush.
	mu         sync.Mutex
	acking     map[string]Status
	ackingDone chan struct{}
	// holding is len(acking), written under mu, so that the ack of a
	// publish that needs no record (most) is passed over without the lock.
	holding atomic.Int64
	// released is closed at the next release, for a lookup waiting on one
	// held record (written); nil while nobody waits.
	released chan struct{}
	// writes carries the pending records of sync publishes to the
	// goroutine that writes them, while it runs (nil otherwise); see
	// writeLater.
	writes chan ackedPublish

	scheme subjects.Scheme
	stream string // the messages stream, whose consumers tell progress

	// window reads the headers of the messages of filter, a filter of
	// indexed subjects that names recipient and sender (a window's, say),
	// as the tracker's owner may:
	// an operator with a consumer of its own (storedIn), an agent with its
	// history consumer for its side (Bus.storedBetween). Nil: not read.
	window func(ctx context.Context, filter, recipient, sender string) ([]Status, error)
}

func newTracker(nc *nats.Conn, o *options, live context.Context, rc *reconnects) (*tracker, error) {
	t := &tracker{bucket: o.scheme.StatusBucket(), nc: nc, reconnects: rc, onError: o.onError, live: live, acking: make(map[string]Status),
		scheme: o.scheme, stream: o.scheme.Stream()}
	t.prefix = o.scheme.StatusSubjectPrefix()
	t.directGet = o.scheme.StatusDirectGetPrefix()
	t.streamGet = o.scheme.StreamDirectGetPrefix()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	t.js = askingJS{js, rc}
	t.reads = streamReads{js: t.js, onError: t.onError, live: live}
	t.pub = asyncpub.New(nc, asyncpub.Options{
		MaxPending: o.maxAsyncPending,
		Timeout:    o.asyncTimeout,
		OnError:    t.failed,
		// A record is the same when stored twice (a put; a create or an
		// update that expects a sequence fails the second time, which
		// failed passes over): one lost with a dropped connection would
		// otherwise leave a wrong state for good.
		SendAgainOnReconnect: true,
		Refused:              rc.refusal,
	})
	return t, nil
}

// close stops writing records, failing those in flight, and waits for the
// resends, which the handle's live context, ended first, ends.
func (t *tracker) close() {
	if t != nil {
		t.pub.Close()
		t.resendMu.Lock()
		t.stopped = true // no resend starts after this
		t.resendMu.Unlock()
		t.resending.Wait()
	}
}

// maxResends bounds the records sent again at once (resend); past it a
// record the bucket did not take is reported lost.
const maxResends = 1024

// resendFor is how long a record the bucket did not take is sent again
// for: longer than a replicated bucket's election after its leader's
// crash (4 to 9 s on the 3-node cluster of deploy/).
const resendFor = 30 * time.Second

// failed reports a failed write, except a pending record that lost to a
// later state (the create found the key taken). A record the bucket did
// not answer (no leader, as while a replicated bucket elects one) is sent
// again (resend): before 2026-11-28 it was lost, reported as a bucket
// not provisioned, and every such failure after it on the handle passed
// over in silence.
func (t *tracker) failed(m *nats.Msg, err error) {
	if isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) || isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return
	}
	if unanswered(err) && t.startResend(m) {
		return
	}
	t.onError(fmt.Errorf("record status %s: %w", m.Subject, err))
}

// startResend starts the resend of record m, unless the tracker closed or
// maxResends are under way.
func (t *tracker) startResend(m *nats.Msg) bool {
	t.resendMu.Lock()
	defer t.resendMu.Unlock()
	if t.stopped || t.live.Err() != nil || t.resends >= maxResends {
		return false
	}
	t.resends++
	t.resending.Go(func() { t.resend(m) })
	return true
}

// unanswered reports whether a write failed for want of an answer: no
// responders, no response or no ack in time, or the API's 503.
func unanswered(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, context.DeadlineExceeded) || unavailableAPI(err)
}

// resend sends record m again, every half second for up to resendFor,
// until it is stored or the handle closes. A record is the same when
// stored twice (a put; a create or an update that expects a revision then
// fails, which failed passes over). The first record that still finds no
// answer is reported, and no other until one is stored.
func (t *tracker) resend(m *nats.Msg) {
	defer func() {
		t.resendMu.Lock()
		t.resends--
		t.resendMu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(t.live, resendFor)
	defer cancel()
	var err error
	for {
		actx, stop := context.WithTimeout(ctx, 2*time.Second)
		_, err = t.js.PublishMsg(actx, m)
		stop()
		if err == nil {
			t.unanswered.Store(false)
			return
		}
		if isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) || isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return // a later state was stored meanwhile
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
			continue
		}
		break
	}
	if t.live.Err() != nil || t.unanswered.Swap(true) {
		return // closed; or reported, and not answered since
	}
	t.onError(fmt.Errorf("record status %s: %w: status bucket %s did not take it for %v (no leader; or not provisioned: run 'agentbus provision'): %w",
		m.Subject, ErrUnavailable, t.bucket, resendFor, err))
}

// needsPendingRecord reports whether the sender writes the pending record
// of m, sent on an indexed subject or not: for a broadcast, whose subject
// has no index and whose record stands for every recipient, a message
// with a TTL that the server removes at its expiry without a trace (its
// record is then what says it expired), and a message without an index
// (WithoutIndex). Any other direct message is its own index: a lookup
// finds it by its subject and reads pending off the stored message
// (index.go), so its sender writes nothing.
func needsPendingRecord(m *Message, indexed bool) bool {
	return m.To == Broadcast || !indexed || m.TTL > 0 && !expiresAtRecipient(m, indexed)
}

// expiresAtRecipient reports whether m, sent on an indexed subject or not,
// stays in the stream past its expiry, to be dropped unread by its
// recipient (who records it expired), instead of being removed by the
// server (Nats-TTL): a direct message of a Request's exchange (it carries
// ExtReplyBy) on an indexed subject. The stored message then stays its own
// index, and a lookup derives its state from it and from its recipient's
// consumer (derive): pending, delivered, expired, or replied when the reply
// Reply sent under the derived ID (replyIDOf) is stored. A round trip
// writes no pending record that way.
func expiresAtRecipient(m *Message, indexed bool) bool {
	_, exchange := m.Extensions[ExtReplyBy]
	return exchange && indexed && m.To != Broadcast
}

// recordPending writes the sender's pending record s of a message the
// server stored as ack says. The record holds the stream sequence, by which
// a lookup reads the recipient's progress from its consumer. It is only
// created, never overwrites: a recipient's state written first wins.
func (t *tracker) recordPending(s Status, ack *jetstream.PubAck) {
	if t == nil {
		return
	}
	s.Stream, s.Sequence = ack.Stream, ack.Sequence
	t.record(s, true)
}

// hold holds the pending record s of a publish until its ack arrives
// (acked) or the publish fails (unsent).
func (t *tracker) hold(s Status) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.acking[s.ID] = s
	t.holding.Store(int64(len(t.acking)))
	t.mu.Unlock()
}

// held returns the record held for the message m.
func (t *tracker) held(m *nats.Msg) (Status, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.acking[heldID(m)]
	return s, ok
}

// heldID returns the ID of m, a message the bus encoded: its Nats-Msg-Id,
// read without Header.Get's canonicalizing, since encode wrote the key in
// its canonical form.
func heldID(m *nats.Msg) string {
	if v := m.Header[jetstream.MsgIDHeader]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// release drops the record held for the message m, once written or when
// the publish failed before it went out.
func (t *tracker) release(m *nats.Msg) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.acking, heldID(m))
	t.holding.Store(int64(len(t.acking)))
	if len(t.acking) == 0 && t.ackingDone != nil {
		close(t.ackingDone)
		t.ackingDone = nil
	}
	if t.released != nil {
		close(t.released)
		t.released = nil
	}
}

// written waits until the pending record of message id, if this process
// holds one, is under way, so that a lookup right after a publish reads
// it; or until ctx ends.
func (t *tracker) written(ctx context.Context, id string) {
	for {
		t.mu.Lock()
		if _, ok := t.acking[id]; !ok {
			t.mu.Unlock()
			return
		}
		if t.released == nil {
			t.released = make(chan struct{})
		}
		released := t.released
		t.mu.Unlock()
		select {
		case <-released:
		case <-ctx.Done():
			return
		}
	}
}

// acked is the bus's asynchronous ack handler: it writes the pending
// record of m, which the server stored as ack says. It runs on nats.go's
// ack goroutine and does not block but when the status bucket's own
// asynchronous writes are stalled. The record stays held until its write
// is under way: nats.go resolves the publish's future before it calls this,
// and a flush must not find nothing to wait for in between.
func (t *tracker) acked(m *nats.Msg, ack *jetstream.PubAck) {
	// Holding nothing, the lock and the look-up are not needed: a record
	// is held before its publish goes out, so before its ack comes.
	if t == nil || t.holding.Load() == 0 {
		return
	}
	if s, ok := t.held(m); ok {
		t.recordPending(s, ack)
		t.release(m)
	}
}

// ackedPublish is a publish the server acknowledged, whose held pending
// record is still to be written.
type ackedPublish struct {
	m   *nats.Msg
	ack *jetstream.PubAck
}

// maxQueued bounds the records waiting for writeLater's goroutine; past
// it the caller writes its own, which slows a publisher that outruns them.
const maxQueued = 1024

// writerIdle is how long writeLater's goroutine waits for another record
// before it exits.
const writerIdle = 100 * time.Millisecond

// writeLater has the held pending record of m, which the server stored as
// ack says, written by a goroutine of the tracker's (acked), so that a sync
// publisher does not wait for it. The goroutine starts with the first
// record, writes them in order and exits once none came for writerIdle: an
// idle bus has none.
func (t *tracker) writeLater(m *nats.Msg, ack *jetstream.PubAck) {
	t.mu.Lock()
	if t.writes == nil {
		t.writes = make(chan ackedPublish, maxQueued)
		go t.writeQueued(t.writes)
	}
	select {
	case t.writes <- ackedPublish{m, ack}:
		t.mu.Unlock()
	default: // full
		t.mu.Unlock()
		t.acked(m, ack)
	}
}

// writeQueued writes the records sent on writes until none came for
// writerIdle. Records are sent, and the decision to exit taken, under t.mu,
// so none is left behind.
func (t *tracker) writeQueued(writes chan ackedPublish) {
	idle := time.NewTimer(writerIdle)
	defer idle.Stop()
	for {
		select {
		case p := <-writes:
			t.acked(p.m, p.ack)
			idle.Reset(writerIdle)
		case <-idle.C:
			t.mu.Lock()
			if len(writes) > 0 {
				t.mu.Unlock()
				idle.Reset(writerIdle)
				continue
			}
			t.writes = nil
			t.mu.Unlock()
			return
		}
	}
}

// unsent records an asynchronous publish that failed with err as failed.
func (t *tracker) unsent(m *nats.Msg, err error) {
	if t == nil {
		return
	}
	// A message held no record for (needsPendingRecord) has its status
	// made from the message itself, which the bus encoded.
	s, ok := t.held(m)
	if !ok {
		if s, ok = t.pendingOf(m.Subject, m.Header, m.Data); !ok {
			return
		}
	}
	s.State, s.Reason = StateFailed, err.Error()
	// Create only: a failed future does not say the server did not store
	// the message (an ack lost with the connection), and a state its
	// recipient wrote since stands. It was overwritten.
	t.record(s, true)
	t.release(m)
}

// flush waits until every record written so far is stored or has failed.
// The bus's asynchronous publishes must be complete first: their acks
// write records; flush then waits for the ack handlers still writing them.
func (t *tracker) flush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	var writing chan struct{}
	if len(t.acking) > 0 {
		if t.ackingDone == nil {
			t.ackingDone = make(chan struct{})
		}
		writing = t.ackingDone
	}
	t.mu.Unlock()
	if writing != nil {
		select {
		case <-writing:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-t.pub.Complete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// update writes s only if the record is still at revision rev, the one it
// was read at: a state derived from what was read never overwrites one a
// recipient wrote in the meantime.
func (t *tracker) update(s Status, rev uint64) {
	t.write(s, strconv.FormatUint(rev, 10))
}

// record writes s. With create it is written only if the record does not
// exist yet, so a sender's pending never overwrites a recipient's state.
// It returns the write's future, nil if nothing was written.
func (t *tracker) record(s Status, create bool) *asyncpub.Future {
	expect := ""
	if create {
		expect = "0"
	}
	return t.write(s, expect)
}

// updateStored writes s only if the record is still at revision rev and
// waits until the bucket stored it: the error says when it was not.
//
// A write whose ack was lost with the connection is sent again on
// reconnect (asyncpub.Options.SendAgainOnReconnect), and then fails on
// its expected revision, its own record in the way. So a failed write
// reads the record, and one that is s itself was stored.
func (t *tracker) updateStored(ctx context.Context, s Status, rev uint64) error {
	if t == nil {
		return fmt.Errorf("%w: lifecycle tracking is off", ErrInvalidOption)
	}
	f := t.write(s, strconv.FormatUint(rev, 10))
	if f == nil {
		return fmt.Errorf("record %s could not be written", s.ID)
	}
	select {
	case <-f.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	_, err := f.Result()
	if isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) {
		m := s.Message()
		if now, gerr := t.get(ctx, &m, s.To); gerr == nil && now.State == s.State && now.By == s.By && now.Updated.Equal(s.Updated) {
			return nil
		}
	}
	return err
}

// recordStored writes s like record(s, false) and waits until the bucket
// stored it or ctx ends. A handler's Reply does, so that the record is
// replied before the handled message is acknowledged: a lookup in between
// would otherwise read completed from the consumer, and write it.
func (t *tracker) recordStored(ctx context.Context, s Status) {
	if f := t.write(s, ""); f != nil {
		select {
		case <-f.Done(): // a failure is reported by the error handler
		case <-ctx.Done():
		}
	}
}

// write writes s, with expect, if not empty, as the record's expected
// last revision ("0": it must not exist), and returns the write's future
// (nil if nothing was written).
func (t *tracker) write(s Status, expect string) *asyncpub.Future {
	if t == nil {
		return nil
	}
	key, err := subjects.StatusKey(s.CorrelationID, s.ID, s.From, s.To)
	if err != nil {
		t.onError(fmt.Errorf("record status of %s: %w", s.ID, err))
		return nil
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.onError(fmt.Errorf("record status of %s: %w", s.ID, err))
		return nil
	}
	m := &nats.Msg{Subject: t.prefix + key, Data: data}
	if expect != "" {
		m.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{expect}}
	}
	f, err := t.pub.Publish(m)
	if err != nil {
		t.failed(m, err)
		return nil
	}
	return f
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
	t.written(ctx, m.ID)
	resp, err := directGet(ctx, t.nc, t.reconnects, t.directGet+key)
	if errors.Is(err, nats.ErrNoResponders) {
		return Status{}, &notProvisionedError{stream: t.bucket, bucket: true, cause: err}
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
	// The key was made of these (ownsKey, without making it again).
	if s.ID != m.ID || s.From != m.From || s.To != to || s.CorrelationID != conversationOf(m) {
		t.onError(fmt.Errorf("record %s ignored: it names another message (%s from %s to %s)", key, s.ID, s.From, s.To))
		return Status{}, fmt.Errorf("%w: %s", ErrNoStatus, m.ID)
	}
	s.revision, _ = strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	return s, nil
}

// canceled reports whether m's record at recipient to says canceled. A
// record that has not ended is also looked for among the states the bucket
// keeps of it (its history, 10 by default): a progress update of the
// running handler, recorded just after the cancel, can have written
// working over it. A message without a record, as a direct message on its
// indexed subject is while it runs, was not canceled: Cancel writes one.
func (t *tracker) canceled(ctx context.Context, m *Message, to string) (bool, error) {
	st, err := t.get(ctx, m, to)
	if errors.Is(err, ErrNoStatus) {
		return false, nil
	}
	if err != nil || st.State.Final() {
		return err == nil && st.State == StateCanceled, err
	}
	key, err := subjects.StatusKey(conversationOf(m), m.ID, m.From, to)
	if err != nil {
		return false, err
	}
	found := false
	err = t.scan(ctx, key, jetstream.DeliverAllPolicy, func(_ string, s Status) {
		found = found || s.State == StateCanceled
	})
	return found, err
}

// read returns the current record of every key matching one of filters,
// brought up to date and sorted (settle): records past their expiry while
// still pending or failed are returned, and written back, as expired.
func (t *tracker) read(ctx context.Context, filters ...string) ([]Status, error) {
	out, err := t.records(ctx, filters...)
	if err != nil {
		return nil, err
	}
	t.settle(ctx, out)
	return out, nil
}

// records returns the last record of every key matching one of filters,
// each read with a reader of its own (newReader: a single filter, so that
// server permissions can pin it).
func (t *tracker) records(ctx context.Context, filters ...string) ([]Status, error) {
	var out []Status
	seen := make(map[string]bool) // an agent's two filters meet on a message to itself
	for _, f := range filters {
		err := t.scan(ctx, f, jetstream.DeliverLastPerSubjectPolicy, func(key string, s Status) {
			if !seen[key] {
				seen[key] = true
				out = append(out, s)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// settle brings the statuses in out up to date (derive) and sorts them
// by the messages' time, ID and recipient.
func (t *tracker) settle(ctx context.Context, out []Status) {
	t.derive(ctx, out)
	slices.SortFunc(out, func(a, b Status) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.ID, b.ID), cmp.Compare(a.To, b.To))
	})
}

// scan passes to add every record of a key matching filter that policy
// selects (the last of each key, or every state kept) with its key's
// subject, read once with a reader of its own (readStream) of a single
// filter, so that server permissions can pin it.
func (t *tracker) scan(ctx context.Context, filter string, policy jetstream.DeliverPolicy, add func(subject string, s Status)) error {
	cfg := jetstream.ConsumerConfig{FilterSubject: t.prefix + filter, DeliverPolicy: policy}
	err := t.reads.readStream(ctx, "KV_"+t.bucket, cfg, recordsTo(t.prefix, t.onError, add))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &notProvisionedError{stream: t.bucket, bucket: true, cause: err}
	case err != nil:
		return fmt.Errorf("read status %s: %w", filter, err)
	}
	return nil
}

// derive brings the records in out that are not final up to date from what
// the server knows, and writes back the final states it finds. A request
// whose reply is stored under the derived ID is replied (replied). A recipient
// writes no record when it handles a direct message (see
// completionRecorded): the stored message, or the sender's record, gives the
// message's stream sequence, and the recipient's consumer of the message's
// priority tells how far the recipient has got. A message at or below the
// consumer's ack floor is completed (for a message with a TTL, whose
// completion is recorded, it was removed unread at its expiry, if that has
// passed; before it, the recipient settled it after the record was read, and
// its own record says how); one the consumer has delivered but not yet acked
// is delivered; a message still pending past its expiry has expired, an
// answer not written back, as only the reader's clock says so. A
// failed record moves on the same way once a later delivery succeeded. A
// consumer that cannot be read (it does not exist yet, or the reader may not
// see it) leaves the record as it is.
//
// The record is read before what the server knows, so an update written in
// between, such as the record of a handler's last progress update, would
// be missing from the final state derived; the record is read again before
// a final state is written back, and the state derived anew from it if it
// has moved. The write-back is conditional on the revision it derives
// from, so a stale state is never stored, and the answer is not stale
// either.
func (t *tracker) derive(ctx context.Context, out []Status) {
	t.deriveAt(ctx, out, time.Now())
}

// deriveAt is derive on a clock that reads now.
func (t *tracker) deriveAt(ctx context.Context, out []Status, now time.Time) {
	floors := make(map[string]*jetstream.ConsumerInfo) // by consumer name; nil if unreadable
	for i, read := range out {
		s, write := t.deriveOne(ctx, floors, now, read)
		if write {
			m := &Message{ID: read.ID, From: read.From, CorrelationID: read.CorrelationID}
			if cur, err := t.get(ctx, m, read.To); err == nil && cur.revision != read.revision {
				read = cur
				s, write = t.deriveOne(ctx, floors, now, read)
			}
		}
		if write {
			t.update(s, read.revision)
		}
		out[i] = s
	}
}

// deriveOne is derive of one record, read: the status it has now, and
// whether that is a final state the record does not say yet, to be written
// back. floors caches the recipients' consumers, by name.
func (t *tracker) deriveOne(ctx context.Context, floors map[string]*jetstream.ConsumerInfo, now time.Time, read Status) (Status, bool) {
	if r, ok := t.replied(ctx, read); ok {
		return r, true
	}
	s := read
	switch s.State {
	case StatePending, StateDelivered, StateFailed, StateWorking, StateInputRequired:
	case StateScheduled:
		if s.FiresAt.IsZero() || now.Before(s.FiresAt) {
			return s, false
		}
		// Fired: the server stored it for the recipient, whose handling
		// writes its record (completionRecorded).
		s.State = StatePending
	default:
		return s, false
	}
	if s.To != Broadcast && s.Sequence > 0 && s.Stream == t.stream {
		if info := t.consumerOf(ctx, floors, s.To, s.Priority); info != nil {
			switch {
			case s.Sequence <= info.AckFloor.Stream && s.ExpiresAt.IsZero() && s.Deliveries <= 1:
				// A redelivery's recipient records its completion itself
				// (completionRecorded): past the ack floor without it, the
				// server gave the message up (unsettled), unhandled.
				s.State, s.Reason = StateCompleted, ""
			case s.Sequence <= info.AckFloor.Stream && !s.ExpiresAt.IsZero() && now.After(s.ExpiresAt):
				s.State, s.Reason = StateExpired, "removed at its expiry before it was handled"
			case s.Sequence <= info.Delivered.Stream && s.State == StatePending:
				s.State = StateDelivered
			}
			if s.State != read.State {
				// The consumer does not count deliveries per message; a
				// recipient records a completion after a redelivery
				// itself, so this was at least the first.
				s.Updated, s.By, s.Deliveries = now.UTC(), s.To, max(s.Deliveries, 1)
			}
		}
	}
	if (s.State == StatePending && s.To != Broadcast || s.State == StateFailed) && !s.ExpiresAt.IsZero() && now.After(s.ExpiresAt) {
		// Derived, not written: only this reader's clock says so. A
		// reader whose clock ran ahead wrote expired over a message still
		// live for its sender and recipient, and the recipient then
		// dropped it unhandled as settled (before 2026-11-28). The
		// recipient records expired itself when it gets the message after
		// its expiry; every reader whose clock is right derives the same.
		s.State, s.Updated, s.Reason = StateExpired, now.UTC(), "TTL passed before it was handled"
		return s, false
	}
	if s.State == StateDelivered && !s.ReplyBy.IsZero() && !s.ExpiresAt.IsZero() && now.After(s.ExpiresAt) {
		// A request stays in the stream past its expiry
		// (expiresAtRecipient), where the server used to remove it:
		// delivered and not answered by then, it expired for its
		// requester. Not written: a handler still running may reply late
		// (replied), and a process of the recipient that gets it again
		// drops it and records expired itself.
		s.State, s.Updated, s.Reason = StateExpired, now.UTC(), reasonUnanswered
		return s, false
	}
	return s, s.State.Final() && s.State != read.State
}

// reasonUnanswered is the reason of a request that a lookup finds
// expired, delivered and not answered by its reply-by: derived, not
// written, as its handler may still reply late (Attach waits for that).
const reasonUnanswered = "delivered, and not answered by its expiry"

// replied returns s, the status of a request, replied, when the reply that
// Reply sent it under the derived ID is stored (replyOf): a handler's Reply
// writes no record. It looks only at a request (it carries a reply-by)
// that has not ended, or that a Cancel ended while its handler went on to
// reply (the work was done, as Cancel says).
func (t *tracker) replied(ctx context.Context, s Status) (Status, bool) {
	switch s.State {
	case StatePending, StateDelivered, StateFailed, StateWorking, StateInputRequired, StateCanceled:
	default:
		return s, false
	}
	if s.ReplyBy.IsZero() || s.To == Broadcast || s.Type == TypeProgress || s.ID == replyIDOf(s.CausationID) {
		return s, false // not a request: a reply, or a progress update, of one
	}
	r, ok := t.replyOf(ctx, s.ID, s.From, s.To)
	if !ok {
		return s, false
	}
	s.State, s.ReplyID, s.Updated, s.By, s.Reason = StateReplied, r.ID, r.Updated, s.To, ""
	return s, true
}

// replyOf returns the pending status of the reply to request id, which
// from sent to to, that Reply sent under the derived ID (replyIDOf), if it
// is stored. It reads the reply off its indexed subject by a filter naming
// both agents, which either may read: the last message of the subject, and
// where that is another one, every message of the filter (window).
func (t *tracker) replyOf(ctx context.Context, id, from, to string) (Status, bool) {
	rid := replyIDOf(id)
	// The reply goes the other way: to the request's sender, from its
	// recipient.
	filter, err := t.scheme.MessageFilterBetween(rid, from, to)
	if err != nil {
		return Status{}, false
	}
	found, others, err := t.stored(ctx, rid, filter)
	if err != nil {
		return Status{}, false
	}
	if len(found) == 0 && others && t.window != nil {
		// Another message between the two came later in the window (or
		// names the reply's ID without carrying it).
		all, err := t.window(ctx, filter, from, to)
		if err != nil {
			return Status{}, false
		}
		found = lastOfEach(all, rid)
	}
	if len(found) == 0 {
		return Status{}, false
	}
	return found[0], true
}

// consumerInfoTimeout bounds a lookup's read of one consumer's state.
const consumerInfoTimeout = 2 * time.Second

// consumerOf returns the info of the consumer that delivers agent's direct
// messages of priority, read once per lookup into floors, or nil if it
// cannot be read.
func (t *tracker) consumerOf(ctx context.Context, floors map[string]*jetstream.ConsumerInfo, agent string, priority int) *jetstream.ConsumerInfo {
	cs, err := t.scheme.Consumers(agent)
	if err != nil || priority < subjects.HighestPriority || priority > subjects.LowestPriority {
		return nil
	}
	name := cs[priority-1].Name
	if info, ok := floors[name]; ok {
		return info
	}
	// Bounded on its own: a server that refuses the request (an agent
	// whose permissions predate this lookup) does not answer, and the
	// record is then returned as written.
	ctx, cancel := context.WithTimeout(ctx, consumerInfoTimeout)
	defer cancel()
	var info *jetstream.ConsumerInfo
	if c, err := t.js.Consumer(ctx, t.stream, name); err == nil {
		info = c.CachedInfo()
	}
	floors[name] = info
	return info
}

// recordsTo returns a reader's callback (readStream) that passes each
// record of the status bucket, whose subjects begin with prefix, to add
// with its subject. A record that is not one, or names another message
// than its key (ownsKey), is passed over and reported to onError: an agent
// may write the keys that name it, and what it writes there must not
// keep others from reading theirs.
func recordsTo(prefix string, onError func(error), add func(subject string, s Status)) func(jetstream.Msg, *jetstream.MsgMetadata) (bool, error) {
	return func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		if op := m.Headers().Get("KV-Operation"); op != "" {
			return false, nil // a delete or purge marker
		}
		key := strings.TrimPrefix(m.Subject(), prefix)
		var s Status
		if err := json.Unmarshal(m.Data(), &s); err != nil {
			onError(fmt.Errorf("record %s ignored: %w", key, err))
			return false, nil
		}
		if !ownsKey(s, key) {
			onError(fmt.Errorf("record %s ignored: it names another message (%s from %s to %s)", key, s.ID, s.From, s.To))
			return false, nil
		}
		s.revision = md.Sequence.Stream
		add(m.Subject(), s)
		return false, nil
	}
}

// recordOf names a message's record: its ID, sender and recipient.
type recordOf struct{ id, from, to string }

// ownsKey reports whether record s names the message, sender and
// recipient its key does. The key is what server permissions check (an
// agent may write only the keys that name it), not the record: one an
// agent wrote under its own key about others' messages is ignored.
func ownsKey(s Status, key string) bool {
	want, err := subjects.StatusKey(s.CorrelationID, s.ID, s.From, s.To)
	return err == nil && want == key
}

// Status returns the lifecycle records of message id that name this bus's
// agent, as sender or recipient: for a direct message its one record, for a
// broadcast the sender's and every recipient's (to the sender) or the
// agent's own (to a recipient). These are the records an agent's server
// permissions let it read (docs/security.md). The messages this bus
// published and the records it wrote before the call are among them (it
// waits for them, as Flush does). A direct
// message is found by its indexed subject (docs/subjects.md) and its
// record read by key; a broadcast, or a message whose subject has no index,
// by a look through the bucket's keys. It returns ErrNoStatus when there
// are none, or the error that kept it from reading the stream
// (ErrNoStatus says the message is not there; that error, that it is not
// known). An id no message can have (codec.ValidateID) fails with
// ErrInvalidMessage.
func (b *Bus) Status(ctx context.Context, id string) ([]Status, error) {
	if b.shards != nil {
		return b.shards.status(ctx, id)
	}
	return b.statusHere(ctx, id)
}

// statusHere is Status on this bus's own root.
func (b *Bus) statusHere(ctx context.Context, id string) ([]Status, error) {
	if err := codec.ValidateID("ID", id); err != nil {
		return nil, err
	}
	filters, err := subjects.StatusKeysOfAgent(id, b.agent)
	if err != nil {
		return nil, err
	}
	// Read this bus's own writes: the messages it published and the
	// records it wrote just now are stored before the lookup.
	fctx, cancel := withDefaultTimeout(ctx)
	err = b.flushHere(fctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("status of %s: waiting for this bus's publishes and records to be stored: %w", id, err)
	}
	return b.lookup(ctx, id, filters, func(ctx context.Context) ([]Status, error) {
		return b.findOwn(ctx, id)
	})
}

// Status returns every lifecycle record of message id, whoever sent or
// received it, or ErrNoStatus. A direct message is found by its indexed
// subject; any other by reading the whole status bucket's keys for the
// ID, which an operator may and an agent may not. An id no message can
// have fails with ErrInvalidMessage.
func (b *Admin) Status(ctx context.Context, id string) ([]Status, error) {
	if err := codec.ValidateID("ID", id); err != nil {
		return nil, err
	}
	return b.lookup(ctx, id, []string{subjects.StatusKeysOfMessage(id)}, func(ctx context.Context) ([]Status, error) {
		return b.status.find(ctx, id)
	})
}

// streamLookupTimeout bounds a lookup's read of the stream by indexed
// subject, before it turns to the records.
const streamLookupTimeout = 2 * time.Second

// lookup returns the statuses of message id: of the messages find finds in
// the stream by their indexed subjects, with their records read by key,
// or if it finds none, the records whose keys match records.
func (b *client) lookup(ctx context.Context, id string, records []string, find func(context.Context) ([]Status, error)) ([]Status, error) {
	if b.status == nil {
		return nil, fmt.Errorf("%w: lifecycle tracking is off", ErrInvalidOption)
	}
	if b.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	// The stream is asked on its own time: a refusal of its direct gets
	// or of the consumers that read a window (permissions from before the
	// index, or an agent's, which allow no batch and no consumer of every
	// agent's subjects), a stream provisioned before the index (none
	// answers) or one that does not answer leaves the lookup to the
	// records. Where they name nothing either, the last is an error, not
	// ErrNoStatus (streamUnread).
	sctx, stopS := b.watchRefusals(ctx, "$JS.API.")
	sctx, cancelS := context.WithTimeout(sctx, streamLookupTimeout)
	found, serr := find(sctx)
	serr = refusedCall(sctx, serr)
	cancelS()
	stopS()
	if serr != nil && ctx.Err() != nil {
		return nil, serr
	}
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	var (
		out []Status
		err error
	)
	if len(found) > 0 {
		if out, err = b.status.withRecords(ctx, found); err == nil {
			b.status.settle(ctx, out)
		}
	} else {
		out, err = b.status.read(ctx, records...)
	}
	if err != nil {
		return nil, refusedCall(ctx, err)
	}
	if len(out) == 0 {
		if streamUnread(serr) {
			return nil, fmt.Errorf("status of %s: no record names it, and %w: %w", id, errStreamUnread, serr)
		}
		return nil, fmt.Errorf("%w: %s", ErrNoStatus, id)
	}
	return out, nil
}

// errStreamUnread is wrapped by the error of a lookup that could not read
// the stream and found no record (streamUnread): the message may be there.
var errStreamUnread = errors.New("the stream could not be read")

// streamUnread reports whether err, what a lookup's read of the stream
// failed with, leaves the message's existence unknown: any failure but a
// refusal of the reader's permissions, or a stream that cannot be read by
// indexed subject (provisioned before the index: no direct get answers).
// A lookup that found no record then returns err, not ErrNoStatus.
func streamUnread(err error) bool {
	return err != nil && !errors.Is(err, ErrPermissionDenied) && !errors.Is(err, nats.ErrNoResponders) &&
		!errors.Is(err, ErrNotProvisioned)
}

// Conversation returns the lifecycle record of every message of the
// conversation correlationID names, in the order the messages were created.
// It reads only the conversation's keys, which share a prefix, so its cost
// grows with the conversation, not with the bucket (docs/observability.md).
// It reads keys of every agent, as an operator may.
func (b *Admin) Conversation(ctx context.Context, correlationID string) ([]Status, error) {
	if b.status == nil {
		return nil, fmt.Errorf("%w: lifecycle tracking is off", ErrInvalidOption)
	}
	if b.isClosed() {
		return nil, ErrClosed
	}
	if err := codec.ValidateID("CorrelationID", correlationID); err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	out, err := b.status.records(ctx, subjects.StatusKeysOfConversation(correlationID))
	if err != nil {
		return nil, refusedCall(ctx, err)
	}
	stored, err := b.status.conversation(ctx, correlationID)
	if err != nil {
		return nil, refusedCall(ctx, err)
	}
	out = withStored(out, stored)
	b.status.settle(ctx, out)
	return out, nil
}
