package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agentbus/agentbus/codec"
)

// ErrTooFewReplies is wrapped by the error of a Gather that ended with
// fewer replies than it wanted; its result says who did what.
var ErrTooFewReplies = errors.New("bus: fewer replies than wanted")

// GatherOption configures one Gather.
type GatherOption func(*gatherOptions)

type gatherOptions struct {
	want           int
	stall          time.Duration
	queueIfOffline bool
}

// Want ends a Gather as soon as k replies came (default: one from every
// agent asked). k larger than the agents asked is all of them.
func Want(k int) GatherOption {
	return func(o *gatherOptions) { o.want = k }
}

// StallTimeout ends a Gather when d passes after a reply without another
// one, even before it has what it wants. The timer starts with the first
// reply; before it, only the deadline counts.
func StallTimeout(d time.Duration) GatherOption {
	return func(o *gatherOptions) { o.stall = d }
}

// GatherOffline asks the agents the registry says are offline too: their
// copies wait in their queues (and count as timed out unless they come
// back in time). By default they are not asked and are listed Offline.
func GatherOffline() GatherOption {
	return func(o *gatherOptions) { o.queueIfOffline = true }
}

// presenceLookups is how many presence records a Gather reads at a time.
const presenceLookups = 16

// GatherResult is what a Gather got: who replied, in the order the replies
// came, who failed, who was offline and not asked, who did not answer in
// time. Requests maps every agent asked to the ID of its copy of the
// request: Status and Attach read a late reply by it.
type GatherResult struct {
	ID       string            // the request's ID, also the conversation of every copy
	Replies  []*Delivery       // in the order they came; Delivery.From is the agent
	Failed   []Status          // the copies that ended without a reply: dead-lettered, canceled, expired
	Offline  []string          // agents the registry says are offline, not asked
	TimedOut []string          // agents asked that had not replied when the Gather ended
	Requests map[string]string // agent -> the ID of its copy
}

// Replied reports whether agent replied.
func (r *GatherResult) Replied(agent string) bool {
	return slices.ContainsFunc(r.Replies, func(d *Delivery) bool { return d.From == agent })
}

// Gather sends request m to each of agents and collects their replies as
// they come, until it has as many as it wants (Want; all by default),
// every copy has replied or ended without a reply (canceled, or
// dead-lettered: TypeDeadLettered), the replies stall (StallTimeout), or
// ctx ends (its deadline, else the
// request timeout, is every copy's reply-by, and a copy still queued then
// expires unread). Each agent gets its own copy, as PublishGroup sends
// them, and replies to it with Reply, as to any request.
//
// The result says who replied, who failed (their copies ended without a
// reply), who was offline (by the registry; not asked unless
// GatherOffline) and who did not answer in time. Fewer replies than wanted
// return the result with an error wrapping ErrTooFewReplies (and ctx's
// error when ctx ended the wait), or ErrClosed when Close ended it. When
// every agent is offline, nobody is asked: the result, with an error
// wrapping ErrNoMembers and ErrTooFewReplies. A reply
// that comes after Gather ended is not lost: it reaches the agent's
// handler (marked Late once the reply-by passed), and Attach reads it by
// the copy's ID (GatherResult.Requests).
func (b *Bus) Gather(ctx context.Context, m Message, agents []string, opts ...GatherOption) (*GatherResult, error) {
	var o gatherOptions
	for _, opt := range opts {
		if opt != nil { // an option left unset: none
			opt(&o)
		}
	}
	agents = slices.Compact(slices.Sorted(slices.Values(agents)))
	agents = slices.DeleteFunc(agents, func(a string) bool { return a == b.agent })
	if len(agents) == 0 {
		return nil, fmt.Errorf("%w: Gather asks nobody", ErrNoMembers)
	}
	if m.To == "" {
		m.To = agents[0] // for the checks; every copy has its own
	}
	if m.To == Broadcast {
		return nil, &codec.FieldError{Field: "To", Value: m.To, Err: fmt.Errorf("%w: a request needs one recipient", ErrInvalidMessage)}
	}
	ctx, cancel, _, err := b.newRequest(ctx, &m, requestOptions{})
	if err != nil {
		return nil, err
	}
	defer cancel()

	res := &GatherResult{ID: m.ID, Requests: make(map[string]string, len(agents))}
	offline := make([]bool, len(agents))
	if !o.queueIfOffline {
		concurrently(len(agents), presenceLookups, func(i int) {
			p, _, err := b.presenceOfAgent(ctx, agents[i])
			offline[i] = err == nil && p.Status == Offline
		})
	}
	var asked []string
	for i, a := range agents {
		if offline[i] {
			res.Offline = append(res.Offline, a)
			continue
		}
		asked = append(asked, a)
	}
	if len(asked) == 0 {
		// Nobody to ask: not a success with no replies.
		return res, fmt.Errorf("%w: %w: request %s: every one of %d agents is offline, none asked (GatherOffline asks them)",
			ErrNoMembers, ErrTooFewReplies, m.ID, len(agents))
	}
	want := o.want
	if want <= 0 || want > len(asked) {
		want = len(asked)
	}

	replies := make(chan *Delivery, len(asked))
	ended := make(chan endSignal, 2*len(asked)) // a copy canceled or dead-lettered, told live and from its stored notice
	byID := make(map[string]string, len(asked)) // copy ID -> agent
	for _, a := range asked {
		c := copyFor(m, a)
		id := c.ID
		if err := b.req.waitInto(b, Status{ID: id, To: a, Time: c.Time}, replies, ended); err != nil {
			b.forgetAll(byID)
			return nil, err
		}
		byID[id], res.Requests[a] = a, id
	}
	defer b.forgetAll(byID)
	acks, err := b.publishCopies(ctx, m, asked)
	pending := len(asked)
	for _, ack := range acks {
		if ack.Err != nil {
			res.Failed = append(res.Failed, Status{ID: res.Requests[ack.Member], From: b.agent, To: ack.Member,
				CorrelationID: m.CorrelationID, State: StateFailed, Reason: ack.Err.Error()})
			pending--
		}
	}
	if err != nil && pending == 0 {
		return res, err
	}

	// A copy that ended without a reply counts as failed at once: the
	// Gather ends as soon as no copy is left that could still reply.
	endedCopies := make(map[string]bool)
	endCopy := func(e endSignal) {
		a, ok := byID[e.id]
		if !ok || endedCopies[a] || res.Replied(a) {
			return
		}
		c := copyFor(m, a)
		st := Status{ID: e.id, From: b.agent, To: a, CorrelationID: m.CorrelationID}
		switch {
		case e.deadLettered != nil:
			st.State, st.Reason = StateDeadLettered, fmt.Sprintf("%s: %s", e.deadLettered.Reason, e.deadLettered.Err)
		case e.verified || b.canceledRecord(ctx, &c):
			st.State, st.By, st.Reason = StateCanceled, e.by, "canceled by "+e.by
		default:
			return // a notice its record does not bear out
		}
		endedCopies[a] = true
		res.Failed = append(res.Failed, st)
	}
	var stall <-chan time.Time
	var stallTimer *time.Timer
	defer func() {
		if stallTimer != nil {
			stallTimer.Stop()
		}
	}()
collect:
	for len(res.Replies) < want && len(res.Replies)+len(endedCopies) < pending {
		select {
		case d := <-replies:
			res.Replies = append(res.Replies, d)
			if o.stall > 0 {
				if stallTimer == nil {
					stallTimer = time.NewTimer(o.stall)
					stall = stallTimer.C
				} else {
					stallTimer.Reset(o.stall)
				}
			}
		case e := <-ended:
			endCopy(e)
		case <-stall:
			break collect
		case <-ctx.Done():
			break collect
		case <-b.closing: // no reply can come: Close stopped the listener
			break collect
		}
	}
	b.forgetAll(byID) // no reply is handed over after this
	for more := true; more; {
		select {
		case d := <-replies:
			res.Replies = append(res.Replies, d)
		default:
			more = false
		}
	}
	if len(res.Replies) < want && b.isClosed() {
		return res, fmt.Errorf("request %s: %d of %d wanted: %w", m.ID, len(res.Replies), want, ErrClosed)
	}

	// Who did not reply: failed, by its record, or not yet done.
	failed := make(map[string]bool, len(res.Failed))
	for _, st := range res.Failed {
		failed[st.To] = true
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), publishAttemptTimeout)
	defer rcancel()
	for _, a := range asked {
		if res.Replied(a) || failed[a] {
			continue
		}
		if b.status != nil {
			c := copyFor(m, a)
			// A copy replied to since the replies stopped being taken
			// counts as not in time: its reply reached the handler.
			if st, err := b.status.get(rctx, &c, a); err == nil && st.State != StateReplied && (st.State.Final() || st.State == StateFailed) {
				res.Failed = append(res.Failed, st)
				continue
			}
		}
		res.TimedOut = append(res.TimedOut, a)
	}
	if len(res.Replies) < want {
		err := fmt.Errorf("%w: request %s: %d of %d wanted (%d asked, %d failed, %d offline, %d timed out)",
			ErrTooFewReplies, m.ID, len(res.Replies), want, len(asked), len(res.Failed), len(res.Offline), len(res.TimedOut))
		if ctx.Err() != nil { // canceled, or the reply-by passed; not a stall
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return res, err
	}
	return res, nil
}

// GatherGroup is Gather to the members of group.
func (b *Bus) GatherGroup(ctx context.Context, group string, m Message, opts ...GatherOption) (*GatherResult, error) {
	members, err := b.GroupMembers(ctx, group)
	if err != nil {
		return nil, err
	}
	members = slices.DeleteFunc(members, func(a string) bool { return a == b.agent })
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoMembers, group)
	}
	setExtension(&m, ExtGroup, group)
	return b.Gather(ctx, m, members, opts...)
}

// forgetAll removes the Gather's waiters, by copy ID.
func (b *Bus) forgetAll(byID map[string]string) {
	for id := range byID {
		b.req.forget(id)
	}
}
