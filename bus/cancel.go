package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// TypeCancel is the type of the notice Cancel sends the recipient of a
// canceled message, at priority 1, so that it overtakes the queued work.
const TypeCancel = "agentbus.cancel"

// ErrCanceled is the cause of a handler's context cancelled by Cancel, and
// wrapped by the reason its record gives.
var ErrCanceled = errors.New("bus: message canceled")

// ErrFinal is wrapped by the error of a call on a message that ended
// (replied, completed, expired, dead-lettered or canceled already): a
// Cancel, which changes nothing and returns the Status that says how it
// ended; an Attach to a request that ended without a reply; a progress
// update or a question (Delivery.Progress, Delivery.AskInput) on a request
// already replied to.
var ErrFinal = errors.New("bus: message already finished")

// Cancel cancels the direct message id, sent by this agent or to it. A
// message still queued is never handed to a handler; a handler running it
// has its context cancelled (context.Cause is ErrCanceled), and what it
// returns is recorded; either way the message's record ends canceled and
// it is not delivered again. After the message ended, Cancel changes
// nothing and returns its Status with an error wrapping ErrFinal.
//
// The recipient learns of the cancel from its record, which only the
// sender, the recipient and an operator may write, and from a notice
// (TypeCancel, priority 1) that overtakes its queued work: a request is
// checked against its record when it is delivered anyway, but a plain
// message queued at priority 1 ahead of the notice can start before the
// notice arrives, and is then cancelled while it runs. The sender of a
// request gets a notice too, until the request's reply-by, which ends a
// Request waiting for it in any of its processes (in the one that cancels,
// Cancel ends it at once). A process whose connection was down when the
// notice went out looks up the records of the messages it runs once it is
// back.
//
// A scheduled message (Schedule), direct or broadcast, canceled by its
// sender never fires: its schedule is removed. Canceled by its recipient,
// it fires, and the recipient drops it by its record.
//
// Errors: ErrFinal, ErrNoStatus (no record of the message that names this
// agent), ErrInvalidOption with lifecycle tracking off, or the server's.
func (b *Bus) Cancel(ctx context.Context, id string) (Status, error) {
	var (
		canceled Status
		err      error
	)
	if b.shards != nil {
		canceled, err = b.shards.cancel(ctx, id)
	} else {
		canceled, err = b.cancelHere(ctx, id)
	}
	if err == nil || !errors.Is(err, ErrFinal) && !errors.Is(err, ErrNoStatus) && !errors.Is(err, ErrInvalidMessage) {
		b.req.cancel(id, "", b.agent) // a Request of this process waiting for it
	}
	return canceled, err
}

// cancelHere cancels message id on this bus's own root; its notices go
// out with Publish, to the recipient's shard.
func (b *Bus) cancelHere(ctx context.Context, id string) (Status, error) {
	mine := func(st Status) bool { return st.From == b.agent || st.To == b.agent }
	return b.cancelByID(ctx, id, b.statusHere, mine, b.agent, b.Publish)
}

// Cancel cancels the direct message id as an operator, as Bus.Cancel does
// for its sender or recipient; the notice comes from "agentbus".
func (a *Admin) Cancel(ctx context.Context, id string) (Status, error) {
	anyone := func(Status) bool { return true }
	return a.cancelByID(ctx, id, a.Status, anyone, operatorSender, a.publishAsOperator)
}

// publishAsOperator publishes m from "agentbus", as the notices of an
// operator's cancel and of its dead-letter watcher come.
func (a *Admin) publishAsOperator(ctx context.Context, m Message) (PubAck, error) {
	m.From = operatorSender
	return PubAck{}, a.publishAs(ctx, m)
}

// cancelAttempts bounds how often a cancel reads a record again that
// changed between its lookup and the cancel's write: a progress update or
// a question of the running handler, which leave it cancelable. Each
// attempt reads the record by its key, a round trip, so a handler that
// records progress without pause leaves it a narrow window only.
const cancelAttempts = 50

// errRecordChanged is wrapped by cancel's error when the record changed
// since it was read.
var errRecordChanged = errors.New("its record changed meanwhile")

// cancelByID cancels message id, whose records lookup reads, as by: the
// first cancelable record that may names.
func (c *client) cancelByID(ctx context.Context, id string, lookup func(context.Context, string) ([]Status, error), may func(Status) bool,
	by string, publish func(context.Context, Message) (PubAck, error)) (Status, error) {
	sts, err := lookup(ctx, id)
	if err != nil {
		return Status{}, err
	}
	i := slices.IndexFunc(sts, func(st Status) bool { return cancelable(st) && may(st) })
	// A broadcast sent has a record for each recipient that handled it
	// as well as its sender's: none of them is canceled.
	if i < 0 || slices.ContainsFunc(sts, func(st Status) bool { return st.To == Broadcast && !cancelable(st) }) {
		return Status{}, fmt.Errorf("%w: %s is a broadcast sent, which cannot be canceled", ErrInvalidMessage, id)
	}
	st := sts[i]
	for attempt := 1; ; attempt++ {
		canceled, err := c.cancel(ctx, st, by, publish)
		if !errors.Is(err, errRecordChanged) || attempt == cancelAttempts || ctx.Err() != nil {
			return canceled, err
		}
		m := st.Message()
		fresh, gerr := c.status.get(ctx, &m, st.To)
		if gerr != nil {
			return canceled, err
		}
		st = fresh
	}
}

// cancelable reports whether the message st records can be canceled: a
// direct message, or a broadcast not sent yet (scheduled: a recurring
// schedule's record reads scheduled while it fires, a one-off's until it
// fired; canceled, to be removed again) or whose schedule's outcome was
// not known (unsentSchedule).
func cancelable(st Status) bool {
	return st.To != Broadcast || st.Schedule != "" && (st.State == StateScheduled || st.State == StateCanceled) || unsentSchedule(st)
}

// unsentSchedule reports whether st is the record of a Schedule that
// failed without knowing whether the server stored it (a lost ack, an
// ended context): its schedule may fire, and Cancel removes it.
func unsentSchedule(st Status) bool {
	return st.State == StateFailed && st.Schedule != "" && st.Sequence == 0 && st.By == st.From
}

// operatorSender is the sender of what an Admin publishes, a name no
// agent may have.
const operatorSender = subjects.Operator

// cancelNotice is the data of a TypeCancel notice: the canceled message,
// whose record its recipient and its sender read to trust the notice.
type cancelNotice struct {
	ID   string `json:"id"`
	From string `json:"from"`
	// To is the message's recipient, whose record the sender reads; a
	// notice without it (from before 2026-11-27) names the agent it is
	// sent to.
	To string `json:"to,omitempty"`
	By string `json:"by"`
}

// cancel writes st canceled, unless a state was written since it was read
// or it ended, and sends the recipient the notice with publish.
func (c *client) cancel(ctx context.Context, st Status, by string, publish func(context.Context, Message) (PubAck, error)) (Status, error) {
	mayUnschedule := st.Schedule != "" && (by == st.From || by == operatorSender)
	if mayUnschedule && (st.State == StateCanceled || st.FiresAt.IsZero() && st.State.Final()) {
		// A schedule its recipient canceled fires on, to be dropped,
		// until its sender or an operator removes it; so does a
		// recurring one whose record a lookup reads ended (from a firing
		// of a schedule whose ack was lost).
		if err := c.unschedule(ctx, st); err != nil {
			return st, fmt.Errorf("cancel %s: %w", st.ID, err)
		}
		if st.FiresAt.IsZero() { // recurring: this cancel stopped it
			return st, nil
		}
	}
	if st.State.Final() {
		return st, fmt.Errorf("%w: %s is %s", ErrFinal, st.ID, st.State)
	}
	canceled := st
	canceled.State, canceled.Updated, canceled.By, canceled.Reason = StateCanceled, time.Now().UTC(), by, "canceled by "+by
	if err := c.status.updateStored(ctx, canceled, st.revision); err != nil {
		if isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) {
			return st, fmt.Errorf("cancel %s: %w: %w", st.ID, errRecordChanged, err)
		}
		return st, fmt.Errorf("cancel %s: %w", st.ID, err)
	}
	if st.State == StateScheduled || unsentSchedule(st) {
		// Its recipient cannot remove the schedule; it drops the message
		// when it fires, by the record, as it does one that fired just
		// before the schedule was removed: no notice is needed.
		if !mayUnschedule {
			return canceled, nil
		}
		if err := c.unschedule(ctx, st); err != nil {
			return canceled, fmt.Errorf("cancel %s: recorded, but the schedule stays (its recipient will drop it): %w", st.ID, err)
		}
		return canceled, nil
	}
	if st.To == Broadcast {
		return canceled, nil
	}
	data, err := json.Marshal(cancelNotice{ID: st.ID, From: st.From, To: st.To, By: by})
	if err != nil {
		return canceled, err
	}
	// The recipient, to stop the work; and the sender of a request, to end
	// a Request waiting for the reply, in any of its processes (in the one
	// that cancels, Cancel ends it at once). The sender's notice expires at
	// the request's reply-by, after which no Request waits: an agent that
	// only sends requests, and never takes its inbox, is left none.
	to := []string{st.To}
	untilReplyBy := time.Until(st.ReplyBy)
	if st.From != st.To && subjects.ValidateID(st.From) == nil && untilReplyBy > 0 {
		to = append(to, st.From)
	}
	for _, agent := range to {
		notice := Message{To: agent, Type: TypeCancel, Priority: 1, CorrelationID: st.CorrelationID, CausationID: st.ID,
			ContentType: "application/json", Data: data}
		if agent != st.To {
			notice.TTL = max(untilReplyBy, time.Second)
		}
		if _, err := publish(context.WithoutCancel(ctx), notice); err != nil {
			return canceled, fmt.Errorf("cancel %s: recorded, but the notice to %s failed: %w", st.ID, agent, err)
		}
	}
	return canceled, nil
}

// cancels are what a Bus knows of canceled messages to its agent: the
// handlings running and the IDs canceled lately.
type cancels struct {
	mu sync.Mutex
	// running holds every handling under way, each at its index
	// (handling.slot): a slice, not a map by ID, because every delivered
	// message is added and removed and only a cancel notice searches it.
	running  []*handling
	canceled recentSet[recordOf] // by ID and sender; the recipient is this agent
}

// start registers h as running, and reports whether its message was
// canceled already.
func (c *cancels) start(h *handling) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.canceled.has(recordOf{id: h.d.ID, from: h.d.From}) {
		return true
	}
	h.slot = len(c.running)
	c.running = append(c.running, h)
	return false
}

// done unregisters h, which start registered.
func (c *cancels) done(h *handling) {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := len(c.running) - 1
	moved := c.running[last]
	c.running[h.slot], moved.slot = moved, h.slot
	c.running[last] = nil
	c.running = c.running[:last]
}

// runningMessages returns what the canceled record of each running
// handling's message is looked up by: its ID, sender and conversation.
func (c *cancels) runningMessages() []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Message, 0, len(c.running))
	for _, h := range c.running {
		out = append(out, Message{ID: h.d.ID, From: h.d.From, CorrelationID: h.d.CorrelationID})
	}
	return out
}

// apply marks message id from sender from canceled and cancels its
// handlers if any run. The sender is part of what names the message: the
// record that vouches for a cancel is one of the message from that sender
// (the notice names it), and the sender of a handler's message is the one
// its subject vouched for; another agent's message with the same ID is
// not canceled.
func (c *cancels) apply(id, from string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.canceled.add(recordOf{id: id, from: from})
	for _, h := range c.running {
		if h.d.ID == id && h.d.From == from {
			h.canceled.Store(true)
			h.ctx.cancelWith(ErrCanceled)
		}
	}
}

// takeNotice applies a cancel notice m, once the record of the message it
// names says canceled (so nobody but its sender, its recipient or an
// operator can cancel it): at its recipient, a handler running it stops;
// at its sender, a Request waiting for it ends.
func (b *Bus) takeNotice(ctx context.Context, m *Message) {
	var n cancelNotice
	if err := json.Unmarshal(m.Data, &n); err != nil || n.ID == "" || b.status == nil {
		return
	}
	// The notice is about a message to this agent, or, naming its
	// recipient, about one this agent sent; never one between others.
	to := b.agent
	if n.From == b.agent && n.To != "" {
		to = n.To
	}
	at, err := b.busOf(ctx, to) // the message's records are on its recipient's shard
	canceled := false
	if err == nil {
		canceled, err = at.status.canceled(ctx, &Message{ID: n.ID, From: n.From, CorrelationID: m.CorrelationID}, to)
	}
	switch {
	case err != nil:
		b.opts.onError(fmt.Errorf("cancel notice for %s from %s ignored: its record could not be read: %w", n.ID, m.From, err))
		return
	case !canceled:
		b.opts.onError(fmt.Errorf("cancel notice for %s from %s ignored: its record is not canceled", n.ID, m.From))
		return
	}
	if to == b.agent {
		b.cancels.apply(n.ID, n.From)
	}
	if n.From == b.agent {
		b.req.cancel(n.ID, to, n.By) // a Request of this agent's, if it went to that recipient
	}
}

// takeMissedNotices cancels, after every reconnect until d is done, the
// running handlers whose messages were canceled while the connection was
// down. Their live notices were lost with the connection, and the stored
// copies come through d only once a handler slot is free: after the
// handlers they cancel when those hold every slot. It reads the record of
// each message running (tracker.canceled).
func (b *Bus) takeMissedNotices(d *consumers.Dispatcher) {
	if b.status == nil {
		return
	}
	reconnected := b.nc.StatusChanged(nats.CONNECTED)
	go func() {
		defer b.nc.RemoveStatusListener(reconnected)
		for {
			select {
			case <-reconnected:
			case <-d.Done():
				return
			}
			b.takeMissed(d.Done())
		}
	}()
}

// takeMissed looks up the record of every message running and cancels
// those canceled, until done is closed.
func (b *Bus) takeMissed(done <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	for _, m := range b.cancels.runningMessages() {
		canceled, err := b.status.canceled(ctx, &m, b.agent)
		switch {
		case canceled:
			b.cancels.apply(m.ID, m.From)
		case err != nil && ctx.Err() == nil:
			b.opts.onError(fmt.Errorf("look for a cancel of %s while the connection was down: %w", m.ID, err))
		}
	}
}

// takeQueuedNotices takes the cancel notices to the agent that its
// priority-1 consumer, whose state p1 is (nil: none was made), still
// holds, before a subscription handles its first message. A notice stored
// while no process of the agent listened arrives after the message it
// cancels when that message is of priority 1 too (one consumer, stream
// order), and can start beside it when handlers run several at once; read
// first, it keeps Cancel's promise that a message canceled while it was
// queued is never handled. It reads with the agent's history consumer,
// from the consumer's ack floor on, only the notices' subjects; a read
// that fails goes to the error handler, and the notices then come as
// before.
func (b *Bus) takeQueuedNotices(ctx context.Context, p1 *jetstream.ConsumerInfo) {
	if p1 == nil || p1.NumPending == 0 && p1.NumAckPending == 0 || b.status == nil {
		return
	}
	filters, err := b.opts.scheme.TypeFilters(b.agent, TypeCancel, 1)
	if err != nil {
		return
	}
	name, _, _ := b.opts.scheme.ReceivedHistoryConsumer(b.agent) // the agent is valid
	b.history.Lock()
	defer b.history.Unlock()
	for _, f := range filters {
		cfg := jetstream.ConsumerConfig{Name: name, FilterSubject: f,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: p1.AckFloor.Stream + 1}
		err := b.readHistory(ctx, cfg, func(jm jetstream.Msg, _ *jetstream.MsgMetadata) (bool, error) {
			if m, err := codec.Decode(jm.Headers(), jm.Data()); err == nil {
				if _, err := b.checkSender(jm.Subject(), m); err == nil {
					b.takeNotice(ctx, m)
				}
			}
			return false, nil
		})
		if err != nil {
			b.opts.onError(fmt.Errorf("read the cancel notices queued for %s: %w", b.agent, err))
			return
		}
	}
}

// CanceledError is returned by a Request whose request was canceled
// (Bus.Cancel, Admin.Cancel) while it waited; it wraps ErrCanceled.
type CanceledError struct {
	ID string // the request's ID
	By string // who canceled it: an agent, or "agentbus" for an operator
}

func (e *CanceledError) Error() string {
	return fmt.Sprintf("request %s canceled by %s", e.ID, e.By)
}

// Unwrap returns ErrCanceled.
func (e *CanceledError) Unwrap() error { return ErrCanceled }

// canceledReason is what a canceled handler's record says it returned.
func canceledReason(err error) error {
	if err == nil || errors.Is(err, ErrCanceled) {
		return fmt.Errorf("%w while its handler ran; it returned %v", ErrCanceled, err)
	}
	return fmt.Errorf("%w while its handler ran; it returned: %w", ErrCanceled, err)
}
