package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// watchEscalations runs WatchEscalations on an admin of its own until the
// returned function is called.
func watchEscalations(t *testing.T, s *embedded.Server, policies []bus.EscalationPolicy) (stop func()) {
	t.Helper()
	admin := adminOf(t, s, bus.WithErrorHandler(func(err error) { t.Errorf("escalations: %v", err) }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.WatchEscalations(ctx, policies) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchEscalations: %v", err)
		}
	}
}

// inboxCount returns how many messages the stream holds for agent.
func inboxCount(t *testing.T, s *embedded.Server, agent string) uint64 {
	t.Helper()
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(testContext(t), "AGENTBUS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(testContext(t), jetstream.WithSubjectFilter("agentbus.agent."+agent+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// TestEscalationOncePerOutage: a worker crashes; two watchers, one of them
// restarted mid-outage, escalate the outage once, after the policy's
// limit, in the pipeline protocol's needs_human; when the worker returns,
// one recovery follows.
func TestEscalationOncePerOutage(t *testing.T) {
	s := newServer(t)
	policies := []bus.EscalationPolicy{{Agent: "worker", After: 2 * time.Second, To: "human", Message: bus.PipelineEscalation}}
	stopA := watchEscalations(t, s, policies)
	stopB := watchEscalations(t, s, policies)
	defer stopB()

	_, nc := registered(t, s, "worker", bus.AgentCard{})
	orch := newBus(t, s, "orchestrator")
	agentInfo(t, orch, "worker", bus.Online)
	nc.Close() // crash
	agentInfo(t, orch, "worker", bus.Offline)
	stopA() // a watcher goes away mid-outage
	stopC := watchEscalations(t, s, policies)
	defer stopC()

	human := newBus(t, s, "human")
	r := newRecorder()
	subscribe(t, human, r.handle)
	d := r.waitCount(t, 1)[0]
	if d.Type != "needs_human" || d.From != "pipeline" || d.Priority != 2 {
		t.Errorf("escalation %s from %s at p%d, want the pipeline's needs_human at p2", d.Type, d.From, d.Priority)
	}
	var native struct {
		Body struct{ Type, Reason string } `json:"body"`
	}
	if err := json.Unmarshal(d.Data, &native); err != nil || native.Body.Type != "agent_offline" {
		t.Errorf("needs_human %s (%v)", d.Data, err)
	}
	// Not before the limit: the escalation was made at least 2s after the
	// time it gives for the outage's start, read from the message itself
	// rather than from this test's clock.
	_, rest, _ := strings.Cut(native.Body.Reason, " offline since ")
	sinceText, _, _ := strings.Cut(rest, " ")
	since, err := time.Parse(time.RFC3339, sinceText)
	if err != nil {
		t.Fatalf("reason %q gives no outage start: %v", native.Body.Reason, err)
	}
	if gap := d.Time.Sub(since); gap < 2*time.Second {
		t.Errorf("escalated at %v, %v after the outage began at %v, want at least the 2s limit", d.Time, gap, since)
	}

	registered(t, s, "worker", bus.AgentCard{})
	if got := r.waitCount(t, 2)[1]; got.Type != "info" {
		t.Errorf("recovery %s, want the pipeline's info", got.Type)
	}
	// Exactly one of each, whatever the watchers did: both are recorded,
	// so none will send another.
	waitFor(t, "two messages to human", func() (bool, string) {
		n := inboxCount(t, s, "human")
		return n == 2, fmt.Sprint(n, " messages")
	})
	if n := len(r.deliveries()); n != 2 {
		t.Errorf("human got %d messages, want an escalation and a recovery", n)
	}
}

// TestEscalationIgnoresFlapping: an agent that goes away and comes back
// within the limit, again and again, is not escalated; the outage that
// lasts is, once.
func TestEscalationIgnoresFlapping(t *testing.T) {
	s := newServer(t)
	stop := watchEscalations(t, s, []bus.EscalationPolicy{{Tag: "build", After: 2 * time.Second, To: "lead"}})
	defer stop()
	card := bus.AgentCard{Skills: []bus.Skill{{ID: "compile", Tags: []string{"build"}}}}
	for range 3 {
		b := newBus(t, s, "builder")
		if err := b.Register(testContext(t), card); err != nil {
			t.Fatal(err)
		}
		b.Close() // offline for a moment, then back
	}
	orch := newBus(t, s, "orchestrator")
	final := agentInfo(t, orch, "builder", bus.Offline)

	lead := newBus(t, s, "lead")
	r := newRecorder()
	subscribe(t, lead, r.handle)
	d := r.waitCount(t, 1)[0]
	var e bus.Escalation
	if err := json.Unmarshal(d.Data, &e); err != nil {
		t.Fatal(err)
	}
	if d.Type != bus.EventEscalation || e.Agent != "builder" || !e.OfflineSince.Equal(final.Presence.Since) || e.Reason != bus.ReasonShutdown {
		t.Errorf("escalation %s %+v, want the last outage (since %v)", d.Type, e, final.Presence.Since)
	}
	if n := inboxCount(t, s, "lead"); n != 1 {
		t.Errorf("lead has %d messages, want one escalation", n)
	}
}

// TestEscalationPolicyInvalid: a policy that can never apply, or whose
// messages can never be sent, is refused at
// once; one for an agent ID no agent can have watched for it forever.
func TestEscalationPolicyInvalid(t *testing.T) {
	admin := adminOf(t, newServer(t))
	for _, p := range []bus.EscalationPolicy{
		{After: time.Minute, To: "human"},
		{Agent: "worker", Tag: "go", After: time.Minute, To: "human"},
		{Agent: "worker", To: "human"},
		{Agent: "worker", After: time.Minute},
		{Agent: "*", After: time.Minute, To: "human"},
		{Agent: strings.Repeat("w", 300), After: time.Minute, To: "human"},
		{Agent: "a\x01b", After: time.Minute, To: "human"},
		// Messages that can never be sent: each escalation failed when
		// due, told only to the error handler (accepted before).
		{Agent: "worker", After: time.Minute, To: "human", Priority: 9},
		{Agent: "worker", After: time.Minute, To: "human", Priority: -1},
		{Agent: "worker", After: time.Minute, To: "human", From: "*"},
		{Agent: "worker", After: time.Minute, To: "human", From: "a\x01b"},
	} {
		ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
		err := admin.WatchEscalations(ctx, []bus.EscalationPolicy{p})
		cancel()
		if !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("policy %+v: %v, want ErrInvalidOption", p, err)
		}
	}
}

// TestEscalationAcrossABlip: an outage that comes due while the watcher's
// connection is away is escalated once it is back. The escalation read
// the agent's presence, failed, and gave up without a word: the outage,
// which went on, was never escalated (found by a helper session).
func TestEscalationAcrossABlip(t *testing.T) {
	bus.SetAPIAttemptTimeout(t, 200*time.Millisecond)
	s := newServer(t)
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	admin, err := bus.ConnectAdmin(p.URL(), bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	r := newRecorder()
	subscribe(t, newBus(t, s, "human"), r.handle)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- admin.WatchEscalations(ctx, []bus.EscalationPolicy{{Agent: "worker", After: 2 * time.Second, To: "human"}})
	}()
	defer func() { cancel(); <-done }()
	worker, _ := registered(t, s, "worker", bus.AgentCard{})
	orch := newBus(t, s, "orchestrator")
	agentInfo(t, orch, "worker", bus.Online)
	worker.Close()
	due := agentInfo(t, orch, "worker", bus.Offline).Presence.Since.Add(2 * time.Second)
	// The network goes away from before the outage is due until after.
	waitFor(t, "half a second before it is due", func() (bool, string) { return time.Now().After(due.Add(-500 * time.Millisecond)), "" })
	p.hold()
	waitFor(t, "a second after it was due", func() (bool, string) { return time.Now().After(due.Add(time.Second)), "" })
	p.release()
	if d := r.waitCount(t, 1)[0]; d.Type != bus.EventEscalation {
		t.Errorf("human got %s, want the escalation", d.Type)
	}
}

// TestTagPolicyRecoveryWhenTheCardChanged: an outage escalated under a Tag
// policy is recovered when the agent comes back with a card without the
// tag. The recovery was decided by the card it came back with: the
// escalation's recipient waited for good (found by a helper session).
func TestTagPolicyRecoveryWhenTheCardChanged(t *testing.T) {
	s := newServer(t)
	lead := newBus(t, s, "lead")
	r := newRecorder()
	subscribe(t, lead, r.handle)
	stop := watchEscalations(t, s, []bus.EscalationPolicy{{Tag: "build", After: time.Second, To: "lead"}})
	defer stop()
	b, _ := registered(t, s, "builder", bus.AgentCard{Skills: []bus.Skill{{ID: "compile", Tags: []string{"build"}}}})
	orch := newBus(t, s, "orchestrator")
	agentInfo(t, orch, "builder", bus.Online)
	b.Close()
	if d := r.waitCount(t, 1)[0]; d.Type != bus.EventEscalation {
		t.Fatalf("first message %s, want the escalation", d.Type)
	}
	registered(t, s, "builder", bus.AgentCard{Skills: []bus.Skill{{ID: "compile", Tags: []string{"compile"}}}})
	if d := r.waitCount(t, 2)[1]; d.Type != bus.EventRecovery {
		t.Errorf("second message %s, want the recovery", d.Type)
	}
}

// TestRecoveryWhenTheAgentCameBackBetweenWatchers: an outage escalated by
// a watcher that stopped is recovered by the next, started after the agent
// came back. The next saw the agent online with no outage of its own, and
// the recovery never came (found by a helper session).
func TestRecoveryWhenTheAgentCameBackBetweenWatchers(t *testing.T) {
	s := newServer(t)
	policies := []bus.EscalationPolicy{{Agent: "worker", After: time.Second, To: "human"}}
	human := newBus(t, s, "human")
	r := newRecorder()
	subscribe(t, human, r.handle)
	stop := watchEscalations(t, s, policies)

	worker, _ := registered(t, s, "worker", bus.AgentCard{})
	orch := newBus(t, s, "orchestrator")
	agentInfo(t, orch, "worker", bus.Online)
	worker.Close()
	agentInfo(t, orch, "worker", bus.Offline)
	if d := r.waitCount(t, 1)[0]; d.Type != bus.EventEscalation {
		t.Fatalf("first message %s, want the escalation", d.Type)
	}
	stop() // the watcher restarts (a deploy of agentbus serve) ...

	registered(t, s, "worker", bus.AgentCard{})
	agentInfo(t, orch, "worker", bus.Online) // ... and the worker is back meanwhile

	stop = watchEscalations(t, s, policies)
	defer stop()
	if d := r.waitCount(t, 2)[1]; d.Type != bus.EventRecovery {
		t.Errorf("second message %s, want the recovery", d.Type)
	}
}
