package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// The path of one message from the stream to the handler and back, in the
// order it happens: the dispatcher (package consumers) picks the message by
// priority and calls deliver, which decodes and checks it, runs the
// handler, decides how to settle it, files a dead letter when it gives the
// message up, records the lifecycle state, sends the settlement and ends
// the span. docs/architecture.md walks through it.

// permanent marks an error after which a message is not redelivered.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks a handler error as permanent: the message is
// dead-lettered at once instead of redelivered. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// busTerm is a termination the bus decided, not its handler: a message it
// could not or must not hand over (undecodable, another sender than its
// subject names, invalid for its protocol, scheduled wrongly), or whose
// handling it ended (expired, canceled). Only these are classified by what
// they wrap (deadLetterReasonOf); a handler's error is a rejection
// whatever it wraps: one wrapping ErrCanceled or ErrExpired, from a Request
// of its own say, was taken for the bus's, and its message terminated
// without a dead letter.
type busTerm struct{ err error }

func (e busTerm) Error() string { return e.err.Error() }
func (e busTerm) Unwrap() error { return e.err }

// terminate is Permanent for a termination the bus decided (busTerm).
func terminate(err error) error { return Permanent(busTerm{err}) }

// isPutOff reports whether err, or an error it wraps, gives its message
// back unhandled (putOff).
func isPutOff(err error) bool {
	var p putOff
	return errors.As(err, &p)
}

// isPermanent reports whether err, or an error it wraps, was made by
// Permanent.
func isPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// GiveBack is what a handler returns to give its message back unhandled,
// to be delivered again after delay (at once if 0), to this process or
// another of the agent: one that received more messages than it means to
// handle, say. It is not a failure: no state is recorded, and it is no step
// towards WithMaxDeliver's limit or the backoff. The server still counts
// the delivery, and allows twice WithMaxDeliver's (docs/reliability.md): a
// message given back past that is dead-lettered as unsettled.
func GiveBack(delay time.Duration) error {
	return putOff{delay: max(delay, 0), why: "by its handler"}
}

// putOff is a delivery given back unhandled, to come again after delay:
// not a failure, and no step towards the delivery limit's backoff. Handle
// returns it for a reply another process may have taken, a handler by
// GiveBack.
type putOff struct {
	delay time.Duration
	why   string
}

func (p putOff) Error() string {
	return fmt.Sprintf("given back for %v, unhandled, %s", p.delay, p.why)
}

// ErrorType names it on the span and in the process duration metric
// (error.type).
func (putOff) ErrorType() string { return "put_off" }

// errMaxDeliver is wrapped by the reason a message is dead-lettered after
// its handler failed on its last allowed delivery.
var errMaxDeliver = errors.New("bus: delivery limit reached")

// outcome is how a message is settled; its text names the settlement on
// the span (messaging.operation.name and the event's name).
type outcome string

const (
	outcomeAck  outcome = "ack"  // handled: never delivered again
	outcomeNak  outcome = "nak"  // given back, to be delivered again
	outcomeTerm outcome = "term" // given up: never delivered again
)

// settlement is how deliver settles a message.
type settlement struct {
	outcome outcome
	delay   time.Duration // before redelivery, for nak
	reason  error         // why, for term
}

// deliver returns the dispatcher handler that delivers each message to h.
func (b *Bus) deliver(h Handler, o subscribeOptions) consumers.Handler {
	maxDeliver := orDefault(o.settings.MaxDeliver, consumers.DefaultMaxDeliver)
	delay := backoff(o.backoff)
	if delay == nil {
		delay = defaultBackoff
	}
	return func(ctx context.Context, cm *consumers.Msg) {
		// decoded stays on this stack, so a delivery allocates only its
		// Delivery: nothing it is passed to may keep a pointer to it
		// (TestHandlerPathAllocates).
		var decoded Message
		th, derr := codec.DecodeWithTraceHeadersInto(&decoded, cm.Header, cm.Data)
		m := &decoded
		if derr != nil {
			m = nil
		}
		if derr == nil && m.Broadcast() && m.From == b.agent && !o.ownBroadcasts && !m.Expired(time.Now()) && b.ownSubject(cm.Subject) {
			b.settle(cm, settlement{outcome: outcomeAck}, nil)
			return
		}
		ctx, op := b.tel.startProcess(ctx, cm, m, th)
		defer op.span.End()
		err := b.handle(ctx, h, cm, m, derr, maxDeliver)
		op.end(b.tel, ctx, err)

		s := b.decide(ctx, cm, err, maxDeliver, delay)
		if s.outcome == outcomeTerm {
			if r, ok := deadLetterReasonOf(s.reason); ok {
				if derr := b.deadLetter(cm, m, r, s.reason); derr != nil {
					// Not terminated: nothing is dropped that could not be
					// kept elsewhere.
					b.opts.onError(fmt.Errorf("message %s kept, not terminated: %w", cm.Subject, derr))
					s = settlement{outcome: outcomeNak, delay: delay(int(cm.Metadata.Deliveries))}
				} else {
					b.tel.countDeadLetter(ctx, op.dest, r)
				}
			} else if errors.Is(s.reason, ErrExpired) {
				b.tel.countExpired(ctx, op.dest)
			}
		}
		b.settle(cm, s, &op)
	}
}

// handle checks a decoded message and runs h on it, recovering a panic.
// The error says what became of it: nil handled, Permanent for a message
// that must not come again (undecodable, another sender than its subject
// says, invalid for its protocol, expired), or what h returned.
func (b *Bus) handle(ctx context.Context, h Handler, cm *consumers.Msg, m *Message, derr error, maxDeliver int) (err error) {
	if derr != nil {
		err = fmt.Errorf("decode message on %s: %w", cm.Subject, derr)
		b.opts.onError(err)
		return terminate(err)
	}
	addr, err := b.checkSender(cm.Subject, m)
	if err != nil {
		b.opts.onError(err)
		return terminate(err)
	}
	fired, scheduled, err := b.checkSchedule(cm.Header, cm.Metadata, m)
	if err != nil {
		b.opts.onError(err)
		return terminate(err)
	}
	if m.To == "" {
		// An event without the to extension (a foreign producer may leave
		// it out, docs/cloudevents.md): the subject names the recipient.
		m.To = addr.To
	}
	// The subject wins over attributes that disagree with it: it is what
	// the sender's permissions allowed and what routed the message here.
	if m.To != addr.To || m.Priority != addr.Priority {
		b.opts.onError(fmt.Errorf("%w: message %s on %s says to %q priority %d; delivered as to %q priority %d",
			ErrAttributeMismatch, m.ID, cm.Subject, m.To, m.Priority, addr.To, addr.Priority))
		m.To, m.Priority = addr.To, addr.Priority
	}
	if err := b.checkNative(ctx, m); err != nil {
		b.opts.onError(err)
		return terminate(err)
	}
	b.reportFindings(ctx, m)
	md := cm.Metadata
	if m.TTL > 0 && m.Expired(time.Now()) { // the clock is read only for a message that can expire
		err := fmt.Errorf("%w at %s", ErrExpired, m.ExpiresAt().Format(time.RFC3339Nano))
		by, ok := conversationBy(m)
		if ok && !by.After(m.ExpiresAt()) {
			err = fmt.Errorf("%w: its conversation %s passed its deadline %s", ErrExpired, m.CorrelationID, by.Format(time.RFC3339Nano))
		}
		b.record(m, nil, StateExpired, md, err)
		if ok && !by.After(m.ExpiresAt()) {
			b.conversationExpired(ctx, m, by)
		}
		return terminate(err)
	}
	f := &inFlight{d: Delivery{
		bus:        b,
		Message:    *m,
		Subject:    cm.Subject,
		Stream:     md.Stream,
		Consumer:   md.Consumer,
		Sequence:   md.StreamSeq,
		Deliveries: int(md.Deliveries),
		Replayed:   len(cm.Header[HeaderReplayOf]) > 0,
	}}
	d := &f.d
	if m.Type == TypeCancel && m.CausationID != "" {
		b.takeNotice(ctx, m)
		return nil
	}
	if m.Type == TypeDeadLettered && m.CausationID != "" {
		b.req.take(d, false) // ends the Request waiting for it, if any; no handler's business
		return nil
	}
	_, exchange := m.Extensions[ExtReplyBy] // a request, or a reply to one
	skip, wait := b.settledElsewhere(ctx, d, exchange, maxDeliver)
	if wait > 0 {
		return putOff{delay: wait, why: "as a reply another process of this agent may have taken"}
	}
	if skip || scheduled && b.settledBeforeFiring(ctx, m, fired) {
		return nil
	}
	return b.run(ctx, h, f, cm, m, addr, exchange, scheduled, maxDeliver)
}

// run runs h on the delivery f holds, checked by handle: with the
// handler's context, the message's do-by deadline and its registration
// for Cancel, recovering a panic. It records the states the handling ends
// in that nobody can derive (completionRecorded). It is apart from handle
// so that its defers are open-coded: in a function with as many returns
// as handle's checks have, each defer costs a record on the stack and the
// runtime's walk to run it (see -gcflags=-d=defer).
func (b *Bus) run(ctx context.Context, h Handler, f *inFlight, cm *consumers.Msg, m *Message, addr subjects.Address, exchange, scheduled bool, maxDeliver int) (err error) {
	d, hs, md := &f.d, &f.hs, cm.Metadata
	hs.d, hs.ctx = d, &f.ctx
	if exchange {
		hs.replyFound = b.findsReply(addr, cm.Header, m)
	}
	f.ctx.Context, f.ctx.h = ctx, hs
	defer f.ctx.release()
	var hctx context.Context = &f.ctx
	doBy, hasDoBy := doByOf(m)
	if hasDoBy {
		var stop context.CancelFunc
		hctx, stop = context.WithDeadline(hctx, doBy)
		defer stop()
	}
	if b.cancels.start(hs) {
		return terminate(fmt.Errorf("%w before it was handled", ErrCanceled))
	}
	defer b.cancels.done(hs)
	returned := false // h returned: not a panic, nor a runtime.Goexit
	defer func() {
		hs.awaitProgressRecord(ctx) // before the records below and the settlement
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
			b.opts.onError(fmt.Errorf("message %s: %w", cm.Subject, err))
		} else if !returned {
			// runtime.Goexit, t.FailNow in a handler: a failure, whose
			// message the dispatcher gives back as this goroutine ends.
			err = fmt.Errorf("%w: it called runtime.Goexit", ErrHandlerPanic)
		} else if err != nil {
			err = checkedError(err)
		}
		switch {
		case err != nil && hs.replied.Load() && !isPutOff(err):
			// Replied, then failed: the requester has its answer, and a
			// redelivery would be passed over as replied. Before
			// 2026-11-28 the failure dead-lettered it, its record
			// dead_lettered over replied.
			b.opts.onError(fmt.Errorf("message %s: its handler replied, then returned an error; acknowledged as replied: %w", cm.Subject, err))
			err = nil
		case hs.canceled.Load() && !hs.replied.Load(): // replied, the work was done
			err = terminate(canceledReason(err))
			b.record(m, hs, StateCanceled, md, err)
		case err != nil && hasDoBy && !time.Now().Before(doBy):
			// Its work is void now: not retried.
			err = terminate(fmt.Errorf("%w: its do-by %s passed while its handler ran; it returned: %w", ErrExpired, doBy.Format(time.RFC3339Nano), err))
			b.record(m, hs, StateExpired, md, err)
		case err == nil && !hs.replied.Load() && (scheduled || completionRecorded(m, cm)) && !b.repliedElsewhere(ctx, m):
			b.record(m, hs, StateCompleted, md, nil)
		case err != nil && !isPermanent(err) && !isPutOff(err) && ctx.Err() == nil && (maxDeliver <= 0 || int(md.Deliveries) < maxDeliver):
			b.recordFailed(m, hs, md, err) // the last failure records dead_lettered
		}
	}()
	if md.Deliveries > 1 && b.status != nil {
		// So that a lookup, which cannot tell from the consumer's ack
		// floor whether a redelivery was handled or given up by the
		// server (its last delivery allowed never settled), does not read
		// completed unless this handling records it. The record keeps the
		// progress counted before, which the handler numbers on from.
		b.seedProgress(ctx, hs)
		b.record(m, hs, StateDelivered, md, nil)
	}
	err = h(hctx, d)
	returned = true
	return err
}

// checkedError returns err, a handler's, unless its Error method panics:
// a nil *T returned as an error, whose method reads its receiver. That
// panic, later in the settlement, gave the message back at once, again
// and again, never dead-lettered (before 2026-11-28). In its place an
// error that says so, permanent if err was.
func checkedError(err error) (checked error) {
	defer func() {
		if r := recover(); r != nil {
			inner := err
			if p, ok := err.(permanent); ok {
				inner = p.err
			}
			checked = fmt.Errorf("the handler returned an error whose Error method panics (a nil %T?): %v", inner, r)
			if isPermanent(err) {
				checked = Permanent(checked)
			}
		}
	}()
	_ = err.Error()
	return err
}

// inFlight is a delivered message being handled: the Delivery its handler
// gets, the handling that Reply, progress updates and Cancel find through
// the handler's context, and that context. It is the one allocation of
// this path for a message whose handler does not watch its context
// (handlerContext); there were five.
type inFlight struct {
	d   Delivery
	hs  handling
	ctx handlerContext
}

// repliedElsewhere reports whether request m (it carries ExtReplyBy) was
// answered from outside its handler, as 'agentbus reply' does from a
// subscribe --exec command: its record reads replied, which the handler's
// completion must not overwrite. A plain message costs no lookup.
func (b *Bus) repliedElsewhere(ctx context.Context, m *Message) bool {
	if _, ok := m.Extensions[ExtReplyBy]; !ok || b.status == nil {
		return false
	}
	st, err := b.status.get(ctx, m, b.agent)
	return err == nil && st.State == StateReplied
}

// doByOf returns the do-by deadline m carries (ExtDoBy), if any.
func doByOf(m *Message) (time.Time, bool) {
	v, ok := m.Extensions[ExtDoBy]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// decide says how to settle a message whose handling ended with err:
// acknowledged when handled; given back at once when the subscription
// stopped under the handler (not the message's fault, so no step towards
// the delivery limit's backoff); terminated for a permanent error or a
// failure on the last allowed delivery; otherwise redelivered after the
// backoff.
func (b *Bus) decide(ctx context.Context, cm *consumers.Msg, err error, maxDeliver int, backoff backoff) settlement {
	delivery := int(cm.Metadata.Deliveries)
	var later putOff
	switch {
	case err == nil:
		return settlement{outcome: outcomeAck}
	case errors.As(err, &later):
		return settlement{outcome: outcomeNak, delay: later.delay}
	case isPermanent(err):
		return settlement{outcome: outcomeTerm, reason: err}
	case ctx.Err() != nil:
		return settlement{outcome: outcomeNak}
	case maxDeliver > 0 && delivery >= maxDeliver:
		return settlement{outcome: outcomeTerm, reason: fmt.Errorf("%w: failed on delivery %d of %d: %w", errMaxDeliver, delivery, maxDeliver, err)}
	}
	return settlement{outcome: outcomeNak, delay: backoff(delivery)}
}

// settle sends settlement s of cm to the server and adds it to op's span.
func (b *Bus) settle(cm *consumers.Msg, s settlement, op *processOp) {
	var err error
	switch s.outcome {
	case outcomeAck:
		err = cm.Ack()
	case outcomeNak:
		err = cm.Nak(s.delay)
	case outcomeTerm:
		err = cm.Term(termReason(s.reason))
	}
	if err != nil {
		b.opts.onError(fmt.Errorf("settle message %s: %w", cm.Subject, err))
	}
	if op != nil && op.span.IsRecording() {
		settleEvent(op.span, s, err)
	}
}

// termReason is the reason sent to the server with a termination: the
// dead-letter reason, or the error's text.
func termReason(err error) string {
	if r, ok := deadLetterReasonOf(err); ok {
		return string(r) + ": " + err.Error()
	}
	return err.Error()
}

// record writes state s of m, delivered to this agent as md says, to the
// lifecycle bucket; reason, if not nil, says why. h is m's handling, if its
// handler ran: the record keeps the progress updates it counts, as the
// records of the work (recordWork) and the reply do, so that a retry
// numbers on from them.
func (b *Bus) record(m *Message, h *handling, s State, md consumers.Metadata, reason error) {
	if b.status == nil {
		return
	}
	b.status.record(b.recordOf(m, h, s, md, reason), false)
}

// recordOf is the record of state s that record writes.
func (b *Bus) recordOf(m *Message, h *handling, s State, md consumers.Metadata, reason error) Status {
	st := statusOf(m, b.agent, s, b.agent)
	st.Stream, st.Sequence, st.Deliveries = md.Stream, md.StreamSeq, int(md.Deliveries)
	if h != nil {
		st.Progress, st.LastProgress = h.progressCount()
	}
	if reason != nil {
		st.Reason = reason.Error()
	}
	return st
}

// recordFailed writes the failed record of m's delivery md as record does,
// but only over the record as it stands now: read first, and written on
// the condition that nobody wrote after (its revision), or that none
// exists. A record of a later delivery, or a final one, is left alone. The
// failure can be slow to reach the server, its connection held: another
// process of the agent may meanwhile have handled the redelivery and
// written completed, which the failure written over it turned, for a
// message with a TTL, into expired at its expiry (before 2026-11-28,
// TestStaleFailedRecord). It costs a read, on the failure path only.
func (b *Bus) recordFailed(m *Message, h *handling, md consumers.Metadata, reason error) {
	if b.status == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	expect := "0" // none may exist: also when the read fails, so nothing is overwritten
	if now, err := b.status.get(ctx, m, b.agent); err == nil {
		if now.State.Final() || now.Deliveries > int(md.Deliveries) {
			return
		}
		expect = strconv.FormatUint(now.revision, 10)
	}
	b.status.write(b.recordOf(m, h, StateFailed, md, reason), expect)
}

// completionRecorded reports whether a recipient writes the completed record
// of m when its handler succeeds. For most messages it does not: a lookup
// finds the message by its indexed subject (or the sender's record), which
// gives its stream sequence, and reads completed (or delivered) from the
// recipient's consumer, whose ack floor has passed it (see Bus.Status). That
// leaves the common path with no lifecycle write on the recipient's side.
// Three kinds are written: a broadcast, whose sender's record names no
// recipient; a message with a TTL, whose consumer also passes it when the
// server removed it unread at its expiry, which a lookup must tell apart;
// and a message delivered more than once, whose record then says how
// often, which the consumer does not (a completion read from it was the
// first delivery). A message a schedule fired is written too (by the
// caller): its sender's record holds the schedule stream's sequence, not the
// message stream's.
//
// A foreign sender may give the TTL as Nats-TTL alone, without an
// expirytime: the server removes the message at its expiry all the same,
// so it counts as one with a TTL (before 2026-11-28 such a message,
// handled, read expired once its TTL passed).
func completionRecorded(m *Message, cm *consumers.Msg) bool {
	return m.Broadcast() || m.TTL > 0 || cm.Metadata.Deliveries > 1 || len(cm.Header[jetstream.MsgTTLHeader]) > 0
}

// checkSender returns the address subject names. It reports
// ErrMalformedSubject for a subject that is not one of the scheme's, and
// ErrSenderMismatch unless the event's source names the agent the subject
// names as the sender. The server's permissions decide who
// may publish on a subject; this check makes sure the event does not claim
// another sender than the subject it was published on.
func (b *Bus) checkSender(subject string, m *Message) (subjects.Address, error) {
	addr, err := b.opts.scheme.Parse(subject)
	if err != nil {
		return addr, fmt.Errorf("%w: %w", ErrMalformedSubject, err)
	}
	if addr.From != m.From {
		return addr, fmt.Errorf("%w: subject %s is from %q, event source %q", ErrSenderMismatch, subject, addr.From, m.From)
	}
	return addr, nil
}

// ownSubject reports whether subject names this agent as its sender: a
// broadcast whose event says it is this agent's own is dropped unhandled
// only then, and one on another agent's subject is dead-lettered by
// checkSender (sender_mismatch) as every other recipient does.
func (b *Bus) ownSubject(subject string) bool {
	addr, err := b.opts.scheme.Parse(subject)
	return err == nil && addr.From == b.agent
}

// countDeadLetter and countExpired count a terminated message of dest.
func (t *telemetry) countDeadLetter(ctx context.Context, dest *destination, r DeadLetterReason) {
	if dest == nil {
		return
	}
	lv := &t.levels[dest.priority-1]
	t.deadLetters.Add(ctx, 1, metric.WithAttributes(append(lv.set.ToSlice(), attrDeadLetterReason.String(string(r)))...))
}

func (t *telemetry) countExpired(ctx context.Context, dest *destination) {
	if dest != nil {
		t.expirations.Add(ctx, 1, t.levels[dest.priority-1].opts...)
	}
}
