package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// Scheduled messages are stored by the server and published by it when
// they are due (nats-server 2.12 message schedules; @every and cron from
// 2.14): no client keeps a timer, and a schedule outlives the process that
// made it and restarts of the server. docs/scheduling.md describes them;
// subjects/schedule.go has the subjects.

// scheduleNextPurge is Nats-Schedule-Next on the last firing of a
// schedule (jetstream.ScheduleNextHeader).
const scheduleNextPurge = "purge"

// ExtScheduleID is the CloudEvents extension a receiver gives each firing
// of a recurring schedule: the ID the schedule was made with. The firing's
// own ID is derived from it and the firing's stream sequence, so each
// firing has a lifecycle record of its own.
const ExtScheduleID = "scheduleid"

// ErrScheduleMismatch is the reason a receiver dead-letters a fired
// message whose schedule was made by another agent than the sender its
// subject and source name, or for another message ID: a schedule's target
// is not checked against the scheduler's permissions by the server.
var ErrScheduleMismatch = fmt.Errorf("%w: scheduled by another agent, or for another message", ErrSenderMismatch)

// When says when a scheduled message fires: once (At, In), or again and
// again (Every, Cron). The zero When is invalid.
type When struct {
	at    time.Time
	every time.Duration
	cron  string
	loc   *time.Location
}

// At fires once at t (to the second; a time past fires at once).
func At(t time.Time) When { return When{at: t.UTC().Truncate(time.Second)} }

// In fires once d from now, to the second.
func In(d time.Duration) When { return At(time.Now().Add(d).Add(time.Second - 1)) }

// Every fires every d (at least one second; whole seconds), the first time
// d from now.
func Every(d time.Duration) When { return When{every: d} }

// Cron fires at the times a cron expression names: six fields with
// seconds ("0 30 9 * * 1-5": 9:30 on weekdays), or @hourly, @daily,
// @weekly, @monthly, @yearly; in loc (nil: UTC), a zone with a name the
// server loads (time.LoadLocation; not time.Local or a time.FixedZone,
// which Validate refuses). The server parses the expression: Schedule
// fails with ErrInvalidOption for one it refuses.
func Cron(expr string, loc *time.Location) When { return When{cron: expr, loc: loc} }

// Once reports whether w fires only once.
func (w When) Once() bool { return !w.at.IsZero() }

// firing returns when w, a schedule that fires once, fires if made at now:
// its time, or now for a time past (the server fires it at once).
func (w When) firing(now time.Time) time.Time {
	if w.at.Before(now) {
		return now
	}
	return w.at
}

// String describes w: its Nats-Schedule pattern, and for a cron
// expression in a time zone the zone after it ("0 0 2 * * * Europe/Berlin").
func (w When) String() string {
	if w.cron != "" && w.loc != nil {
		return w.pattern() + " " + w.loc.String()
	}
	return w.pattern()
}

// pattern returns the server's Nats-Schedule pattern of w.
func (w When) pattern() string {
	switch {
	case !w.at.IsZero():
		return "@at " + w.at.Format(time.RFC3339)
	case w.every > 0:
		return "@every " + w.every.String()
	}
	return w.cron
}

// Validate reports what is wrong with w, as Schedule would: an error
// wrapping ErrInvalidOption. The server checks a cron expression itself.
func (w When) Validate() error {
	set := 0
	for _, b := range []bool{!w.at.IsZero(), w.every != 0, w.cron != ""} {
		if b {
			set++
		}
	}
	switch {
	case set != 1:
		return fmt.Errorf("%w: a schedule needs one of At, In, Every or Cron", ErrInvalidOption)
	case w.every != 0 && (w.every < time.Second || w.every%time.Second != 0):
		return fmt.Errorf("%w: Every(%v): whole seconds, at least one", ErrInvalidOption, w.every)
	case w.cron != "" && w.loc != nil:
		// The server loads the zone by its name.
		name := w.loc.String()
		if name == "Local" {
			return fmt.Errorf("%w: Cron(%q, time.Local): the server would read \"Local\" as its own zone; name the zone (time.LoadLocation)", ErrInvalidOption, w.cron)
		}
		if _, err := time.LoadLocation(name); err != nil {
			return fmt.Errorf("%w: Cron(%q): time zone %q has no name the server can load (time.LoadLocation): %w", ErrInvalidOption, w.cron, name, err)
		}
	}
	return nil
}

// ScheduledTTL is how long a scheduled message without a TTL of its own is
// kept after it fires, when the bus does not provision the stream (with
// WithProvision it is the stream's MaxAge): the fired copy carries it as
// its Nats-TTL, in the message stream and in the schedule stream alike.
const ScheduledTTL = DefaultMaxAge

// Schedule stores m to be sent when w says, and returns at once: the server
// keeps the schedule (in the schedule stream, subjects.Scheme.ScheduleStream)
// and publishes m then, whether or not this process still runs. m's record
// reads scheduled, with the schedule and the time it fires, until the
// recipient gets it; Cancel before that and it never fires. A message sent
// once (At, In) has its Time set to when it fires, unless set, so its TTL
// and its conversation's deadline count from then. Each firing of a
// recurring schedule (Every, Cron) reaches the recipient as a message of
// its own, whose ID is derived from m's and which carries m's ID as
// ExtScheduleID; m may then have no TTL, and its firings carry no
// deadline of its conversation nor reply-by (ExtConversationBy,
// ExtReplyBy), which a recurring schedule outlives.
//
// Scheduling the same ID again within the duplicate window stores it once
// (PubAck.Duplicate); later, the new schedule replaces the old.
//
// Errors: those of Publish, ErrInvalidOption for an invalid When,
// ErrUnsupportedServer before nats-server 2.12 (2.14 for Every and Cron),
// ErrNotProvisioned when the schedule stream does not exist, and, under
// generated permissions, ErrPermissionDenied unless the agent was made a
// scheduler (agentbus auth init --schedulers).
func (b *Bus) Schedule(ctx context.Context, m Message, w When) (PubAck, error) {
	if b.shards != nil {
		return b.shards.schedule(ctx, m, w)
	}
	return b.scheduleHere(ctx, m, w)
}

// scheduleHere is Schedule on this bus's own root.
func (b *Bus) scheduleHere(ctx context.Context, m Message, w When) (PubAck, error) {
	if err := w.Validate(); err != nil {
		return PubAck{}, err
	}
	if err := b.schedulesSupported(ctx, w); err != nil {
		return PubAck{}, err
	}
	if !w.Once() && m.TTL > 0 {
		return PubAck{}, &codec.FieldError{Field: "TTL", Value: m.TTL.String(), Err: fmt.Errorf("%w: a recurring schedule's messages cannot share one expiry", ErrInvalidMessage)}
	}
	inherit(ctx, &m)
	if !w.Once() {
		// Its firings come after any deadline of the conversation it was
		// made in, and after the reply-by of a request it answers: they
		// carry neither, or each would expire, or be late, on arrival.
		withoutExtensions(&m, ExtConversationBy, ExtReplyBy)
	}
	var start time.Time // the conversation's deadline counts from the firing
	if w.Once() {
		start = w.firing(time.Now())
		if m.Time.IsZero() {
			m.Time = start // its TTL counts from the firing
		}
	}
	msg, op, err := b.prepareAt(ctx, &m, time.Now(), start)
	if err != nil {
		return PubAck{}, err
	}
	if err := b.scheduleMsg(msg, &m, w); err != nil {
		op.abandon(err)
		return PubAck{}, err
	}
	ack, err := b.send(ctx, msg)
	if err != nil {
		return PubAck{}, b.scheduleFailed(ctx, op, &m, w, msg, err)
	}
	b.status.recordPending(scheduleStatus(&m, w, StateScheduled, b.agent, nil), ack)
	op.end(b.tel, ctx, nil, ack.Duplicate)
	return PubAck{ID: m.ID, Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// scheduleFailed ends op, the Schedule of m as w says, sent as msg, that
// failed with err, and returns the error Schedule returns. A schedule the
// server refused (a cron expression or a zone it cannot read among them:
// ErrInvalidOption) or that was never sent leaves no record, so that the
// same ID scheduled again reads scheduled. One that may be stored (its ack
// lost, the context ended) is recorded failed with its schedule, which
// its sender's Cancel then removes.
func (b *Bus) scheduleFailed(ctx context.Context, op sendOp, m *Message, w When, msg *nats.Msg, err error) error {
	var apiErr *jetstream.APIError
	refused := errors.As(err, &apiErr)
	switch {
	case refused && apiErr.ErrorCode == jetstream.JSErrCodeSchedulePatternInvalid:
		// Validate leaves a cron expression to the server, which parses it.
		err = fmt.Errorf("%w: Cron(%q): the server refuses the expression: %w", ErrInvalidOption, w.cron, err)
	case refused && apiErr.ErrorCode == jsErrCodeScheduleTimeZoneInvalid:
		err = fmt.Errorf("%w: Cron(%q, %s): the server refuses the time zone: %w", ErrInvalidOption, w.cron, w.loc, err)
	default:
		err = b.publishError(b.opts.scheme.ScheduleStream(), msg, m.ID, err)
	}
	if refused || errors.Is(err, ErrPermissionDenied) || errors.Is(err, ErrPayloadTooLarge) ||
		errors.Is(err, ErrNotProvisioned) || errors.Is(err, ErrClosed) {
		op.abandon(err)
		return err
	}
	op.end(b.tel, ctx, err, false)
	b.status.record(scheduleStatus(m, w, StateFailed, b.agent, err), false)
	return err
}

// scheduleStatus returns the sender's record of m, scheduled as w says:
// state s (scheduled, or failed when the outcome is not known), and why.
func scheduleStatus(m *Message, w When, s State, by string, reason error) Status {
	st := statusOf(m, m.To, s, by)
	st.Schedule = w.String()
	if w.Once() {
		st.FiresAt = w.at
	}
	if reason != nil {
		st.Reason = reason.Error() + " (it may be stored: Cancel removes it)"
	}
	return st
}

// jsErrCodeScheduleTimeZoneInvalid is the server's error for a schedule's
// time zone it cannot load (nats-server JSMessageSchedulesTimeZoneInvalidErr),
// which nats.go does not name.
const jsErrCodeScheduleTimeZoneInvalid jetstream.ErrorCode = 10223

// scheduleMsg turns msg, m encoded for its direct or broadcast subject,
// into m's schedule: stored on the schedule subject, firing to the fired
// form of its subject when w says.
func (b *Bus) scheduleMsg(msg *nats.Msg, m *Message, w When) error {
	sc := b.opts.scheme
	target, err := sc.Fired(m.ID, msg.Subject)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	if msg.Subject, err = sc.Schedule(m.From, m.ID); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	ttl := b.scheduledTTL()
	if m.TTL > 0 { // the server counts it from the firing
		ttl = m.ExpiresAt().Sub(w.firing(time.Now()))
	}
	delete(msg.Header, jetstream.MsgTTLHeader) // the schedule waits; the firing expires
	msg.Header[jetstream.ScheduleHeader] = []string{w.pattern()}
	msg.Header[jetstream.ScheduleTargetHeader] = []string{target}
	msg.Header[jetstream.ScheduleTTLHeader] = []string{ttlSeconds(ttl)}
	if w.loc != nil && w.cron != "" {
		msg.Header[jetstream.ScheduleTimeZoneHeader] = []string{w.loc.String()}
	}
	return nil
}

// scheduledTTL is the Nats-TTL of a fired message without a TTL of its own.
func (b *Bus) scheduledTTL() time.Duration {
	if p := b.opts.provision; p != nil {
		return orDefault(p.MaxAge, DefaultMaxAge)
	}
	return ScheduledTTL
}

// schedulesSupported reports whether the server can keep schedules like w.
// While the connection is down, the version of the server the schedule
// will reach is not known: it waits until the connection is back, or ctx
// ends (Publish would wait as long for its ack).
func (b *Bus) schedulesSupported(ctx context.Context, w When) error {
	need := minScheduleServer
	if !w.Once() {
		need = minRecurringServer
	}
	version := b.nc.ConnectedServerVersion()
	if version == "" {
		ctx, cancel := withDefaultTimeout(ctx)
		defer cancel()
		if err := b.nc.FlushWithContext(ctx); err != nil { // answered once connected
			return b.closedBy(fmt.Errorf("schedule: server version unknown, %w: %w", notConnected(b.nc), err))
		}
		if version = b.nc.ConnectedServerVersion(); version == "" {
			return b.closedBy(fmt.Errorf("schedule: server version unknown: %w", notConnected(b.nc)))
		}
	}
	v, ok := parseVersion(version)
	if !ok || !atLeast(v, need) {
		return fmt.Errorf("%w: nats-server %s keeps no %q schedules; they need %d.%d or later",
			ErrUnsupportedServer, version, w.String(), need[0], need[1])
	}
	return nil
}

// The first nats-server versions with message schedules, and with
// recurring ones.
var (
	minScheduleServer  = [3]int{2, 12, 0}
	minRecurringServer = [3]int{2, 14, 0}
)

// firing is what a fired message's headers say of its schedule.
type firing struct {
	scheduleID string // the ID the schedule was made with
	recurring  bool
}

// checkSchedule checks a message that a schedule fired (it carries
// Nats-Scheduler, which only the server sets on a message stream): the
// schedule must be the subject's sender's, for m's ID. For a recurring
// schedule it gives m its firing's own ID, derived from the schedule's ID
// and the stream sequence, ExtScheduleID, and the time the firing was
// stored (md) as its Time. ok is false for a message no schedule fired.
func (b *Bus) checkSchedule(h nats.Header, md consumers.Metadata, m *Message) (f firing, ok bool, err error) {
	scheduler := h.Get(jetstream.SchedulerHeader)
	if scheduler == "" {
		return firing{}, false, nil
	}
	from, idTok, err := b.opts.scheme.ParseSchedule(scheduler)
	if err != nil {
		return firing{}, true, fmt.Errorf("%w: %w", ErrScheduleMismatch, err)
	}
	if from != m.From || idTok != subjects.IDToken(m.ID) {
		return firing{}, true, fmt.Errorf("%w: message %s from %q was scheduled as %s", ErrScheduleMismatch, m.ID, m.From, scheduler)
	}
	f = firing{scheduleID: m.ID, recurring: recurringFiring(h)}
	if f.recurring {
		asFiring(m, md.StreamSeq, md.Timestamp)
	}
	return f, true, nil
}

// recurringFiring reports whether h are the headers of a message a
// recurring schedule fired (nats-server sets Nats-Scheduler on a fired
// message, and Nats-Schedule-Next to purge on the last firing of one sent
// once).
func recurringFiring(h nats.Header) bool {
	return h.Get(jetstream.SchedulerHeader) != "" && h.Get(jetstream.ScheduleNextHeader) != scheduleNextPurge
}

// asFiring makes m, as its recurring schedule stored it, the firing stored
// in the message stream at seq at stored: its own ID (firingID), the time
// it fired, and its schedule's ID as ExtScheduleID. The receiver, History
// and Redeliver read a firing so.
func asFiring(m *Message, seq uint64, stored time.Time) {
	scheduleID := m.ID
	m.ID = firingID(scheduleID, seq)
	m.Time = stored.UTC()
	setExtension(m, ExtScheduleID, scheduleID)
}

// firingID returns the ID of the firing of schedule scheduleID stored in
// the message stream at seq.
func firingID(scheduleID string, seq uint64) string {
	return uuid.NewSHA1(firingSpace, []byte(scheduleID+"\x00"+strconv.FormatUint(seq, 10))).String()
}

// firingSpace names the IDs of the firings of recurring schedules.
var firingSpace = uuid.MustParse("9c1b7f0e-6a2d-4e8b-b3f5-2d7c4a9e1f60")

// settledBeforeFiring reports whether the schedule of the fired message f
// was canceled, or its message already ended, by its record: a cancel of a
// message that fired meanwhile reaches the recipient only by the record.
func (b *Bus) settledBeforeFiring(ctx context.Context, m *Message, f firing) bool {
	if b.status == nil {
		return false
	}
	sm := *m
	sm.ID = f.scheduleID
	recipient := b.agent
	if m.Broadcast() {
		recipient = Broadcast // the schedule's record is its sender's, of the broadcast
	}
	s, err := b.status.get(ctx, &sm, recipient)
	if err != nil {
		return false
	}
	if f.recurring {
		return s.State == StateCanceled
	}
	return s.State.Final()
}

// unschedule removes the schedule of the message st records, so that it
// never fires: a message on the schedule's subject that rolls it up and
// expires a minute later.
func (c *client) unschedule(ctx context.Context, st Status) error {
	subj, err := c.opts.scheme.Schedule(st.From, st.ID)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: subj, Header: nats.Header{
		jetstream.MsgRollup:    []string{jetstream.MsgRollupSubject},
		jetstream.MsgTTLHeader: []string{"60s"},
	}}
	ctx, stop := c.watchRefusals(ctx, subj)
	defer stop()
	if _, err := publishAgain(ctx, c.js, m); err != nil {
		return refusedCall(ctx, fmt.Errorf("unschedule %s: %w", st.ID, err))
	}
	return nil
}
