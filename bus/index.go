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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// The message as its own index. A direct message the bus sends has an
// indexed subject, <root>.agent.<to>.p<N>.<from>.<type>.<id>.<conversation>
// (subjects.Scheme.IndexedDirect), so the stream's subject index finds it
// by its ID: a lookup reads the last message of each subject a filter such
// as <root>.agent.*.*.*.*.<id>.* matches with one direct get, and learns
// from it its sender, recipient, conversation and sequence. From those it
// reads the message's records by their exact keys, where it would
// otherwise look through every key of the status bucket for the ID.
//
// The bus's own IDs (UUID version 7) are named by the 4 ms window of
// their time (subjects.IndexToken), which the messages made in it share:
// the stream then keeps an index entry per window and route, not per
// message, which is what lifecycle tracking cost a publish
// (docs/performance.md). An operator's lookup reads the headers of the
// window's messages and keeps the one with the ID (find); an agent's reads
// the last message of its two filters first, and every message they match
// where that is another one (Bus.findOwn). Messages stored by an
// earlier version, which named each ID, are found by the ID's own token
// second.

// find returns the pending status of every message of the stream whose
// event's ID is id, found by its indexed subject under any agents, as an
// operator may read them (Admin.Status): for the ID's window, the headers
// of the window's messages (storedIn); for an ID's own token, the last
// message of each subject its filter matches (storedAll). It stops at the
// first filter that finds the ID. (A window's last messages would come
// with their bodies, one per route and conversation window: at a high
// rate over many routes, more to read than the window's headers.)
func (t *tracker) find(ctx context.Context, id string) ([]Status, error) {
	windowed := subjects.Windowed(subjects.IndexToken(id))
	for i, f := range t.scheme.MessageFilters(id) {
		var (
			found []Status
			err   error
		)
		if i == 0 && windowed {
			if found, err = t.storedIn(ctx, f); err == nil {
				found = lastOfEach(found, id)
			}
		} else {
			found, err = t.storedAll(ctx, id, f)
		}
		if err != nil {
			return nil, err
		}
		if len(found) > 0 {
			return found, nil
		}
	}
	return nil, nil
}

// findOwn returns the pending status of message id that the stream holds
// under an indexed subject naming this agent, as the recipient or the
// sender, as an agent may read it (Bus.Status): the last message each of
// its filters of id matches, one direct get each (stored), and where that
// is another message (of the ID's window, or one whose subject names an ID
// it does not carry), every message the pair matches, by their headers,
// with the agent's history consumers (storedUnder). It stops at the first
// pair of filters that finds the ID.
func (b *Bus) findOwn(ctx context.Context, id string) ([]Status, error) {
	filters, err := b.opts.scheme.MessageFiltersOfAgent(id, b.agent)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(filters); i += 2 {
		pair := filters[i : i+2]
		found, others, err := b.status.stored(ctx, id, pair...)
		if err != nil {
			return nil, err
		}
		if len(found) == 0 && others {
			all, err := b.storedUnder(ctx, pair)
			if err != nil {
				return nil, err
			}
			found = lastOfEach(all, id)
		}
		if len(found) > 0 {
			return found, nil
		}
	}
	return nil, nil
}

// lastOfEach returns, of the statuses of stored messages in stream order,
// those of message id, the last of each sender, recipient, type, priority
// and conversation: what reading the last message of each subject that
// names the ID finds, where a subject of its own names it. A recurring
// schedule's firings, stored under the schedule's ID, so count as its
// latest firing, as do copies of a message sent again after the duplicate
// window.
func lastOfEach(stored []Status, id string) []Status {
	type route struct {
		from, to, typ, conv string
		priority            int
	}
	at := make(map[route]int)
	var out []Status
	for _, st := range stored {
		if st.ID != id {
			continue
		}
		r := route{st.From, st.To, st.Type, st.CorrelationID, st.Priority}
		if i, ok := at[r]; ok {
			out[i] = st
			continue
		}
		at[r] = len(out)
		out = append(out, st)
	}
	return out
}

// conversation returns the pending status of every message of the
// conversation correlationID names that the stream holds under an indexed
// subject, in stream order, read with a short-lived consumer of their
// headers per filter of the conversation (storedIn): an operator's read.
// A window's filter also matches the conversations begun with it; their
// messages are left out.
func (t *tracker) conversation(ctx context.Context, correlationID string) ([]Status, error) {
	var out []Status
	for _, f := range t.scheme.ConversationFilters(correlationID) {
		stored, err := t.storedIn(ctx, f)
		if err != nil {
			return nil, err
		}
		out = append(out, inConversation(stored, correlationID)...)
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return out, nil
}

// inConversation returns the statuses of stored that belong to the
// conversation correlationID names, in place.
func inConversation(stored []Status, correlationID string) []Status {
	return slices.DeleteFunc(stored, func(st Status) bool { return st.CorrelationID != correlationID })
}

// stored returns, for each of filters, the pending status of the last
// message of the stream whose indexed subject the filter matches, read off
// the message itself, if its event's ID is id: a subject that names an ID
// its event does not carry (a foreign publisher's mistake, or a forgery,
// which permissions limit to the publisher's own subjects) finds nothing.
// A filter with no message finds nothing either; others reports that a
// filter's last message was another one (of the same window, or a
// forgery). The error says the stream could not be asked: it was
// provisioned before the index (no direct gets), or the reader's
// permissions predate it; the caller then looks through the records
// instead.
func (t *tracker) stored(ctx context.Context, id string, filters ...string) (out []Status, others bool, err error) {
	for _, f := range filters {
		resp, err := directGet(ctx, t.nc, t.reconnects, t.streamGet+f)
		if err != nil {
			return nil, false, fmt.Errorf("find %s in stream %s: %w", id, t.stream, err)
		}
		switch code := resp.Header.Get("Status"); code {
		case "":
		case "404":
			continue
		default:
			return nil, false, fmt.Errorf("find %s in stream %s: server answered %s %s", id, t.stream, code, resp.Header.Get("Description"))
		}
		st, ok := t.storedStatus(resp)
		switch {
		case !ok || st.ID != id:
			others = true
		// An agent's two filters meet on a message to itself.
		case !slices.ContainsFunc(out, func(o Status) bool { return o.Sequence == st.Sequence }):
			out = append(out, st)
		}
	}
	return out, others, nil
}

// maxBatch is how many messages the server answers one batched direct
// get with, at most (nats-server's limit).
const maxBatch = 1024

// storedAll returns the pending status of every message of the stream
// whose indexed subject matches filter and whose event's ID is id, read off
// the message itself, the last of each subject: for a subject of the
// ID's own, the message it names. It asks for them all at once, a direct
// get with the filter in its body, which an operator may and an agent may
// not (its permissions name the subject in the request's subject, stored).
// More than maxBatch subjects are an error. An answer that does not come
// in time is asked for again (askAgain).
func (t *tracker) storedAll(ctx context.Context, id, filter string) ([]Status, error) {
	return askAgain(ctx, t.reconnects, func(ctx context.Context) ([]Status, error) { return t.storedAllOnce(ctx, id, filter) })
}

// storedAllOnce is one attempt of storedAll.
func (t *tracker) storedAllOnce(ctx context.Context, id, filter string) ([]Status, error) {
	inbox := t.nc.NewInbox()
	sub, err := t.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	req, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{[]string{filter}, maxBatch})
	if err != nil {
		return nil, err
	}
	if err := t.nc.PublishRequest(strings.TrimSuffix(t.streamGet, "."), inbox, req); err != nil {
		return nil, err
	}
	var out []Status
	for {
		resp, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, &notProvisionedError{stream: t.stream, cause: err}
		}
		if err != nil {
			return nil, fmt.Errorf("read %s in stream %s: %w", filter, t.stream, err)
		}
		switch code := resp.Header.Get("Status"); code {
		case "":
			if st, ok := t.storedStatus(resp); ok && st.ID == id {
				out = append(out, st)
			}
			continue
		case "204": // the end of the batch
			return out, nil
		case "404":
			return nil, nil
		default:
			return nil, fmt.Errorf("read %s in stream %s: server answered %s %s", filter, t.stream, code, resp.Header.Get("Description"))
		}
	}
}

// storedStatus returns the pending status of the stored message a direct
// get answered with (resp), as statusOfStored does.
func (t *tracker) storedStatus(resp *nats.Msg) (Status, bool) {
	seq, _ := strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	ts, _ := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	return t.statusOfStored(resp.Header.Get(jetstream.SubjectHeader), resp.Header, resp.Data, seq, ts)
}

// statusOfStored returns the pending status of the message stored on
// subject at sequence seq at time ts, with headers h and data (pendingOf).
func (t *tracker) statusOfStored(subject string, h nats.Header, data []byte, seq uint64, ts time.Time) (Status, bool) {
	st, ok := t.pendingOf(subject, h, data)
	if !ok {
		return Status{}, false
	}
	st.Stream, st.Sequence = t.stream, seq
	if !ts.IsZero() {
		st.Updated = ts.UTC()
	}
	return st, true
}

// pendingOf returns the pending status of the direct message on subject
// with headers h and data, as its sender's record would hold it, or false
// if it is not a direct message that names its sender truly. The subject
// says who it is to, as it does for delivery. data may be nil: the status
// needs only the headers.
func (t *tracker) pendingOf(subject string, h nats.Header, data []byte) (Status, bool) {
	a, err := t.scheme.Parse(subject)
	if err != nil || a.Kind != subjects.KindDirect {
		return Status{}, false
	}
	m, err := codec.Decode(h, data)
	if err != nil || m.From != a.From {
		return Status{}, false
	}
	m.To, m.Priority = a.To, a.Priority
	return statusOf(m, a.To, StatePending, m.From), true
}

// storedIn returns the pending status of every message of the stream whose
// indexed subject matches filter, in stream order, read with a reader of
// their headers (readStream): any number of them, where storedAll answers
// up to maxBatch. The reader's name is random, which an operator may
// create and an agent may not (see Bus.History for an agent's read).
func (t *tracker) storedIn(ctx context.Context, filter string) ([]Status, error) {
	var out []Status
	cfg := jetstream.ConsumerConfig{FilterSubject: filter, HeadersOnly: true}
	err := t.reads.readStream(ctx, t.stream, cfg, func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		if st, ok := t.statusOfStored(m.Subject(), m.Headers(), nil, md.Sequence.Stream, md.Timestamp); ok {
			out = append(out, st)
		}
		return false, nil
	})
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, &notProvisionedError{stream: t.stream, cause: err}
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", filter, err)
	}
	return out, nil
}

// withStored returns records followed by the statuses of the messages in
// stored that no record describes (the same ID, sender and recipient), the
// sequence of a stored message filled into a record that lacks one.
func withStored(records, stored []Status) []Status {
	type key struct{ id, from, to string }
	at := make(map[key]int, len(records))
	for i, r := range records {
		at[key{r.ID, r.From, r.To}] = i
	}
	out := records
	for _, st := range stored {
		if i, ok := at[key{st.ID, st.From, st.To}]; ok {
			out[i] = recordOver(out[i], st)
			continue
		}
		at[key{st.ID, st.From, st.To}] = len(out)
		out = append(out, st)
	}
	return out
}

// recordOver returns rec, the record of the message stored as st, which it
// describes better (a recipient's state, a reply, a cancel), with st's
// stream and sequence if it holds none. A sender's failed record, of a
// publish that failed (never delivered), is not: the stream holds the
// message, stored by an earlier attempt, or by the first publish of its
// ID, so st says more (before 2026-11-28 a refused re-send made the stored
// message read failed). A failed schedule's record is kept: it holds the
// schedule, which its sender's Cancel removes, where st is a firing's.
func recordOver(rec, st Status) Status {
	if rec.State == StateFailed && rec.Deliveries == 0 && rec.Schedule == "" {
		st.revision = rec.revision // what is derived is written back over it
		return st
	}
	if rec.Sequence == 0 {
		rec.Stream, rec.Sequence = st.Stream, st.Sequence
	}
	return rec
}

// withRecords returns the statuses of the messages found in the stream,
// each replaced by its record where one exists: the record says more (a
// recipient's state, a reply, a cancel), and the stored message fills in
// the sequence where the record lacks one.
func (t *tracker) withRecords(ctx context.Context, found []Status) ([]Status, error) {
	out := make([]Status, 0, len(found))
	for _, st := range found {
		m := st.Message()
		rec, err := t.get(ctx, &m, st.To)
		switch {
		case err == nil:
			out = append(out, recordOver(rec, st))
		case errors.Is(err, ErrNoStatus):
			out = append(out, st)
		default:
			return nil, err
		}
	}
	return out, nil
}
