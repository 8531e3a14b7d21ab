package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/subjects"
)

// EscalationPolicy says what happens when an agent stays offline too long:
// after After of one outage, an escalation message goes to To (a human's
// inbox, an orchestrator); when the agent comes back, a recovery message
// follows.
type EscalationPolicy struct {
	// Agent is the agent the policy watches. With Tag instead, the policy
	// watches every agent whose card has a skill with that tag (a role).
	Agent string
	Tag   string
	// After is how long an outage lasts before it is escalated: the
	// pipeline protocol's 3 minutes, say. It counts from when the registry
	// found the agent gone.
	After time.Duration
	// To receives the escalation and the recovery.
	To string
	// From is the sender the messages carry; empty means "agentbus".
	From string
	// Priority of the messages; 0 means 2.
	Priority int
	// Message, if set, makes the escalation or recovery message (Type,
	// Data, ...: see PipelineEscalation for the pipeline protocol's
	// needs_human). Nil sends EventEscalation or EventRecovery with the
	// Escalation as JSON data.
	Message func(Escalation) (Message, error)
}

// Escalation is what an escalation or a recovery message reports.
type Escalation struct {
	Agent string `json:"agent"`
	// OfflineSince is when the outage began.
	OfflineSince time.Time `json:"offlineSince"`
	// Reason is why the agent is offline (ReasonSilent, ReasonShutdown).
	Reason string `json:"reason"`
	// After is the policy's limit.
	After Duration `json:"after"`
	// Recovered is set on the recovery message, with when.
	Recovered   bool      `json:"recovered"`
	RecoveredAt time.Time `json:"recoveredAt,omitzero"`
	// To and MessageID are the recipient and the ID the message gets, for
	// a Message func that writes them into a native message.
	To        string `json:"-"`
	MessageID string `json:"-"`
}

// The types of the default escalation and recovery messages.
const (
	EventEscalation = "agentbus.escalation"
	EventRecovery   = "agentbus.recovery"
)

// WatchEscalations applies policies until ctx ends, and returns nil then
// (ErrClosed if the Admin closes first):
// it watches presence (WatchPresence) and, when an agent a policy covers
// has been offline for the policy's After, sends the escalation; when the
// agent comes back, the recovery. Each outage is escalated, and recovered,
// exactly once, however many processes watch and however often they
// restart: the first to create the outage's record in the registry
// (subjects.OutageKey) sends it, with a message ID of its own that the
// stream deduplicates. An agent that flaps never stays offline for After,
// and is not escalated.
func (a *Admin) WatchEscalations(ctx context.Context, policies []EscalationPolicy) error {
	for i, p := range policies {
		if (p.Agent == "") == (p.Tag == "") || p.After <= 0 || subjects.ValidateID(p.To) != nil {
			return fmt.Errorf("%w: escalation policy %d needs an Agent or a Tag, After > 0 and a valid To", ErrInvalidOption, i)
		}
		if err := subjects.ValidateID(p.Agent); p.Agent != "" && err != nil {
			// No agent can have it: the watch would wait for it forever.
			return fmt.Errorf("%w: escalation policy %d: Agent: %w", ErrInvalidOption, i, err)
		}
		// Messages that can never be sent: every escalation would fail
		// when due, told only to the error handler.
		if err := subjects.ValidateID(p.From); p.From != "" && err != nil {
			return fmt.Errorf("%w: escalation policy %d: From: %w", ErrInvalidOption, i, err)
		}
		if p.Priority != 0 && (p.Priority < subjects.HighestPriority || p.Priority > subjects.LowestPriority) {
			return fmt.Errorf("%w: escalation policy %d: Priority %d is not 0 (for 2) or %d..%d",
				ErrInvalidOption, i, p.Priority, subjects.HighestPriority, subjects.LowestPriority)
		}
	}
	w := &escalations{a: a, policies: policies, outages: map[string]*outage{}}
	defer w.stopAll()
	ctx, cancel := context.WithCancel(ctx) // ends the attempts under way, first
	defer cancel()
	if err := w.readEscalated(ctx); err != nil {
		a.opts.onError(fmt.Errorf("watch escalations: outages escalated before: %w", err))
	}
	return a.WatchPresence(ctx, func(c PresenceChange) { w.change(ctx, c) })
}

// escalations is one WatchEscalations.
type escalations struct {
	a        *Admin
	policies []EscalationPolicy

	mu      sync.Mutex
	outages map[string]*outage // by agent
	timers  sync.WaitGroup
}

// outage is one agent's current outage.
type outage struct {
	since  time.Time
	reason string
	timer  *time.Timer // its escalation's; nil for one escalated before this watch (readEscalated)
	policy EscalationPolicy
	done   chan struct{} // closed when the timer's escalate returned
}

// stop stops o's pending escalation, and reports whether it will not run
// now (false once it ran or runs, or for an outage with none).
func (o *outage) stop() bool { return o.timer != nil && o.timer.Stop() }

// change takes one presence change. An agent back online ends its outage
// under the policy that covered it when it went: a card that lost the
// policy's tag meanwhile left the escalation without its recovery.
func (w *escalations) change(ctx context.Context, c PresenceChange) {
	var p EscalationPolicy
	if c.Presence.Status == Offline {
		var ok bool
		if p, ok = w.policyFor(ctx, c.Agent); !ok {
			return
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := w.outages[c.Agent]
	switch c.Presence.Status {
	case Offline:
		if prev != nil && prev.since.Equal(c.Presence.Since) {
			return
		}
		if prev != nil && prev.stop() {
			w.timers.Done() // it will not run
		}
		o := &outage{since: c.Presence.Since, reason: c.Presence.Reason, policy: p, done: make(chan struct{})}
		w.arm(ctx, c.Agent, o, time.Until(o.since.Add(p.After)), 0)
		w.outages[c.Agent] = o
	case Online:
		if prev == nil {
			return
		}
		fired := !prev.stop()
		if !fired {
			w.timers.Done() // it will not run
		}
		delete(w.outages, c.Agent)
		recovered := c.Presence.Since
		w.timers.Go(func() {
			if fired {
				// Its escalation may still be on its way, its record
				// not written yet: the recovery follows it.
				select {
				case <-prev.done:
				case <-ctx.Done():
					return
				}
			}
			w.recover(ctx, c.Agent, prev, recovered)
		})
	}
}

// readEscalated takes the outages the registry says were escalated and
// not recovered as w's own, escalated: a watcher that starts after such an
// agent came back, while none ran, sends the recovery when the presence it
// reads first says the agent is online. It saw the agent online with no
// outage of its own, and the recovery never came.
func (w *escalations) readEscalated(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	type outageID struct {
		agent string
		since int64
	}
	read := func(kind string) (map[outageID]Escalation, error) {
		found := map[outageID]Escalation{}
		cfg := jetstream.ConsumerConfig{FilterSubject: w.a.registry.prefix + kind + ".>", DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}
		err := w.a.reads.readStream(ctx, w.a.registry.stream, cfg, func(m jetstream.Msg, _ *jetstream.MsgMetadata) (bool, error) {
			var e Escalation
			if json.Unmarshal(m.Data(), &e) == nil && e.Agent != "" {
				found[outageID{e.Agent, e.OfflineSince.UnixNano()}] = e
			}
			return false, nil
		})
		return found, err
	}
	escalated, err := read("escalated")
	if err != nil {
		return err
	}
	recovered, err := read("recovered")
	if err != nil {
		return err
	}
	for id, e := range escalated {
		if _, ok := recovered[id]; ok {
			continue
		}
		p, ok := w.policyFor(ctx, e.Agent)
		if !ok {
			continue
		}
		done := make(chan struct{})
		close(done) // escalated: no timer, nothing left to fire
		w.mu.Lock()
		if prev := w.outages[e.Agent]; prev == nil || prev.since.Before(e.OfflineSince) {
			w.outages[e.Agent] = &outage{since: e.OfflineSince, reason: e.Reason, policy: p, done: done}
		}
		w.mu.Unlock()
	}
	return nil
}

// escalateRetry bounds the wait before an escalation that failed (the
// registry or the stream out of reach: a dropped connection, a server
// restarting) is tried again; the waits double from a second up to it.
const escalateRetry = 30 * time.Second

// arm makes agent's outage o escalate after d, and again after a failure
// while o lasts (attempt counts them); o.done is closed when it is over.
// Called with w.mu held.
func (w *escalations) arm(ctx context.Context, agent string, o *outage, d time.Duration, attempt int) {
	w.timers.Add(1)
	o.timer = time.AfterFunc(d, func() {
		defer w.timers.Done()
		err := w.escalate(ctx, agent, o)
		if err != nil && ctx.Err() == nil {
			w.mu.Lock()
			current := w.outages[agent] == o
			if current {
				w.arm(ctx, agent, o, min(time.Second<<min(attempt, 5), escalateRetry), attempt+1)
			}
			w.mu.Unlock()
			w.a.opts.onError(fmt.Errorf("escalate %s (tried again while the outage lasts: %t): %w", agent, current, err))
			if current {
				return
			}
		}
		close(o.done)
	})
}

// policyFor returns the policy that covers agent, the first that does.
func (w *escalations) policyFor(ctx context.Context, agent string) (EscalationPolicy, bool) {
	var card *AgentCard
	for _, p := range w.policies {
		if p.Agent == agent {
			return p, true
		}
		if p.Tag == "" {
			continue
		}
		if card == nil {
			info, err := w.a.LookupAgent(ctx, agent)
			if err != nil {
				return EscalationPolicy{}, false
			}
			card = &info.Card
		}
		if (AgentQuery{Tag: p.Tag}).matches(AgentInfo{Card: *card}) {
			return p, true
		}
	}
	return EscalationPolicy{}, false
}

// escalate sends the escalation of agent's outage o, if the agent is
// still in it and nobody sent it yet. Its error says it could not tell or
// could not send: the caller tries again.
func (w *escalations) escalate(ctx context.Context, agent string, o *outage) error {
	if ctx.Err() != nil {
		return nil
	}
	p, _, err := w.a.presenceOf(ctx, agent)
	if err != nil {
		return fmt.Errorf("read its presence: %w", err)
	}
	if p.Status != Offline || !p.Since.Equal(o.since) {
		return nil // back, or gone again since: the newer change decides
	}
	e := Escalation{Agent: agent, OfflineSince: o.since, Reason: o.reason, After: Duration(o.policy.After)}
	return w.send(ctx, "escalated", o, e)
}

// recover sends the recovery of agent's outage o if it was escalated,
// trying again after a failure until ctx ends.
func (w *escalations) recover(ctx context.Context, agent string, o *outage, at time.Time) {
	escalated, err := subjects.OutageKey("escalated", agent, o.since.UnixNano())
	if err != nil {
		return
	}
	for attempt := 0; ; attempt++ {
		done, err := w.a.registryHas(ctx, escalated)
		if err == nil && !done {
			return // not escalated: nothing to recover from
		}
		if err == nil {
			e := Escalation{Agent: agent, OfflineSince: o.since, Reason: o.reason, After: Duration(o.policy.After), Recovered: true, RecoveredAt: at}
			if err = w.send(ctx, "recovered", o, e); err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.a.opts.onError(fmt.Errorf("recover %s (tried again): %w", agent, err))
		select {
		case <-time.After(min(time.Second<<min(attempt, 5), escalateRetry)):
		case <-ctx.Done():
			return
		}
	}
}

// send sends the escalation or recovery e (kind "escalated" or
// "recovered") once: the message with an ID of its own, then the outage's
// record. A process that dies in between leaves the record absent; the
// next one to try sends the message again, and the stream drops it as a
// duplicate within its duplicate window. Its error says what failed; the
// same send again is safe.
func (w *escalations) send(ctx context.Context, kind string, o *outage, e Escalation) error {
	key, err := subjects.OutageKey(kind, e.Agent, o.since.UnixNano())
	if err != nil {
		return err
	}
	subject := w.a.registry.prefix + key
	if done, err := w.a.registryHas(ctx, key); err != nil {
		return fmt.Errorf("%s %s: %w", kind, e.Agent, err)
	} else if done {
		return nil // sent already
	}
	e.To = o.policy.To
	e.MessageID = kind + "/" + e.Agent + "/" + strconv.FormatInt(o.since.UnixNano(), 10)
	m, err := escalationMessage(o.policy, e, kind)
	if err != nil { // the policy's Message: no use trying again
		w.a.opts.onError(fmt.Errorf("%s %s: %w", kind, e.Agent, err))
		return nil
	}
	m.ID = e.MessageID
	if err := w.a.publishAs(ctx, m); err != nil {
		return fmt.Errorf("%s %s: %w", kind, e.Agent, err)
	}
	data, _ := json.Marshal(e)
	rec := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}}
	if _, err := publishAgain(ctx, w.a.js, rec); err != nil && !isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence) {
		return fmt.Errorf("%s %s: record: %w", kind, e.Agent, err)
	}
	return nil
}

// registryHas reports whether the registry holds key.
func (c *client) registryHas(ctx context.Context, key string) (bool, error) {
	resp, err := c.getKey(ctx, c.registry, key)
	return resp != nil, err
}

// escalationMessage makes the message of e under policy p.
func escalationMessage(p EscalationPolicy, e Escalation, kind string) (Message, error) {
	var m Message
	if p.Message != nil {
		var err error
		if m, err = p.Message(e); err != nil {
			return Message{}, err
		}
	} else {
		data, err := json.Marshal(e)
		if err != nil {
			return Message{}, err
		}
		m = Message{Type: EventEscalation, ContentType: "application/json", Data: data}
		if kind == "recovered" {
			m.Type = EventRecovery
		}
	}
	m.To = p.To
	if m.From == "" {
		m.From = p.From
	}
	if m.From == "" {
		m.From = operatorSender
	}
	if m.Priority == 0 {
		m.Priority = p.Priority
	}
	if m.Priority == 0 {
		m.Priority = 2
	}
	if m.CorrelationID == "" {
		m.CorrelationID = "outage/" + e.Agent + "/" + strconv.FormatInt(e.OfflineSince.UnixNano(), 10)
	}
	return m, nil
}

// publishAs publishes m, whose From is set, as the admin may: encoded as a
// Bus would, and waited for.
func (a *Admin) publishAs(ctx context.Context, m Message) error {
	m.SetDefaults(time.Now())
	msg, err := a.encode(&m)
	if err != nil {
		return err
	}
	_, err = publishAgain(ctx, a.js, msg)
	return err
}

// stopAll stops the pending escalations and waits for those running.
func (w *escalations) stopAll() {
	w.mu.Lock()
	for _, o := range w.outages {
		if o.stop() {
			w.timers.Done()
		}
	}
	w.outages = map[string]*outage{}
	w.mu.Unlock()
	w.timers.Wait()
}

// PipelineEscalation makes the pipeline protocol's own message for an
// escalation (needs_human, with reason, type "agent_offline" and the
// agent) or a recovery (info): pass it as EscalationPolicy.Message where
// the pipeline protocol is spoken. Its sender is "pipeline", the
// document's broker.
func PipelineEscalation(e Escalation) (Message, error) {
	subject, body := "needs_human", map[string]any{
		"reason": fmt.Sprintf("%s offline since %s (%s)", e.Agent, e.OfflineSince.UTC().Format(time.RFC3339), e.Reason),
		"type":   "agent_offline", "fromState": "offline",
	}
	if e.Recovered {
		subject, body = "info", map[string]any{"message": fmt.Sprintf("%s is back since %s", e.Agent, e.RecoveredAt.UTC().Format(time.RFC3339))}
	}
	native, err := json.Marshal(map[string]any{
		"id": e.MessageID, "from": "pipeline", "to": e.To, "subject": subject, "body": body,
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "replyTo": nil, "status": "pending",
	})
	if err != nil {
		return Message{}, err
	}
	m, err := profiles.Prepare(profiles.Pipeline{}, native, profiles.Addressing{})
	if err != nil {
		return Message{}, err
	}
	return *m, nil
}
