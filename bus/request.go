package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/subjects"
)

// ExtReplyBy is the CloudEvents extension a Request sets on its request
// and Reply copies onto the reply: the time, RFC 3339, until which the
// requester waits. A reply that reaches the requester's handler after it is
// marked Late.
const ExtReplyBy = "replyby"

// Request publishes m and waits for its reply: the first message from m's
// recipient to the bus's agent whose CausationID (causationid) is m's ID, as
// Reply sends it and as any message published inside the handler of m is
// (see Publish); a message from another agent is not taken for it. m
// needs one recipient, not Broadcast. Without a deadline on ctx it waits
// WithRequestTimeout (by default the protocol's request timeout, or 5
// minutes).
//
// Deadlines: the deadline of ctx is the request's reply-by (ExtReplyBy).
// The request expires at it (its TTL is set from the time remaining, or
// kept if shorter): met after it, its recipient drops it unread, and its
// status reads expired. With lifecycle tracking it is sent without
// Nats-TTL, so that it stays in the stream as its own index and needs no
// pending record; without, the server removes it at its expiry. Request
// returns a *DeadlineError (errors.Is ErrRequestTimeout) when a deadline
// passes: the reply-by, a do-by
// (DoBy: the handler's context ends there too) or an idle timeout
// (IdleTimeout, reset by each progress update). A request canceled while
// Request waits (Cancel, by its recipient, an operator or another process
// of the agent too) returns a *CanceledError (errors.Is ErrCanceled). A
// request dead-lettered while Request waits (its handler rejected it,
// failed on every delivery allowed, or never settled it) returns a
// *DeadLetteredError (errors.Is ErrDeadLettered), from the notice its
// recipient, or an operator's dead-letter watcher, sends (TypeDeadLettered).
// Close ends a Request still waiting with an error wrapping ErrClosed; its
// reply, when it comes, goes to a handler of the agent like any late
// reply.
//
// The reply travels through JetStream like any message, and is processed
// once: Request takes it as it is published, from a subscription of the
// process listening on the agent's subjects for as long as it waits (and a
// second after the last Request, so that a loop of them subscribes once); if a
// Subscription of the process receives it first, that hands it over
// instead of running its handler; and after a reconnect the process reads
// from the stream, as Attach does, the answers that came while its
// connection was down, which no listener heard. Either way the stored copy
// is recorded completed and later never reaches a handler: the
// subscription of another process of the agent that meets it puts it off
// once, a second, for that record. The same holds for the progress
// updates OnProgress takes and the questions OnInput answers (with
// WithoutLifecycle, all that holds only within this process). A reply that
// comes after Request gave up goes to the agent's handler, with
// Delivery.Late set once the request's reply-by passed (a Request ended
// sooner, by a cancel of its context, say, leaves it unset).
//
// The returned Delivery has no Stream, Consumer or Sequence when the reply
// was taken as it was published.
//
// A request sent again with the ID of one sent before, within the
// duplicate window (a retry, a process that restarted), is stored once;
// Request then follows the first as Attach does: the updates and the reply
// stored are handed over as those still to come, and a request that ended
// without a reply returns Attach's error.
//
// A request to an agent the registry says is offline (Bus.Register,
// docs/presence.md) fails at once with an *AgentOfflineError (errors.Is
// ErrAgentOffline) naming how long it has been gone, and so does a request
// waiting for an agent that goes offline (found within one of its
// heartbeat intervals after the registry does); QueueIfOffline sends it
// anyway, to wait in the agent's queue. A Request reuses the presence the
// bus read for an earlier one less than 100 ms before, unless it said
// offline: a request sent on it to an agent gone offline since fails once
// the reading is 100 ms old. An agent that never registered is requested
// as before. Plain messages queue for an offline agent as always.
func (b *Bus) Request(ctx context.Context, m Message, opts ...RequestOption) (*Delivery, error) {
	ro := applyRequestOptions(opts)
	if m.To == Broadcast {
		return nil, &codec.FieldError{Field: "To", Value: m.To, Err: fmt.Errorf("%w: a request needs one recipient", ErrInvalidMessage)}
	}
	ctx, cancel, replyBy, err := b.newRequest(ctx, &m, ro)
	if err != nil {
		return nil, err
	}
	defer cancel()

	// The recipient's presence, unless the caller queues for it anyway:
	// offline fails now; online is checked again every heartbeat interval,
	// and a reading taken earlier (presenceFresh) once more when it is no
	// longer fresh.
	var check *presenceCheck
	if !ro.queueIfOffline {
		r, cached, err := b.requestPresence(ctx, m.To)
		switch {
		case err != nil: // the registry cannot tell; the request goes
		case r.p.Status == Offline:
			return nil, &AgentOfflineError{Agent: m.To, Presence: r.p}
		default:
			check = newPresenceCheck(r, cached)
			defer check.stop()
		}
	}

	w, err := b.req.wait(b, Status{ID: m.ID, To: m.To, Time: m.Time}, ro)
	if err != nil {
		return nil, err
	}
	defer b.req.forget(m.ID)
	ack, err := b.Publish(ctx, m)
	if err != nil {
		return nil, err
	}
	if ack.Duplicate && b.status != nil {
		// Sent before with this ID (a retry, a process that restarted):
		// its answers so far may be stored, which no listener hears, and
		// it may have ended. It is followed as Attach follows it, if it
		// went to the same recipient: the ID may have been used for a
		// message to another, whose answer is not this request's (before
		// 2026-11-28 Request returned it).
		b.req.forget(m.ID)
		if err := b.sameRequest(ctx, &m); err != nil {
			return nil, err
		}
		d, err := b.Attach(ctx, m.ID, opts...)
		if !errors.Is(err, ErrNoStatus) {
			return d, err
		}
		// No record to follow it by yet: waited for as if sent now.
		if w, err = b.req.wait(b, Status{ID: m.ID, To: m.To, Time: m.Time}, ro); err != nil {
			return nil, err
		}
	}
	return b.await(ctx, w, &m, replyBy, ro, check)
}

// sameRequest returns an error wrapping ErrInvalidMessage, on the ID, when
// the message the server already holds under m's ID (its publish was a
// duplicate) went from this agent to another recipient than m's.
func (b *Bus) sameRequest(ctx context.Context, m *Message) error {
	sts, err := b.Status(ctx, m.ID)
	if err != nil {
		return nil // nothing to compare: Attach says what it finds
	}
	var other string
	for _, st := range sts {
		if st.From != b.agent {
			continue
		}
		if st.To == m.To {
			return nil
		}
		other = st.To
	}
	if other == "" {
		return nil
	}
	return &codec.FieldError{Field: "ID", Value: m.ID,
		Err: fmt.Errorf("%w: already used, within the duplicate window, for a message to %s; the server dropped this one to %s", ErrInvalidMessage, other, m.To)}
}

// newRequest makes m, sent with ctx, a request as ro says: its sender,
// defaults, reply-by (ctx's deadline, else the request timeout), do-by and
// conversation deadline, and its expiry at the earliest of them. The
// returned context ends at the earliest deadline; its cancel func must be
// called. A deadline passed already is a *DeadlineError.
func (b *Bus) newRequest(ctx context.Context, m *Message, ro requestOptions) (context.Context, context.CancelFunc, time.Time, error) {
	cancels := []context.CancelFunc{}
	cancelAll := func() {
		for _, c := range cancels {
			c()
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.requestTimeout(m))
		cancels = append(cancels, cancel)
	}
	replyBy, _ := ctx.Deadline()
	inherit(ctx, m)
	if m.From == "" {
		m.From = b.agent
	}
	now := time.Now()
	m.SetDefaults(now)
	if by := b.limitToConversation(ctx, m, now); !by.IsZero() && by.Before(replyBy) {
		// Nobody may wait past the conversation.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, by)
		cancels = append(cancels, cancel)
		replyBy = by
	}
	setExtension(m, ExtReplyBy, replyBy.UTC().Format(time.RFC3339Nano))

	// The request expires, unread, at the earlier of its deadlines: nobody
	// waits for its reply after the one, its work is void after the other.
	expiry, kind := replyBy, deadlineReplyBy
	if !ro.doBy.IsZero() {
		setExtension(m, ExtDoBy, ro.doBy.UTC().Format(time.RFC3339Nano))
		if ro.doBy.Before(expiry) {
			expiry, kind = ro.doBy, deadlineDoBy
		}
	}
	if m.Time.After(expiry) && time.Now().Before(expiry) {
		// Its expiry counts from its time: the TTL would be negative.
		cancelAll()
		return nil, nil, time.Time{}, &codec.FieldError{Field: "Time", Value: m.Time.Format(time.RFC3339Nano),
			Err: fmt.Errorf("%w: a request's time is after its %s deadline %s", ErrInvalidMessage, kind, expiry.Format(time.RFC3339Nano))}
	}
	if exp := m.ExpiresAt(); exp.IsZero() || exp.After(expiry) {
		m.TTL = expiry.Sub(m.Time)
	}
	if !time.Now().Before(expiry) {
		cancelAll()
		return nil, nil, time.Time{}, &DeadlineError{ID: m.ID, To: m.To, Kind: kind, Deadline: expiry}
	}
	if kind == deadlineDoBy {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, expiry)
		cancels = append(cancels, cancel)
	}
	return ctx, cancelAll, replyBy, nil
}

// await waits for the reply to request m, which w waits for, handing the
// progress updates to ro.onProgress, until the reply comes, the request is
// canceled, its recipient is found offline when check is due, a deadline
// passes (ctx's, the reply-by or the do-by when earlier, or the idle
// timeout), or the Bus closes (ErrClosed).
func (b *Bus) await(ctx context.Context, w *waiter, m *Message, replyBy time.Time, ro requestOptions, check *presenceCheck) (*Delivery, error) {
	var idle <-chan time.Time
	resetIdle := func() {}
	if ro.idleTimeout > 0 {
		t := time.NewTimer(ro.idleTimeout)
		defer t.Stop()
		idle, resetIdle = t.C, func() { t.Reset(ro.idleTimeout) }
	}
	follow := func() {
		for _, u := range b.req.updates(w) {
			if _, ok := u.IsInputRequest(); ok && ro.onInput != nil {
				b.answerInput(ctx, ro.onInput, u)
			} else {
				ro.onProgress(u)
			}
		}
	}
	var failed error
wait:
	for {
		select {
		case d := <-w.reply:
			follow() // the updates before the reply
			return d, nil
		case <-w.news:
			follow()
			resetIdle() // after the callbacks: their time is the requester's, not the work's
		case e := <-w.ended:
			if e.deadLettered != nil {
				failed = e.deadLettered
				break wait
			}
			if e.verified || b.canceledRecord(ctx, m) {
				failed = &CanceledError{ID: m.ID, By: e.by}
				break wait
			}
		case <-check.C():
			r, err := b.readPresence(ctx, m.To, time.Now())
			if err == nil && r.p.Status == Offline {
				failed = fmt.Errorf("request %s: %w", m.ID, &AgentOfflineError{Agent: m.To, Presence: r.p})
				break wait
			}
			check.looked(r, err)
		case <-idle:
			failed = &DeadlineError{ID: m.ID, To: m.To, Kind: deadlineIdle, Deadline: time.Now().UTC(), Idle: ro.idleTimeout}
			break wait
		case <-b.closing: // no reply can come: Close stopped the listener
			failed = fmt.Errorf("request %s to %s: %w", m.ID, m.To, ErrClosed)
			break wait
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				de := &DeadlineError{ID: m.ID, To: m.To, Kind: deadlineReplyBy, Deadline: replyBy}
				if by, ok := conversationBy(m); ok && !by.After(replyBy) {
					de.Kind, de.Deadline = deadlineConversation, by
				}
				if !ro.doBy.IsZero() && !time.Now().Before(ro.doBy) {
					de.Kind, de.Deadline = deadlineDoBy, ro.doBy
				}
				failed = de
			}
			break wait
		}
	}
	b.req.forget(m.ID) // after this no reply can be handed over
	select {
	case d := <-w.reply:
		follow()
		return d, nil
	default:
	}
	if de, ok := failed.(*DeadlineError); ok {
		switch de.Kind {
		case deadlineIdle:
			// Nobody waits for the work any more: its worker is told to stop.
			b.cancelAbandoned(m.ID)
		case deadlineConversation:
			b.conversationExpired(ctx, m, de.Deadline)
		}
	}
	if failed != nil {
		return nil, failed
	}
	if cause := context.Cause(ctx); cause != ctx.Err() {
		// Why ctx ended, too: ErrCanceled for an AskInput whose request
		// was canceled, which ends the handler's context.
		return nil, fmt.Errorf("%w: request %s to %s: %w: %w", ErrRequestTimeout, m.ID, m.To, ctx.Err(), cause)
	}
	return nil, fmt.Errorf("%w: request %s to %s: %w", ErrRequestTimeout, m.ID, m.To, ctx.Err())
}

// RequestOption configures one Request.
type RequestOption func(*requestOptions)

// applyRequestOptions returns the options opts set; a nil one, an option
// left unset, sets none.
func applyRequestOptions(opts []RequestOption) requestOptions {
	var ro requestOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&ro)
		}
	}
	return ro
}

type requestOptions struct {
	queueIfOffline bool
	onProgress     func(*Delivery)
	onInput        func(context.Context, *Delivery) (Message, error)
	doBy           time.Time
	idleTimeout    time.Duration
}

// DoBy gives the request a deadline for its work, t, carried as ExtDoBy:
// the handler's context ends at t, a request still queued then expires
// unread (its record ends expired), and Request returns a *DeadlineError
// (Kind "do-by") at t. A handler that fails after t is not retried: its
// record ends expired. Without DoBy a request has only its reply-by, the
// deadline of Request's context: queued past it, it expires unread; a
// handler that runs past it is left to finish, and its reply comes Late.
func DoBy(t time.Time) RequestOption {
	return func(o *requestOptions) { o.doBy = t }
}

// IdleTimeout ends a Request that hears nothing, neither a progress update,
// a question (Delivery.AskInput) nor the reply, for d: it returns a
// *DeadlineError (Kind "idle") and cancels the request (Cancel), so that
// its worker stops. Each progress update or question starts d again, once
// the OnProgress and OnInput functions it calls returned (the time they
// take is the requester's, not the worker's); the deadline of Request's
// context stays the hard cap. d <= 0 means no idle timeout.
func IdleTimeout(d time.Duration) RequestOption {
	return func(o *requestOptions) { o.idleTimeout = d }
}

// ExtDoBy is the CloudEvents extension DoBy sets on a request: the time,
// RFC 3339, by which its work must be done. The handler's context has it
// as its deadline.
const ExtDoBy = "doby"

// The kinds of DeadlineError.
const (
	deadlineReplyBy = "reply-by"
	deadlineDoBy    = "do-by"
	deadlineIdle    = "idle"
	// the conversation's deadline (ExtConversationBy)
	deadlineConversation = "conversation"
)

// DeadlineError is returned by a Request whose deadline passed before the
// reply came: Kind "reply-by" (its context's deadline, or the request
// timeout), "do-by" (DoBy), "idle" (IdleTimeout, Idle long without news)
// or "conversation" (the conversation's deadline, ExtConversationBy). It matches ErrRequestTimeout and context.DeadlineExceeded with
// errors.Is. A reply that comes later is not lost: it reaches the agent's
// handler, marked Late.
type DeadlineError struct {
	ID       string        // the request's ID
	To       string        // its recipient
	Kind     string        // "reply-by", "do-by", "idle" or "conversation"
	Deadline time.Time     // the deadline that passed
	Idle     time.Duration // for "idle": the idle timeout
}

func (e *DeadlineError) Error() string {
	if e.Kind == deadlineIdle {
		return fmt.Sprintf("request %s to %s: no progress, question or reply for %v", e.ID, e.To, e.Idle)
	}
	return fmt.Sprintf("request %s to %s: %s deadline %s passed", e.ID, e.To, e.Kind, e.Deadline.UTC().Format(time.RFC3339Nano))
}

// Is reports whether target is ErrRequestTimeout.
func (e *DeadlineError) Is(target error) bool { return target == ErrRequestTimeout }

// Unwrap returns context.DeadlineExceeded.
func (e *DeadlineError) Unwrap() error { return context.DeadlineExceeded }

// requestTimeout is how long a Request of m waits when its context has no
// deadline: WithRequestTimeout, else the request timeout of the protocol
// m is a message of (profiles.Defaults), else DefaultRequestTimeout.
func (b *Bus) requestTimeout(m *Message) time.Duration {
	if b.opts.requestTimeout > 0 {
		return b.opts.requestTimeout
	}
	if p, ok := profiles.ForDataSchema(m.DataSchema); ok && p.Defaults().RequestTimeout > 0 {
		return p.Defaults().RequestTimeout
	}
	return DefaultRequestTimeout
}

// cancelAbandoned cancels request id, which its requester gave up, so that
// its worker stops; the cancel is best effort.
func (b *Bus) cancelAbandoned(id string) {
	if b.status == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishAttemptTimeout)
	defer cancel()
	if _, err := b.Cancel(ctx, id); err != nil && !errors.Is(err, ErrFinal) {
		b.opts.onError(fmt.Errorf("cancel abandoned request %s: %w", id, err))
	}
}

// OnProgress calls f with each progress update the recipient sends
// (Delivery.Progress) while Request waits for the reply, in the order
// they arrive, on Request's goroutine. Progress never completes a request:
// only the reply does. Without OnProgress the updates reach the agent's
// handler like any message (Delivery.IsProgress).
func OnProgress(f func(*Delivery)) RequestOption {
	return func(o *requestOptions) { o.onProgress = f }
}

// QueueIfOffline sends a request to an agent the registry says is offline
// instead of failing with ErrAgentOffline: it waits in the agent's queue,
// and Request waits for the reply until its context ends.
func QueueIfOffline() RequestOption {
	return func(o *requestOptions) { o.queueIfOffline = true }
}

// Reply sends m as the reply to request: to its sender, in its conversation
// (the same correlation ID), with CausationID (causationid) set to its ID and,
// unless m sets one, its priority. m.To may be left empty; any other
// recipient than the request's sender is an error wrapping
// ErrInvalidMessage, as a reply sent elsewhere would never reach the
// Request waiting for it. The request's lifecycle status becomes replied.
// Inside the handler of the request, pass the handler's ctx. Other errors
// are Publish's.
//
// A reply without an ID gets one derived from the request's (a UUIDv5 of
// it), so that the request has one reply: a second Reply to it, from a
// redelivery after a crash for example, is a duplicate the server drops
// (PubAck.Duplicate). Its status then needs no record: a lookup of the
// request finds the reply by that ID. Within one handling, a Reply with
// another ID than the first's fails with ErrFinal: the request has its
// answer. A handler that replied and then returns an error has its
// request acknowledged, replied; the error goes to the error handler.
func (b *Bus) Reply(ctx context.Context, request *Message, m Message) (PubAck, error) {
	if request == nil || request.ID == "" || request.From == "" {
		return PubAck{}, fmt.Errorf("%w: reply to a request without ID or sender", ErrInvalidMessage)
	}
	switch m.To {
	case "":
		m.To = request.From
	case request.From:
	default:
		return PubAck{}, &codec.FieldError{Field: "To", Value: m.To,
			Err: fmt.Errorf("%w: a reply goes to the request's sender %q", ErrInvalidMessage, request.From)}
	}
	if m.CorrelationID == "" {
		m.CorrelationID = conversationOf(request)
	}
	m.CausationID = request.ID
	if m.Priority == 0 {
		m.Priority = request.Priority
	}
	if by, ok := request.Extensions[ExtReplyBy]; ok {
		setExtension(&m, ExtReplyBy, by)
	}
	derivedID := m.ID == ""
	if derivedID {
		m.ID = replyIDOf(request.ID)
	}
	h := handlingOf(ctx) // the request's handling, when Reply is called from its handler
	if h != nil && h.d.ID != request.ID {
		h = nil
	}
	var ack PubAck
	var err error
	if h != nil {
		ack, err = h.sendReply(ctx, m.ID, func() (PubAck, error) { return b.Publish(ctx, m) })
	} else {
		ack, err = b.Publish(ctx, m)
	}
	if err != nil {
		return PubAck{}, err
	}
	s := statusOf(request, b.agent, StateReplied, b.agent)
	s.ReplyID = ack.ID
	if h != nil {
		s.Progress, s.LastProgress = h.progressCount()
		if !derivedID || !h.replyFound || h.d.Deliveries > 1 {
			// Stored before the handler returns and the request is acked
			// (the requester already has the reply). On a later delivery
			// the record says how often it came, as a completion's does
			// (completionRecorded): a lookup that finds the reply does not
			// know.
			b.status.recordStored(ctx, s.withDelivery(h.d))
		}
		return ack, nil
	}
	// From outside the handler: the record is what the request's
	// recipient reads when it is delivered, and skips it.
	b.status.record(s, false)
	return ack, nil
}

// findsReply reports whether a lookup of request m, delivered on the
// subject addr names with headers h, finds the reply this bus sends it
// under the derived ID (tracker.replied), so that the reply needs no
// record: m came on its indexed subject and stays in the stream past its
// expiry (no Nats-TTL, expiresAtRecipient), the reply goes on an indexed
// subject too, and both are on this bus's root.
func (b *Bus) findsReply(addr subjects.Address, h nats.Header, m *Message) bool {
	return b.indexed() && b.shards == nil && addr.Index.ID == subjects.IndexToken(m.ID) && len(h[jetstream.MsgTTLHeader]) == 0
}

// replyIDOf returns the ID Reply gives the reply to request id when the
// reply has none: a UUIDv5 of id in replySpace, or for a request ID that is
// a UUID version 7 (the bus's own), the same bits under the request's time
// as a version 7, so that the reply's indexed subject names a window
// (subjects.IndexToken), the request's, and costs the server no subject of
// its own, as the request's does not.
func replyIDOf(id string) string {
	u := uuid.NewSHA1(replySpace, []byte(id))
	// Windowed exactly where the index names the request by its window.
	if r, err := uuid.Parse(id); err == nil && subjects.Windowed(subjects.IndexToken(id)) {
		copy(u[:6], r[:6]) // the milliseconds
		u[6] = u[6]&0x0f | 0x70
	}
	return u.String()
}

var replySpace = uuid.MustParse("9c4e7b1a-2d63-4f0e-8a57-c31b6e0d94f2")

// requests are a bus's Requests waiting for replies.
type requests struct {
	mu       sync.Mutex
	waiting  map[string]*waiter // by request ID
	listener *nats.Subscription // while any request waits, and listenerLinger after
	// reconnected tells readMissed of every loss of the connection and
	// every reconnect while the listener lasts; closed with it, when
	// stopReads ends the reads under way.
	reconnected chan nats.Status
	stopReads   context.CancelFunc
	// down is set from a loss of the connection until readMissed starts
	// reading what the Requests waiting then missed: a Request registered
	// meanwhile catches up too (waiter.catchingUp).
	down   bool
	nc     *nats.Conn
	idle   *time.Timer       // ends the listener listenerLinger after the last request
	closed bool              // the bus closed: the listener ends with the last request
	taken  recentSet[string] // IDs of replies and progress updates handed to a Request
	sent   recentSet[string] // IDs of the requests this process sent

	// unrecorded are the replies a Request took from the listener whose
	// stored copy has not reached a subscription of this process yet, by
	// ID: their taken records are put off (deferTaken). recordDue writes
	// the records whose wait is over.
	unrecorded map[string]unrecordedReply
	recordDue  *time.Timer
	writing    sync.WaitGroup // writeDue writing what fell due

	// handing is held while an answer that did not come through a
	// subscription is handed over and its record seen to (handOver).
	// Close takes it once the requests are closed: a Request may return
	// the reply before the listener has written the record that keeps
	// its stored copy from a handler, and Close then waits for that
	// record as for every write in flight.
	handing sync.Mutex
}

// unrecordedReply is a reply a Request took, and when.
type unrecordedReply struct {
	d  *Delivery
	at time.Time
}

// listenerLinger is how long the listener stays subscribed after the last
// Request stopped waiting. Its subject has a wildcard, and the server walks
// its whole subscription cache to subscribe or unsubscribe one, under the
// lock every publish's routing takes (nats-server's Sublist.addToCache and
// removeFromCache): about 50 µs on the requester's connection, ahead of its
// request, which a listener per request paid twice. A loop of requests
// now subscribes once. The price is a copy of the agent's messages for the
// second after its last request, which the listener drops undecoded.
const listenerLinger = time.Second

// waiter is one Request waiting: for its reply, and for the progress
// updates before it.
type waiter struct {
	// request is what the answers are read from the stream by after a
	// reconnect (readAnswers): the request's ID, recipient and time.
	request Status
	reply   chan *Delivery // room for the reply (a Gather's is shared by its copies)
	ended   chan endSignal // capacity 1 (a Gather's is shared by its copies, with room for each)
	news    chan struct{}  // capacity 1: a progress update or question came
	follow  bool           // the Request follows progress (OnProgress)
	answer  bool           // the Request answers questions (OnInput)
	// updates are the progress updates and questions taken and not yet
	// handed to the Request, in order, under requests.mu: as many as the
	// recipient sends before the Request's function catches up, so none is
	// lost.
	updates []*Delivery
	shown   map[string]bool // questions shown to OnProgress, not taken
	// handed are the progress updates taken for the Request, by ID, so
	// that the other copy of one (core subscription, stream) is dropped
	// however many other messages were taken in between.
	handed map[string]bool
	// catchingUp is set, for a Request that follows progress or answers
	// questions, from a loss of the connection until readMissed handed it
	// what it missed meanwhile: the answers the listener hears after the
	// reconnect are newer, and are held until then (held), so that
	// OnProgress gets every update in order, and the reply after them.
	catchingUp bool
	held       []*Delivery
}

// endSignal tells a Request its request ended without a reply: canceled
// by an agent (by; a notice that came over the network is verified
// against the record first), or dead-lettered (TypeDeadLettered).
type endSignal struct {
	id           string // the request's
	by           string
	verified     bool
	deadLettered *DeadLetteredError
}

// end tells w its request ended, unless it was told already.
func (w *waiter) end(e endSignal) {
	select {
	case w.ended <- e:
	default:
	}
}

// wait registers a Request for the reply to request, which needs its ID,
// recipient and time, and makes sure the process listens on the agent's
// subjects.
func (r *requests) wait(b *Bus, request Status, ro requestOptions) (*waiter, error) {
	w := &waiter{request: request, reply: make(chan *Delivery, 1), ended: make(chan endSignal, 1), news: make(chan struct{}, 1),
		follow: ro.onProgress != nil, answer: ro.onInput != nil}
	return w, r.register(b, w)
}

// waitInto registers a copy of a Gather, whose reply goes to replies and
// whose end without one to ended.
func (r *requests) waitInto(b *Bus, request Status, replies chan *Delivery, ended chan endSignal) error {
	return r.register(b, &waiter{request: request, reply: replies, ended: ended, news: make(chan struct{}, 1)})
}

// register makes w wait for the reply to its request.
func (r *requests) register(b *Bus, w *waiter) error {
	id := w.request.ID
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting == nil {
		r.waiting = make(map[string]*waiter)
	}
	if _, dup := r.waiting[id]; dup {
		return &codec.FieldError{Field: "ID", Value: id, Err: fmt.Errorf("%w: a request with this ID is already waiting", ErrInvalidMessage)}
	}
	if r.closed {
		return fmt.Errorf("%w: request %s", ErrClosed, id)
	}
	r.sent.add(id)
	if r.listener == nil {
		filter, err := b.opts.scheme.AgentFilter(b.agent)
		if err != nil {
			return err
		}
		if r.listener, err = b.nc.Subscribe(filter, b.listen); err != nil {
			return fmt.Errorf("listen for replies on %s: %w", filter, err)
		}
		var ctx context.Context
		ctx, r.stopReads = context.WithCancel(context.Background())
		r.nc, r.reconnected = b.nc, b.nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
		go b.readMissed(ctx, r.reconnected)
	}
	w.catchingUp = r.down && (w.follow || w.answer)
	r.waiting[id] = w
	return nil
}

// forget removes the Request for id. A reply held for it while it caught
// up after a reconnect (take) goes to it still: the Request reads its
// reply channel once more. The listener ends listenerLinger after the
// last one, unless another comes meanwhile, or at once after the bus
// closed. It is idempotent.
func (r *requests) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.waiting[id]; ok {
		for _, d := range w.held {
			if isReply(d) { // taken while w caught up: it is the Request's still
				select {
				case w.reply <- d:
				default:
				}
			}
		}
		w.held = nil
	}
	delete(r.waiting, id)
	switch {
	case len(r.waiting) > 0 || r.listener == nil:
	case r.closed:
		r.unlisten()
	case r.idle == nil:
		r.idle = time.AfterFunc(listenerLinger, r.endIdleListener)
	default:
		r.idle.Reset(listenerLinger)
	}
}

// endIdleListener ends the listener if no Request waits.
func (r *requests) endIdleListener() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waiting) == 0 {
		r.unlisten()
	}
}

// unlisten ends the listener, and readMissed with it, under r.mu.
func (r *requests) unlisten() {
	if r.listener != nil {
		r.listener.Unsubscribe()
		r.listener = nil
		r.nc.RemoveStatusListener(r.reconnected)
		r.stopReads()
		r.reconnected, r.stopReads = nil, nil
	}
}

// close ends the listener if no Request waits, and otherwise with the
// last one; no Request waits after it.
func (r *requests) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.idle != nil {
		r.idle.Stop()
	}
	if len(r.waiting) == 0 {
		r.unlisten()
	}
}

// listening reports whether any Request waits, so that the listener can
// drop what it receives while it lingers undecoded.
func (r *requests) listening() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiting) > 0
}

// cancel tells the Request waiting for id, if any, that by canceled it:
// one whose request went to recipient to, any if to is empty (a cancel of
// this process's own).
func (r *requests) cancel(id, to, by string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.waiting[id]; ok && (to == "" || w.request.To == to) {
		w.end(endSignal{id: id, by: by, verified: true})
	}
}

// markTaken remembers that the message id was handed to a Request, so that
// its stored copy does not reach a handler too.
func (r *requests) markTaken(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.taken.add(id)
}

// updates returns the progress updates taken for w since the last call.
func (r *requests) updates(w *waiter) []*Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := w.updates
	w.updates = nil
	return u
}

// take hands d to the Request waiting for it, if any, and reports whether
// one was (took). A reply or progress update already taken also reports
// took, and again, so that its other copy is dropped without a second
// record. A progress update goes to a Request that follows progress (and
// is otherwise not taken); it never completes one. live says d came from
// the listener, not from the stream: for a Request catching up after a
// reconnect it is held until then (waiter.held).
func (r *requests) take(d *Delivery, live bool) (took, again bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, put := r.unrecorded[d.ID]; put || r.taken.has(d.ID) {
		delete(r.unrecorded, d.ID) // its other copy came: the record is needless
		return true, true
	}
	w, ok := r.waiting[d.CausationID]
	if !ok {
		return false, false
	}
	if d.Type == TypeDeadLettered {
		// Not taken either: the request's recipient, or an operator's
		// dead-letter watcher, says it ended without a reply.
		var n deadLetteredNotice
		if (d.From == w.request.To || d.From == operatorSender) && json.Unmarshal(d.Data, &n) == nil && n.ID == d.CausationID {
			w.end(endSignal{id: n.ID, verified: true,
				deadLettered: &DeadLetteredError{ID: n.ID, Agent: w.request.To, Reason: n.Reason, Err: n.Error}})
		}
		return false, false
	}
	if d.Type != TypeCancel && d.From != w.request.To {
		// Only the agent asked answers: another that knows the request's
		// ID (a Gather's other member, which can derive its copies' IDs)
		// does not take its place. Its message goes to a handler, as
		// readAnswers skips it.
		return false, false
	}
	// Held while w catches up after a reconnect, what the listener hears
	// (and the reply, whichever way it came), comes after what w missed.
	hold := w.catchingUp && (live || isReply(d))
	if d.Type == TypeCancel {
		// Not taken: the Request checks the record, and the stored copy
		// goes its own way.
		var n cancelNotice
		if json.Unmarshal(d.Data, &n) == nil && n.ID == d.CausationID {
			w.end(endSignal{id: n.ID, by: n.By})
		}
		return false, false
	}
	if _, ok := d.IsInputRequest(); ok {
		// A question: answered by the Request (taken), or shown to it
		// and left to the handler of its stored copy. Either way it is
		// news: the work goes on (IdleTimeout).
		w.heard()
		switch {
		case w.answer:
			r.taken.add(d.ID)
		case w.follow && !w.shown[d.ID]:
			if w.shown == nil {
				w.shown = make(map[string]bool)
			}
			w.shown[d.ID] = true
		default:
			return false, false
		}
		w.queue(d, hold)
		return w.answer, false
	}
	if d.IsProgress() {
		w.heard()
		if !w.follow {
			return false, false
		}
		if w.handed[d.ID] {
			return true, true
		}
		if w.handed == nil {
			w.handed = make(map[string]bool)
		}
		w.handed[d.ID] = true
		w.queue(d, hold)
		r.taken.add(d.ID)
		return true, false
	}
	r.taken.add(d.ID)
	if hold {
		w.held = append(w.held, d)
		return true, false
	}
	delete(r.waiting, d.CausationID)
	w.reply <- d
	return true, false
}

// heard tells the Request w waits for that news came (IdleTimeout, follow).
func (w *waiter) heard() {
	select {
	case w.news <- struct{}{}:
	default:
	}
}

// queue adds d, a progress update or a question, to those the Request w
// waits for hands to its functions, or to those held while it catches up
// (hold).
func (w *waiter) queue(d *Delivery, hold bool) {
	if hold {
		w.held = append(w.held, d)
	} else {
		w.updates = append(w.updates, d)
	}
}

// isReply reports whether d, an answer to a request, is its reply: neither
// a progress update, a question nor a cancel notice.
func isReply(d *Delivery) bool {
	_, question := d.IsInputRequest()
	return !question && !d.IsProgress() && d.Type != TypeCancel && d.Type != TypeDeadLettered
}

// release ends w's catching up: the answers held meanwhile go to it, in
// the order they came, as take would have given them; the reply, if one
// is held, last. Nothing goes to a Request that stopped waiting.
func (r *requests) release(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.waiting[id]
	if !ok || !w.catchingUp {
		return
	}
	held := w.held
	w.catchingUp, w.held = false, nil
	for _, d := range held {
		if !isReply(d) {
			w.updates = append(w.updates, d)
			w.heard()
			continue
		}
		delete(r.waiting, id)
		w.reply <- d
		return
	}
}

// lost marks every Request that follows progress or answers questions as
// catching up: the connection is down, and what is published meanwhile
// reaches no listener.
func (r *requests) lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	for _, w := range r.waiting {
		w.catchingUp = w.follow || w.answer
	}
}

// back ends the time the connection was down for the Requests registered
// from now on: readMissed reads for those waiting already.
func (r *requests) back() {
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
}

// listen receives the messages published to the agent while a Request
// waits, and hands over the replies.
func (b *Bus) listen(nm *nats.Msg) {
	if !b.req.listening() {
		return
	}
	m, err := codec.Decode(nm.Header, nm.Data)
	if err != nil || m.CausationID == "" {
		return // the subscription dead-letters what cannot be decoded
	}
	if _, err := b.checkSender(nm.Subject, m); err != nil {
		return
	}
	b.handOver(&Delivery{Message: *m, Subject: nm.Subject, bus: b}, true)
}

// handOver hands d, an answer to a request of this process that did not
// come through a subscription, to the Request waiting for it, if any:
// from the listener (live), or read from the stream.
func (b *Bus) handOver(d *Delivery, live bool) {
	b.req.handing.Lock()
	defer b.req.handing.Unlock()
	if took, again := b.req.take(d, live); took && !again {
		b.tookFromListener(d)
	}
}

// handedOver waits until no answer is being handed over (handOver), so
// that the records of those handed over are under way.
func (r *requests) handedOver() {
	r.handing.Lock()
	r.handing.Unlock() // empty: waiting for the lock is the point
}

// readMissed reads, after every reconnect until reconnected is closed, the
// answers to the requests waiting that came while the connection was down
// (readAnswers), and hands them over as the listener would have: those
// published meanwhile reached no listener, and only a subscription of the
// process would otherwise meet their stored copies. What the listener
// hears for a Request before its read is done is held until then (waiter.held).
// A read ends with lasting, which ends with the listener.
func (b *Bus) readMissed(lasting context.Context, reconnected chan nats.Status) {
	for status := range reconnected {
		if status != nats.CONNECTED {
			b.req.lost()
			if len(reconnected) > 0 || !b.nc.IsConnected() {
				continue // the reconnect is still to come
			}
			// Connected again, and no event says so: the channel was
			// full when the reconnect was told (nats.go drops events
			// then). The read is due now, or the Requests would catch
			// up for good.
		}
		b.req.back()
		for _, st := range b.req.waitingFor() {
			if b.req.isWaiting(st.ID) {
				b.catchUp(lasting, st)
			}
		}
	}
}

// catchUp reads the answers stored to the request st records, which a
// Request of this process waits for, and hands them over as the listener
// would have (readAnswers): the progress updates in order, then the reply
// or else the questions not answered yet; then what the listener held
// meanwhile (release). The read ends with parent, or after defaultTimeout.
func (b *Bus) catchUp(parent context.Context, st Status) {
	defer b.req.release(st.ID)
	ctx, cancel := context.WithTimeout(parent, defaultTimeout)
	defer cancel()
	var questions []*Delivery
	reply, err := b.readAnswers(ctx, st, func(d *Delivery) {
		if d.IsProgress() {
			b.handOver(d, false)
		} else {
			questions = append(questions, d)
		}
	})
	switch {
	case err != nil && parent.Err() == nil:
		b.opts.onError(fmt.Errorf("read the answers to request %s: %w", st.ID, err))
	case reply != nil:
		b.handOver(reply, false) // the questions before it are moot
	default:
		b.handOverQuestions(ctx, questions)
	}
}

// waitingFor returns the requests waiting.
func (r *requests) waitingFor() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Status, 0, len(r.waiting))
	for _, w := range r.waiting {
		out = append(out, w.request)
	}
	return out
}

// isWaiting reports whether the Request for id still waits.
func (r *requests) isWaiting(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.waiting[id]
	return ok
}

// takenRecordWait is how long the record of a reply a Request took from
// the listener waits for the reply's stored copy to reach a subscription
// of this process, which acknowledges it without a handler and so makes
// the record needless. In a running agent the copy comes within a
// millisecond or two.
const takenRecordWait = 100 * time.Millisecond

// otherTakerWait is how long a subscription puts off the stored copy of a
// reply to a request this process did not send, whose record does not say
// taken: a Request of another process of the agent may have taken it, and
// writes its record within takenRecordWait.
const otherTakerWait = time.Second

// tookFromListener sees to the record of reply d, which a Request took
// from the listener. It is written at once unless a subscription of this
// process will meet the stored copy of d, a reply under the derived ID
// (replyIDOf): its record is then put off (deferTaken), and written only
// if the copy does not come in time. A reply with an ID of its own, or a
// progress update, is written at once: a subscription of another process
// reads it before its handler, and does not wait for it.
func (b *Bus) tookFromListener(d *Delivery) {
	if b.status == nil {
		return // no records
	}
	if d.ID != replyIDOf(d.CausationID) || !b.subscribed() {
		b.recordTaken(d)
		return
	}
	b.req.deferTaken(d, b.recordTaken)
}

// subscribed reports whether the bus has a subscription running.
func (b *Bus) subscribed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs) > 0
}

// deferTaken puts off the record of reply d for takenRecordWait; write
// writes it then, unless its stored copy came (take). After close it is
// written at once.
func (r *requests) deferTaken(d *Delivery, write func(*Delivery)) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		write(d)
		return
	}
	if r.unrecorded == nil {
		r.unrecorded = make(map[string]unrecordedReply)
	}
	r.unrecorded[d.ID] = unrecordedReply{d: d, at: time.Now()}
	switch {
	case r.recordDue == nil:
		r.recordDue = time.AfterFunc(takenRecordWait, func() { r.writeDue(write, false) })
	case len(r.unrecorded) == 1: // the timer is idle
		r.recordDue.Reset(takenRecordWait)
	}
	r.mu.Unlock()
}

// writeDue writes the records put off for takenRecordWait or longer, or
// all of them with all, and sets the timer for the next one.
func (r *requests) writeDue(write func(*Delivery), all bool) {
	now := time.Now()
	var due []*Delivery
	r.mu.Lock()
	next := time.Duration(0)
	for id, u := range r.unrecorded {
		if wait := takenRecordWait - now.Sub(u.at); wait > 0 && !all {
			if next == 0 || wait < next {
				next = wait // the soonest of those still waiting
			}
			continue
		}
		due = append(due, u.d)
		delete(r.unrecorded, id)
	}
	if next > 0 {
		r.recordDue.Reset(next)
	}
	r.writing.Add(1)
	r.mu.Unlock()
	defer r.writing.Done()
	for _, d := range due {
		write(d)
	}
}

// flushTaken writes every record still put off, and stops the timer: the
// bus closes, and no subscription of it will meet their stored copies.
func (r *requests) flushTaken(write func(*Delivery)) {
	r.writeDue(write, true)
	r.mu.Lock()
	if r.recordDue != nil {
		r.recordDue.Stop()
	}
	r.mu.Unlock()
	r.writing.Wait() // what the timer took before the stop is written too
}

// sentHere reports whether this process sent request id lately.
func (r *requests) sentHere(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent.has(id)
}

// canceledRecord reports whether the record of request m, sent by this
// agent, says canceled.
func (b *Bus) canceledRecord(ctx context.Context, m *Message) bool {
	if b.status == nil {
		return false
	}
	sent := *m
	sent.From = b.agent
	at, err := b.busOf(ctx, m.To) // the request's records are on its recipient's shard
	if err != nil {
		return false
	}
	canceled, _ := at.status.canceled(ctx, &sent, m.To)
	return canceled
}

// recordTaken marks a reply or progress update a Request took as
// completed, and a question it answers (OnInput) as working until its
// answer records it replied, so that the stored copy never reaches a
// handler, in another process of the agent either (settledElsewhere).
func (b *Bus) recordTaken(d *Delivery) {
	state := StateCompleted
	if _, ok := d.IsInputRequest(); ok {
		state = StateWorking
	}
	s := statusOf(&d.Message, b.agent, state, b.agent).withDelivery(d)
	s.Reason = reasonTaken
	b.status.record(s, false)
}

// reasonTaken is the reason of the record of an answer a Request took
// (recordTaken).
const reasonTaken = "taken by Request"

// takenElsewhere reports whether record s says a Request took its message
// (recordTaken): completed, or, for a question, working.
func takenElsewhere(s Status) bool {
	return s.Reason == reasonTaken && (s.State == StateCompleted || s.State == StateWorking)
}

// settledElsewhere decides what happens to a delivery before the handler
// runs, and reports whether the handler is to be skipped (the message is
// acknowledged), or the delivery put off for wait. A reply goes to the
// Request waiting for it, or is skipped when it was taken already in this
// process. A message of a Request's exchange (exchange: it carries
// ExtReplyBy, the request or a reply) is skipped when its lifecycle
// record is final already: a reply taken by a Request in another process,
// a request answered with Reply from outside its handler. A request
// delivered again is also skipped when its handler replied before (its
// reply, under the derived ID, writes no record). The stored copy of a
// answer to a request this process did not send (a reply under the
// derived ID, a progress update or a question) whose record neither ends
// it nor says taken is put off once for otherTakerWait (with a delivery to
// spare), for the record of another process's Request that took it
// (tookFromListener). Otherwise a reply after the requester's deadline is
// marked Late.
func (b *Bus) settledElsewhere(ctx context.Context, d *Delivery, exchange bool, maxDeliver int) (skip bool, wait time.Duration) {
	derivedReply := exchange && d.CausationID != "" && d.ID == replyIDOf(d.CausationID)
	if d.CausationID != "" {
		if took, again := b.req.take(d, false); took {
			// A reply taken from its stored copy is acknowledged here:
			// no other process meets it, so it needs no record.
			if !again && !derivedReply {
				b.recordTaken(d)
			}
			return true, 0
		}
	}
	if !exchange {
		return false, 0
	}
	if b.status != nil {
		s, err := b.status.get(ctx, &d.Message, b.agent)
		replay := d.Replayed && s.State == StateDeadLettered // the replay's record may still be on its way
		if err == nil && (s.State.Final() && !replay || takenElsewhere(s)) {
			return true, 0
		}
		if d.Deliveries > 1 && !derivedReply && d.Type != TypeProgress {
			if _, ok := b.status.replyOf(ctx, d.ID, d.From, b.agent); ok {
				return true, 0
			}
		}
		_, question := d.IsInputRequest()
		answer := d.CausationID != "" && (derivedReply || d.IsProgress() || question)
		if answer && d.Deliveries == 1 && (maxDeliver <= 0 || maxDeliver > 1) && !b.req.sentHere(d.CausationID) {
			return false, otherTakerWait
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, d.Extensions[ExtReplyBy]); err == nil && d.CausationID != "" && time.Now().After(t) {
		d.Late = true
	}
	return false, 0
}

// recentSet remembers the last recentSetSize values added. It costs
// nothing until the first add: a bus holds three (requests sent, replies
// taken, messages canceled), which most agents never fill, and with the
// ring inline they came to 48 KiB of every agent's heap.
type recentSet[K comparable] struct {
	ring []K // recentSetSize long, made by the first add
	next int
	set  map[K]struct{}
}

const recentSetSize = 1024

func (s *recentSet[K]) add(v K) {
	if s.ring == nil {
		s.ring = make([]K, recentSetSize)
		s.set = make(map[K]struct{}, recentSetSize)
	}
	delete(s.set, s.ring[s.next])
	s.ring[s.next] = v
	s.set[v] = struct{}{}
	s.next = (s.next + 1) % recentSetSize
}

func (s *recentSet[K]) has(v K) bool {
	_, ok := s.set[v]
	return ok
}
