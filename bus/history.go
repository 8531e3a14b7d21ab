package bus

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// History reads a conversation back as its messages, bodies included, from
// the stream (docs/history.md). The status bucket is the index: every
// record of a message names its conversation in its key and holds the
// message's stream sequence, so a conversation's messages are found
// without scanning the stream. An operator gets each body by its sequence;
// an agent, which may not, reads its own messages again with short-lived
// consumers of its own subjects.

// The size of a page of History.
const (
	// DefaultHistoryLimit is the page size of a HistoryQuery without a
	// Limit.
	DefaultHistoryLimit = 1000
	// MaxHistoryLimit is the largest page.
	MaxHistoryLimit = 10_000
)

// ExtRedeliveryOf is the CloudEvents extension that marks a message an
// operator delivered again (Admin.Redeliver): its value is the ID of the
// message it repeats. The repeat has an ID of its own, and the original's
// sender, type, priority, conversation, causation, time, data and other
// extensions.
const ExtRedeliveryOf = "redeliveryof"

// Errors of History and Redeliver.
var (
	// ErrNotParticipant is returned by Bus.History for a conversation of
	// which no record names the agent: it sent and received nothing in it,
	// or the conversation does not exist (an agent cannot tell the two
	// apart).
	ErrNotParticipant = errors.New("bus: agent took no part in the conversation")
	// ErrMessageGone is a HistoryEntry's Err when the stream no longer
	// holds the message its records name: past its TTL, past the stream's
	// retention, or removed (a dead-lettered message).
	ErrMessageGone = errors.New("bus: message no longer in the stream")
	// ErrNotRecorded is a HistoryEntry's Err when the message stored at the
	// sequence a record names is another message than the record's, or of
	// another conversation: a record not written by the bus.
	ErrNotRecorded = errors.New("bus: stored message is not the recorded one")
	// ErrInvalidCursor is returned for a HistoryQuery.After that is not
	// of the form HistoryEntry.Cursor makes. A well-formed one names a
	// place in the order, whether or not a page ended there.
	ErrInvalidCursor = errors.New("bus: invalid history cursor")
)

// HistoryQuery selects a page of a conversation's history. The zero value
// selects the first DefaultHistoryLimit messages.
type HistoryQuery struct {
	// Limit bounds the messages of the page, at most MaxHistoryLimit; zero
	// means DefaultHistoryLimit.
	Limit int
	// After is the Next of the page before; empty means the first page.
	After string
}

// Validate reports a negative Limit or one above MaxHistoryLimit
// (ErrInvalidOption) and an After no History returned (ErrInvalidCursor).
func (q HistoryQuery) Validate() error {
	if q.Limit < 0 || q.Limit > MaxHistoryLimit {
		return fmt.Errorf("%w: history limit %d is not within 0..%d", ErrInvalidOption, q.Limit, MaxHistoryLimit)
	}
	_, err := parseCursor(q.After)
	return err
}

// HistoryPage is one page of a conversation's messages, in the order they
// were created (their time, then their stream sequence).
type HistoryPage struct {
	// CorrelationID names the conversation.
	CorrelationID string
	// Entries are the page's messages.
	Entries []HistoryEntry
	// Next is the HistoryQuery.After of the next page; empty on the last.
	Next string
}

// HistoryEntry is one message of a conversation's history, stored once in
// the stream: a broadcast is one entry, whoever received it.
type HistoryEntry struct {
	// Message is the stored message as the recipient gets it. When Err is
	// set, it holds only what the message's record says: ID, From, To,
	// Type, Priority, CorrelationID, CausationID and Time.
	Message
	// Subject is the subject it is stored under; empty for a message the
	// stream no longer holds.
	Subject string
	// Stream and Sequence say where it is stored.
	Stream   string
	Sequence uint64
	// Err is nil when Message is the stored message, else why not: wraps
	// ErrMessageGone, ErrNotRecorded, ErrSenderMismatch, ErrMalformedSubject
	// or the codec's error for a stored message that is not a valid event.
	Err error
}

// Cursor is the HistoryQuery.After that selects the messages after e:
// its place in the order, "<unix seconds>.<nanoseconds>.<sequence>.<ID in
// unpadded base64url>".
func (e HistoryEntry) Cursor() string {
	return strconv.FormatInt(e.Time.Unix(), 10) + "." + strconv.Itoa(e.Time.Nanosecond()) + "." +
		strconv.FormatUint(e.Sequence, 10) + "." + base64.RawURLEncoding.EncodeToString([]byte(e.ID))
}

// parseCursor reads a Cursor back as the place it names; "" is before
// the first.
func parseCursor(c string) (HistoryEntry, error) {
	if c == "" {
		return HistoryEntry{}, nil
	}
	parts := strings.Split(c, ".")
	if len(parts) == 4 {
		sec, err1 := strconv.ParseInt(parts[0], 10, 64)
		nsec, err2 := strconv.ParseUint(parts[1], 10, 32)
		seq, err3 := strconv.ParseUint(parts[2], 10, 64)
		id, err4 := base64.RawURLEncoding.DecodeString(parts[3])
		if err := errors.Join(err1, err2, err3, err4); err == nil && nsec < uint64(time.Second) {
			return HistoryEntry{Message: Message{ID: string(id), Time: time.Unix(sec, int64(nsec))}, Sequence: seq}, nil
		}
	}
	return HistoryEntry{}, fmt.Errorf("%w: %q", ErrInvalidCursor, c)
}

// compareEntries orders entries by time, then stream sequence, then ID.
func compareEntries(a, b HistoryEntry) int {
	return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Sequence, b.Sequence), cmp.Compare(a.ID, b.ID))
}

// History returns a page of the conversation correlationID: every message
// of it that the stream stored, bodies included, whoever sent or received
// it, in the order they were created. The conversation's records in the
// status bucket list the messages, each read from the stream by its
// sequence; a message whose record outlived its body (a TTL, the stream's
// retention) is an entry whose Err wraps ErrMessageGone. The direct
// messages the stream holds on indexed subjects of the conversation are
// in it whether or not they have a record (their senders write none), read
// with a short-lived consumer of their headers. A page costs a read of
// every record and every indexed message of the conversation and one get
// per message of the page (docs/history.md).
//
// Errors: ErrNoStatus (no record of the conversation), ErrInvalidOption
// (a bad Limit, or lifecycle tracking off), ErrInvalidCursor,
// ErrNotProvisioned, ErrClosed, or the server's.
func (b *Admin) History(ctx context.Context, correlationID string, q HistoryQuery) (HistoryPage, error) {
	if err := b.historyCall(q); err != nil {
		return HistoryPage{}, err
	}
	if err := codec.ValidateID("CorrelationID", correlationID); err != nil {
		return HistoryPage{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	stored, err := b.status.conversation(ctx, correlationID)
	if err != nil {
		return HistoryPage{}, refusedCall(ctx, fmt.Errorf("history of %s: %w", correlationID, err))
	}
	all, records, err := b.recorded(ctx, stored, subjects.StatusKeysOfConversation(correlationID))
	if err != nil {
		return HistoryPage{}, refusedCall(ctx, fmt.Errorf("history of %s: %w", correlationID, err))
	}
	if records == 0 {
		return HistoryPage{}, fmt.Errorf("%w: conversation %s", ErrNoStatus, correlationID)
	}
	p := pageOf(correlationID, all, q)
	if err := b.fetch(ctx, p.Entries); err != nil {
		return HistoryPage{}, refusedCall(ctx, fmt.Errorf("history of %s: %w", correlationID, err))
	}
	return p, nil
}

// History returns a page of the conversation correlationID as this agent
// took part in it: the messages it sent (direct or broadcast) and those it
// received (direct, or broadcasts it handled), bodies included, in the
// order they were created, as Admin.History returns them. It finds them
// by the conversation's records that name the agent, which its
// permissions let it read, and reads them from the stream with up to three
// short-lived consumers of its own subjects (direct messages to it, from
// it, and the broadcasts), each from the page's first message to its
// last; it cannot read messages between other agents, nor get a message
// by its sequence (docs/security.md). One History or Attach of a process
// reads at a time. The Bus of a Shards reads every shard, at once: what
// the agent sent is on its recipients' shards.
//
// Errors: ErrNotParticipant (no record of the conversation names the
// agent), ErrInvalidOption (a bad Limit, or lifecycle tracking off),
// ErrInvalidCursor, ErrNotProvisioned, ErrClosed, ErrPermissionDenied on an
// authorization from before History, or the server's.
func (b *Bus) History(ctx context.Context, correlationID string, q HistoryQuery) (HistoryPage, error) {
	if err := b.historyCall(q); err != nil {
		return HistoryPage{}, err
	}
	if err := codec.ValidateID("CorrelationID", correlationID); err != nil {
		return HistoryPage{}, err
	}
	filters, err := subjects.StatusKeysOfAgentInConversation(correlationID, b.agent)
	if err != nil {
		return HistoryPage{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	// This bus's own messages and records are among those read.
	if err := b.Flush(ctx); err != nil {
		return HistoryPage{}, fmt.Errorf("history of %s: waiting for this bus's publishes and records to be stored: %w", correlationID, err)
	}
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	var (
		all     []HistoryEntry
		records int
	)
	if b.shards != nil {
		all, records, err = b.shards.ownEntries(ctx, correlationID, filters)
	} else {
		all, records, err = b.ownEntries(ctx, correlationID, filters)
	}
	if err != nil {
		return HistoryPage{}, refusedCall(ctx, fmt.Errorf("history of %s: %w", correlationID, err))
	}
	if records == 0 {
		return HistoryPage{}, fmt.Errorf("%w: %s in %s", ErrNotParticipant, b.agent, correlationID)
	}
	p := pageOf(correlationID, all, q)
	if b.shards != nil {
		err = b.shards.readOwn(ctx, p.Entries)
	} else {
		err = b.readOwn(ctx, p.Entries)
	}
	if err != nil {
		return HistoryPage{}, refusedCall(ctx, fmt.Errorf("history of %s: %w", correlationID, err))
	}
	return p, nil
}

// ownEntries returns the entries of the conversation correlationID that
// this bus's stream holds and its records, filters, name, sorted, and how
// many records name the agent.
func (b *Bus) ownEntries(ctx context.Context, correlationID string, filters []string) ([]HistoryEntry, int, error) {
	stored, err := b.storedOwn(ctx, correlationID)
	if err != nil {
		return nil, 0, err
	}
	return b.recorded(ctx, stored, filters...)
}

// historyCall checks what a History call needs before any I/O.
func (c *client) historyCall(q HistoryQuery) error {
	if c.isClosed() {
		return ErrClosed
	}
	if err := q.Validate(); err != nil {
		return err
	}
	if c.status == nil {
		return fmt.Errorf("%w: lifecycle tracking is off, and with it the index of conversations", ErrInvalidOption)
	}
	return nil
}

// recorded returns the messages the records of the keys matching filters
// name, and those in stored (found by their indexed subjects, which the
// sender wrote no record for), one entry per message stored in the stream,
// in order, each with what its records say of it, and how many records and
// stored messages it read. A message has
// a record per recipient, each read in its last state, which holds the
// sequence of the copy stored last (a replayed dead letter's replay). A
// last state without one (a reply sent outside its handler rewrites the
// record without it) has the record's earlier states read too: the bucket
// keeps ten. A message whose records hold no sequence is not stored (yet):
// a failed publish, a schedule not fired.
func (c *client) recorded(ctx context.Context, stored []Status, filters ...string) ([]HistoryEntry, int, error) {
	stream := c.opts.scheme.Stream()
	records := 0
	// An entry per message and sequence: a record that names another
	// message's sequence (not written by the bus) is an entry of its own,
	// and does not hide the message.
	type entryKey struct {
		seq uint64
		id  string
	}
	at := make(map[entryKey]int)
	seqs := make(map[uint64]bool) // the sequences of the entries
	type copyKey struct{ id, from, to string }
	recordedCopy := map[copyKey]bool{} // the messages whose records name a copy
	var out []HistoryEntry
	var again []string // keys whose last state has no sequence
	lastStates := true
	add := func(subject string, s Status) {
		if lastStates {
			records++
		}
		if s.Sequence == 0 {
			if lastStates && s.State != StateScheduled {
				again = append(again, strings.TrimPrefix(subject, c.opts.scheme.StatusSubjectPrefix()))
			}
			return
		}
		if s.Stream != stream {
			return
		}
		k := entryKey{s.Sequence, s.ID}
		if i, ok := at[k]; ok {
			if s.To == Broadcast { // the sender's record of a broadcast
				out[i].To = Broadcast
			}
			return
		}
		if ck := (copyKey{s.ID, s.From, s.To}); subject != "" {
			recordedCopy[ck] = true
		} else if recordedCopy[ck] {
			// Another copy of a message whose records name the one that
			// counts (a dead-lettered original, whose replay they name).
			return
		}
		if subject == "" && seqs[s.Sequence] {
			// Found by its indexed subject, which names a recurring
			// schedule's firing by the schedule's ID, where its records
			// name it by its own (asFiring): the same message.
			if _, ok := at[entryKey{s.Sequence, firingID(s.ID, s.Sequence)}]; ok {
				return
			}
		}
		seqs[s.Sequence] = true
		at[k] = len(out)
		out = append(out, HistoryEntry{Message: s.Message(), Stream: s.Stream, Sequence: s.Sequence})
	}
	for _, f := range filters {
		if err := c.status.scan(ctx, f, jetstream.DeliverLastPerSubjectPolicy, add); err != nil {
			return nil, 0, err
		}
	}
	for _, st := range stored {
		add("", st)
	}
	lastStates = false
	for _, k := range again {
		if err := c.status.scan(ctx, k, jetstream.DeliverAllPolicy, add); err != nil {
			return nil, 0, err
		}
	}
	slices.SortFunc(out, compareEntries)
	return out, records, nil
}

// pageOf returns the page of all, sorted, that q selects (q is valid).
func pageOf(correlationID string, all []HistoryEntry, q HistoryQuery) HistoryPage {
	start := 0
	if q.After != "" {
		after, _ := parseCursor(q.After)
		var found bool
		start, found = slices.BinarySearchFunc(all, after, compareEntries)
		if found {
			start++
		}
	}
	end := min(start+orDefault(q.Limit, DefaultHistoryLimit), len(all))
	p := HistoryPage{CorrelationID: correlationID, Entries: slices.Clone(all[start:end])}
	if end < len(all) {
		p.Next = all[end-1].Cursor()
	}
	return p
}

// historyGets is how many message gets an operator's History has in
// flight at once.
const historyGets = 16

// fetch reads the message of each entry from the stream by its sequence,
// historyGets at a time.
func (b *Admin) fetch(ctx context.Context, entries []HistoryEntry) error {
	if len(entries) == 0 {
		return nil
	}
	s, err := b.js.Stream(ctx, b.opts.scheme.Stream())
	if err != nil {
		return b.notProvisioned(err)
	}
	var (
		mu    sync.Mutex
		first error
	)
	concurrently(len(entries), historyGets, func(i int) {
		e := &entries[i]
		raw, err := s.GetMsg(ctx, e.Sequence)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			e.Err = gone(e)
		case err != nil:
			mu.Lock()
			if first == nil {
				first = fmt.Errorf("get %s sequence %d: %w", e.Stream, e.Sequence, err)
			}
			mu.Unlock()
		default:
			b.readEntry(e, raw.Subject, raw.Header, raw.Data, raw.Time)
		}
	})
	return first
}

// gone is the Err of an entry whose message the stream no longer holds.
func gone(e *HistoryEntry) error {
	return fmt.Errorf("%w: %s at %s sequence %d", ErrMessageGone, e.ID, e.Stream, e.Sequence)
}

// readEntry fills e with the message stored under subject with h and
// data at stored, or sets e.Err to why it is not the message e's record
// names. A firing of a recurring schedule is read as its receiver reads it
// (asFiring), whether e names it by its own ID (its records) or by its
// schedule's (its indexed subject, before a record).
func (c *client) readEntry(e *HistoryEntry, subject string, h nats.Header, data []byte, stored time.Time) {
	e.Subject = subject
	m, err := codec.Decode(h, data)
	if err != nil {
		e.Err = fmt.Errorf("message %s at %s sequence %d: %w", e.ID, e.Stream, e.Sequence, err)
		return
	}
	scheduleID := ""
	if recurringFiring(h) {
		scheduleID = m.ID
		asFiring(m, e.Sequence, stored)
	}
	addr, err := c.opts.scheme.Parse(subject)
	switch {
	case err != nil:
		e.Err = fmt.Errorf("%w: %w", ErrMalformedSubject, err)
	case addr.From != m.From:
		e.Err = fmt.Errorf("%w: subject %s is from %q, event source %q", ErrSenderMismatch, subject, addr.From, m.From)
	case m.ID != e.ID && (scheduleID == "" || scheduleID != e.ID) || conversationOf(m) != e.CorrelationID:
		e.Err = fmt.Errorf("%w: %s sequence %d holds %s of conversation %s, recorded as %s of %s",
			ErrNotRecorded, e.Stream, e.Sequence, m.ID, conversationOf(m), e.ID, e.CorrelationID)
	}
	if e.Err != nil {
		return
	}
	if m.To == "" { // a foreign producer's event: the subject names the recipient
		m.To = addr.To
	}
	e.Message = *m
}

// readOwn fills entries, messages this agent sent or received, from the
// stream with its history consumers: the direct messages to it, those
// from it, and, for what is left, the broadcasts; each from the first of
// the entries it may hold to the last. What none of them holds is gone.
func (b *Bus) readOwn(ctx context.Context, entries []HistoryEntry) error {
	left := make(map[uint64][]*HistoryEntry, len(entries)) // not read yet, by sequence
	for i := range entries {
		left[entries[i].Sequence] = append(left[entries[i].Sequence], &entries[i])
	}
	readers := []struct {
		consumer func(string) (string, string, error)
		holds    func(*HistoryEntry) bool
	}{
		{b.opts.scheme.ReceivedHistoryConsumer, func(e *HistoryEntry) bool { return e.To == b.agent }},
		{b.opts.scheme.SentHistoryConsumer, func(e *HistoryEntry) bool { return e.From == b.agent && e.To != Broadcast }},
		{b.opts.scheme.BroadcastHistoryConsumer, func(*HistoryEntry) bool { return true }},
	}
	b.history.Lock()
	defer b.history.Unlock()
	for _, r := range readers {
		var first, last uint64
		for seq, es := range left {
			if !slices.ContainsFunc(es, r.holds) {
				continue
			}
			if first == 0 || seq < first {
				first = seq
			}
			last = max(last, seq)
		}
		if last == 0 {
			continue
		}
		name, filter, err := r.consumer(b.agent)
		if err != nil {
			return err
		}
		cfg := jetstream.ConsumerConfig{Name: name, FilterSubject: filter,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first}
		err = b.readHistory(ctx, cfg, func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
			seq := md.Sequence.Stream
			for _, e := range left[seq] {
				b.readEntry(e, m.Subject(), m.Headers(), m.Data(), md.Timestamp)
			}
			delete(left, seq)
			return seq >= last, nil
		})
		if err != nil {
			return fmt.Errorf("read with %s: %w", name, b.notProvisioned(err))
		}
	}
	for _, es := range left {
		for _, e := range es {
			e.Err = gone(e)
		}
	}
	return nil
}

// storedOwn returns the pending status of every message of the
// conversation correlationID names that the stream holds under an indexed
// subject naming this agent, as the recipient or the sender, in stream
// order (storedUnder).
func (b *Bus) storedOwn(ctx context.Context, correlationID string) ([]Status, error) {
	filters, err := b.opts.scheme.ConversationFiltersOfAgent(correlationID, b.agent)
	if err != nil {
		return nil, err
	}
	out, err := b.storedUnder(ctx, filters)
	if err != nil {
		return nil, err
	}
	return inConversation(out, correlationID), nil
}

// storedUnder returns the pending status of every message of the stream whose
// indexed subject matches a pair of filters naming this agent, as the
// recipient and as the sender (subjects.Scheme.MessageFiltersOfAgent and
// the like), in stream order; an empty filter is skipped. It reads their
// headers with the agent's history consumers, one per filter of a pair:
// the only consumers of the stream its permissions let it create besides
// its own durable ones.
func (b *Bus) storedUnder(ctx context.Context, pairs []string) ([]Status, error) {
	received, _, _ := b.opts.scheme.ReceivedHistoryConsumer(b.agent) // the agent is valid
	sent, _, _ := b.opts.scheme.SentHistoryConsumer(b.agent)
	b.history.Lock()
	defer b.history.Unlock()
	var out []Status
	seen := make(map[uint64]bool) // a message to itself meets both filters
	for i, filter := range pairs {
		if filter == "" {
			continue
		}
		name := []string{received, sent}[i%2]
		cfg := jetstream.ConsumerConfig{Name: name, FilterSubject: filter, HeadersOnly: true}
		err := b.readHistory(ctx, cfg, func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
			seq := md.Sequence.Stream
			if st, ok := b.status.statusOfStored(m.Subject(), m.Headers(), nil, seq, md.Timestamp); ok && !seen[seq] {
				seen[seq] = true
				out = append(out, st)
			}
			return false, nil
		})
		if err != nil {
			return nil, fmt.Errorf("read with %s: %w", name, b.notProvisioned(err))
		}
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return out, nil
}

// storedBetween returns the pending status of every message of filter, a
// filter of the messages from sender to recipient, in stream order, read
// with this agent's history consumer for its side (storedUnder): none if
// the agent is neither.
func (b *Bus) storedBetween(ctx context.Context, filter, recipient, sender string) ([]Status, error) {
	switch b.agent {
	case recipient:
		return b.storedUnder(ctx, []string{filter})
	case sender:
		return b.storedUnder(ctx, []string{"", filter})
	}
	return nil, nil
}

// readHistory reads what the consumer cfg describes, made a reader
// (asReader), as streamReads.readAfresh does: it passes each message to
// each as readPending does, and deletes the consumer. Its name is one of
// the agent's history consumers (subjects.Scheme.HistoryConsumer and the
// like), of which the agent has one each: the caller holds b.history, and
// createHistory keeps other processes of the agent out while this one
// reads.
func (b *Bus) readHistory(ctx context.Context, cfg jetstream.ConsumerConfig, each func(jetstream.Msg, *jetstream.MsgMetadata) (bool, error)) error {
	stream := b.opts.scheme.Stream()
	return b.reads.readAfresh(ctx, stream, func(ctx context.Context) (jetstream.Consumer, error) {
		return b.createHistory(ctx, stream, asReader(cfg))
	}, each)
}

// createHistory creates history consumer cfg for this read alone. Every
// process of an agent names its history consumers alike, and the server
// hands a create the consumer that exists when their configurations are
// equal: two processes reading the same filter at once would each get part
// of its messages through one consumer, and a lookup would miss the
// message it looks for. The description, unique to the read, makes every
// create differ, so the server refuses a second one (ErrConsumerExists)
// while the first reads. The refused process waits for the first to delete
// its consumer, as it does once read, a few milliseconds for a lookup.
// After historyTakeover, or half the time ctx has left if less, it deletes
// the consumer and creates its own: one whose process died before deleting
// it would otherwise keep the agent from reading until the server removes
// it, a minute after its last use. A read still under way then fails with
// an error, never a short answer. A create whose answer does not come is
// made again (askAgain): its configuration, description included, is the
// same, so the server hands back the consumer if the first made it.
func (b *Bus) createHistory(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cfg.Description = "agentbus history read " + nuid.Next()
	patience := historyTakeover
	if d, ok := ctx.Deadline(); ok {
		patience = min(patience, time.Until(d)/2)
	}
	start := time.Now()
	wait := historyRetryFirst
	for {
		c, err := askAgain(ctx, b.reconnects, func(ctx context.Context) (jetstream.Consumer, error) {
			return b.js.CreateConsumer(ctx, stream, cfg)
		})
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return c, err
		}
		if time.Since(start) >= patience {
			if err := b.js.DeleteConsumer(ctx, stream, cfg.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil, fmt.Errorf("take over history consumer %s: %w", cfg.Name, err)
			}
			start = time.Now() // another process may take it first
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("history consumer %s held by another process of %s: %w", cfg.Name, b.agent, ctx.Err())
		}
		wait = min(2*wait, historyRetryMax)
	}
}

// The waits of createHistory: the first retry, the longest, and how long
// at most another process may hold a history consumer before it is taken
// over.
const (
	historyRetryFirst = time.Millisecond
	historyRetryMax   = 50 * time.Millisecond
	historyTakeover   = 5 * time.Second
)

// Redeliver publishes message id again to agent to, as the operator may:
// a restarted agent gets a past message of its conversations back, to
// reload its context. The message is read from the stream (the latest
// copy stored, found by its records) and published as RedeliverEntry
// does. Errors: ErrNoStatus (no record of id), ErrMessageGone and the
// other errors of a HistoryEntry (the stream does not hold it as
// recorded), ErrInvalidAgentID, ErrInvalidOption with lifecycle tracking
// off, ErrClosed, or the server's.
func (b *Admin) Redeliver(ctx context.Context, id, to string) (PubAck, error) {
	if err := b.historyCall(HistoryQuery{}); err != nil {
		return PubAck{}, err
	}
	if err := codec.ValidateID("ID", id); err != nil {
		return PubAck{}, err
	}
	if err := subjects.ValidateID(to); err != nil {
		return PubAck{}, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	stored, err := b.status.find(ctx, id)
	if err != nil {
		return PubAck{}, refusedCall(ctx, fmt.Errorf("redeliver %s: %w", id, err))
	}
	all, _, err := b.recorded(ctx, stored, subjects.StatusKeysOfMessage(id))
	if err == nil {
		all = slices.DeleteFunc(all, func(e HistoryEntry) bool { return e.ID != id })
		err = b.fetch(ctx, all)
	}
	if err != nil {
		return PubAck{}, refusedCall(ctx, fmt.Errorf("redeliver %s: %w", id, err))
	}
	if len(all) == 0 {
		if sts, err := b.Status(ctx, id); err == nil {
			for _, st := range sts {
				if st.State == StateScheduled {
					return PubAck{}, fmt.Errorf("%w: %s is scheduled (%s) and has not fired: nothing is stored to redeliver", ErrNoStatus, id, st.Schedule)
				}
			}
		}
		return PubAck{}, fmt.Errorf("%w: %s", ErrNoStatus, id)
	}
	latest := all[len(all)-1]
	for _, e := range all {
		if e.Err == nil && (latest.Err != nil || e.Sequence > latest.Sequence) {
			latest = e
		}
	}
	return b.RedeliverEntry(ctx, latest, to)
}

// RedeliverEntry publishes the message of e, read by History, again to
// agent to: with a new ID (the original's may still be in the duplicate
// window, and its record is final), the extension ExtRedeliveryOf naming
// the original, To set to to, and no TTL (the original's has passed, or
// would drop the repeat unread); its sender, type, priority, conversation,
// causation, time, data and other extensions are the original's. The
// admin publishes it in the sender's name, on the subject that names the
// sender, as the receiver's check of the event's source requires: a
// delivery an agent could not make. The repeat has a pending record of
// its own and is part of the conversation's history.
//
// Errors: e.Err, wrapped (nothing to repeat); ErrInvalidMessage for an
// entry that was not read from the stream or cannot be sent again;
// ErrInvalidAgentID; ErrClosed, or the server's.
func (b *Admin) RedeliverEntry(ctx context.Context, e HistoryEntry, to string) (PubAck, error) {
	if b.isClosed() {
		return PubAck{}, ErrClosed
	}
	if e.Err != nil {
		return PubAck{}, fmt.Errorf("redeliver %s: %w", e.ID, e.Err)
	}
	if e.Subject == "" || e.Sequence == 0 {
		return PubAck{}, fmt.Errorf("%w: redeliver %s: not a message read from the stream", ErrInvalidMessage, e.ID)
	}
	if err := subjects.ValidateID(to); err != nil {
		return PubAck{}, err
	}
	m := e.Message
	setExtension(&m, ExtRedeliveryOf, e.ID) // a copy of the extensions
	m.ID, m.To, m.TTL = codec.NewID(), to, 0
	msg, err := b.encode(&m)
	if err != nil {
		return PubAck{}, fmt.Errorf("redeliver %s: %w", e.ID, err)
	}
	ack, err := b.republish(ctx, msg, m.ID)
	if err != nil {
		return PubAck{}, fmt.Errorf("redeliver %s to %s: %w", e.ID, to, err)
	}
	b.status.recordPending(statusOf(&m, to, StatePending, operatorSender), &jetstream.PubAck{Stream: ack.Stream, Sequence: ack.Sequence})
	return ack, nil
}
