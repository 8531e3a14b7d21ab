package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// poisonIssue is the work item no worker can do.
const poisonIssue = "JOP-666"

// startWorker starts process n (1 or 2) of agent worker: it connects and
// subscribes to the agent's inbox. Both processes subscribe with the same
// settings; they share the agent's durable consumers, so they split the
// work, and a message one of them abandons goes to the other.
func (d *demo) startWorker(ctx context.Context, n int) (*agent, error) {
	return d.launchWorker(ctx, n, false)
}

// startRegisteredWorker is startWorker for a process that first registers
// the agent's card and reports its presence, every heartbeat.
func (d *demo) startRegisteredWorker(ctx context.Context, n int) (*agent, error) {
	return d.launchWorker(ctx, n, true)
}

func (d *demo) launchWorker(ctx context.Context, n int, register bool) (*agent, error) {
	var opts []bus.Option
	if register {
		opts = append(opts, bus.WithHeartbeat(heartbeat))
	}
	w, err := d.connect(worker, fmt.Sprintf("%s#%d", worker, n), opts...)
	if err != nil {
		return nil, err
	}
	d.workers = append(d.workers, w)
	if register {
		card := bus.AgentCard{Description: "develops pipeline issues", Profiles: []string{"pipeline", "basemessage"},
			Skills: []bus.Skill{{ID: "develop", Tags: []string{"go"}}}, Accepts: []string{"develop", "ESCALATION_REQUEST"}}
		if err := w.bus.Register(ctx, card); err != nil {
			return nil, err
		}
	}
	w.sub, err = w.bus.Subscribe(ctx, d.workerHandler(w),
		bus.WithAckWait(ackWait),
		bus.WithMaxDeliver(maxDeliver),
		bus.WithBackoff(func(int) time.Duration { return retryDelay }),
	)
	if err != nil {
		return nil, err
	}
	d.emit(Event{From: w.label, Event: EventOnline,
		Detail: fmt.Sprintf("%s comes online: a process of agent %s subscribes to its inbox", w.label, worker)})
	return w, nil
}

// workerHandler is the worker's handler: it does the work of a pipeline
// "develop" item or an escalation, and tells the demo what it did.
// Returning nil acks the message; an error has it redelivered after the
// backoff, until its last allowed delivery, when it is dead-lettered.
func (d *demo) workerHandler(w *agent) bus.Handler {
	return func(ctx context.Context, dl *bus.Delivery) error {
		if w.stall.Load() {
			// The crash scene: this process hangs on the message until it is
			// killed, and never acks it.
			d.observe(ctx, w, dl, errStalled)
			<-ctx.Done()
			return ctx.Err()
		}
		err := work(dl)
		d.observe(ctx, w, dl, err)
		return err
	}
}

// work does a worker's job: it reads the native message, which the bus
// hands over byte for byte, and fails on the one issue that cannot be
// built, every time.
func work(dl *bus.Delivery) error {
	switch dl.Type {
	case "develop":
		var item pipelineMessage
		if err := json.Unmarshal(dl.Data, &item); err != nil {
			return bus.Permanent(fmt.Errorf("read work item: %w", err))
		}
		if issue, _ := item.Body["issue"].(string); issue == poisonIssue {
			return fmt.Errorf("check out %s: branch not found", issue)
		}
	case "ESCALATION_REQUEST":
		// Drop everything and fix it.
	}
	return nil
}

// startReviewer starts the reviewer: it connects and subscribes.
func (d *demo) startReviewer(ctx context.Context) error {
	r, err := d.connect(reviewer, reviewer)
	if err != nil {
		return err
	}
	d.reviewer = r
	if r.sub, err = r.bus.Subscribe(ctx, d.reviewerHandler(ctx, r)); err != nil {
		return err
	}
	d.emit(Event{From: reviewer, Event: EventOnline, Detail: "reviewer comes online and subscribes to its inbox"})
	return nil
}

// reviewerHandler is the reviewer's handler: it answers a basemessage
// VALIDATION_REQUEST with a VALIDATION_RESPONSE through Reply, which
// addresses the reply to the requester, in its conversation, and records
// the request as replied. A pipeline review_pr is long work (see review).
// ctx is the subscriber's, for telling the demo what a handler whose own
// context ended did.
func (d *demo) reviewerHandler(ctx context.Context, r *agent) bus.Handler {
	subscribed := ctx
	return func(ctx context.Context, dl *bus.Delivery) error {
		switch dl.Type {
		case "review_pr":
			err := review(ctx, dl)
			d.observe(subscribed, r, dl, err)
			return err
		case "VALIDATION_REQUEST":
		default:
			d.observe(ctx, r, dl, nil)
			return nil
		}
		var req struct {
			MessageID string            `json:"messageId"`
			Payload   validationRequest `json:"payload"`
		}
		if err := json.Unmarshal(dl.Data, &req); err != nil {
			return bus.Permanent(fmt.Errorf("read validation request: %w", err))
		}
		reply, err := prepare(profiles.BaseMessage{}, baseMessage{
			MessageID: req.MessageID + "-reply", CorrelationID: dl.CorrelationID, Timestamp: now(),
			From: reviewer, To: dl.From, Type: "VALIDATION_RESPONSE", Version: "1.0", ReplyTo: req.MessageID,
			Payload: validationResponse{TaskID: req.Payload.TaskID, Decision: "APPROVED",
				Reasons: []string{"tests pass", "the change is limited to " + req.Payload.Subject}},
		})
		if err == nil {
			_, err = dl.Reply(ctx, *reply)
		}
		d.observe(ctx, r, dl, err)
		return err
	}
}

// reviewStep is one step of a pull request's review: what the reviewer
// reports as it starts it, how far along the review is then (-1: it does
// not say), and how long it takes.
type reviewStep struct {
	what    string
	percent int
	takes   time.Duration
}

// reviewSteps are the steps of a review. The tests take long: the tasks
// scene cancels the review while they run.
var reviewSteps = []reviewStep{
	{"cloning acme/app", -1, 200 * time.Millisecond},
	{"building", 20, 200 * time.Millisecond},
	{"running tests", 40, 10 * time.Second},
	{"reviewing the diff", 80, 200 * time.Millisecond},
}

// testsStep is the number of the progress update that starts the tests.
const testsStep = 3

// review does the long work of a pipeline review_pr: before each step it
// sends the requester a progress update (Delivery.Progress), and between
// steps it checks its context, which ends if the review is canceled
// (context.Cause is bus.ErrCanceled) or its do-by passes. A finished review
// replies review_approved.
func review(ctx context.Context, dl *bus.Delivery) error {
	stopped := func(err error) error {
		if ctx.Err() != nil {
			return context.Cause(ctx) // bus.ErrCanceled, or the do-by's context.DeadlineExceeded
		}
		return err
	}
	for _, s := range reviewSteps {
		p := bus.Progress{Message: s.what}
		if s.percent >= 0 {
			p.Percent = &s.percent
		}
		if err := dl.Progress(ctx, p); err != nil {
			return stopped(err)
		}
		t := time.NewTimer(s.takes)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return stopped(nil)
		}
	}
	var req pipelineMessage
	if err := json.Unmarshal(dl.Data, &req); err != nil {
		return bus.Permanent(fmt.Errorf("read review request: %w", err))
	}
	reply, err := prepare(profiles.Pipeline{}, pipelineMessage{
		ID: dl.ID + "-reply", From: reviewer, To: dl.From, Subject: "review_approved", Priority: dl.Priority,
		Body:      map[string]any{"prUrl": req.Body["prUrl"], "phase": req.Body["phase"], "summary": "tests pass; the diff does what its issues ask"},
		Timestamp: now(), ReplyTo: &dl.ID, Status: "pending",
	})
	if err == nil {
		_, err = dl.Reply(ctx, *reply)
	}
	return stopped(err)
}
