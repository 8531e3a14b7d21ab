package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
)

// Attach follows request id, which this agent sent, as the Request that
// sent it would: a process that restarted (or any other process of the
// agent) takes up a request still running. The progress updates sent so
// far go to OnProgress first, in order, read from the stream; then the
// updates still to come, and Attach returns the reply, already sent or
// still to come, like Request. Other options (IdleTimeout, DoBy) work as
// for Request; without a deadline on ctx Attach waits until the request's
// reply-by. Once the reply-by passed, a reply the handler sent late is
// returned too: Attach waits for it until ctx's deadline, or without one
// returns it if it is stored and a *DeadlineError if not.
//
// A request that ended without a reply returns an error: canceled a
// *CanceledError, expired unread a *DeadlineError, completed without a
// reply or dead-lettered ErrFinal. Errors: ErrNoStatus (no record of a
// request id from this agent), ErrInvalidMessage for a message that is not
// a request, ErrInvalidOption with lifecycle tracking off, or the
// server's.
//
// Attach reads the agent's past messages with one short-lived consumer
// (subjects.Scheme.HistoryConsumer), so a process attaches to one request
// at a time.
func (b *Bus) Attach(ctx context.Context, id string, opts ...RequestOption) (*Delivery, error) {
	ro := applyRequestOptions(opts)
	sts, err := b.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	var st Status
	for _, s := range sts {
		if s.From == b.agent && s.To != Broadcast {
			st = s
		}
	}
	if st.ID == "" {
		for _, s := range sts {
			if s.To == b.agent {
				return nil, fmt.Errorf("%w: no request %s from %s: it was sent to %s by %s, who may attach to it", ErrNoStatus, id, b.agent, b.agent, s.From)
			}
		}
		return nil, fmt.Errorf("%w: no request %s from %s", ErrNoStatus, id, b.agent)
	}
	if st.ReplyBy.IsZero() {
		return nil, fmt.Errorf("%w: %s is not a request (it has no reply-by): no reply to attach to; Status follows it", ErrInvalidMessage, id)
	}
	m := &Message{ID: st.ID, From: b.agent, To: st.To, CorrelationID: st.CorrelationID}
	expired := &DeadlineError{ID: id, To: st.To, Kind: deadlineReplyBy, Deadline: st.ReplyBy}
	switch st.State {
	case StateCanceled:
		return nil, &CanceledError{ID: id, By: st.By}
	case StateExpired:
		if st.Reason != reasonUnanswered {
			return nil, expired // dropped unread: no handler will reply
		}
		// Delivered and not answered by its reply-by: its handler may
		// still reply, late.
	case StateDeadLettered:
		return nil, fmt.Errorf("%w: %w: request %s is %s, without a reply: %s", ErrFinal, ErrDeadLettered, id, st.State, st.Reason)
	case StateCompleted:
		return nil, fmt.Errorf("%w: request %s is %s, without a reply", ErrFinal, id, st.State)
	}
	// Past the reply-by, and without a deadline of the caller's, a late
	// reply already stored is read, not waited for.
	readOnly := false
	if _, ok := ctx.Deadline(); !ok {
		until := st.ReplyBy
		if !until.After(time.Now()) {
			until, readOnly = time.Now().Add(defaultTimeout), true
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	replyBy, _ := ctx.Deadline()
	if !ro.doBy.IsZero() && ro.doBy.Before(replyBy) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, ro.doBy)
		defer cancel()
	}

	// Waiting first, so that nothing sent while the past is read is
	// missed; what is both read and taken is handed over once.
	seen := make(map[string]bool)
	onProgress := ro.onProgress
	if onProgress != nil {
		ro.onProgress = func(d *Delivery) {
			if !seen[d.ID] {
				seen[d.ID] = true
				onProgress(d)
			}
		}
	}
	w, err := b.req.wait(b, st, ro)
	if err != nil {
		return nil, err
	}
	defer b.req.forget(id)
	var questions, past []*Delivery
	reply, err := b.readAnswers(ctx, st, func(d *Delivery) {
		if !d.IsProgress() {
			questions = append(questions, d)
		} else if ro.onProgress != nil {
			b.req.markTaken(d.ID)
			past = append(past, d)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", id, err)
	}
	// Handed over once the read let go of the history: OnProgress may
	// read it (History, Status) or take its time.
	for _, d := range past {
		ro.onProgress(d)
	}
	if reply == nil && readOnly {
		return nil, expired
	}
	if reply == nil {
		b.handOverQuestions(ctx, questions)
		return b.await(ctx, w, m, replyBy, ro, nil)
	}
	b.req.forget(id)
	b.req.markTaken(reply.ID)
	b.recordTaken(reply)
	// Taken meanwhile: the progress updates, all seen, and the questions,
	// which the reply makes moot.
	for _, u := range b.req.updates(w) {
		if _, question := u.IsInputRequest(); ro.onProgress != nil && (!question || ro.onInput == nil) {
			ro.onProgress(u)
		}
	}
	return reply, nil
}

// readAnswers reads the messages stored for this agent from the recipient
// of request st since the request, hands each progress update and question
// (Delivery.AskInput) on it to update, in order, and returns its reply if
// one is stored. update runs with b.history held: it must not read the
// agent's history, as Status may (see handOverQuestions).
func (b *Bus) readAnswers(ctx context.Context, st Status, update func(*Delivery)) (*Delivery, error) {
	name, filter, err := b.opts.scheme.HistoryConsumer(b.agent, st.To)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.ConsumerConfig{Name: name, FilterSubject: filter}
	if st.Sequence > 0 && st.Stream == b.opts.scheme.Stream() {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, st.Sequence
	} else {
		start := st.Time.Add(-time.Second)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	b.history.Lock()
	defer b.history.Unlock()
	var reply *Delivery
	err = b.readHistory(ctx, cfg, func(jm jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		m, err := codec.Decode(jm.Headers(), jm.Data())
		if err != nil || m.CausationID != st.ID || m.Type == TypeCancel {
			return false, nil
		}
		if _, err := b.checkSender(jm.Subject(), m); err != nil {
			return false, nil
		}
		d := &Delivery{bus: b, Message: *m, Subject: jm.Subject(), Stream: md.Stream, Consumer: md.Consumer,
			Sequence: md.Sequence.Stream, Deliveries: int(md.NumDelivered)}
		if m.Type == TypeDeadLettered {
			b.req.take(d, false) // ends the Request or Attach waiting for it
			return false, nil
		}
		if _, question := d.IsInputRequest(); question || d.IsProgress() {
			update(d)
			return false, nil
		}
		reply = d
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the messages from %s: %w", st.To, err)
	}
	return reply, nil
}

// handOverQuestions hands the questions (Delivery.AskInput) read from the
// stream for a request this process waits for to the waiting Request or
// Attach, as the listener would, unless answered already: an answer given
// (by the process that sent the request, say) is not asked for again.
// Called once readAnswers is done: the look-up may read the agent's
// history, which readAnswers holds.
func (b *Bus) handOverQuestions(ctx context.Context, questions []*Delivery) {
	for _, q := range questions {
		if !b.answered(ctx, q) {
			b.handOver(q, false)
		}
	}
}

// answered reports whether question q (Delivery.AskInput), which this
// agent was asked, has had its answer, by its status.
func (b *Bus) answered(ctx context.Context, q *Delivery) bool {
	sts, err := b.Status(ctx, q.ID)
	if err != nil {
		return false
	}
	for _, st := range sts {
		if st.To == b.agent && (st.State == StateReplied || st.State.Final()) {
			return true
		}
	}
	return false
}
