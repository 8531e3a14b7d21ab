package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/bus/auth"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// authServer is an embedded server running the authorization auth.Generate
// writes for some agents, with the bus provisioned by the admin.
type authServer struct {
	s     *embedded.Server
	setup *auth.Setup
	admin *bus.Admin // to look at what the agents did
}

func newAuthServer(t *testing.T, agents ...string) *authServer {
	t.Helper()
	return newAuthServerConfig(t, auth.Config{Agents: agents})
}

// newAuthServerConfig is newAuthServer for the authorization c asks for.
func newAuthServerConfig(t *testing.T, c auth.Config) *authServer {
	t.Helper()
	setup, err := auth.Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), auth.ConfigFileName)
	if err := os.WriteFile(file, setup.ServerConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.ConfigFile = file })
	nc := embeddedtest.Connect(t, s, setup.Admin().Option())
	admin := newAdmin(t, nc)
	if _, err := admin.Provision(testContext(t), bus.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	return &authServer{s: s, setup: setup, admin: admin}
}

// identity returns the generated identity of agent.
func (a *authServer) identity(t *testing.T, agent string) auth.Identity {
	t.Helper()
	id, ok := a.setup.Agent(agent)
	if !ok {
		t.Fatalf("no identity for %q", agent)
	}
	return id
}

// agentBus connects agent over TCP with its own credentials, as any
// program does with bus.Connect; background errors go to onError.
func (a *authServer) agentBus(t *testing.T, agent string, onError func(error), opts ...bus.Option) *bus.Bus {
	t.Helper()
	opts = append([]bus.Option{
		bus.WithNATSOptions(a.identity(t, agent).Option()),
		bus.WithErrorHandler(onError),
	}, opts...)
	b, err := bus.Connect(a.s.ClientURL(), agent, opts...)
	if err != nil {
		t.Fatalf("bus.Connect(%q): %v", agent, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestAgentPermissionsAllowNormalWork: under the generated authorization
// agents do all their work (subscribe, publish, publish asynchronously,
// request and reply, read their status records, dead-letter, report their
// backlog), and the server refuses none of it.
func TestAgentPermissionsAllowNormalWork(t *testing.T) {
	srv := newAuthServer(t, "lead", "build worker")
	var leadErrs, workerErrs errorTally
	lead := srv.agentBus(t, "lead", leadErrs.add)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	worker := srv.agentBus(t, "build worker", workerErrs.add, bus.WithMeterProvider(mp))
	ctx := testContext(t)

	// The worker answers questions, rejects poison for good and records
	// the rest.
	r := newRecorder()
	longStarted := make(chan struct{}, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		switch d.Type {
		case "poison":
			return bus.Permanent(errors.New("cannot handle it"))
		case "question":
			_, err := d.Reply(ctx, bus.Message{Type: "answer", Data: []byte("42")})
			return err
		case "long":
			select {
			case longStarted <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return r.handle(ctx, d)
	})
	subscribe(t, lead, func(context.Context, *bus.Delivery) error { return nil })

	task := publish(t, lead, bus.Message{To: worker.Agent(), Type: "task", Priority: 1})
	f, err := lead.PublishAsync(ctx, bus.Message{To: worker.Agent(), Type: "async-task"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Wait(ctx); err != nil {
		t.Fatalf("PublishAsync: %v", err)
	}
	note := publish(t, lead, bus.Message{To: bus.Broadcast, Type: "note"})
	r.waitCount(t, 3)
	if types := r.types(); !slices.Contains(types, "task") || !slices.Contains(types, "async-task") || !slices.Contains(types, "note") {
		t.Fatalf("worker handled %v, want task, async-task and note", types)
	}

	reply, err := lead.Request(ctx, bus.Message{To: worker.Agent(), Type: "question"})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if reply.Type != "answer" || string(reply.Data) != "42" {
		t.Fatalf("reply %s %q, want answer 42", reply.Type, reply.Data)
	}
	// Either side reads a question replied, off the reply it finds by the
	// derived ID, through its own permissions (the first lookup writes
	// the record: a question each).
	for _, b := range []*bus.Bus{lead, worker} {
		answer, err := lead.Request(ctx, bus.Message{To: worker.Agent(), Type: "question"})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if st := waitState(t, b, answer.CausationID, bus.StateReplied); st.ReplyID != answer.ID {
			t.Errorf("%s: status %+v, want replied with %s", b.Agent(), st, answer.ID)
		}
	}
	// The requester attaches to its request again (its history consumer),
	// and cancels running work (the record, the notice).
	if again, err := lead.Attach(ctx, reply.CausationID); err != nil || again.ID != reply.ID {
		t.Fatalf("Attach = %+v, %v; want the reply %s again", again, err, reply.ID)
	}
	// Both read the conversation back with bodies (their history
	// consumers: to them, from them), and the lead its broadcast's (the
	// broadcasts' one).
	for _, b := range []*bus.Bus{lead, worker} {
		p, err := b.History(ctx, reply.CorrelationID, bus.HistoryQuery{})
		if err != nil || len(p.Entries) != 2 || p.Entries[0].Err != nil || p.Entries[1].Err != nil || string(p.Entries[1].Data) != "42" {
			t.Fatalf("%s: History = %+v, %v; want the question and the answer", b.Agent(), p.Entries, err)
		}
	}
	if p, err := lead.History(ctx, note.ID, bus.HistoryQuery{}); err != nil || len(p.Entries) != 1 || p.Entries[0].Err != nil || p.Entries[0].To != bus.Broadcast {
		t.Fatalf("lead: History of its broadcast = %+v, %v", p.Entries, err)
	}
	// A direct message without a TTL has no record: each side finds it by
	// its indexed subject, with its history consumer filtered to the
	// conversation and to itself.
	for _, b := range []*bus.Bus{lead, worker} {
		p, err := b.History(ctx, task.ID, bus.HistoryQuery{})
		if err != nil || len(p.Entries) != 1 || p.Entries[0].ID != task.ID || p.Entries[0].Err != nil {
			t.Fatalf("%s: History of the task = %+v, %v; want the task", b.Agent(), p.Entries, err)
		}
	}
	long := publish(t, lead, bus.Message{To: worker.Agent(), Type: "long"})
	waitState(t, lead, long.ID, bus.StateDelivered)
	// Delivered is to the worker's process; the worker records the cancel
	// only if its handler runs by then (a message canceled before its
	// handler starts is dropped unhandled, its record left as the lead
	// wrote it).
	select {
	case <-longStarted:
	case <-ctx.Done():
		t.Fatal("the worker's handler of the long task did not start")
	}
	if _, err := lead.Cancel(ctx, long.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	waitFor(t, "the worker's canceled record", func() (bool, string) {
		sts, err := lead.Status(ctx, long.ID)
		return err == nil && sts[0].State == bus.StateCanceled && sts[0].By == worker.Agent(), fmt.Sprintf("%+v, %v", sts, err)
	})

	// Sender and recipient read the record that names them.
	waitFor(t, "the task recorded completed", func() (bool, string) {
		for _, b := range []*bus.Bus{lead, worker} {
			sts, err := b.Status(ctx, task.ID)
			if err != nil || len(sts) != 1 || sts[0].State != bus.StateCompleted {
				return false, fmt.Sprintf("%s: %+v, %v", b.Agent(), sts, err)
			}
		}
		return true, ""
	})

	// The worker files its dead letters under its own name, a broadcast's
	// too.
	publish(t, lead, bus.Message{To: worker.Agent(), Type: "poison"})
	publish(t, lead, bus.Message{To: bus.Broadcast, Type: "poison"})
	var dls []bus.DeadLetter
	waitFor(t, "two dead letters", func() (bool, string) {
		dls, err = srv.admin.DeadLetters(ctx, bus.DeadLetterFilter{Agent: worker.Agent()})
		return err == nil && len(dls) == 2, fmt.Sprintf("%d dead letters, %v", len(dls), err)
	})
	var originals []string
	for _, dl := range dls {
		originals = append(originals, withoutIndex(t, dl.Subject))
		if dl.Agent != worker.Agent() || dl.Reason != bus.ReasonRejected {
			t.Errorf("dead letter of %s by %q, reason %s; want the worker, rejected", dl.Subject, dl.Agent, dl.Reason)
		}
	}
	slices.Sort(originals)
	if want := []string{"agentbus.agent.build%20worker.p3.lead.poison", "agentbus.all.p3.lead.poison"}; !slices.Equal(originals, want) {
		t.Errorf("dead letters of %q, want %q", originals, want)
	}

	// The backlog gauges read the worker's consumers.
	if _, ok := find(collect(t, reader), "agentbus.backlog"); !ok {
		t.Error("no agentbus.backlog reported")
	}

	// Each registers its own card and reads the other's.
	for _, b := range []*bus.Bus{lead, worker} {
		if err := b.Register(ctx, bus.AgentCard{Description: b.Agent()}); err != nil {
			t.Fatalf("%s: Register: %v", b.Agent(), err)
		}
	}
	if a, err := lead.LookupAgent(ctx, "build worker"); err != nil || a.Card.Description != "build worker" || a.Presence.Status != bus.Online {
		t.Errorf("lead reads the worker's card: %+v, %v", a, err)
	}
	if all, err := worker.Agents(ctx); err != nil || len(all) != 2 {
		t.Errorf("worker lists %d agents, %v; want 2", len(all), err)
	}
	// Both answer NATS micro discovery under their permissions.
	if got := discover(t, srv.admin.Conn(), 2); !slices.Equal(got, []string{"build worker", "lead"}) {
		t.Errorf("discovered %v", got)
	}
	// A second process of the worker closes, and the worker stays online:
	// the closing process asks for the other, which answers.
	second := srv.agentBus(t, "build worker", workerErrs.add)
	if err := second.Register(ctx, bus.AgentCard{Description: "build worker"}); err != nil {
		t.Fatalf("second process: Register: %v", err)
	}
	second.Close()
	if a, err := lead.LookupAgent(ctx, "build worker"); err != nil || a.Presence.Status != bus.Online {
		t.Errorf("one process of the worker closed: %+v, %v; want online", a.Presence, err)
	}

	for agent, errs := range map[string]*errorTally{"lead": &leadErrs, "build worker": &workerErrs} {
		if errs.total() != 0 {
			t.Errorf("%s: background errors %v", agent, errs)
		}
	}
}

// intruder is an agent that tries what its permissions forbid, with plain
// nats.go on its own credentials. Every permission error the server sends
// it arrives on errs.
type intruder struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	bus   *bus.Bus   // its bus, on a connection of its own
	admin *bus.Admin // an operator's handle with its credentials
	errs  chan error
}

func newIntruder(t *testing.T, srv *authServer, agent string) *intruder {
	t.Helper()
	in := &intruder{errs: make(chan error, 64)}
	report := func(err error) {
		select {
		case in.errs <- err:
		default:
			t.Errorf("error dropped: %v", err)
		}
	}
	nc, err := nats.Connect(srv.s.ClientURL(),
		srv.identity(t, agent).Option(),
		nats.CustomInboxPrefix(bus.InboxPrefix(agent)),
		nats.PermissionErrOnSubscribe(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { report(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	in.nc = nc
	if in.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	in.bus = srv.agentBus(t, agent, report)
	if in.admin, err = bus.ConnectAdmin(srv.s.ClientURL(), bus.WithNATSOptions(srv.identity(t, agent).Option(),
		nats.CustomInboxPrefix(bus.InboxPrefix(agent))), bus.WithErrorHandler(report)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.admin.Close() })
	return in
}

// violation waits for the server's permission error for op ("Publish" or
// "Subscription") on a subject that matches pattern, where a "*" token
// stands for any one token. Any other error fails the test.
func (in *intruder) violation(t *testing.T, op, pattern string) {
	t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	select {
	case err := <-in.errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("error %v, want a permissions violation", err)
		}
		// nats.go gives the refused subject only in the error's text.
		_, subject, ok := strings.Cut(err.Error(), "Permissions Violation for "+op+" to ")
		if !ok || !subjectMatches(pattern, strings.Trim(subject, `"`)) {
			t.Fatalf("error %v, want the violation for %s to %q", err, op, pattern)
		}
	case <-timer.C:
		t.Fatalf("no permissions violation for %s to %q", op, pattern)
	}
}

// subjectMatches reports whether subject has pattern's tokens, a "*" in
// pattern matching any one.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	if len(p) != len(s) {
		return false
	}
	for i := range p {
		if p[i] != "*" && p[i] != s[i] {
			return false
		}
	}
	return true
}

// denied runs call, a request the server must refuse, until the server's
// permission error for publishing to a subject matching pattern arrives;
// the request itself gets no answer and ends when its context does. call
// must then have failed.
func (in *intruder) denied(t *testing.T, pattern string, call func(ctx context.Context) error) {
	t.Helper()
	in.deniedEach(t, []string{pattern}, call)
}

// deniedEach checks that the server refuses each of the publishes that
// patterns match, in order, during call, and that call fails.
func (in *intruder) deniedEach(t *testing.T, patterns []string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	for _, p := range patterns {
		in.violation(t, "Publish", p)
	}
	cancel()
	if err := <-done; err == nil {
		t.Errorf("the call succeeded after the server refused it")
	}
}

// deniedRequest checks with denied that the server refuses a raw request
// to subject with body in JSON, as a client that bypasses the bus would
// send it.
func (in *intruder) deniedRequest(t *testing.T, subject string, body any) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	in.denied(t, subject, func(ctx context.Context) error {
		_, err := in.nc.RequestWithContext(ctx, subject, data)
		return err
	})
}

// TestProvisionWithAnAgentsIdentity: a bus made WithProvision with an
// agent's credentials, which allow no stream requests, fails at once with
// ErrPermissionDenied naming the refused request, as Admin.Provision does.
// Before, bus.Connect waited out provisioning's 10 s and said "provision
// stream AGENTBUS_SCHED: context deadline exceeded".
func TestProvisionWithAnAgentsIdentity(t *testing.T) {
	srv := newAuthServer(t, "alice")
	opts := []bus.Option{bus.WithNATSOptions(srv.identity(t, "alice").Option()), bus.WithProvision(bus.StreamConfig{}),
		bus.WithErrorHandler(func(error) {})}
	b, err := bus.Connect(srv.s.ClientURL(), "alice", opts...)
	if err == nil {
		b.Close()
	}
	if !errors.Is(err, bus.ErrPermissionDenied) || !strings.Contains(err.Error(), "$JS.API.STREAM.") {
		t.Errorf("Connect with WithProvision as an agent: %v; want ErrPermissionDenied naming the stream request", err)
	}
	s, err := bus.ConnectShards(srv.s.ClientURL(), "alice", 3, opts...)
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, bus.ErrPermissionDenied) {
		t.Errorf("ConnectShards with WithProvision as an agent: %v; want ErrPermissionDenied", err)
	}
}

// refusedCall is a call of a handle H, a *bus.Bus or a *bus.Admin, that
// the server refuses.
type refusedCall[H any] struct {
	name string
	f    func(context.Context, H) error
}

// checkEveryCallRefused makes each call on a handle of its own, as the
// connection's first call, then all of them on one handle, after the
// refusal, and fails unless each returns ErrPermissionDenied before its
// deadline of 20 s: with attempts of an hour (SetAPIAttemptTimeout), a call
// the refusal did not end waits for it.
func checkEveryCallRefused[H any](t *testing.T, connect func() H, calls []refusedCall[H]) {
	t.Helper()
	check := func(t *testing.T, h H, c refusedCall[H]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(testContext(t), 20*time.Second)
		defer cancel()
		if err := c.f(ctx, h); !errors.Is(err, bus.ErrPermissionDenied) || ctx.Err() != nil {
			t.Errorf("%s: %v (context %v); want ErrPermissionDenied before the deadline", c.name, err, ctx.Err())
		}
	}
	t.Run("first call", func(t *testing.T) {
		for _, c := range calls {
			check(t, connect(), c)
		}
	})
	t.Run("after the refusal", func(t *testing.T) {
		h := connect()
		for _, c := range calls {
			check(t, h, c)
		}
	})
}

// TestBusWithAnotherAgentsIdentity: a bus of alice connected with
// mallory's credentials, which allow neither alice's inbox nor her
// subjects, fails every call at once with ErrPermissionDenied: as the
// connection's first call and after the refusal. Before, Register,
// Request, Gather and PublishAsync waited out their context: the server
// refuses the inbox subscription once, and their requests (askAgain) and
// asynchronous publishes (asyncpub, whose acks come to that inbox) heard
// of no refusal.
func TestBusWithAnotherAgentsIdentity(t *testing.T) {
	srv := newAuthServer(t, "alice", "bob", "mallory")
	bus.SetAPIAttemptTimeout(t, time.Hour) // a call the refusal does not end waits for its context
	bus.SetPublishAttemptTimeout(t, time.Hour)
	connect := func() *bus.Bus {
		b, err := bus.Connect(srv.s.ClientURL(), "alice", bus.WithNATSOptions(srv.identity(t, "mallory").Option()),
			bus.WithErrorHandler(func(error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	calls := []refusedCall[*bus.Bus]{
		{"Register", func(ctx context.Context, b *bus.Bus) error { return b.Register(ctx, bus.AgentCard{}) }},
		{"JoinGroup", func(ctx context.Context, b *bus.Bus) error { return b.JoinGroup(ctx, "g") }},
		{"Agents", func(ctx context.Context, b *bus.Bus) error { _, err := b.Agents(ctx); return err }},
		{"LookupAgent", func(ctx context.Context, b *bus.Bus) error { _, err := b.LookupAgent(ctx, "bob"); return err }},
		{"WatchPresence", func(ctx context.Context, b *bus.Bus) error { return b.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
		{"Request", func(ctx context.Context, b *bus.Bus) error {
			_, err := b.Request(ctx, bus.Message{To: "bob", Type: "T"})
			return err
		}},
		{"Gather", func(ctx context.Context, b *bus.Bus) error {
			_, err := b.Gather(ctx, bus.Message{Type: "T"}, []string{"bob"})
			return err
		}},
		{"Cancel", func(ctx context.Context, b *bus.Bus) error { _, err := b.Cancel(ctx, "m1"); return err }},
		{"History", func(ctx context.Context, b *bus.Bus) error {
			_, err := b.History(ctx, "c1", bus.HistoryQuery{})
			return err
		}},
		{"Schedule", func(ctx context.Context, b *bus.Bus) error {
			_, err := b.Schedule(ctx, bus.Message{To: "bob", Type: "T"}, bus.In(time.Hour))
			return err
		}},
		{"PublishAsync", func(ctx context.Context, b *bus.Bus) error {
			f, err := b.PublishAsync(ctx, bus.Message{To: "bob", Type: "T"})
			if err != nil {
				return err
			}
			_, err = f.Wait(ctx)
			return err
		}},
		{"EnsureConsumers", func(ctx context.Context, b *bus.Bus) error { return b.EnsureConsumers(ctx) }},
	}
	checkEveryCallRefused(t, connect, calls)
}

// TestOperatorHandleWithAnAgentsIdentity: an operator's handle connected
// with an agent's credentials, which allow no subscription to nats.go's
// default inbox, fails every call at once with ErrPermissionDenied naming
// the refused inbox: as the connection's first call, whose first request
// the refusal answers, and as a call after it. Before, such a call waited
// out its context with "context deadline exceeded" ('agentbus agents' run
// with an agent's nkey: 10 s), and a watch without a deadline waited for
// good: the bus took its refusal for no refusal (it compared against
// nats.Options.InboxPrefix, empty for the default inbox), the server
// refuses the subscription only once, and several calls watched for no
// refusal at all.
func TestOperatorHandleWithAnAgentsIdentity(t *testing.T) {
	srv := newAuthServer(t, "alice")
	bus.SetAPIAttemptTimeout(t, time.Hour) // a call the refusal does not end waits for its context
	connect := func() *bus.Admin {
		admin, err := bus.ConnectAdmin(srv.s.ClientURL(), bus.WithNATSOptions(srv.identity(t, "alice").Option()),
			bus.WithErrorHandler(func(error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		return admin
	}
	calls := []refusedCall[*bus.Admin]{
		{"Agents", func(ctx context.Context, a *bus.Admin) error { _, err := a.Agents(ctx); return err }},
		{"LookupAgent", func(ctx context.Context, a *bus.Admin) error { _, err := a.LookupAgent(ctx, "alice"); return err }},
		{"FindAgents", func(ctx context.Context, a *bus.Admin) error {
			_, err := a.FindAgents(ctx, bus.AgentQuery{})
			return err
		}},
		{"Groups", func(ctx context.Context, a *bus.Admin) error { _, err := a.Groups(ctx); return err }},
		{"GroupMembers", func(ctx context.Context, a *bus.Admin) error { _, err := a.GroupMembers(ctx, "g"); return err }},
		{"AddToGroup", func(ctx context.Context, a *bus.Admin) error { return a.AddToGroup(ctx, "g", "alice") }},
		{"Backlog", func(ctx context.Context, a *bus.Admin) error { _, err := a.Backlog(ctx, "alice"); return err }},
		{"Status", func(ctx context.Context, a *bus.Admin) error { _, err := a.Status(ctx, "m1"); return err }},
		{"Conversation", func(ctx context.Context, a *bus.Admin) error { _, err := a.Conversation(ctx, "c1"); return err }},
		{"History", func(ctx context.Context, a *bus.Admin) error {
			_, err := a.History(ctx, "c1", bus.HistoryQuery{})
			return err
		}},
		{"DeadLetters", func(ctx context.Context, a *bus.Admin) error {
			_, err := a.DeadLetters(ctx, bus.DeadLetterFilter{})
			return err
		}},
		{"Cancel", func(ctx context.Context, a *bus.Admin) error { _, err := a.Cancel(ctx, "m1"); return err }},
		{"Redeliver", func(ctx context.Context, a *bus.Admin) error { _, err := a.Redeliver(ctx, "m1", "alice"); return err }},
		{"Provision", func(ctx context.Context, a *bus.Admin) error {
			_, err := a.Provision(ctx, bus.StreamConfig{})
			return err
		}},
		{"EnsureConsumers", func(ctx context.Context, a *bus.Admin) error { return a.EnsureConsumers(ctx, "alice") }},
		{"WatchPresence", func(ctx context.Context, a *bus.Admin) error {
			return a.WatchPresence(ctx, func(bus.PresenceChange) {})
		}},
		{"WatchGroups", func(ctx context.Context, a *bus.Admin) error { return a.WatchGroups(ctx, "", func(bus.GroupChange) {}) }},
		{"WatchDeadLetters", func(ctx context.Context, a *bus.Admin) error { return a.WatchDeadLetters(ctx) }},
	}
	checkEveryCallRefused(t, connect, calls)
}

// TestAgentPermissionsDenyOtherAgents: an agent that goes around the bus
// with plain nats.go on its own credentials can neither read, take, forge
// nor destroy another agent's messages, consumers, dead letters or status
// records, nor the streams: the server refuses each attempt with a
// permissions violation, which nats.go reports to the connection's error
// handler (and, for a subscription, from NextMsg).
func TestAgentPermissionsDenyOtherAgents(t *testing.T) {
	srv := newAuthServer(t, "alice", "bob", "mallory")
	var aliceErrs, bobErrs errorTally
	alice := srv.agentBus(t, "alice", aliceErrs.add, bus.WithHeartbeat(time.Second))
	bob := srv.agentBus(t, "bob", bobErrs.add)
	mallory := newIntruder(t, srv, "mallory")
	ctx := testContext(t)
	s := subjects.Default()

	// Alice's consumers exist; bob's message waits in them, with its
	// status record.
	sub, err := alice.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	sub.Stop()
	<-sub.Done()
	// And her card and membership, which mallory's rollups must not purge.
	if err := alice.Register(ctx, bus.AgentCard{Description: "alice's card"}); err != nil {
		t.Fatal(err)
	}
	if err := alice.JoinGroup(ctx, "crew"); err != nil {
		t.Fatal(err)
	}
	sent := publish(t, bob, bus.Message{To: "alice", Type: "secret", Data: []byte("for alice")})
	key, err := subjects.StatusKey(sent.ID, sent.ID, "bob", "alice")
	if err != nil {
		t.Fatal(err)
	}
	statusKey := "$KV." + s.StatusBucket() + "." + key
	waitFor(t, "the pending record", func() (bool, string) {
		sts, err := srv.admin.Status(ctx, sent.ID)
		return err == nil && len(sts) == 1, fmt.Sprintf("%+v, %v", sts, err)
	})

	const stream = "AGENTBUS"
	for _, tt := range []struct {
		name, subject string
	}{
		{"subscribe to alice's messages", "agentbus.agent.alice.>"},
		{"subscribe to alice's inbox", "_INBOX.alice.>"},
		{"subscribe to every message", "agentbus.>"},
		{"subscribe to the dead letters", "agentbus.dlq.>"},
		// Answering there would keep alice online when she closes.
		{"answer for alice's processes", "agentbus.processes.alice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub, err := mallory.nc.SubscribeSync(tt.subject)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if _, err := sub.NextMsg(testTimeout); !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("NextMsg error %v, want a permissions violation", err)
			}
			mallory.violation(t, "Subscription", tt.subject)
		})
	}

	t.Run("pull from alice's consumer", func(t *testing.T) {
		mallory.deniedRequest(t, "$JS.API.CONSUMER.MSG.NEXT."+stream+".alice_p3", map[string]any{"batch": 1})
	})
	t.Run("read the status bucket's consumers", func(t *testing.T) {
		mallory.denied(t, "$JS.API.CONSUMER.INFO.KV_"+stream+"_STATUS.x", func(ctx context.Context) error {
			_, err := mallory.js.Consumer(ctx, "KV_"+stream+"_STATUS", "x")
			return err
		})
	})
	t.Run("ack alice's message", func(t *testing.T) {
		ack := fmt.Sprintf("$JS.ACK.%s.alice_p3.1.%d.1.%d.0", stream, sent.Sequence, time.Now().UnixNano())
		mallory.denied(t, ack, func(ctx context.Context) error {
			_, err := mallory.nc.RequestWithContext(ctx, ack, []byte("+ACK"))
			return err
		})
	})
	t.Run("create a consumer on alice's subjects", func(t *testing.T) {
		mallory.denied(t, "$JS.API.CONSUMER.CREATE."+stream+".mallory_p3.agentbus.agent.alice.p3.>", func(ctx context.Context) error {
			_, err := mallory.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
				Durable: "mallory_p3", FilterSubject: "agentbus.agent.alice.p3.>"})
			return err
		})
	})
	t.Run("take over alice's consumer", func(t *testing.T) {
		mallory.denied(t, "$JS.API.CONSUMER.CREATE."+stream+".alice_p3.agentbus.agent.alice.p3.>", func(ctx context.Context) error {
			_, err := mallory.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
				Durable: "alice_p3", FilterSubject: "agentbus.agent.alice.p3.>", AckPolicy: jetstream.AckNonePolicy})
			return err
		})
	})
	t.Run("create a consumer with two filters", func(t *testing.T) {
		mallory.denied(t, "$JS.API.CONSUMER.CREATE."+stream+".mallory_p3", func(ctx context.Context) error {
			_, err := mallory.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
				Durable: "mallory_p3", FilterSubjects: []string{"agentbus.agent.mallory.p3.>", "agentbus.agent.alice.p3.>"}})
			return err
		})
	})
	t.Run("hide another filter in its own consumer", func(t *testing.T) {
		// The subject is one mallory may use; the server itself refuses a
		// configured filter that is not the subject's.
		subject := "$JS.API.CONSUMER.CREATE." + stream + ".mallory_p3.agentbus.agent.mallory.p3.>"
		hiddenFilterRefused(t, mallory.nc, subject, map[string]any{"stream_name": stream, "config": map[string]any{
			"durable_name": "mallory_p3", "filter_subject": "agentbus.agent.alice.p3.>", "ack_policy": "explicit"}})
	})
	t.Run("publish as alice", func(t *testing.T) {
		for _, subject := range []string{"agentbus.agent.bob.p1.alice.order", "agentbus.all.p1.alice.order"} {
			mallory.denied(t, subject, func(ctx context.Context) error {
				_, err := mallory.js.Publish(ctx, subject, []byte("forged"))
				return err
			})
		}
	})
	t.Run("publish as alice through the bus", func(t *testing.T) {
		// mallory's credentials, a bus that claims to be alice: the
		// publish fails with ErrPermissionDenied after one attempt, not
		// with a timeout after three.
		nc, err := nats.Connect(srv.s.ClientURL(), srv.identity(t, "mallory").Option(),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		forger, err := bus.New(nc, "alice", bus.WithoutLifecycle())
		if err != nil {
			t.Fatal(err)
		}
		defer forger.Close()
		_, err = forger.Publish(ctx, bus.Message{To: "bob", Type: "order"})
		if !errors.Is(err, bus.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("Publish as alice error = %v, want ErrPermissionDenied wrapping nats.ErrPermissionViolation", err)
		}
	})
	t.Run("publish as alice through a bus of its own connection", func(t *testing.T) {
		// On a connection of its own the bus sees the server's refusal and
		// fails the publish at once, long before the context's deadline,
		// instead of waiting out the attempt.
		forger, err := bus.Connect(srv.s.ClientURL(), "alice", bus.WithoutLifecycle(),
			bus.WithNATSOptions(srv.identity(t, "mallory").Option()), bus.WithErrorHandler(func(error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer forger.Close()
		// A publish that the refusal did not end would wait out its
		// attempt, an hour here, and end at this deadline, failing with
		// ErrPermissionDenied all the same (read from the connection's
		// last error), so only the context tells the two apart. The
		// deadline is generous for a loaded machine: it was 3 s, below the
		// default attempt's 5 s, and a full run once took longer.
		bus.SetPublishAttemptTimeout(t, time.Hour)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err = forger.Publish(pctx, bus.Message{To: "bob", Type: "order"})
		if !errors.Is(err, bus.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("Publish as alice error = %v, want ErrPermissionDenied wrapping nats.ErrPermissionViolation", err)
		}
		if pctx.Err() != nil {
			t.Errorf("Publish returned only at its context's deadline: the refusal did not end it")
		}
	})
	t.Run("subscribe and look up status as alice, at once", func(t *testing.T) {
		// Consumer and status requests the server refuses end at once with
		// ErrPermissionDenied naming the refused subject, not at the
		// context's deadline with "context deadline exceeded".
		forger, err := bus.Connect(srv.s.ClientURL(), "alice",
			bus.WithNATSOptions(srv.identity(t, "mallory").Option()), bus.WithErrorHandler(func(error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer forger.Close()
		// Requests the refusal did not end would wait out their attempts,
		// an hour here, and end at this deadline (3 s before, which a
		// loaded full run once passed).
		bus.SetAPIAttemptTimeout(t, time.Hour)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		// What the server refuses first names it: alice's reply inbox,
		// which mallory may not subscribe to, or the request itself.
		_, err = forger.Subscribe(pctx, func(context.Context, *bus.Delivery) error { return nil })
		if !errors.Is(err, bus.ErrPermissionDenied) || !strings.Contains(err.Error(), "Permissions Violation for") {
			t.Errorf("Subscribe as alice error = %v, want ErrPermissionDenied naming what was refused", err)
		}
		_, err = forger.Status(pctx, sent.ID)
		if !errors.Is(err, bus.ErrPermissionDenied) || !strings.Contains(err.Error(), "Permissions Violation for") {
			t.Errorf("Status as alice error = %v, want ErrPermissionDenied naming what was refused", err)
		}
		if pctx.Err() != nil {
			t.Errorf("the calls returned only at their context's deadline: the refusals did not end them")
		}
	})
	t.Run("read a conversation it took no part in", func(t *testing.T) {
		// Through the bus: no record of the conversation names mallory.
		if p, err := mallory.bus.History(ctx, sent.ID, bus.HistoryQuery{}); !errors.Is(err, bus.ErrNotParticipant) || len(p.Entries) != 0 {
			t.Errorf("History = %+v, %v; want ErrNotParticipant and nothing", p.Entries, err)
		}
		// Around it: the conversation's records, its history consumers on
		// alice's or bob's subjects, or alice's.
		conv := "$KV." + s.StatusBucket() + "." + subjects.ConversationKey(sent.ID) + ".>"
		mallory.denied(t, "$JS.API.CONSUMER.CREATE.KV_"+s.StatusBucket()+".*."+conv, func(ctx context.Context) error {
			_, err := mallory.js.OrderedConsumer(ctx, "KV_"+s.StatusBucket(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{conv}})
			return err
		})
		for _, c := range []struct{ name, filter string }{
			{"mallory_h", "agentbus.agent.alice.>"},
			{"mallory_hs", "agentbus.agent.*.*.bob.*"},
			{"mallory_hs", "agentbus.agent.alice.*.*.*"},
			{"mallory_ha", "agentbus.agent.>"},
			{"alice_h", "agentbus.agent.alice.>"},
			{"bob_hs", "agentbus.agent.*.*.bob.*"},
		} {
			mallory.denied(t, "$JS.API.CONSUMER.CREATE."+stream+"."+c.name+"."+c.filter, func(ctx context.Context) error {
				_, err := mallory.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Name: c.name, FilterSubject: c.filter,
					AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: sent.Sequence})
				return err
			})
		}
		// Its own sent-messages consumer, with alice's messages hidden in
		// the request body: the server's own check.
		subject := "$JS.API.CONSUMER.CREATE." + stream + ".mallory_hs.agentbus.agent.*.*.mallory.*"
		hiddenFilterRefused(t, mallory.nc, subject, map[string]any{"stream_name": stream, "config": map[string]any{
			"name": "mallory_hs", "filter_subject": "agentbus.agent.alice.>", "ack_policy": "none"}})
	})
	t.Run("file a dead letter as alice", func(t *testing.T) {
		mallory.denied(t, "agentbus.dlq.alice.bob.secret", func(ctx context.Context) error {
			_, err := mallory.js.Publish(ctx, "agentbus.dlq.alice.bob.secret", []byte("forged"))
			return err
		})
	})
	t.Run("delete the stream", func(t *testing.T) {
		mallory.denied(t, "$JS.API.STREAM.DELETE."+stream, func(ctx context.Context) error {
			return mallory.js.DeleteStream(ctx, stream)
		})
	})
	t.Run("purge the stream", func(t *testing.T) {
		mallory.deniedRequest(t, "$JS.API.STREAM.PURGE."+stream, struct{}{})
	})
	t.Run("purge the dead letters", func(t *testing.T) {
		mallory.deniedRequest(t, "$JS.API.STREAM.PURGE."+stream+"_DLQ", struct{}{})
	})
	t.Run("take or forge the unsettled deliveries", func(t *testing.T) {
		// A forged advisory would have the watcher dead-letter, and remove,
		// any message of the stream.
		mallory.deniedRequest(t, "$JS.API.CONSUMER.CREATE."+stream+"_UNSETTLED.watch", map[string]any{"stream_name": stream + "_UNSETTLED"})
		mallory.deniedRequest(t, "$JS.API.STREAM.PURGE."+stream+"_UNSETTLED", struct{}{})
		mallory.deniedRequest(t, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+stream+".alice_p3", map[string]any{"stream_seq": sent.Sequence})
	})
	t.Run("list the stream's subjects", func(t *testing.T) {
		mallory.deniedRequest(t, "$JS.API.STREAM.INFO."+stream, map[string]any{"subjects_filter": ">"})
	})
	t.Run("get a message by sequence", func(t *testing.T) {
		mallory.deniedRequest(t, "$JS.API.STREAM.MSG.GET."+stream, map[string]any{"seq": sent.Sequence})
		mallory.deniedRequest(t, "$JS.API.DIRECT.GET."+stream, map[string]any{"seq": sent.Sequence})
	})
	t.Run("read alice's dead letters", func(t *testing.T) {
		mallory.denied(t, "$JS.API.CONSUMER.CREATE."+stream+"_DLQ.*.agentbus.dlq.alice.*.*", func(ctx context.Context) error {
			_, err := mallory.admin.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "alice"})
			return err
		})
	})
	t.Run("read alice's status record", func(t *testing.T) {
		subject := "$JS.API.DIRECT.GET.KV_" + s.StatusBucket() + "." + statusKey
		mallory.denied(t, subject, func(ctx context.Context) error {
			_, err := mallory.nc.RequestWithContext(ctx, subject, nil)
			return err
		})
	})
	t.Run("list the status bucket's keys", func(t *testing.T) {
		// Stream information with a subjects filter would list every
		// status key: who sent what to whom.
		subject := "$JS.API.STREAM.INFO.KV_" + s.StatusBucket()
		mallory.deniedRequest(t, subject, map[string]any{"subjects_filter": ">"})
	})
	t.Run("read any record through its own key's subject", func(t *testing.T) {
		// mallory may direct-get its own keys; the server refuses a request
		// there that asks for a sequence instead.
		own, err := subjects.StatusKey("c", "m", "mallory", "bob")
		if err != nil {
			t.Fatal(err)
		}
		m, err := mallory.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+s.StatusBucket()+".$KV."+s.StatusBucket()+"."+own, []byte(`{"seq":1}`))
		if err != nil {
			t.Fatal(err)
		}
		if status := m.Header.Get("Status"); status != "408" || len(m.Data) != 0 {
			t.Fatalf("reply status %q with %q, want 408 and nothing", status, m.Data)
		}
	})
	t.Run("look up alice's status records", func(t *testing.T) {
		// The lookup asks the stream for the messages of the ID's window
		// first, with a consumer of every agent's subjects of the window,
		// then the bucket's keys; both are refused.
		mallory.deniedEach(t, []string{"$JS.API.CONSUMER.CREATE." + s.Stream() + ".*." + s.MessageFilters(sent.ID)[0],
			"$JS.API.CONSUMER.CREATE.KV_" + s.StatusBucket() + ".*.$KV." + s.StatusBucket() + ".*." + sent.ID + ".*.*"}, func(ctx context.Context) error {
			_, err := mallory.admin.Status(ctx, sent.ID)
			return err
		})
	})
	t.Run("write alice's status record", func(t *testing.T) {
		mallory.denied(t, statusKey, func(ctx context.Context) error {
			_, err := mallory.js.Publish(ctx, statusKey, []byte(`{"state":"completed"}`))
			return err
		})
	})
	t.Run("write alice's card or presence", func(t *testing.T) {
		for _, subject := range []string{s.RegistrySubjectPrefix() + "card.alice", s.PresenceSubjectPrefix() + "presence.alice"} {
			mallory.denied(t, subject, func(ctx context.Context) error {
				_, err := mallory.js.Publish(ctx, subject, []byte(`{"name":"alice","description":"forged"}`))
				return err
			})
		}
	})
	t.Run("list the lookups' consumers", func(t *testing.T) {
		subject := "$JS.API.CONSUMER.NAMES.KV_" + s.StatusBucket()
		mallory.deniedRequest(t, subject, struct{}{})
	})
	t.Run("roll up a stream", func(t *testing.T) {
		// mallory may write to subjects of each stream, but not purge the
		// stream with a rollup: the message streams allow none, and
		// Provision turns them off on the status and registry buckets.
		// (The presence bucket must allow them: docs/security.md.)
		own, err := subjects.StatusKey("c", "m", "mallory", "bob")
		if err != nil {
			t.Fatal(err)
		}
		for _, subject := range []string{"$KV." + s.StatusBucket() + "." + own, "agentbus.agent.bob.p1.mallory.x", "agentbus.dlq.mallory.bob.x",
			s.RegistrySubjectPrefix() + "card.mallory", s.RegistrySubjectPrefix() + "group.crew.mallory"} {
			m := &nats.Msg{Subject: subject, Header: nats.Header{"Nats-Rollup": []string{"all"}}}
			_, err = mallory.js.PublishMsg(ctx, m)
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10111 || !strings.Contains(apiErr.Description, "rollup not permitted") {
				t.Errorf("rollup on %s: error %v, want 10111 rollup not permitted", subject, err)
			}
		}
	})

	t.Run("roll up the presence bucket", func(t *testing.T) {
		// The presence bucket must allow rollups (subject delete markers),
		// so mallory can purge every presence record: alice reads unknown
		// until her next heartbeat writes hers again (docs/security.md).
		subject := s.PresenceSubjectPrefix() + "presence.mallory"
		m := &nats.Msg{Subject: subject, Header: nats.Header{"Nats-Rollup": []string{"all"}}}
		if _, err := mallory.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("rollup on %s: %v", subject, err)
		}
		purged := time.Now()
		waitLastSeen(t, srv.admin, "alice", purged)
	})

	// Nothing mallory tried reached alice's message or its record, her card
	// or her membership.
	if sts, err := srv.admin.Status(ctx, sent.ID); err != nil || len(sts) != 1 {
		t.Errorf("bob's message to alice has records %+v, %v; want its one record", sts, err)
	}
	if info, err := srv.admin.LookupAgent(ctx, "alice"); err != nil || info.Card.Description != "alice's card" {
		t.Errorf("alice's card %+v, %v; want hers", info.Card, err)
	}
	if members, err := srv.admin.GroupMembers(ctx, "crew"); err != nil || !slices.Equal(members, []string{"alice"}) {
		t.Errorf("crew's members %q, %v; want alice", members, err)
	}
	r := newRecorder()
	subscribe(t, alice, r.handle)
	if got := r.waitCount(t, 1); got[0].ID != sent.ID || string(got[0].Data) != "for alice" || got[0].Deliveries != 1 {
		t.Errorf("alice got %+v, want bob's message on its first delivery", got[0])
	}
	select {
	case err := <-mallory.errs:
		t.Errorf("unexpected error for mallory: %v", err)
	default:
	}
	for agent, errs := range map[string]*errorTally{"alice": &aliceErrs, "bob": &bobErrs} {
		if errs.total() != 0 {
			t.Errorf("%s: background errors %v", agent, errs)
		}
	}
}

// hiddenFilterRefused sends a consumer create request on subject, which
// the agent's permissions allow, with a body whose filter is not the
// subject's, and checks that the server refuses it (10131).
func hiddenFilterRefused(t *testing.T, nc *nats.Conn, subject string, body map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	m, err := nc.RequestWithContext(testContext(t), subject, data)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error == nil || resp.Error.ErrorCode != 10131 {
		t.Fatalf("response %s, want error 10131 (filter does not match the subject's)", m.Data)
	}
}

// TestCancelDeniedToOthers: only a message's sender, its recipient and an
// operator may cancel it. Another agent finds no record naming it, cannot
// write the record under its own credentials, and a notice it forges is
// ignored by the recipient, which handles the message as usual.
func TestCancelDeniedToOthers(t *testing.T) {
	srv := newAuthServer(t, "alice", "bob", "mallory")
	ctx := testContext(t)
	aliceErrs := make(chan error, 16)
	alice := srv.agentBus(t, "alice", func(err error) { aliceErrs <- err })
	bob := srv.agentBus(t, "bob", func(error) {})
	mallory := srv.agentBus(t, "mallory", func(error) {})
	sent := publish(t, bob, bus.Message{To: "alice", Type: "task"})
	waitState(t, bob, sent.ID, bus.StatePending)

	if _, err := mallory.Cancel(ctx, sent.ID); !errors.Is(err, bus.ErrPermissionDenied) && !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("mallory's Cancel: %v, want ErrPermissionDenied or ErrNoStatus", err)
	}
	forged, _ := json.Marshal(map[string]string{"id": sent.ID, "from": "bob", "by": "bob"})
	publish(t, mallory, bus.Message{To: "alice", Type: bus.TypeCancel, Priority: 1, CausationID: sent.ID,
		ContentType: "application/json", Data: forged})

	r := newRecorder()
	subscribe(t, alice, r.handle)
	if got := r.waitCount(t, 1); got[0].ID != sent.ID {
		t.Fatalf("alice handled %+v, want bob's task", got[0].Message)
	}
	waitState(t, bob, sent.ID, bus.StateCompleted)
	select {
	case err := <-aliceErrs:
		if !strings.Contains(err.Error(), "cancel notice for "+sent.ID+" from mallory ignored") {
			t.Errorf("alice's error %v, want the forged notice ignored", err)
		}
	case <-ctx.Done():
		t.Error("the forged notice was not reported")
	}
}

// forgeCancel has mallory cancel message id at agent victim the way her
// permissions allow: she writes a canceled record under a key that names
// her as the sender or the recipient, then sends victim a notice that
// names the same.
func forgeCancel(t *testing.T, mallory *intruder, conv, id, from, to, victim string) {
	t.Helper()
	ctx := testContext(t)
	key, err := subjects.StatusKey(conv, id, from, to)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec, _ := json.Marshal(map[string]any{"id": id, "from": from, "to": to, "state": "canceled",
		"by": "mallory", "correlationId": conv, "time": now, "updated": now})
	if _, err := mallory.js.Publish(ctx, "$KV."+subjects.Default().StatusBucket()+"."+key, rec); err != nil {
		t.Fatalf("mallory writes a record of her own: %v", err)
	}
	notice, _ := json.Marshal(map[string]string{"id": id, "from": from, "to": to, "by": "mallory"})
	publish(t, mallory.bus, bus.Message{To: victim, Type: bus.TypeCancel, Priority: 1,
		CorrelationID: conv, CausationID: id, ContentType: "application/json", Data: notice})
}

// noticeTaken waits until agent's bus has taken every cancel notice
// stored for it: its priority-1 consumer acked them.
func noticeTaken(t *testing.T, b *bus.Bus, agent string, n uint64) {
	t.Helper()
	waitFor(t, agent+" took the notice", func() (bool, string) {
		info, err := consumerInfo(t, b, agent+"_p1")
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Consumer >= n && info.NumAckPending == 0, fmt.Sprintf("%+v", info.AckFloor)
	})
}

// TestForgedCancelNotice: an agent cannot cancel another's message with a
// record it may write (naming itself) and a notice naming the same: not a
// recipient's handling of a broadcast, nor of a group copy, nor a sender's
// Gather waiting for another member's copy. Before, the recipient matched
// the notice to a handling by ID alone, and the sender to a Request by ID
// alone (found by a helper session).
func TestForgedCancelNotice(t *testing.T) {
	// handling subscribes alice with a handler that holds the message
	// with type typ until released, and reports whether it was canceled.
	handling := func(t *testing.T, alice *bus.Bus, typ string) (started <-chan *bus.Delivery, release chan<- struct{}, canceled <-chan bool) {
		ds, done, out := make(chan *bus.Delivery, 1), make(chan struct{}), make(chan bool, 1)
		subscribe(t, alice, func(ctx context.Context, d *bus.Delivery) error {
			if d.Type != typ {
				return nil
			}
			ds <- d
			<-done
			out <- ctx.Err() != nil
			return nil
		}, bus.WithConcurrency(2)) // the notice's stored copy comes through while one runs
		return ds, done, out
	}
	t.Run("broadcast", func(t *testing.T) {
		srv := newAuthServer(t, "alice", "bob", "mallory")
		alice, bob := srv.agentBus(t, "alice", func(error) {}), srv.agentBus(t, "bob", func(error) {})
		mallory := newIntruder(t, srv, "mallory")
		started, release, canceled := handling(t, alice, "long")
		note := publish(t, bob, bus.Message{To: bus.Broadcast, Type: "long"})
		<-started
		forgeCancel(t, mallory, note.ID, note.ID, "mallory", "alice", "alice")
		noticeTaken(t, alice, "alice", 1)
		close(release)
		if <-canceled {
			t.Error("alice's handling of bob's broadcast was canceled by mallory")
		}
	})
	t.Run("group copy", func(t *testing.T) {
		srv := newAuthServer(t, "alice", "bob", "mallory")
		ctx := testContext(t)
		alice, bob := srv.agentBus(t, "alice", func(error) {}), srv.agentBus(t, "bob", func(error) {})
		mallory := newIntruder(t, srv, "mallory")
		for _, b := range []*bus.Bus{alice, mallory.bus} {
			if err := b.JoinGroup(ctx, "crew"); err != nil {
				t.Fatal(err)
			}
		}
		started, release, canceled := handling(t, alice, "task")
		if _, err := bob.PublishGroup(ctx, "crew", bus.Message{Type: "task"}); err != nil {
			t.Fatal(err)
		}
		aliceCopy := <-started // mallory can derive its ID from her own copy's
		forgeCancel(t, mallory, aliceCopy.CorrelationID, aliceCopy.ID, "mallory", "alice", "alice")
		noticeTaken(t, alice, "alice", 1)
		close(release)
		if <-canceled {
			t.Error("alice's handling of bob's copy was canceled by mallory")
		}
	})
	t.Run("gather", func(t *testing.T) {
		srv := newAuthServer(t, "alice", "bob", "mallory")
		ctx := testContext(t)
		alice, bob := srv.agentBus(t, "alice", func(error) {}), srv.agentBus(t, "bob", func(error) {})
		mallory := newIntruder(t, srv, "mallory")
		subscribe(t, bob, func(context.Context, *bus.Delivery) error { return nil })
		copies, forged := make(chan *bus.Delivery, 1), make(chan struct{})
		subscribe(t, alice, func(ctx context.Context, d *bus.Delivery) error {
			copies <- d // mallory can derive its ID from her own copy
			<-forged
			_, err := d.Reply(ctx, bus.Message{Type: "answer"})
			return err
		})
		subscribe(t, mallory.bus, func(ctx context.Context, d *bus.Delivery) error {
			_, err := d.Reply(ctx, bus.Message{Type: "answer"})
			return err
		})
		results := make(chan *bus.GatherResult, 1)
		go func() {
			res, _ := bob.Gather(ctx, bus.Message{Type: "question"}, []string{"alice", "mallory"})
			results <- res
		}()
		d := <-copies
		// A record naming mallory as the sender, then one naming her as
		// the recipient, each with its notice to bob.
		forgeCancel(t, mallory, d.CorrelationID, d.ID, "mallory", "bob", "bob")
		forgeCancel(t, mallory, d.CorrelationID, d.ID, "bob", "mallory", "bob")
		noticeTaken(t, bob, "bob", 2)
		close(forged)
		if res := <-results; res == nil || !res.Replied("alice") {
			t.Errorf("bob's Gather has no reply from alice; failed: %+v", res.Failed)
		}
	})
}

// TestForgedRecordBody: a record is read only as the message its key
// names. mallory may write keys naming her; one that says, under such a
// key, that alice dead-lettered bob's broadcast is not among bob's
// statuses. Before, the body was taken as it was (found by a helper
// session).
func TestForgedRecordBody(t *testing.T) {
	srv := newAuthServer(t, "alice", "bob", "mallory")
	ctx := testContext(t)
	alice, bob := srv.agentBus(t, "alice", func(error) {}), srv.agentBus(t, "bob", func(error) {})
	mallory := newIntruder(t, srv, "mallory")
	r := newRecorder()
	subscribe(t, alice, r.handle)
	note := publish(t, bob, bus.Message{To: bus.Broadcast, Type: "note", TTL: time.Hour})
	r.waitCount(t, 1)
	waitState(t, bob, note.ID, bus.StateCompleted)
	key, err := subjects.StatusKey(note.ID, note.ID, "mallory", "bob")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	body, _ := json.Marshal(map[string]any{"id": note.ID, "from": "bob", "to": "alice", "type": "note", "priority": 3,
		"correlationId": note.ID, "state": "dead_lettered", "by": "alice", "time": now, "updated": now})
	if _, err := mallory.js.Publish(ctx, "$KV."+subjects.Default().StatusBucket()+"."+key, body); err != nil {
		t.Fatalf("mallory writes a key naming her: %v", err)
	}
	sts, err := bob.Status(ctx, note.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.State == bus.StateDeadLettered {
			t.Errorf("bob's Status reports the record mallory wrote: %+v", sts)
		}
	}
}

// TestUndecodableRecord: a record that is not one, which an agent wrote
// under a key naming it, keeps nobody from reading the conversation or a
// broadcast's statuses: it is passed over. Before, History, Conversation
// and the Status of a broadcast failed as a whole (found by a helper
// session).
func TestUndecodableRecord(t *testing.T) {
	srv := newAuthServer(t, "alice", "bob", "mallory")
	ctx := testContext(t)
	alice, bob := srv.agentBus(t, "alice", func(error) {}), srv.agentBus(t, "bob", func(error) {})
	mallory := newIntruder(t, srv, "mallory")
	r := newRecorder()
	subscribe(t, bob, r.handle)
	const conv = "conv-bad-record"
	publish(t, alice, bus.Message{ID: "m-1", To: "bob", Type: "task", CorrelationID: conv})
	note := publish(t, alice, bus.Message{To: bus.Broadcast, Type: "note", CorrelationID: conv})
	r.waitCount(t, 2)
	for key, data := range map[string]string{"junk": "not json", note.ID: `{"priority":"high"}`} {
		k, err := subjects.StatusKey(conv, key, "mallory", "bob")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mallory.js.Publish(ctx, "$KV."+subjects.Default().StatusBucket()+"."+k, []byte(data)); err != nil {
			t.Fatalf("mallory writes a key naming her: %v", err)
		}
	}
	if p, err := srv.admin.History(ctx, conv, bus.HistoryQuery{}); err != nil || len(p.Entries) != 2 {
		t.Errorf("Admin.History = %+v, %v; want the two messages", p, err)
	}
	if _, err := bob.History(ctx, conv, bus.HistoryQuery{}); err != nil {
		t.Errorf("bob's History: %v", err)
	}
	if _, err := srv.admin.Conversation(ctx, conv); err != nil {
		t.Errorf("Admin.Conversation: %v", err)
	}
	for _, st := range []interface {
		Status(context.Context, string) ([]bus.Status, error)
	}{srv.admin, bob} {
		if _, err := st.Status(ctx, note.ID); err != nil {
			t.Errorf("Status of the broadcast: %v", err)
		}
	}
}

// TestAgentOnAnUnprovisionedBus: an agent under its generated permissions
// that publishes to a bus nobody provisioned is told so (ErrNotProvisioned,
// with what to run), as an unrestricted connection is. Before, the check
// that tells a missing stream from one that cannot answer asked for
// stream info, which agents may not, and it said ErrUnavailable (found by
// a helper session).
func TestAgentOnAnUnprovisionedBus(t *testing.T) {
	setup, err := auth.Generate(auth.Config{Agents: []string{"alice", "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), auth.ConfigFileName)
	if err := os.WriteFile(file, setup.ServerConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.ConfigFile = file })
	id, _ := setup.Agent("alice")
	b, err := bus.Connect(s.ClientURL(), "alice", bus.WithNATSOptions(id.Option()), bus.WithErrorHandler(func(error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Publish(testContext(t), bus.Message{To: "bob", Type: "task"}); !errors.Is(err, bus.ErrNotProvisioned) {
		t.Errorf("Publish on an unprovisioned bus, as an agent: %v; want ErrNotProvisioned", err)
	}
}
