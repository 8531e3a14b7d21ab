package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// HeaderReplayOf marks a message replayed from the dead-letter stream; its
// value is "<dead-letter stream>/<sequence>". Delivery.Replayed reports it.
const HeaderReplayOf = "Agentbus-Replay-Of"

// ErrDeadLetterNotFound is returned for a dead-letter sequence that the
// dead-letter stream does not hold.
var ErrDeadLetterNotFound = errors.New("bus: dead letter not found")

// DeadLetterFilter selects dead letters. The zero value selects all.
type DeadLetterFilter struct {
	// Agent selects the dead letters of one receiving agent.
	Agent string
	// Type selects one message type.
	Type string
	// Since selects those dead-lettered at or after it; zero means all.
	Since time.Time
	// Limit bounds how many are returned; zero means no bound.
	Limit int
}

// DeadLetters lists the dead letters f selects, oldest first.
func (b *Admin) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	out, err := b.deadLetters(ctx, f)
	return out, refusedCall(ctx, err)
}

// deadLetters is DeadLetters; the exported method fails at once when the server
// refuses one of its requests.
func (b *Admin) deadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	if b.isClosed() {
		return nil, ErrClosed
	}
	filter, err := b.opts.scheme.DeadLetterFilter(f.Agent, f.Type)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cfg := jetstream.ConsumerConfig{FilterSubject: filter}
	if !f.Since.IsZero() {
		since := f.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	var out []DeadLetter
	stream := b.opts.scheme.DeadLetterStream()
	err = b.reads.readStream(ctx, stream, cfg, func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		out = append(out, readDeadLetter(md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data()))
		return f.Limit > 0 && len(out) >= f.Limit, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", b.streamMissing(stream, err))
	}
	return out, nil
}

// DeadLetter returns the dead letter at sequence seq of the dead-letter
// stream, or ErrDeadLetterNotFound.
func (b *Admin) DeadLetter(ctx context.Context, seq uint64) (*DeadLetter, error) {
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	out, err := b.deadLetterAt(ctx, seq)
	return out, refusedCall(ctx, err)
}

// deadLetterAt is DeadLetter; the exported method fails at once when the
// server refuses one of its requests.
func (b *Admin) deadLetterAt(ctx context.Context, seq uint64) (*DeadLetter, error) {
	if b.isClosed() {
		return nil, ErrClosed
	}
	if seq == 0 { // no stream holds it; the server calls it a bad request
		return nil, fmt.Errorf("%w: sequence %d", ErrDeadLetterNotFound, seq)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := b.js.Stream(ctx, b.opts.scheme.DeadLetterStream())
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", seq, b.notProvisioned(err))
	}
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("%w: sequence %d", ErrDeadLetterNotFound, seq)
	}
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	dl := readDeadLetter(seq, raw.Time, raw.Header, raw.Data)
	return &dl, nil
}

// ReplayDeadLetter publishes the dead letter at seq again, with its
// original data and HeaderReplayOf added, so the agent that dead-lettered
// it handles it anew and can tell it was replayed. A valid event goes to
// that agent alone (a broadcast's too, which the others handled), without
// its expiry, which has passed more often than not, as Redeliver sends
// one; its record reads pending again, at the replay. Any other (not a
// valid event, or from another sender than its subject named) goes on its
// original subject with its original headers, and is dead-lettered again.
// Replaying the same dead letter twice within the duplicate window stores
// it once (PubAck.Duplicate). The dead letter stays until purged.
func (b *Admin) ReplayDeadLetter(ctx context.Context, seq uint64) (PubAck, error) {
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	out, err := b.replayDeadLetter(ctx, seq)
	return out, refusedCall(ctx, err)
}

// replayDeadLetter is ReplayDeadLetter; the exported method fails at once when the server
// refuses one of its requests.
func (b *Admin) replayDeadLetter(ctx context.Context, seq uint64) (PubAck, error) {
	dl, err := b.DeadLetter(ctx, seq)
	if err != nil {
		return PubAck{}, err
	}
	data := dl.Data
	if dl.DataDropped > 0 {
		if data, err = b.droppedData(ctx, dl); err != nil {
			return PubAck{}, fmt.Errorf("replay dead letter %d: %w", seq, err)
		}
	}
	ref := b.opts.scheme.DeadLetterStream() + "/" + strconv.FormatUint(seq, 10)
	if dl.Message == nil || dl.Reason == ReasonSenderMismatch || dl.Reason == ReasonMalformed || subjects.ValidateID(dl.Agent) != nil {
		h := make(nats.Header, len(dl.Header)+2)
		for k, v := range dl.Header {
			h[k] = v
		}
		h[HeaderReplayOf] = []string{ref}
		h[jetstream.MsgIDHeader] = []string{"replay/" + ref}
		id := ""
		if dl.Message != nil {
			id = dl.Message.ID
		}
		ack, err := b.republish(ctx, &nats.Msg{Subject: dl.Subject, Header: h, Data: data}, id)
		if err != nil {
			return PubAck{}, fmt.Errorf("replay dead letter %d: %w", seq, err)
		}
		return ack, nil
	}
	m := *dl.Message
	m.To, m.TTL, m.Data = dl.Agent, 0, data
	msg, err := b.encode(&m)
	if err != nil {
		return PubAck{}, fmt.Errorf("replay dead letter %d: %w", seq, err)
	}
	keepOtherHeaders(msg.Header, dl.Header)
	msg.Header[HeaderReplayOf] = []string{ref}
	msg.Header[jetstream.MsgIDHeader] = []string{"replay/" + ref}
	var rev uint64
	if b.status != nil {
		if st, err := b.status.get(ctx, &m, dl.Agent); err == nil {
			rev = st.revision
		}
	}
	ack, err := b.republish(ctx, msg, m.ID)
	if err != nil {
		return PubAck{}, fmt.Errorf("replay dead letter %d: %w", seq, err)
	}
	if b.status != nil && !ack.Duplicate {
		// Unless its recipient wrote a record of the replay meanwhile.
		s := statusOf(&m, dl.Agent, StatePending, operatorSender)
		s.Stream, s.Sequence = ack.Stream, ack.Sequence
		if err := b.status.updateStored(ctx, s, rev); err != nil && !isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) {
			b.opts.onError(fmt.Errorf("replay dead letter %d: the record of %s: %w", seq, m.ID, err))
		}
	}
	return ack, nil
}

// keepOtherHeaders copies to h, the headers of a replay encoded anew, those
// of orig the event's encoding does not make: a foreign producer's W3C
// traceparent and tracestate, a user's own. Not the event's attributes
// (ce-*, Content-Type), which the encoding wrote, nor the server's (Nats-*)
// or the bus's (Agentbus-*, the original's control headers among them),
// which the replay leaves out or sets itself.
func keepOtherHeaders(h, orig nats.Header) {
	for k, v := range orig {
		if _, made := h[k]; made || hasPrefixFold(k, "ce-") || hasPrefixFold(k, "Nats-") ||
			hasPrefixFold(k, "Agentbus-") || strings.EqualFold(k, "Content-Type") {
			continue
		}
		h[k] = v
	}
}

// droppedData reads the data dl could not keep (DeadLetter.DataDropped)
// from the original message, while its stream has it.
func (b *Admin) droppedData(ctx context.Context, dl *DeadLetter) ([]byte, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	gone := fmt.Errorf("its data (%d bytes) was too large to keep with it, and the original, %s seq %d, is gone", dl.DataDropped, dl.Stream, dl.StreamSequence)
	s, err := b.js.Stream(ctx, dl.Stream)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", gone, err)
	}
	raw, err := s.GetMsg(ctx, dl.StreamSequence)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", gone, err)
	}
	if raw.Subject != dl.Subject || len(raw.Data) != dl.DataDropped {
		return nil, fmt.Errorf("%w: another message is at its place", gone)
	}
	return raw.Data, nil
}

// republish stores msg, which the admin publishes in an agent's name (a
// replayed dead letter, a redelivered message: Redeliver), and returns the
// receipt of message id.
func (b *Admin) republish(ctx context.Context, msg *nats.Msg, id string) (PubAck, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ack, err := publishAgain(ctx, b.js, msg)
	if err != nil {
		return PubAck{}, b.notProvisioned(err)
	}
	return PubAck{ID: id, Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// PurgeDeadLetters removes the dead letters f selects; with Since set, those
// dead-lettered before it. Limit is ignored. It returns how many it removed.
func (b *Admin) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (uint64, error) {
	ctx, stop := b.watchRefusals(ctx, "$JS.API.")
	defer stop()
	out, err := b.purgeDeadLetters(ctx, f)
	return out, refusedCall(ctx, err)
}

// purgeDeadLetters is PurgeDeadLetters; the exported method fails at once when the server
// refuses one of its requests.
func (b *Admin) purgeDeadLetters(ctx context.Context, f DeadLetterFilter) (uint64, error) {
	if b.isClosed() {
		return 0, ErrClosed
	}
	filter, err := b.opts.scheme.DeadLetterFilter(f.Agent, f.Type)
	if err != nil {
		return 0, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := b.js.Stream(ctx, b.opts.scheme.DeadLetterStream())
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", b.notProvisioned(err))
	}
	req := jetstream.StreamPurgeRequest{Subject: filter}
	if !f.Since.IsZero() {
		// Purge up to the first dead letter at or after Since.
		raw, err := b.firstSince(ctx, s.CachedInfo().Config.Name, filter, f.Since)
		if err != nil {
			return 0, err
		}
		req.Sequence = raw
	}
	n, err := purge(ctx, b.nc, s.CachedInfo().Config.Name, req)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return n, nil
}

// purge purges stream as req says and returns how many messages the
// server removed, which nats.go's Stream.Purge does not say. (The count
// was the stream's before less after, which counted the dead letters of
// other agents stored meanwhile, and wrapped around.)
func purge(ctx context.Context, nc *nats.Conn, stream string, req jetstream.StreamPurgeRequest) (uint64, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream, body)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Error  *jetstream.APIError `json:"error"`
		Purged uint64              `json:"purged"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s: %w", stream, err)
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	return resp.Purged, nil
}

// firstSince returns the sequence of the first message on filter stored at
// or after t, or 0 if there is none.
func (c *client) firstSince(ctx context.Context, stream, filter string, t time.Time) (uint64, error) {
	var first uint64
	cfg := jetstream.ConsumerConfig{FilterSubject: filter, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t, HeadersOnly: true}
	err := c.reads.readStream(ctx, stream, cfg, func(_ jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		first = md.Sequence.Stream
		return true, nil
	})
	return first, err
}

// readDeadLetter splits a stored dead letter into what it says and the
// original message.
func readDeadLetter(seq uint64, stored time.Time, h nats.Header, data []byte) DeadLetter {
	dl := DeadLetter{
		Sequence: seq,
		Reason:   DeadLetterReason(h.Get(HeaderDeadLetterReason)),
		Error:    h.Get(HeaderDeadLetterError),
		Stream:   h.Get(HeaderDeadLetterStream),
		Subject:  h.Get(HeaderDeadLetterSubject),
		Header:   make(nats.Header, len(h)),
		Data:     data,
	}
	dl.Deliveries, _ = strconv.ParseUint(h.Get(HeaderDeadLetterDeliveries), 10, 64)
	dl.StreamSequence, _ = strconv.ParseUint(h.Get(HeaderDeadLetterSequence), 10, 64)
	dl.Agent, _ = subjects.DecodeToken(h.Get(HeaderDeadLetterAgent))
	// The server's clock, as DeadLetterFilter.Since selects by; the
	// header has the dead-lettering agent's, which may run ahead or
	// behind (before 2026-11-28 Time was the header's).
	dl.Time = stored.UTC()
	dl.DataDropped, _ = strconv.Atoi(h.Get(HeaderDeadLetterDataDropped))
	for k, v := range h {
		switch k {
		case HeaderDeadLetterReason, HeaderDeadLetterError, HeaderDeadLetterDeliveries, HeaderDeadLetterStream,
			HeaderDeadLetterSequence, HeaderDeadLetterSubject, HeaderDeadLetterAgent, HeaderDeadLetterTime,
			HeaderDeadLetterDataDropped, jetstream.MsgIDHeader:
		default:
			dl.Header[k] = v
		}
	}
	if m, err := codec.Decode(dl.Header, data); err == nil {
		dl.Message = m
	}
	return dl
}

// WatchDeadLetters dead-letters the messages whose last allowed delivery
// was never settled, typically because the process handling it crashed.
// JetStream does not redeliver such a message and leaves it in the stream;
// it announces it with a MAX_DELIVERIES advisory, which the unsettled
// stream keeps (StreamConfig.UnsettledJetStream) until a watcher has
// handled it: one that comes while no watcher runs, or while its
// connection is down, waits for the next. WatchDeadLetters copies each
// such message to the dead-letter stream (once, even if it also arrives
// the other way) and, for a direct message, removes it from the stream. It
// blocks until ctx ends and returns nil then.
//
// One watcher per bus is enough; `agentbus serve` runs one, and several
// share the work. The connection needs permission to read the unsettled
// stream and the advisories, get messages by sequence and delete them: an
// operator's. It returns ErrClosed if the Admin closes meanwhile, and
// ErrNotProvisioned at once without the dead-letter stream. Without the
// unsettled stream (provisioned before 2026-11-27, or refused by the
// server: see Admin.Provision) it reports that to the error handler and
// hears the advisories as they are published, while it runs.
// The dead-lettered message's record says the agent whose delivery it was
// dead-lettered it.
func (b *Admin) WatchDeadLetters(ctx context.Context) error {
	if b.isClosed() {
		return ErrClosed
	}
	ctx, stopWatch := b.whileOpen(ctx)
	defer stopWatch()
	cons, err := refusable(ctx, b.client, b.unsettledWatch)
	var missing *notProvisionedError
	switch {
	case errors.As(err, &missing) && missing.stream == b.opts.scheme.UnsettledStream():
		return b.watchAdvisories(ctx, err)
	case err != nil:
		return b.watchNotStarted(ctx, fmt.Errorf("watch dead letters: %w", err))
	}
	it, err := cons.Messages()
	if err != nil {
		return b.watchNotStarted(ctx, fmt.Errorf("watch dead letters: %w", err))
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil:
			return b.watchEnded()
		case errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrMsgIteratorClosed) ||
			errors.Is(err, nats.ErrConnectionClosed):
			return fmt.Errorf("watch dead letters: %w", b.closedOr(err))
		case err != nil:
			b.opts.onError(fmt.Errorf("watch dead letters: %w", err))
			continue
		}
		switch err := b.handleMaxDeliveries(ctx, m.Data()); {
		case err == nil:
			_ = m.Ack()
		case isPermanent(err):
			b.opts.onError(err)
			_ = m.Term()
		default:
			b.opts.onError(err)
			_ = m.NakWithDelay(unsettledRetry)
		}
	}
}

// watchAdvisories is WatchDeadLetters without the unsettled stream, which
// missing says: it hears the MAX_DELIVERIES advisories as they are
// published, and reports missing once it does.
func (b *Admin) watchAdvisories(ctx context.Context, missing error) error {
	// Its connection closing ends it too, as it ends the watch through
	// the unsettled stream: it waited for ctx alone, watching nothing.
	closed := b.nc.StatusChanged(nats.CLOSED)
	defer b.nc.RemoveStatusListener(closed)
	events := make(chan *nats.Msg, 64)
	sub, err := b.nc.ChanSubscribe(b.opts.scheme.MaxDeliveriesAdvisories(), events)
	if err != nil {
		return fmt.Errorf("watch dead letters: %w", b.closedOr(err))
	}
	defer sub.Unsubscribe()
	fctx, cancel := context.WithTimeout(ctx, defaultTimeout)
	err = b.nc.FlushWithContext(fctx) // then the server has the subscription
	cancel()
	if err != nil {
		return b.watchNotStarted(ctx, fmt.Errorf("watch dead letters: %w", err))
	}
	b.opts.onError(fmt.Errorf("watch dead letters: %w; until it is, an unsettled delivery is dead-lettered only while a watcher runs", missing))
	for {
		select {
		case <-ctx.Done():
			return b.watchEnded()
		case <-closed:
			return fmt.Errorf("watch dead letters: %w", b.closedOr(nats.ErrConnectionClosed))
		case m := <-events:
			if err := b.handleMaxDeliveries(ctx, m.Data); err != nil {
				b.opts.onError(err)
			}
		}
	}
}

// unsettledWatcher names the dead-letter watchers' durable consumer of the
// unsettled stream, which they share.
const unsettledWatcher = "watch"

// unsettledRetry is how long an advisory whose handling failed (the server
// busy, the connection down) waits to be handled again.
const unsettledRetry = 5 * time.Second

// unsettledWatch makes the watchers' consumer of the unsettled stream, and
// reports ErrNotProvisioned without it or without the dead-letter stream.
func (b *Admin) unsettledWatch(ctx context.Context) (jetstream.Consumer, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	dlq, unsettled := b.opts.scheme.DeadLetterStream(), b.opts.scheme.UnsettledStream()
	if _, err := b.js.Stream(ctx, dlq); err != nil {
		return nil, b.streamMissing(dlq, err)
	}
	cons, err := askAgain(ctx, b.reconnects, func(ctx context.Context) (jetstream.Consumer, error) {
		return b.js.CreateOrUpdateConsumer(ctx, unsettled, jetstream.ConsumerConfig{
			Durable:     unsettledWatcher,
			Description: "agentbus dead-letter watchers",
			AckPolicy:   jetstream.AckExplicitPolicy,
			MaxDeliver:  -1,
		})
	})
	if err != nil {
		return nil, b.streamMissing(unsettled, err)
	}
	return cons, nil
}

// maxDeliveriesAdvisory is the part of the server's advisory we use.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// handleMaxDeliveries dead-letters the message a MAX_DELIVERIES advisory
// (data) names. Its error is Permanent for an advisory that can never be
// handled; handled again, a message already dead-lettered is copied once
// (the dead letter's Nats-Msg-Id) and one already removed is done.
func (b *Admin) handleMaxDeliveries(ctx context.Context, data []byte) error {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(data, &adv); err != nil {
		return Permanent(fmt.Errorf("max deliveries advisory: %w", err))
	}
	c, err := b.opts.scheme.ParseConsumer(adv.Consumer)
	if err != nil {
		return Permanent(fmt.Errorf("max deliveries advisory for consumer %q: %w", adv.Consumer, err))
	}
	agent := c.Agent
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := b.js.Stream(ctx, adv.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Permanent(fmt.Errorf("max deliveries advisory: stream %s: %w", adv.Stream, err))
	}
	if err != nil {
		return fmt.Errorf("max deliveries advisory: stream %s: %w", adv.Stream, err)
	}
	raw, err := s.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // gone: dead-lettered and removed by an earlier attempt, or expired
	}
	if err != nil {
		return fmt.Errorf("max deliveries advisory: get %s seq %d: %w", adv.Stream, adv.StreamSeq, err)
	}
	dl := deadLetter{
		agent:      agent,
		reason:     ReasonUnsettled,
		err:        fmt.Errorf("not settled after %d deliveries", adv.Deliveries),
		subject:    raw.Subject,
		stream:     adv.Stream,
		seq:        adv.StreamSeq,
		deliveries: adv.Deliveries,
		header:     raw.Header,
		data:       raw.Data,
	}
	dropped, err := b.writeDeadLetter(ctx, dl)
	if err != nil {
		return err
	}
	if m, err := codec.Decode(raw.Header, raw.Data); err == nil {
		b.recordDeadLetter(dl, m, agent) // on the agent's behalf
		b.tellSender(m, dl, b.publishAsOperator)
	}
	// The attributes of the subscriber's count (countDeadLetter), so that
	// both add up by priority: before 2026-11-28 these had none, and a
	// messaging.system the other has not.
	attrs := []attribute.KeyValue{attrAgent.String(agent), attrDeadLetterReason.String(string(ReasonUnsettled))}
	if addr, err := b.opts.scheme.Parse(raw.Subject); err == nil {
		attrs = append(attrs, attrPriority.Int(addr.Priority))
	}
	b.tel.deadLetters.Add(ctx, 1, metric.WithAttributes(attrs...))
	// A direct message concerns this agent alone; a broadcast stays for the
	// agents that have not handled it yet. One whose data the dead letter
	// could not keep stays too, for its replay.
	if addr, err := b.opts.scheme.Parse(raw.Subject); err == nil && addr.Kind == subjects.KindDirect && !dropped {
		if err := s.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("remove dead-lettered %s seq %d: %w", adv.Stream, adv.StreamSeq, err)
		}
	}
	return nil
}
