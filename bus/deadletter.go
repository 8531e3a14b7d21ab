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
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// Headers a dead letter carries on top of the original message's headers.
const (
	// HeaderDeadLetterReason says why the message was dead-lettered: one of
	// the DeadLetterReason values.
	HeaderDeadLetterReason = "Agentbus-Dlq-Reason"
	// HeaderDeadLetterError is the last error, on one line.
	HeaderDeadLetterError = "Agentbus-Dlq-Error"
	// HeaderDeadLetterDeliveries is how often the message was delivered.
	HeaderDeadLetterDeliveries = "Agentbus-Dlq-Deliveries"
	// HeaderDeadLetterStream and HeaderDeadLetterSequence locate the
	// original message.
	HeaderDeadLetterStream   = "Agentbus-Dlq-Stream"
	HeaderDeadLetterSequence = "Agentbus-Dlq-Sequence"
	// HeaderDeadLetterSubject is the subject the message was published on.
	HeaderDeadLetterSubject = "Agentbus-Dlq-Subject"
	// HeaderDeadLetterAgent is the agent that could not handle it.
	HeaderDeadLetterAgent = "Agentbus-Dlq-Agent"
	// HeaderDeadLetterTime is when it was dead-lettered (RFC 3339), by the
	// dead-lettering agent's clock; DeadLetter.Time is the server's.
	HeaderDeadLetterTime = "Agentbus-Dlq-Time"
	// HeaderDeadLetterDataDropped is the size in bytes of the original's
	// data when it was too large to keep beside the dead letter's headers
	// (a message close to the server's max_payload): the dead letter has
	// no data, and the original stays in its stream until its retention.
	HeaderDeadLetterDataDropped = "Agentbus-Dlq-Data-Dropped"
	// HeaderDeadLetterHeadersDropped names, comma-separated, the
	// original's headers a dead letter does not keep because with them
	// its headers passed the server's 64 KiB (a foreign message's, near
	// that limit): the largest go first, until the rest fit.
	HeaderDeadLetterHeadersDropped = "Agentbus-Dlq-Headers-Dropped"
	// HeaderDeadLetterOrigPrefix prefixes the JetStream control headers of
	// the original message (Nats-Expected-Stream, Nats-TTL, Nats-Rollup,
	// ...), which a dead letter keeps as "Agentbus-Dlq-Orig-<header>" with
	// the header's name as the message had it: under their own names the
	// server would act on them again when the dead letter is stored, and
	// refuse it or expire it. The original's Nats-Msg-Id is not kept: the
	// dead letter's own ID ends with it.
	HeaderDeadLetterOrigPrefix = "Agentbus-Dlq-Orig-"
)

// jetStreamControlHeaders are the headers nats-server (2.15) acts on when a
// message is published to a stream, matched in any case, and
// jetStreamControlPrefixes the families of them that the server itself
// strips by prefix when it copies a message (sources, mirrors, schedules).
// A copy of a message, such as a dead letter, must not carry them: on
// another stream they can make the server refuse the copy
// (Nats-Expected-*, Nats-TTL, Nats-Rollup, Nats-Incr, Nats-Batch-Id,
// Nats-Schedule*, Nats-Stream-Source), expire it (Nats-TTL), purge other
// messages (Nats-Rollup) or treat it as a marker or a trace. The server's
// response and republish headers (Nats-Stream, Nats-Sequence, ...) and
// Nats-Request-Info, which it removes before storing, are not acted on and
// are kept.
var (
	jetStreamControlHeaders = []string{
		"Nats-Msg-Id",             // deduplication
		"Nats-TTL",                // per-message TTL
		"Nats-Rollup",             // purges the subject or the stream
		"Nats-Incr",               // counter streams
		"Nats-Counter-Sources",    // counter streams
		"Nats-Stream-Source",      // only sourced messages may carry it
		"Nats-Marker-Reason",      // delete markers
		"Nats-Required-Api-Level", // batches and API requests
	}
	jetStreamControlPrefixes = []string{
		"Nats-Expected-", // -Stream, -Last-Sequence, -Last-Subject-Sequence(-Subject), -Last-Msg-Id
		"Nats-Batch-",    // -Id, -Sequence, -Commit: atomic batches
		"Nats-Schedule",  // Nats-Schedule, -Time-Zone, -TTL, -Rollup, -Target, -Source, -Next, Nats-Scheduler
		"Nats-Trace-",    // -Dest, -Only, -Hop, -Origin-Account: message tracing
	}
)

// hasPrefixFold reports whether s begins with prefix, in any case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// isJetStreamControlHeader reports whether k names, in any case, a header
// the server acts on when a message carrying it is published to a stream.
// (The server matches names exactly; a copy drops other spellings too, so
// that no client or proxy that changes their case can make them count.)
func isJetStreamControlHeader(k string) bool {
	for _, h := range jetStreamControlHeaders {
		if strings.EqualFold(k, h) {
			return true
		}
	}
	for _, p := range jetStreamControlPrefixes {
		if hasPrefixFold(k, p) {
			return true
		}
	}
	return false
}

// DeadLetterReason says why a message was dead-lettered.
type DeadLetterReason string

// The reasons a message is dead-lettered.
const (
	// ReasonMaxDeliveries: the handler failed on every allowed delivery.
	ReasonMaxDeliveries DeadLetterReason = "max_deliveries"
	// ReasonRejected: the handler returned Permanent(err).
	ReasonRejected DeadLetterReason = "rejected"
	// ReasonMalformed: the message is not a valid CloudEvent, or it was
	// stored on a subject that is not one of the scheme's.
	ReasonMalformed DeadLetterReason = "malformed"
	// ReasonSenderMismatch: the event's source names another agent than
	// the subject it was published on.
	ReasonSenderMismatch DeadLetterReason = "sender_mismatch"
	// ReasonInvalidNative: the message breaks the rules of its strict
	// protocol profile (docs/protocols.md).
	ReasonInvalidNative DeadLetterReason = "invalid_native"
	// ReasonUnsettled: the last allowed delivery was never acknowledged,
	// typically because the process crashed; found from the server's
	// MAX_DELIVERIES advisory.
	ReasonUnsettled DeadLetterReason = "unsettled"
)

// DefaultDeadLetterMaxAge is how long dead letters are kept.
const DefaultDeadLetterMaxAge = 90 * 24 * time.Hour

// deadLetterDedupWindow is how long the dead-letter stream remembers a dead
// letter's ID, so a message that reaches it both ways is stored once.
const deadLetterDedupWindow = 24 * time.Hour

// maxErrorHeader bounds the error text carried in a dead letter.
const maxErrorHeader = 1024

// deadLetter describes one message on its way to the dead-letter stream.
type deadLetter struct {
	agent      string
	reason     DeadLetterReason
	err        error
	subject    string
	stream     string
	seq        uint64
	deliveries uint64
	header     nats.Header
	data       []byte
}

// deadLetterID identifies a dead letter for deduplication: one per original
// message and receiving agent, whichever way it arrives. It ends with the
// message's own ID: deduplication spans the whole dead-letter stream, and
// an agent that could predict another agent's dead-letter IDs could file
// one of its own under such an ID first and so have the real one dropped
// (docs/security.md).
func deadLetterID(dl deadLetter) string {
	return "dlq/" + dl.stream + "/" + strconv.FormatUint(dl.seq, 10) + "/" + subjects.EncodeToken(dl.agent) +
		"/" + dl.header.Get(jetstream.MsgIDHeader)
}

// writeDeadLetter stores dl on the dead-letter stream and waits for the ack.
// A message too large to store with the dead letter's headers is stored
// without its data (HeaderDeadLetterDataDropped), and dropped says so: the
// original must stay where it is. It failed, and the message was kept,
// delivered again and never dead-lettered. One whose headers with the dead
// letter's pass the server's 64 KiB is stored without its largest
// (HeaderDeadLetterHeadersDropped); before 2026-11-28 it was kept, and
// delivered again, for good.
func (b *client) writeDeadLetter(ctx context.Context, dl deadLetter) (dropped bool, err error) {
	from, typ := "unknown", "unknown"
	if addr, err := b.opts.scheme.Parse(dl.subject); err == nil {
		from, typ = addr.From, addr.Type
	}
	subject, err := b.opts.scheme.DeadLetter(dl.agent, from, typ)
	if err != nil {
		return false, fmt.Errorf("dead-letter subject: %w", err)
	}
	h := deadLetterHeader(dl.header)
	h[jetstream.MsgIDHeader] = []string{deadLetterID(dl)}
	h[HeaderDeadLetterReason] = []string{string(dl.reason)}
	if dl.err != nil {
		h[HeaderDeadLetterError] = []string{oneLine(dl.err.Error(), maxErrorHeader)}
	}
	h[HeaderDeadLetterDeliveries] = []string{strconv.FormatUint(dl.deliveries, 10)}
	h[HeaderDeadLetterStream] = []string{dl.stream}
	h[HeaderDeadLetterSequence] = []string{strconv.FormatUint(dl.seq, 10)}
	h[HeaderDeadLetterSubject] = []string{dl.subject}
	h[HeaderDeadLetterAgent] = []string{subjects.EncodeToken(dl.agent)}
	h[HeaderDeadLetterTime] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	msg := &nats.Msg{Subject: subject, Header: h, Data: dl.data}
	_, err = publishAgain(ctx, b.js, msg)
	if isAPIError(err, jsErrCodeHeaderExceedsMaximum) {
		dropLargestHeaders(h, dl.header)
		_, err = publishAgain(ctx, b.js, msg)
	}
	if len(dl.data) > 0 && (errors.Is(err, nats.ErrMaxPayload) || isAPIError(err, jetstream.JSErrCodeStreamMessageExceedsMaximum)) {
		h[HeaderDeadLetterDataDropped] = []string{strconv.Itoa(len(dl.data))}
		msg.Data, dropped = nil, true
		_, err = publishAgain(ctx, b.js, msg)
	}
	if err != nil {
		return false, fmt.Errorf("write dead letter for %s seq %d: %w", dl.stream, dl.seq, b.notProvisioned(err))
	}
	return dropped, nil
}

// keptHeaders bounds the original's headers a dead letter keeps when with
// them it would pass the server's 64 KiB: room for the dead letter's own.
const keptHeaders = 48 << 10

// dropLargestHeaders removes from h, a dead letter's headers, the largest
// of the original's, orig, until what is left of them is keptHeaders at
// most, and names them in HeaderDeadLetterHeadersDropped.
func dropLargestHeaders(h, orig nats.Header) {
	var names []string
	for k := range orig { // not those the dead letter's own replace
		if !strings.EqualFold(k, jetstream.MsgIDHeader) && !strings.HasPrefix(k, "Agentbus-Dlq-") {
			names = append(names, k)
		}
	}
	size := func(k string) int {
		n := 0
		for _, v := range orig[k] {
			n += len(k) + len(v) + 4 // "k: v\r\n"
		}
		return n
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(size(b)-size(a), strings.Compare(a, b)) })
	total := 0
	for _, k := range names {
		total += size(k)
	}
	var dropped []string
	for _, k := range names {
		if total <= keptHeaders {
			break
		}
		total -= size(k)
		dropped = append(dropped, k)
		delete(h, k)
		delete(h, HeaderDeadLetterOrigPrefix+k)
	}
	h[HeaderDeadLetterHeadersDropped] = []string{oneLine(strings.Join(dropped, ","), maxErrorHeader)}
}

// deadLetterHeader returns the headers of a dead letter of a message with
// header orig, before the dead letter's own: orig's, except that its
// JetStream control headers are renamed with HeaderDeadLetterOrigPrefix,
// and its Nats-Msg-Id dropped, so that the dead-letter stream stores the
// copy as it is, and stores it once.
func deadLetterHeader(orig nats.Header) nats.Header {
	h := make(nats.Header, len(orig)+9)
	var control []string
	for k, v := range orig {
		if isJetStreamControlHeader(k) {
			control = append(control, k)
			continue
		}
		h[k] = v
	}
	// After the others, so that the original's control headers win over
	// any header of the same name it carried.
	for _, k := range control {
		if !strings.EqualFold(k, jetstream.MsgIDHeader) {
			h[HeaderDeadLetterOrigPrefix+k] = orig[k]
		}
	}
	return h
}

// oneLine makes s a valid header value: no line breaks, at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// deadLetterReasonOf returns the dead-letter reason of a message terminated
// for reason, and false if it was not dead-lettered because it only
// expired or was canceled. Only a termination the bus decided (busTerm) is
// classified by what it wraps; a handler's error is a rejection, or a
// failure on the last delivery allowed.
func deadLetterReasonOf(reason error) (DeadLetterReason, bool) {
	var bt busTerm
	switch {
	case reason == nil:
		return "", false
	case errors.Is(reason, errMaxDeliver):
		return ReasonMaxDeliveries, true
	case !errors.As(reason, &bt):
		return ReasonRejected, true
	}
	switch err := bt.err; {
	case errors.Is(err, ErrExpired), errors.Is(err, ErrCanceled):
		return "", false
	case errors.Is(err, codec.ErrMalformed), errors.Is(err, ErrMalformedSubject):
		return ReasonMalformed, true
	case errors.Is(err, ErrSenderMismatch):
		return ReasonSenderMismatch, true
	case errors.Is(err, ErrInvalidNative):
		return ReasonInvalidNative, true
	}
	return ReasonRejected, true
}

// deadLetter files the message cm, decoded as m (nil if it could not be),
// on the dead-letter stream for reason r and records it dead_lettered.
func (b *Bus) deadLetter(cm *consumers.Msg, m *Message, r DeadLetterReason, reason error) error {
	dl := deadLetter{
		agent:      b.agent,
		reason:     r,
		err:        reason,
		subject:    cm.Subject,
		stream:     cm.Metadata.Stream,
		seq:        cm.Metadata.StreamSeq,
		deliveries: cm.Metadata.Deliveries,
		header:     cm.Header,
		data:       cm.Data,
	}
	if _, err := b.writeDeadLetter(context.Background(), dl); err != nil {
		return err
	}
	b.recordDeadLetter(dl, m, b.agent)
	b.tellSender(m, dl, b.Publish)
	return nil
}

// recordDeadLetter records the message dl holds, decoded as m, as
// dead-lettered at its agent. A message that cannot be decoded (m nil) has
// no record to update, and neither has one whose subject does not vouch
// for its sender: its record's key names the sender and ID it claims, and
// it wrote dead_lettered over the record of another agent's message with
// that ID (whose request its recipient then skipped as ended).
func (b *client) recordDeadLetter(dl deadLetter, m *Message, by string) {
	if m == nil || dl.reason == ReasonSenderMismatch || dl.reason == ReasonMalformed {
		return
	}
	if addr, err := b.opts.scheme.Parse(dl.subject); err != nil || addr.From != m.From {
		return // the unsettled path meets what no subscriber checked
	}
	s := statusOf(m, dl.agent, StateDeadLettered, by)
	s.Stream, s.Sequence, s.Deliveries = dl.stream, dl.seq, int(dl.deliveries)
	s.Reason = fmt.Sprintf("%s: %v", dl.reason, dl.err)
	b.status.record(s, false)
}

// TypeDeadLettered is the type of the notice the bus sends the sender of a
// request that was dead-lettered (its handler failed on every delivery
// allowed, rejected it, or never settled it), so that a Request or a Gather
// waiting for the reply ends at once, where it waited out its deadline: a
// Request with a *DeadLetteredError. The notice comes from the request's
// recipient, or from "agentbus" when an operator's dead-letter watcher
// dead-lettered it (ReasonUnsettled); its causation is the request, its
// data says why (JSON: id, from, to, reason, error), and it expires at the
// request's reply-by. A subscriber takes it and hands it to no handler.
const TypeDeadLettered = "agentbus.dead_lettered"

// ErrDeadLettered is wrapped by the error of a Request whose request was
// dead-lettered while it waited (*DeadLetteredError).
var ErrDeadLettered = errors.New("bus: request dead-lettered")

// DeadLetteredError is returned by a Request whose request was
// dead-lettered while it waited; it wraps ErrDeadLettered.
type DeadLetteredError struct {
	ID     string           // the request's ID
	Agent  string           // the agent that could not handle it
	Reason DeadLetterReason // why it was dead-lettered
	Err    string           // the last error, as the dead letter has it
}

func (e *DeadLetteredError) Error() string {
	if e.Err == "" {
		return fmt.Sprintf("request %s dead-lettered at %s: %s", e.ID, e.Agent, e.Reason)
	}
	return fmt.Sprintf("request %s dead-lettered at %s: %s: %s", e.ID, e.Agent, e.Reason, e.Err)
}

// Unwrap returns ErrDeadLettered.
func (e *DeadLetteredError) Unwrap() error { return ErrDeadLettered }

// deadLetteredNotice is the data of a TypeDeadLettered notice.
type deadLetteredNotice struct {
	ID     string           `json:"id"`
	From   string           `json:"from"`
	To     string           `json:"to"`
	Reason DeadLetterReason `json:"reason"`
	Error  string           `json:"error,omitempty"`
}

// tellSender sends the sender of m, dead-lettered as dl says, a
// TypeDeadLettered notice with publish when m is a request whose sender
// may still wait for its reply: one with a reply-by to come, from another
// agent, that its recipient did not answer with a protocol rejection
// (checkNative) and whose sender the subject vouched for (not
// ReasonSenderMismatch). Progress updates and the bus's own notices are
// no requests. A failure goes to the error handler: the Request then
// waits out its deadline, as before.
func (c *client) tellSender(m *Message, dl deadLetter, publish func(context.Context, Message) (PubAck, error)) {
	if m == nil || m.From == dl.agent || m.From == operatorSender || subjects.ValidateID(m.From) != nil ||
		m.Extensions[ExtProgress] != "" || m.Type == TypeCancel || m.Type == TypeDeadLettered {
		return
	}
	replyBy, err := time.Parse(time.RFC3339Nano, m.Extensions[ExtReplyBy])
	if err != nil || m.CausationID != "" && m.ID == replyIDOf(m.CausationID) {
		return // not a request, or a reply to one
	}
	switch dl.reason {
	case ReasonMaxDeliveries, ReasonRejected, ReasonUnsettled:
	case ReasonInvalidNative:
		if p, ok := profiles.ForDataSchema(m.DataSchema); ok {
			if _, rejects := p.(profiles.Rejecter); rejects {
				return // the protocol's rejection is the answer
			}
		}
	default:
		return
	}
	untilReplyBy := time.Until(replyBy)
	if untilReplyBy <= 0 {
		return // nobody waits any more
	}
	n := deadLetteredNotice{ID: m.ID, From: m.From, To: dl.agent, Reason: dl.reason}
	if dl.err != nil {
		n.Error = oneLine(dl.err.Error(), maxErrorHeader)
	}
	data, err := json.Marshal(n)
	if err != nil {
		return
	}
	notice := Message{To: m.From, Type: TypeDeadLettered, Priority: m.Priority, CorrelationID: conversationOf(m), CausationID: m.ID,
		ContentType: "application/json", Data: data, TTL: max(untilReplyBy, time.Second)}
	ctx, cancel := context.WithTimeout(context.Background(), publishAttemptTimeout)
	defer cancel()
	if _, err := publish(ctx, notice); err != nil {
		c.opts.onError(fmt.Errorf("tell %s that its request %s was dead-lettered: %w", m.From, m.ID, err))
	}
}

// DeadLetter is a message kept on the dead-letter stream.
type DeadLetter struct {
	// Sequence is its sequence in the dead-letter stream.
	Sequence uint64
	// Reason, Error and Deliveries say why it was dead-lettered.
	Reason     DeadLetterReason
	Error      string
	Deliveries uint64
	// Agent is the agent that could not handle it.
	Agent string
	// Stream, StreamSequence and Subject locate the original message.
	Stream         string
	StreamSequence uint64
	Subject        string
	// Time is when it was dead-lettered: when the dead-letter stream
	// stored it, by the server's clock, which DeadLetterFilter.Since
	// compares with. HeaderDeadLetterTime, which the dead-lettering agent
	// writes by its own clock, is not read.
	Time time.Time
	// Message is the decoded original, or nil if it was not a valid
	// CloudEvent (Reason is then ReasonMalformed).
	Message *Message
	// Header and Data are the original message as it was stored, with the
	// JetStream control headers the server would act on again (such as
	// Nats-Expected-Stream) kept as Agentbus-Dlq-Orig-<header>, and the
	// dead letter's own headers.
	Header nats.Header
	Data   []byte
	// DataDropped is the size of the original's data when it was too
	// large to keep beside the dead letter's headers: Data is empty, and
	// Admin.ReplayDeadLetter reads the original from Stream at
	// StreamSequence while it is there.
	DataDropped int
}
