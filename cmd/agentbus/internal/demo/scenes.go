package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// priority: with no worker online, the orchestrator queues three work
// items at priorities 4, 4 and 5, then an ESCALATION_REQUEST, priority 1.
// When worker#1 comes online it handles the escalation first, then the
// rest by priority, in publish order within a priority.
func (d *demo) priority(ctx context.Context) (string, error) {
	for _, item := range []pipelineMessage{
		develop("dev-101", worker, "JOP-101", 4, 1, 3),
		develop("dev-102", worker, "JOP-102", 4, 2, 3),
		develop("dev-103", worker, "JOP-103", 5, 3, 3),
	} {
		_, m, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, item, 0)
		if err != nil {
			return "", err
		}
		d.expect(m.ID, bus.StateCompleted, 1)
		d.emit(messageEvent(m, EventQueued, "pipeline work item queued; no worker is online"))
	}
	_, m, err := d.orch.send(ctx, profiles.BaseMessage{}, baseMessage{
		MessageID: "esc-1", CorrelationID: Conversation, Timestamp: now(),
		From: orchestrator, To: worker, Type: "ESCALATION_REQUEST", Version: "1.0",
		Payload: escalationRequest{
			TaskID: "JOP-100", EscalationType: "HUMAN", Reason: "main does not build; fix it before anything else",
			FailureHistory: []failureAttempt{{Agent: "ci", Attempts: 3, LastError: "go build: undefined: config.Load"}},
			Context:        map[string]any{"branch": "main"},
		},
	})
	if err != nil {
		return "", err
	}
	d.expect(m.ID, bus.StateCompleted, 1)
	d.emit(messageEvent(m, EventQueued, "basemessage escalation queued last"))

	if _, err := d.startWorker(ctx, 1); err != nil {
		return "", err
	}
	want := []string{"esc-1", "dev-101", "dev-102", "dev-103"}
	var got []string
	for i := range want {
		o, err := d.next(ctx, "work at worker#1")
		if err != nil {
			return "", err
		}
		got = append(got, o.d.ID)
		if o.err != nil {
			return "", fmt.Errorf("%s failed %s: %w", o.by.label, o.d.ID, o.err)
		}
		d.emit(messageEvent(&o.d.Message, EventHandled, fmt.Sprintf("handled %s by %s", ordinal(i+1), o.by.label)))
	}
	if !slices.Equal(got, want) {
		return "", fmt.Errorf("handled %v, want %v", got, want)
	}
	return "the p1 escalation, queued last, was handled first; then p4, p4, p5 in publish order", nil
}

// crash: worker#1 takes a work item and its process dies before it acks
// (its connection closes). worker#2, another process of agent worker,
// comes online; after the ack wait the server gives it the message, as
// delivery 2.
func (d *demo) crash(ctx context.Context) (string, error) {
	w1 := d.workers[0]
	w1.stall.Store(true)
	_, m, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, develop("dev-104", worker, "JOP-104", 3, 1, 1), 0)
	if err != nil {
		return "", err
	}
	d.expect(m.ID, bus.StateCompleted, 2)
	d.emit(messageEvent(m, EventPublished, "pipeline work item published"))

	o, err := d.next(ctx, "dev-104 at worker#1")
	if err != nil {
		return "", err
	}
	if o.by != w1 || o.d.ID != m.ID || !errors.Is(o.err, errStalled) {
		return "", unexpected(o, "dev-104 taken by worker#1")
	}
	d.emit(messageEvent(&o.d.Message, EventTaken, fmt.Sprintf("taken by %s (delivery %d)", w1.label, o.d.Deliveries)))
	w1.crash()
	d.emit(Event{From: w1.label, Event: EventCrashed,
		Detail: fmt.Sprintf("%s crashes: its connection closes before it acks dev-104 or gives it back", w1.label)})

	w2, err := d.startWorker(ctx, 2)
	if err != nil {
		return "", err
	}
	o, err = d.next(ctx, "dev-104 redelivered to worker#2")
	if err != nil {
		return "", err
	}
	if o.by != w2 || o.d.ID != m.ID || o.err != nil || o.d.Deliveries != 2 {
		return "", unexpected(o, "dev-104 handled by worker#2 on delivery 2")
	}
	d.emit(messageEvent(&o.d.Message, EventRedelivered, fmt.Sprintf("redelivered after the %s ack wait to %s (delivery %d), handled",
		ackWait, w2.label, o.d.Deliveries)))
	return fmt.Sprintf("dev-104, abandoned by the crashed %s, was handled by %s on delivery 2", w1.label, w2.label), nil
}

// duplicate: the orchestrator publishes a work item, then publishes it
// again with the same ID, as a retry after a lost ack does. The server
// stores it once and the worker handles it once.
func (d *demo) duplicate(ctx context.Context) (string, error) {
	m, err := prepare(profiles.Pipeline{}, develop("dev-105", worker, "JOP-105", 3, 1, 1))
	if err != nil {
		return "", err
	}
	first, err := d.orch.bus.Publish(ctx, *m)
	if err != nil {
		return "", err
	}
	d.expect(m.ID, bus.StateCompleted, 1)
	d.emit(messageEvent(m, EventPublished, fmt.Sprintf("pipeline work item published, stored at stream sequence %d", first.Sequence)))
	again, err := d.orch.bus.Publish(ctx, *m)
	if err != nil {
		return "", err
	}
	if !again.Duplicate || again.Sequence != first.Sequence {
		return "", fmt.Errorf("second publish of %s: duplicate %t at sequence %d, want a duplicate of sequence %d",
			m.ID, again.Duplicate, again.Sequence, first.Sequence)
	}
	d.emit(messageEvent(m, EventDuplicate, fmt.Sprintf("published again with the same ID (a retry): the server reports a duplicate of sequence %d and drops it", again.Sequence)))

	o, err := d.next(ctx, "dev-105 at the worker")
	if err != nil {
		return "", err
	}
	if o.d.ID != m.ID || o.err != nil || o.d.Deliveries != 1 {
		return "", unexpected(o, "dev-105 handled on delivery 1")
	}
	d.emit(messageEvent(&o.d.Message, EventHandled, "handled once, by "+o.by.label))
	return "the second publish was reported Duplicate, and the worker handled dev-105 once", nil
}

// ttl: the orchestrator asks the reviewer, who is offline, for a review
// that is only worth doing within a second. The second passes; the message
// expires, and its lifecycle record says so.
func (d *demo) ttl(ctx context.Context) (string, error) {
	const ttl = time.Second
	_, m, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, pipelineMessage{
		ID: "pr-7", From: orchestrator, To: reviewer, Subject: "review_pr", Priority: 2,
		Body:      map[string]any{"prUrl": "https://git.example.com/acme/app/pull/7", "phase": 2, "issues": []string{"JOP-104", "JOP-105"}, "repo": "acme/app"},
		Timestamp: now(), Status: "pending",
	}, ttl)
	if err != nil {
		return "", err
	}
	d.expect(m.ID, bus.StateExpired, 0)
	d.emit(messageEvent(m, EventQueued, fmt.Sprintf("pipeline review request queued with a TTL of %s; the reviewer is offline", ttl)))

	// Waiting out the TTL is the point of the scene.
	t := time.NewTimer(time.Until(m.ExpiresAt()))
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return "", ctx.Err()
	}
	// The server removes the message when its TTL passes, without a trace;
	// the sender's lookup finds its record still pending past the expiry
	// and records it expired.
	st, err := awaitState(ctx, d.orch.bus, m.ID, reviewer, bus.StateExpired)
	if err != nil {
		return "", err
	}
	d.emit(messageEvent(m, EventExpired, fmt.Sprintf("expired unread: lifecycle record %s (%s)", st.State, st.Reason)))
	return "pr-7 expired before the reviewer came online; its record reads expired", nil
}

// request: the reviewer comes online. The orchestrator sends it a
// basemessage VALIDATION_REQUEST with Request, which waits for the reply;
// the reviewer's handler answers with Reply. The reviewer never sees the
// expired pr-7, although at priority 2 it would have come first.
func (d *demo) request(ctx context.Context) (string, error) {
	if err := d.startReviewer(ctx); err != nil {
		return "", err
	}
	m, err := prepare(profiles.BaseMessage{}, baseMessage{
		MessageID: "val-1", CorrelationID: Conversation, Timestamp: now(),
		From: orchestrator, To: reviewer, Type: "VALIDATION_REQUEST", Version: "1.0",
		Payload: validationRequest{TaskID: "JOP-104", ValidationType: "QUALITY", Subject: "config loading",
			Details: map[string]any{"files": []string{"config/load.go"}, "changes": "fix the build of main"}},
	})
	if err != nil {
		return "", err
	}
	d.expect(m.ID, bus.StateReplied, 1)
	d.expect(m.ID+"-reply", bus.StateCompleted, 0)

	type result struct {
		reply *bus.Delivery
		err   error
		took  time.Duration
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	done := make(chan result, 1)
	d.emit(messageEvent(m, EventRequest, "basemessage request sent; the orchestrator waits for the reply"))
	sent := time.Now()
	wg.Go(func() {
		reply, err := d.orch.bus.Request(rctx, *m)
		done <- result{reply, err, time.Since(sent)}
	})

	o, err := d.next(ctx, "val-1 at the reviewer")
	if err != nil {
		return "", err
	}
	if o.by != d.reviewer || o.d.ID != m.ID || o.err != nil {
		return "", unexpected(o, "val-1 answered by the reviewer; pr-7 expired and must not arrive")
	}
	d.emit(messageEvent(&o.d.Message, EventHandled, "handled by the reviewer, its first message: the expired pr-7 never arrived"))

	r := <-done
	if r.err != nil {
		return "", r.err
	}
	if r.reply.CausationID != m.ID || r.reply.CorrelationID != Conversation || r.reply.Type != "VALIDATION_RESPONSE" {
		return "", fmt.Errorf("reply %s %s replying to %q in %q, want a VALIDATION_RESPONSE to %s in %s",
			r.reply.ID, r.reply.Type, r.reply.CausationID, r.reply.CorrelationID, m.ID, Conversation)
	}
	d.emit(messageEvent(&r.reply.Message, EventReply,
		fmt.Sprintf("basemessage reply reaches the waiting Request %s after it was sent", r.took.Round(time.Millisecond))))

	st, err := awaitState(ctx, d.orch.bus, m.ID, reviewer, bus.StateReplied)
	if err != nil {
		return "", err
	}
	d.emit(messageEvent(m, EventReplied, fmt.Sprintf("lifecycle record %s, reply %s", st.State, st.ReplyID)))
	return fmt.Sprintf("Request returned the reply %s in %s; the request's record reads replied", r.reply.ID, r.took.Round(time.Millisecond)), nil
}

// poison: a work item the worker fails on every time. It is retried after
// the backoff, and after its last allowed delivery it goes to the
// dead-letter stream with the reason. The item queued behind it is handled
// meanwhile.
func (d *demo) poison(ctx context.Context) (string, error) {
	var poison *bus.Message
	for i, item := range []pipelineMessage{
		develop("dev-666", worker, poisonIssue, 3, 1, 2),
		develop("dev-106", worker, "JOP-106", 3, 2, 2),
	} {
		_, m, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, item, 0)
		if err != nil {
			return "", err
		}
		if i == 0 {
			poison = m
			d.expect(m.ID, bus.StateDeadLettered, maxDeliver)
		} else {
			d.expect(m.ID, bus.StateCompleted, 1)
		}
		d.emit(messageEvent(m, EventPublished, "pipeline work item published"))
	}

	failures, flowed := 0, false
	for failures < maxDeliver || !flowed {
		o, err := d.next(ctx, "work at the worker")
		if err != nil {
			return "", err
		}
		switch {
		case o.d.ID == poison.ID && o.err != nil:
			failures++
			detail := fmt.Sprintf("failed on delivery %d of %d (%v); retried after %s", o.d.Deliveries, maxDeliver, o.err, retryDelay)
			if o.d.Deliveries >= maxDeliver {
				detail = fmt.Sprintf("failed on delivery %d of %d (%v): it goes to the dead-letter stream", o.d.Deliveries, maxDeliver, o.err)
			}
			d.emit(messageEvent(&o.d.Message, EventFailed, detail))
		case o.d.ID == "dev-106" && o.err == nil:
			flowed = true
			detail := "handled by " + o.by.label
			if failures > 0 && failures < maxDeliver {
				detail += " while dev-666 waits for its retry: the poison blocks nothing"
			}
			d.emit(messageEvent(&o.d.Message, EventHandled, detail))
		default:
			return "", unexpected(o, "dev-666 failing or dev-106 handled")
		}
	}

	// The operator reads the dead-letter stream.
	var dl bus.DeadLetter
	err := reread(ctx, "dead letter of dev-666", func(ctx context.Context) (bool, string, error) {
		dls, err := d.operator.DeadLetters(ctx, bus.DeadLetterFilter{Agent: worker})
		if err != nil {
			return false, "", err
		}
		for _, x := range dls {
			if x.Message != nil && x.Message.ID == poison.ID {
				dl = x
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d other dead letters", len(dls)), nil
	})
	if err != nil {
		return "", err
	}
	if dl.Reason != bus.ReasonMaxDeliveries || dl.Deliveries != maxDeliver {
		return "", fmt.Errorf("dead letter of %s: reason %s after %d deliveries, want %s after %d",
			poison.ID, dl.Reason, dl.Deliveries, bus.ReasonMaxDeliveries, maxDeliver)
	}
	d.emit(messageEvent(poison, EventDeadLettered, fmt.Sprintf("on the dead-letter stream at sequence %d: reason %s, %d deliveries, error %q",
		dl.Sequence, dl.Reason, dl.Deliveries, dl.Error)))
	return fmt.Sprintf("dev-666 was dead-lettered (%s) after %d deliveries; dev-106 behind it was handled", dl.Reason, dl.Deliveries), nil
}

// trace: every message of the demo but the review round's carries one
// correlation ID, so they form one conversation and one OpenTelemetry
// trace. The operator reads the conversation's lifecycle records, every
// message in the order it was created with where it ended.
func (d *demo) trace(ctx context.Context) (string, error) {
	traceID := bus.ConversationTraceID(Conversation)
	d.emit(Event{From: operator, Event: EventTrace,
		Detail: fmt.Sprintf("conversation %s is trace %s (bus.ConversationTraceID)", Conversation, traceID)})

	var records []bus.Status
	err := reread(ctx, "conversation "+Conversation, func(ctx context.Context) (bool, string, error) {
		sts, err := d.operator.Conversation(ctx, Conversation)
		if err != nil {
			return false, "", err
		}
		records = sts
		return settled(sts, d.expected), describe(sts), nil
	})
	if err != nil {
		return "", err
	}
	var wrong []string
	for _, st := range records {
		d.emit(Event{From: st.From, To: st.To, Type: st.Type, Priority: st.Priority, ID: st.ID,
			Event: EventRecord, Detail: recordDetail(st)})
		want, ok := d.expected[st.ID]
		switch {
		case !ok:
			wrong = append(wrong, st.ID+" is not one of the demo's messages")
		case st.State != want.state:
			wrong = append(wrong, fmt.Sprintf("%s is %s, want %s", st.ID, st.State, want.state))
		case want.deliveries > 0 && st.Deliveries != want.deliveries:
			wrong = append(wrong, fmt.Sprintf("%s took %d deliveries, want %d", st.ID, st.Deliveries, want.deliveries))
		}
	}
	if len(records) != len(d.expected) {
		wrong = append(wrong, fmt.Sprintf("%d records, want %d", len(records), len(d.expected)))
	}
	if len(wrong) > 0 {
		return "", errors.New(strings.Join(wrong, "; "))
	}
	own := 0 // progress updates and cancel notices
	for _, st := range records {
		if strings.HasPrefix(st.Type, "agentbus.") {
			own++
		}
	}
	return fmt.Sprintf("%d messages of two protocols and %d of the bus's own (progress updates, cancel notices), one conversation, trace %s",
		len(records)-own, own, traceID), nil
}

// settled reports whether every expected message has a record in a final
// state, or in the state expected of it.
func settled(sts []bus.Status, expected map[string]expectation) bool {
	done := 0
	for _, st := range sts {
		if want, ok := expected[st.ID]; ok && (st.State.Final() || st.State == want.state) {
			done++
		}
	}
	return done == len(expected)
}

// describe lists the records' states, for an error.
func describe(sts []bus.Status) string {
	parts := make([]string, len(sts))
	for i, st := range sts {
		parts[i] = st.ID + "=" + string(st.State)
	}
	return strings.Join(parts, " ")
}

// recordDetail says where a message ended.
func recordDetail(st bus.Status) string {
	s := string(st.State)
	switch {
	case st.State == bus.StateReplied:
		s += ", reply " + st.ReplyID
	case st.State == bus.StateDeadLettered:
		reason, _, _ := strings.Cut(st.Reason, ":")
		s += " (" + reason + ")"
	}
	if st.Deliveries > 1 {
		s += fmt.Sprintf(" after %d deliveries", st.Deliveries)
	}
	return s
}

// unexpected is the error for a handler doing something else than the
// scene waits for.
func unexpected(o observation, want string) error {
	outcome := "handled"
	if o.err != nil {
		outcome = o.err.Error()
	}
	return fmt.Errorf("%s got %s (delivery %d, %s), want %s", o.by.label, o.d.ID, o.d.Deliveries, outcome, want)
}

// ordinal returns "1st", "2nd", "3rd", "4th" ...
func ordinal(n int) string {
	switch n {
	case 1:
		return "1st"
	case 2:
		return "2nd"
	case 3:
		return "3rd"
	}
	return fmt.Sprintf("%dth", n)
}

// presence: the worker processes so far leave, and worker#3 comes online
// registered: its card, and a heartbeat every second (10 s by default).
// It is killed. Nobody watches for it, yet the registry finds the agent
// offline three heartbeats later: the server removed its presence record.
// A request to it fails at once. Work for it queues. The operator's
// escalation policy calls the human once the outage has lasted a second
// (the pipeline protocol's 3 minutes), with the protocol's needs_human.
// worker#4 comes back, drains the queue by priority, and the human is told
// it recovered.
func (d *demo) presence(ctx context.Context) (string, error) {
	for _, w := range d.workers {
		if !w.crashed.Load() {
			w.bus.Close() // stops its subscription
		}
	}
	h, err := d.connect(human, human)
	if err != nil {
		return "", err
	}
	d.human = h
	inbox := make(chan *bus.Delivery, 4)
	if h.sub, err = h.bus.Subscribe(ctx, func(_ context.Context, dl *bus.Delivery) error {
		inbox <- dl
		return nil
	}); err != nil {
		return "", err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() {
		err := d.operator.WatchEscalations(watchCtx, []bus.EscalationPolicy{
			{Agent: worker, After: escalateAfter, To: human, Message: bus.PipelineEscalation},
		})
		if err != nil {
			d.onError(operator, nil)(err)
		}
	})
	defer func() { stopWatch(); watching.Wait() }()
	d.emit(Event{From: operator, Event: EventStart,
		Detail: fmt.Sprintf("operator's escalation policy: worker offline for %s calls %s with the pipeline's needs_human", escalateAfter, human)})

	w3, err := d.startRegisteredWorker(ctx, 3)
	if err != nil {
		return "", err
	}
	w3.crash()
	crashed := time.Now()
	d.emit(Event{From: w3.label, Event: EventCrashed, Detail: fmt.Sprintf("%s is killed: its heartbeats (every %s) stop", w3.label, heartbeat)})

	var gone bus.AgentInfo
	if err := reread(ctx, "worker offline", func(ctx context.Context) (bool, string, error) {
		a, err := d.operator.LookupAgent(ctx, worker)
		gone = a
		return err == nil && a.Presence.Status == bus.Offline, string(a.Presence.Status), err
	}); err != nil {
		return "", err
	}
	d.emit(Event{From: worker, Event: EventOffline, Detail: fmt.Sprintf("the registry finds %s offline (%s) %s after the kill, three missed heartbeats: the server removed its presence record, no process watched for it",
		worker, gone.Presence.Reason, time.Since(crashed).Round(100*time.Millisecond))})

	asked := time.Now()
	_, err = d.orch.bus.Request(ctx, bus.Message{To: worker, Type: "STATUS_CHECK", CorrelationID: Conversation})
	if !errors.Is(err, bus.ErrAgentOffline) {
		return "", fmt.Errorf("request to the offline worker: %v, want ErrAgentOffline", err)
	}
	d.emit(Event{From: orchestrator, To: worker, Type: "STATUS_CHECK", Event: EventRequest,
		Detail: fmt.Sprintf("a request to %s fails in %s: %v", worker, time.Since(asked).Round(time.Millisecond), err)})

	for _, item := range []pipelineMessage{
		develop("dev-201", worker, "JOP-201", 4, 1, 2),
		develop("dev-202", worker, "JOP-202", 2, 2, 2),
	} {
		_, m, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, item, 0)
		if err != nil {
			return "", err
		}
		d.expect(m.ID, bus.StateCompleted, 1)
		d.emit(messageEvent(m, EventQueued, "pipeline work item queued for the offline worker"))
	}

	call, err := receive(ctx, inbox, "the escalation")
	if err != nil {
		return "", err
	}
	if call.Type != "needs_human" || call.From != "pipeline" {
		return "", fmt.Errorf("the human got %s from %s, want the pipeline's needs_human", call.Type, call.From)
	}
	d.emit(messageEvent(&call.Message, EventEscalated, fmt.Sprintf("%s's inbox gets the pipeline's needs_human %s after the kill, once", human, time.Since(crashed).Round(100*time.Millisecond))))

	w4, err := d.startRegisteredWorker(ctx, 4)
	if err != nil {
		return "", err
	}
	want := []string{"dev-202", "dev-201"}
	for i, id := range want {
		o, err := d.next(ctx, "the queued work at "+w4.label)
		if err != nil {
			return "", err
		}
		if o.by != w4 || o.d.ID != id || o.err != nil {
			return "", unexpected(o, id+" handled by "+w4.label)
		}
		d.emit(messageEvent(&o.d.Message, EventHandled, fmt.Sprintf("handled %s by %s", ordinal(i+1), w4.label)))
	}
	back, err := receive(ctx, inbox, "the recovery")
	if err != nil {
		return "", err
	}
	if back.Type != "info" {
		return "", fmt.Errorf("the human got %s, want the pipeline's info", back.Type)
	}
	d.emit(messageEvent(&back.Message, EventRecovered, fmt.Sprintf("%s's inbox is told the worker is back", human)))
	return "the killed worker was found offline with nobody watching, a request to it failed at once, the human was called once, and the worker drained p2 then p4 on return", nil
}

// receive waits for the next delivery of inbox.
func receive(ctx context.Context, inbox <-chan *bus.Delivery, what string) (*bus.Delivery, error) {
	t := time.NewTimer(waitTimeout)
	defer t.Stop()
	select {
	case dl := <-inbox:
		return dl, nil
	case <-t.C:
		return nil, fmt.Errorf("no %s within %s", what, waitTimeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

// tasks: long work between agents (docs/tasks.md). The orchestrator asks
// the reviewer for a review, pr-8, with Request and OnProgress: the
// reviewer reports each step as it starts it (Delivery.Progress), and the
// orchestrator shows each update as it arrives. While the tests run, a
// newer commit makes the review moot and the orchestrator cancels it
// (Bus.Cancel): its Request returns a *bus.CanceledError, the reviewer's
// handler sees its context end with bus.ErrCanceled, and the record reads
// canceled. Then the reviewer goes offline, and the orchestrator asks for
// another review, pr-9, to be done within a second (DoBy). The second
// passes: the Request returns a *bus.DeadlineError, the record reads
// expired, and when the reviewer comes back the request is gone: its first
// message is the one queued behind it.
func (d *demo) tasks(ctx context.Context) (string, error) {
	updates, err := d.canceledReview(ctx)
	if err != nil {
		return "", err
	}
	if err := d.missedDoBy(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("pr-8 streamed %d progress updates and was canceled mid-task: its Request returned *CanceledError, its handler's context bus.ErrCanceled, its record reads canceled; "+
		"pr-9's do-by passed while the reviewer was offline: its Request returned *DeadlineError, its record reads expired, and the reviewer never got it", updates), nil
}

// canceledReview is the first half of the tasks scene: pr-8 reports
// progress and is canceled while its tests run. It returns how many
// updates the orchestrator got.
func (d *demo) canceledReview(ctx context.Context) (int, error) {
	m, err := prepare(profiles.Pipeline{}, reviewRequest("pr-8", 8, 3, "JOP-201", "JOP-202"))
	if err != nil {
		return 0, err
	}
	d.expect(m.ID, bus.StateCanceled, 1)

	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	// OnProgress runs on Request's goroutine; the scene shows the updates
	// from its own, so that they and what the scene does in between are
	// reported in order.
	updates := make(chan *bus.Delivery, len(reviewSteps))
	done := make(chan error, 1)
	d.emit(messageEvent(m, EventRequest, "pipeline review request sent with Request and OnProgress: the orchestrator follows the review as it goes"))
	wg.Go(func() {
		_, err := d.orch.bus.Request(rctx, *m, bus.OnProgress(func(u *bus.Delivery) {
			select {
			case updates <- u:
			case <-rctx.Done():
			}
		}))
		done <- err
	})

	var got []int
	show := func(u *bus.Delivery) (int, error) {
		p, n, ok := u.ProgressUpdate()
		if !ok || u.CausationID != m.ID {
			return 0, fmt.Errorf("%s %s from %s is not a progress update on %s", u.Type, u.ID, u.From, m.ID)
		}
		got = append(got, n)
		d.expect(u.ID, bus.StateCompleted, 0)
		what := p.Message
		if p.Percent != nil {
			what = fmt.Sprintf("%d%% %s", *p.Percent, p.Message)
		}
		// The update's ID is a UUID the bus makes; the request's says which
		// work it is about.
		d.emit(Event{From: u.From, To: u.To, Type: u.Type, Priority: u.Priority, Event: EventProgress,
			Detail: fmt.Sprintf("update %d on %s: %s", n, m.ID, what)})
		return n, nil
	}
	t := time.NewTimer(waitTimeout)
	defer t.Stop()
	var reqErr error
wait:
	for {
		select {
		case u := <-updates:
			n, err := show(u)
			if err != nil {
				return 0, err
			}
			if n != testsStep {
				continue
			}
			st, err := d.orch.bus.Cancel(ctx, m.ID)
			if err != nil {
				return 0, fmt.Errorf("cancel %s: %w", m.ID, err)
			}
			d.emit(messageEvent(m, EventCancel, fmt.Sprintf("a newer commit makes the review moot: the orchestrator cancels it while the tests run (Bus.Cancel); record %s by %s",
				st.State, st.By)))
		case reqErr = <-done:
			for len(updates) > 0 { // taken before the Request returned
				if _, err := show(<-updates); err != nil {
					return 0, err
				}
			}
			break wait
		case <-t.C:
			return 0, fmt.Errorf("the Request of %s did not end within %s", m.ID, waitTimeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if want := []int{1, 2, 3}; !slices.Equal(got, want) {
		return 0, fmt.Errorf("progress updates %v on %s, want %v", got, m.ID, want)
	}
	var ce *bus.CanceledError
	if !errors.As(reqErr, &ce) || ce.By != orchestrator {
		return 0, fmt.Errorf("the Request of %s returned %v, want a *bus.CanceledError by %s", m.ID, reqErr, orchestrator)
	}
	d.emit(messageEvent(m, EventCanceled, fmt.Sprintf("the orchestrator's Request returns at once: *bus.CanceledError %q", reqErr)))

	o, err := d.next(ctx, m.ID+" at the reviewer")
	if err != nil {
		return 0, err
	}
	if o.by != d.reviewer || o.d.ID != m.ID || !errors.Is(o.err, bus.ErrCanceled) {
		return 0, unexpected(o, m.ID+" stopped by its cancel")
	}
	d.emit(messageEvent(&o.d.Message, EventCanceled, fmt.Sprintf("the reviewer stops %q: a priority-1 cancel notice ended its handler's context, whose cause is bus.ErrCanceled",
		reviewSteps[testsStep-1].what)))

	st, err := awaitState(ctx, d.orch.bus, m.ID, reviewer, bus.StateCanceled)
	if err != nil {
		return 0, err
	}
	d.emit(messageEvent(m, EventCanceled, fmt.Sprintf("lifecycle record %s; it is not delivered again", st.State)))

	// The cancel notices (bus.TypeCancel) are messages of the conversation
	// too, with IDs the bus makes: one to the reviewer, which is to have
	// taken it before it goes offline, or it would wait for its return;
	// and one to the orchestrator, for a Request of another of its
	// processes, which waits unread in its inbox until the request's
	// reply-by: the orchestrator takes no inbox.
	notices := map[string]bus.Status{} // by recipient
	err = reread(ctx, "cancel notices of "+m.ID, func(ctx context.Context) (bool, string, error) {
		sts, err := d.operator.Conversation(ctx, Conversation)
		for _, st := range sts {
			if st.Type == bus.TypeCancel && st.CausationID == m.ID {
				notices[st.To] = st
			}
		}
		return len(notices) == 2, fmt.Sprintf("notices to %d agents", len(notices)), err
	})
	if err != nil {
		return 0, err
	}
	for to, notice := range notices {
		state, deliveries := bus.StateCompleted, 1
		if to == orchestrator {
			state, deliveries = bus.StatePending, 0
		}
		d.expect(notice.ID, state, deliveries)
		if _, err := awaitState(ctx, d.orch.bus, notice.ID, to, state); err != nil {
			return 0, err
		}
	}
	return len(got), nil
}

// missedDoBy is the second half of the tasks scene: the reviewer is
// offline past pr-9's do-by.
func (d *demo) missedDoBy(ctx context.Context) error {
	if err := d.reviewer.bus.Close(); err != nil {
		return err
	}
	d.emit(Event{From: reviewer, Event: EventOffline, Detail: "the reviewer goes offline: its process stops; its durable consumers keep its queue"})

	const within = time.Second
	m, err := prepare(profiles.Pipeline{}, reviewRequest("pr-9", 9, 2, "JOP-203"))
	if err != nil {
		return err
	}
	d.expect(m.ID, bus.StateExpired, 0)
	rctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	sent := time.Now()
	d.emit(messageEvent(m, EventRequest, fmt.Sprintf("pipeline review request sent with Request and a do-by %s away (DoBy); the reviewer is offline", within)))
	_, err = d.orch.bus.Request(rctx, *m, bus.DoBy(sent.Add(within)))
	var de *bus.DeadlineError
	if !errors.As(err, &de) || de.Kind != "do-by" {
		return fmt.Errorf("the Request of %s returned %v, want a do-by *bus.DeadlineError", m.ID, err)
	}
	d.emit(messageEvent(m, EventDeadline, fmt.Sprintf("the orchestrator's Request returns *bus.DeadlineError, kind %s, %s after it was sent",
		de.Kind, time.Since(sent).Round(100*time.Millisecond))))
	// The request expired with its do-by: it stays queued, for the reviewer
	// to drop unread, and the sender's lookup finds it pending past its
	// expiry.
	st, err := awaitState(ctx, d.orch.bus, m.ID, reviewer, bus.StateExpired)
	if err != nil {
		return err
	}
	d.emit(messageEvent(m, EventExpired, fmt.Sprintf("expired unread: lifecycle record %s", st.State)))

	_, info, err := d.orch.sendInConversation(ctx, profiles.Pipeline{}, pipelineMessage{
		ID: "info-1", From: orchestrator, To: reviewer, Subject: "info",
		Body:      map[string]any{"message": "pr-9 missed its do-by; it moves to the next phase"},
		Timestamp: now(), Status: "pending",
	}, 0)
	if err != nil {
		return err
	}
	d.expect(info.ID, bus.StateCompleted, 1)
	d.emit(messageEvent(info, EventQueued, "pipeline info queued for the offline reviewer"))

	if err := d.startReviewer(ctx); err != nil {
		return err
	}
	o, err := d.next(ctx, info.ID+" at the reviewer")
	if err != nil {
		return err
	}
	if o.by != d.reviewer || o.d.ID != info.ID || o.err != nil {
		return unexpected(o, info.ID+" handled by the reviewer; "+m.ID+" expired and must not arrive")
	}
	d.emit(messageEvent(&o.d.Message, EventHandled, fmt.Sprintf("handled by the reviewer, its first message since it came back: the expired %s, at p%d, never arrived",
		m.ID, m.Priority)))
	return nil
}

// reviewRequest is the pipeline's review_pr for pull request pr, at the
// given priority.
func reviewRequest(id string, pr, priority int, issues ...string) pipelineMessage {
	return pipelineMessage{
		ID: id, From: orchestrator, To: reviewer, Subject: "review_pr", Priority: priority,
		Body: map[string]any{"prUrl": fmt.Sprintf("https://git.example.com/acme/app/pull/%d", pr), "phase": 2,
			"issues": issues, "repo": "acme/app"},
		Timestamp: now(), Status: "pending",
	}
}
