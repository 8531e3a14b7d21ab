package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// The review scene: the swarm protocol's review round (docs/groups.md).
const (
	// reviewers is the group of the review round.
	reviewers = "reviewers"
	// component is the component under review; the swarm profile makes
	// its component_id the correlation ID, so the round is a conversation
	// of its own.
	component = "config-loader"
	// roundWant is how many verdicts the lead proceeds with (bus.Want).
	roundWant = 3
	// roundReplyBy is how long the lead's round is open: the reply-by of
	// every copy, at which a copy nobody answered expires.
	roundReplyBy = time.Second
)

// The reviewers of the round, named by their role in the swarm document:
// two answer at once, one once it has read the diff, one takes its time,
// one crashes.
const (
	security = "security" // answers at once
	qa       = "qa"       // answers at once
	api      = "api"      // answers third, after the crash (see review)
	perf     = "perf"     // answers after the lead proceeded
	ui       = "ui"       // crashes on its copy
)

// panelist is a reviewer of the round and what it does with its copy.
type panelist struct {
	name string
	does string // for the timeline
	// wait, when not nil, is closed when the reviewer may answer.
	wait <-chan struct{}
	// crash makes the handler hang until the scene kills the process.
	crash bool
	// issues are what its verdict finds.
	issues []reviewIssue
}

// review: the swarm protocol's review round. Five reviewers join group
// reviewers (Bus.JoinGroup). The orchestrator, the swarm's Lead, forwards
// the implementer's ComponentHandoff to the group with Bus.GatherGroup and
// bus.Want(3), the round's reply-by a second away: each reviewer gets its
// own copy, a valid swarm message, and answers with a ReviewResult through
// Delivery.Reply. security and qa answer at once; ui takes its copy and
// its process dies; api answers next (it waits for those three, so that
// the timeline always reads in one order), and the lead proceeds with
// three verdicts, told who replied, failed, was offline and timed out.
// perf, the slow one, answers after that: its verdict is not lost, and the
// lead reads it with Bus.Attach by its copy's ID (GatherResult.Requests).
// ui's copy is held by a dead process and no process of agent ui comes
// back: Attach to it returns a *bus.DeadlineError at the round's reply-by,
// which the scene waits out; delivered and not answered by its expiry, the
// copy reads expired.
func (d *demo) review(ctx context.Context) (string, error) {
	crashed, slowDone := make(chan struct{}), make(chan struct{})
	var closeOnce [2]sync.Once
	releaseAPI := func() { closeOnce[0].Do(func() { close(crashed) }) }
	releasePerf := func() { closeOnce[1].Do(func() { close(slowDone) }) }
	defer releaseAPI()
	defer releasePerf()
	lowIssue := reviewIssue{Severity: "low", File: "config/load.go", Line: new(42),
		Description: "Load reads the file twice", SuggestedFix: "read it once and parse the bytes"}
	panel := []panelist{
		{name: security, does: "answers at once"},
		{name: qa, does: "answers at once"},
		{name: api, does: "answers after a look at the diff", wait: crashed},
		{name: perf, does: "runs benchmarks first, and answers late", wait: slowDone, issues: []reviewIssue{lowIssue}},
		{name: ui, does: "crashes on its copy", crash: true},
	}
	byName := make(map[string]*agent, len(panel))
	roles := make(map[*agent]panelist, len(panel))
	for _, p := range panel {
		a, err := d.connect(p.name, p.name)
		if err != nil {
			return "", err
		}
		d.panel = append(d.panel, a)
		byName[p.name], roles[a] = a, p
		if err := a.bus.JoinGroup(ctx, reviewers); err != nil {
			return "", err
		}
		if a.sub, err = a.bus.Subscribe(ctx, d.panelHandler(ctx, a, p)); err != nil {
			return "", err
		}
		d.emit(Event{From: p.name, Event: EventOnline,
			Detail: fmt.Sprintf("%s joins group %s (JoinGroup) and subscribes; it %s", p.name, reviewers, p.does)})
	}

	notes := "adds Load, which reads the config file at start"
	m, err := prepareSwarm(componentHandoff{
		Schema: "ComponentHandoff", ComponentID: component, Status: "complete",
		FilesCreated: []string{"config/load.go"}, FilesModified: []string{"cmd/app/main.go"},
		Summary: "config loader with defaults and validation", Notes: &notes, Attempt: 1, TurnCount: 14,
	}, orchestrator, reviewers)
	if err != nil {
		return "", err
	}
	m.ID = "review-1" // swarm messages have no ID of their own; the bus's is ours to choose

	type result struct {
		res *bus.GatherResult
		err error
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	replyBy := time.Now().Add(roundReplyBy)
	rctx, cancel := context.WithDeadline(ctx, replyBy)
	defer cancel()
	done := make(chan result, 1)
	sent := time.Now()
	d.emit(messageEvent(m, EventRequest, fmt.Sprintf("the lead forwards swarm ComponentHandoff %s to group %s with GatherGroup and Want(%d), reply-by %s: each member gets its own copy",
		component, reviewers, roundWant, roundReplyBy)))
	wg.Go(func() {
		res, err := d.orch.bus.GatherGroup(rctx, reviewers, *m, bus.Want(roundWant))
		done <- result{res, err}
	})

	// Until the lead proceeds: two verdicts at once and the crash, in any
	// order, then api's verdict, the third.
	var answered []string
	for len(answered) < roundWant {
		o, err := d.next(ctx, "a reviewer's answer")
		if err != nil {
			return "", err
		}
		switch {
		case o.by == byName[ui] && errors.Is(o.err, errStalled):
			byName[ui].crash()
			d.emit(Event{From: ui, Event: EventCrashed,
				Detail: fmt.Sprintf("%s takes its copy and its process dies: its connection closes with no verdict and no ack", ui)})
		case o.err == nil && o.by != byName[perf] && o.by != byName[ui]:
			answered = append(answered, o.by.label)
			d.emit(verdictEvent(o.d, "verdict "+roles[o.by].verdict().summary()))
		default:
			return "", unexpected(o, "a verdict from security, qa or api, or ui's crash")
		}
		if len(answered) == 2 && byName[ui].crashed.Load() {
			releaseAPI()
		}
	}

	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if r.err != nil {
		return "", fmt.Errorf("GatherGroup: %w", r.err)
	}
	res := r.res
	if err := checkRound(res, answered); err != nil {
		return "", err
	}
	d.emit(Event{From: orchestrator, Event: EventGathered, Detail: fmt.Sprintf("the lead proceeds with %d verdicts, %s after it asked: %s",
		len(res.Replies), time.Since(sent).Round(time.Millisecond), roundSummary(res))})

	// The slow reviewer answers after the lead proceeded; its verdict
	// waits in the lead's inbox, read by its copy's ID.
	releasePerf()
	o, err := d.next(ctx, "perf's verdict")
	if err != nil {
		return "", err
	}
	if o.by != byName[perf] || o.err != nil {
		return "", unexpected(o, "perf's verdict")
	}
	d.emit(verdictEvent(o.d, fmt.Sprintf("verdict %s, after the lead proceeded", roles[o.by].verdict().summary())))
	actx, acancel := context.WithTimeout(ctx, waitTimeout)
	defer acancel()
	late, err := d.orch.bus.Attach(actx, res.Requests[perf])
	if err != nil {
		return "", fmt.Errorf("attach to perf's copy: %w", err)
	}
	if late.From != perf || late.CausationID != res.Requests[perf] || !validVerdict(late) {
		return "", fmt.Errorf("Attach to perf's copy returned %s %s from %s, want perf's ReviewResult", late.Type, late.ID, late.From)
	}
	d.emit(Event{From: late.From, To: late.To, Type: late.Type, Priority: late.Priority, Event: EventReply,
		Detail: fmt.Sprintf("the lead reads perf's verdict, %s, with Attach by its copy's ID, GatherResult.Requests[%q]", verdictOf(late), perf)})

	// The crashed reviewer's copy: nobody answers it by the reply-by, which
	// the scene waits out.
	uiCopy := res.Requests[ui]
	bctx, bcancel := context.WithDeadline(ctx, replyBy)
	defer bcancel()
	_, err = d.orch.bus.Attach(bctx, uiCopy)
	var de *bus.DeadlineError
	if !errors.As(err, &de) {
		return "", fmt.Errorf("attach to ui's copy: %v, want a *bus.DeadlineError at the reply-by", err)
	}
	d.emit(Event{From: orchestrator, To: ui, Type: m.Type, Priority: m.Priority, Event: EventDeadline,
		Detail: fmt.Sprintf("Attach to ui's copy returns *bus.DeadlineError, kind %s, at the round's reply-by", de.Kind)})
	st, err := awaitState(ctx, d.orch.bus, uiCopy, ui, bus.StateExpired)
	if err != nil {
		return "", err
	}
	if st.Deliveries != 1 || st.CorrelationID != component {
		return "", fmt.Errorf("ui's copy: %d deliveries in conversation %q, want 1 in %s", st.Deliveries, st.CorrelationID, component)
	}
	d.emit(Event{From: orchestrator, To: ui, Type: m.Type, Priority: m.Priority, Event: EventExpired,
		Detail: fmt.Sprintf("ui's copy, delivered once to the dead process, passed its expiry unanswered; no process of %s came back to take it again: lifecycle record %s", ui, st.State)})

	return fmt.Sprintf("the lead proceeded at %d of 5 verdicts (%s); perf's late verdict was read with Attach; ui crashed and its copy expired at the reply-by; every copy and verdict is a valid swarm message, in conversation %s",
		roundWant, strings.Join(answered, ", "), component), nil
}

// panelHandler is a reviewer's handler in the review round: it checks its
// copy of the lead's ComponentHandoff (a valid swarm message to it, sent to
// group reviewers) and answers with a ReviewResult through Reply, which
// the lead's Gather takes; or it hangs, for the scene to kill its process.
// ctx is the subscriber's, for telling the demo what a handler whose own
// context ended did.
func (d *demo) panelHandler(ctx context.Context, a *agent, p panelist) bus.Handler {
	subscribed := ctx
	return func(ctx context.Context, dl *bus.Delivery) error {
		if err := checkCopy(dl, p.name); err != nil {
			d.observe(subscribed, a, dl, err)
			return bus.Permanent(err)
		}
		if p.crash {
			d.observe(subscribed, a, dl, errStalled)
			<-ctx.Done()
			return ctx.Err()
		}
		if p.wait != nil {
			select {
			case <-p.wait:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		reply, err := prepareSwarm(p.verdict(), p.name, dl.From)
		if err == nil {
			_, err = dl.Reply(ctx, *reply)
		}
		d.observe(subscribed, a, dl, err)
		return err
	}
}

// verdict is the reviewer's ReviewResult on the component: rejected if
// it found a critical or high issue.
func (p panelist) verdict() reviewResult {
	r := reviewResult{Schema: "ReviewResult", ComponentID: component, Verdict: "approved",
		Issues: append([]reviewIssue{}, p.issues...), TurnCount: 6}
	if slices.ContainsFunc(p.issues, func(i reviewIssue) bool { return i.Severity == "critical" || i.Severity == "high" }) {
		r.Verdict = "rejected"
	}
	return r
}

// checkCopy checks a reviewer's copy of the round's request: a swarm
// ComponentHandoff, valid by the protocol's rules, to this reviewer, sent
// to group reviewers, in the component's conversation.
func checkCopy(dl *bus.Delivery, to string) error {
	switch {
	case dl.Type != "ComponentHandoff" || dl.DataSchema != (profiles.Swarm{}).DataSchema():
		return fmt.Errorf("%s %s (%s) is not a swarm ComponentHandoff", dl.Type, dl.ID, dl.DataSchema)
	case dl.To != to || dl.Extensions[bus.ExtGroup] != reviewers || dl.CorrelationID != component:
		return fmt.Errorf("copy %s to %s of group %q in %q, want one to %s of %s in %s",
			dl.ID, dl.To, dl.Extensions[bus.ExtGroup], dl.CorrelationID, to, reviewers, component)
	}
	if err := (profiles.Swarm{}).Validate(dl.Data); err != nil {
		return err
	}
	return nil
}

// validVerdict reports whether d is a swarm ReviewResult on the
// component, valid by the protocol's rules.
func validVerdict(d *bus.Delivery) bool {
	return d.Type == "ReviewResult" && d.CorrelationID == component && d.DataSchema == (profiles.Swarm{}).DataSchema() &&
		(profiles.Swarm{}).Validate(d.Data) == nil
}

// checkRound checks what the lead's Gather got: the verdicts of the
// reviewers that answered, valid swarm ReviewResults on the component;
// nobody failed or offline; perf (slow) and ui (crashed) timed out.
func checkRound(res *bus.GatherResult, answered []string) error {
	var replied []string
	for _, r := range res.Replies {
		replied = append(replied, r.From)
		if !validVerdict(r) || r.CausationID != res.Requests[r.From] || r.CorrelationID != component {
			return fmt.Errorf("verdict %s %s from %s: not a valid swarm ReviewResult answering its copy %s", r.Type, r.ID, r.From, res.Requests[r.From])
		}
	}
	slices.Sort(replied)
	answered = slices.Sorted(slices.Values(answered))
	switch {
	case !slices.Equal(replied, answered):
		return fmt.Errorf("the round got verdicts from %v, want %v", replied, answered)
	case len(res.Failed) != 0 || len(res.Offline) != 0:
		return fmt.Errorf("the round has failed %v and offline %v, want none", res.Failed, res.Offline)
	case !slices.Equal(res.TimedOut, []string{perf, ui}):
		return fmt.Errorf("the round has timed out %v, want [%s %s]", res.TimedOut, perf, ui)
	case len(res.Requests) != 5:
		return fmt.Errorf("the round asked %d reviewers, want 5", len(res.Requests))
	}
	return nil
}

// roundSummary says who did what in a round, each list by name: replies
// sent a moment apart may reach the lead in either order.
func roundSummary(res *bus.GatherResult) string {
	list := func(names []string) string {
		if len(names) == 0 {
			return "none"
		}
		return strings.Join(names, ", ")
	}
	var replied, failed []string
	for _, r := range res.Replies {
		replied = append(replied, r.From+" ("+verdictOf(r)+")")
	}
	for _, st := range res.Failed {
		failed = append(failed, st.To+" ("+string(st.State)+")")
	}
	slices.Sort(replied)
	slices.Sort(failed)
	return fmt.Sprintf("replied %s; failed %s; offline %s; timed out %s",
		list(replied), list(failed), list(res.Offline), list(res.TimedOut))
}

// verdictOf reads the verdict of a ReviewResult, with its issues.
func verdictOf(d *bus.Delivery) string {
	var r reviewResult
	if err := json.Unmarshal(d.Data, &r); err != nil {
		return "unreadable"
	}
	return r.summary()
}

// summary is the verdict, with the severity of each issue.
func (r reviewResult) summary() string {
	var severities []string
	for _, i := range r.Issues {
		severities = append(severities, i.Severity)
	}
	if len(severities) > 0 {
		return fmt.Sprintf("%s (issues: %s)", r.Verdict, strings.Join(severities, ", "))
	}
	return r.Verdict
}

// verdictEvent is the event of a reviewer answering its copy d.
func verdictEvent(d *bus.Delivery, detail string) Event {
	return Event{From: d.To, To: d.From, Type: "ReviewResult", Priority: d.Priority, Event: EventReplied, Detail: detail}
}
