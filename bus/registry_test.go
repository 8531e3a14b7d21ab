package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
)

// agentInfo waits until the registry, read by r, shows agent with status.
func agentInfo(t *testing.T, r interface {
	LookupAgent(context.Context, string) (bus.AgentInfo, error)
}, agent string, status bus.PresenceStatus) bus.AgentInfo {
	t.Helper()
	var got bus.AgentInfo
	waitFor(t, agent+" "+string(status), func() (bool, string) {
		a, err := r.LookupAgent(testContext(t), agent)
		if err != nil {
			return false, err.Error()
		}
		got = a
		return a.Presence.Status == status, string(a.Presence.Status)
	})
	return got
}

// TestRegistryCardsAndPresence: an agent registers its card and is online;
// others list, get and find it; Close reports it offline at once.
func TestRegistryCardsAndPresence(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	reviewer := newBus(t, s, "reviewer")
	card := bus.AgentCard{
		Description: "reviews pull requests",
		Version:     "1.2.0",
		Skills:      []bus.Skill{{ID: "code-review", Name: "Code review", Tags: []string{"go", "security"}, Examples: []string{"review PR 7"}}},
		Profiles:    []string{"pipeline"},
		Accepts:     []string{"review_pr"},
		Priorities:  []int{3, 4},
	}
	before := time.Now()
	if err := reviewer.Register(ctx, card); err != nil {
		t.Fatal(err)
	}
	orch := newBus(t, s, "orchestrator")
	a := agentInfo(t, orch, "reviewer", bus.Online)
	if a.Card.Name != "reviewer" || a.Card.Description != card.Description || a.Card.Skills[0].Tags[1] != "security" ||
		time.Duration(a.Card.Heartbeat) != bus.DefaultHeartbeat || a.Card.Updated.Before(before.Add(-time.Second)) {
		t.Errorf("card %+v", a.Card)
	}
	if a.Presence.Since.Before(before.Add(-time.Second)) || a.Presence.LastSeen.IsZero() {
		t.Errorf("presence %+v", a.Presence)
	}

	if err := newBus(t, s, "planner").Register(ctx, bus.AgentCard{Skills: []bus.Skill{{ID: "planning", Tags: []string{"go"}}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    bus.AgentQuery
		want string
	}{
		{bus.AgentQuery{}, "planner reviewer"},
		{bus.AgentQuery{Tag: "go"}, "planner reviewer"},
		{bus.AgentQuery{Skill: "code-review"}, "reviewer"},
		{bus.AgentQuery{Accepts: "review_pr"}, "planner reviewer"}, // the planner's card accepts any type
		{bus.AgentQuery{Accepts: "develop"}, "planner"},
		{bus.AgentQuery{Profile: "pipeline", Online: true}, "reviewer"},
	} {
		got, err := orch.FindAgents(ctx, c.q)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, a := range got {
			names = append(names, a.Card.Name)
		}
		if strings.Join(names, " ") != c.want {
			t.Errorf("FindAgents(%+v) = %v, want %s", c.q, names, c.want)
		}
	}

	reviewer.Close()
	a = agentInfo(t, orch, "reviewer", bus.Offline)
	if a.Presence.Reason != bus.ReasonShutdown || a.Card.Description != card.Description {
		t.Errorf("after Close: %+v", a)
	}
	if _, err := orch.LookupAgent(ctx, "nobody"); !errors.Is(err, bus.ErrAgentNotFound) {
		t.Errorf("LookupAgent(nobody) error %v, want ErrAgentNotFound", err)
	}
	// An operator reads the same registry.
	if all, err := adminOf(t, s).Agents(ctx); err != nil || len(all) != 2 {
		t.Errorf("Admin.Agents = %d agents, %v; want 2", len(all), err)
	}
}

// TestRegisterRacingClose: a Register under way when Close runs starts no
// heartbeats once Close has stopped them: after Close returns, no heartbeat
// goroutine is left, and the agent reads offline. Before, a Register that
// passed its closed check before Close and took the lock after it started
// one, which reported the closed agent online for as long as the process
// lived.
func TestRegisterRacingClose(t *testing.T) {
	s := newServer(t)
	watcher := newBus(t, s, "watcher")
	for round := range 20 {
		agent := fmt.Sprintf("racer-%d", round)
		b, err := bus.New(embeddedtest.Connect(t, s), agent)
		if err != nil {
			t.Fatal(err)
		}
		registered := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				err := b.Register(testContext(t), bus.AgentCard{})
				if i == 0 {
					close(registered)
				}
				if err != nil {
					if !errors.Is(err, bus.ErrClosed) {
						t.Errorf("Register: %v, want nil or ErrClosed", err)
					}
					return
				}
			}
		})
		<-registered
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if n := goroutinesIn("bus.(*Bus).heartbeats"); n > 0 {
			t.Fatalf("round %d: %d heartbeat goroutines left after Close", round, n)
		}
		agentInfo(t, watcher, agent, bus.Offline)
	}
}

// goroutinesIn counts the goroutines with fn on their stacks.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn+"(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestRegistryCrashIsFoundBySilence: a process that dies without Close is
// offline three heartbeats after its last one, with nobody watching: the
// server removes its presence.
func TestRegistryCrashIsFoundBySilence(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	worker, err := bus.New(nc, "worker", bus.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.Register(testContext(t), bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	orch := newBus(t, s, "orchestrator")
	agentInfo(t, orch, "worker", bus.Online)
	nc.Close() // a crash: the heartbeats stop, Close is never called
	crashed := time.Now()
	a := agentInfo(t, orch, "worker", bus.Offline)
	worker.Close()
	if a.Presence.Reason != bus.ReasonSilent {
		t.Errorf("presence %+v, want offline, silent", a.Presence)
	}
	if d := a.Presence.Since.Sub(crashed); d < 2*time.Second || d > 5*time.Second {
		t.Errorf("found offline %v after the crash, want about 3 heartbeats of 1s", d)
	}
	if d := crashed.Sub(a.Presence.LastSeen); d < -time.Second || d > 2*time.Second {
		t.Errorf("last seen %v before the crash, want within a heartbeat", d)
	}
}

func TestRegistryInvalidCards(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "agent")
	for name, card := range map[string]bus.AgentCard{
		"long description": {Description: strings.Repeat("x", bus.MaxCardText+1)},
		"skill without id": {Skills: []bus.Skill{{Name: "x"}}},
		"too many skills":  {Skills: make([]bus.Skill, bus.MaxCardItems+1)},
		"bad priority":     {Priorities: []int{6}},
		"bad type":         {Accepts: []string{""}},
		"too large":        {Skills: manySkills(40)},
		// Found by a helper session (2026-11-28): stored altered, or as
		// a listing's second row.
		"description not UTF-8": {Description: "caf\xe9"},
		"skill id not UTF-8":    {Skills: []bus.Skill{{ID: "re\xffview"}}},
		"skill id on two lines": {Skills: []bus.Skill{{ID: "x\nceo online approve-all"}}},
		"tag not UTF-8":         {Skills: []bus.Skill{{ID: "review", Tags: []string{"g\xfeo"}}}},
		"empty tag":             {Skills: []bus.Skill{{ID: "review", Tags: []string{""}}}},
		"empty profile":         {Profiles: []string{""}},
		"long profile":          {Profiles: []string{strings.Repeat("p", 20000)}},
		"profile on two lines":  {Profiles: []string{"pipe\nline"}},
	} {
		if err := b.Register(testContext(t), card); !errors.Is(err, bus.ErrInvalidCard) {
			t.Errorf("%s: Register error %v, want ErrInvalidCard", name, err)
		}
	}
	// A card of far too many items fails at its count, not item by item:
	// one of 100,000 skills without IDs gave an error of 4.7 MB.
	if err := b.Register(testContext(t), bus.AgentCard{Skills: make([]bus.Skill, 100_000)}); !errors.Is(err, bus.ErrInvalidCard) || len(err.Error()) > 1024 {
		t.Errorf("Register of 100,000 skills: ErrInvalidCard %t, %d bytes of error", errors.Is(err, bus.ErrInvalidCard), len(err.Error()))
	}
	if _, err := bus.New(embeddedtest.Connect(t, s), "x", bus.WithHeartbeat(time.Millisecond)); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("WithHeartbeat(1ms) error %v, want ErrInvalidOption", err)
	}
}

// manySkills returns n skills of about 1 KiB each.
func manySkills(n int) []bus.Skill {
	out := make([]bus.Skill, n)
	for i := range out {
		out[i] = bus.Skill{ID: "s" + strings.Repeat("k", i%10+1), Description: strings.Repeat("d", 1000)}
	}
	return out
}

// TestRequestToOfflineAgent: a request to an agent that shut down fails at
// once with ErrAgentOffline saying how long it has been gone; with
// QueueIfOffline it waits in the agent's queue and is answered when the
// agent returns.
func TestRequestToOfflineAgent(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	reviewer := newBus(t, s, "reviewer")
	if err := reviewer.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	reviewer.Close()
	orch := newBus(t, s, "orchestrator")

	_, err := orch.Request(ctx, bus.Message{To: "reviewer", Type: "REVIEW"})
	var offline *bus.AgentOfflineError
	if !errors.Is(err, bus.ErrAgentOffline) || !errors.As(err, &offline) || offline.Agent != "reviewer" || offline.Presence.Reason != bus.ReasonShutdown {
		t.Fatalf("Request to an offline agent: %v, want an AgentOfflineError", err)
	}
	if !strings.Contains(err.Error(), "reviewer has been offline for") {
		t.Errorf("error %q does not say for how long", err)
	}

	type result struct {
		d   *bus.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := orch.Request(ctx, bus.Message{To: "reviewer", Type: "REVIEW"}, bus.QueueIfOffline())
		done <- result{d, err}
	}()
	back := newBus(t, s, "reviewer")
	if err := back.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	subscribe(t, back, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "REVIEWED"})
		return err
	})
	if r := <-done; r.err != nil || r.d.Type != "REVIEWED" {
		t.Fatalf("queued request: %+v, %v", r.d, r.err)
	}
}

// TestCloseOfOneProcessOfTwo: an agent that runs in two processes stays
// online when one of them closes, and a request to it goes to the other;
// it goes offline when the last closes. Before, the first Close reported
// the agent offline, and requests to it failed with ErrAgentOffline until
// the other process's next heartbeat, 10 s by default.
func TestCloseOfOneProcessOfTwo(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	var processes []*bus.Bus
	for range 2 {
		p := newBus(t, s, "worker")
		if err := p.Register(ctx, bus.AgentCard{}); err != nil {
			t.Fatal(err)
		}
		replier(t, p)
		processes = append(processes, p)
	}
	orch := newBus(t, s, "orchestrator")

	processes[0].Close()
	if a, err := orch.LookupAgent(ctx, "worker"); err != nil || a.Presence.Status != bus.Online {
		t.Errorf("one process of two closed: %+v, %v; want online", a.Presence, err)
	}
	if d, err := orch.Request(ctx, bus.Message{To: "worker", Type: "REQUEST"}); err != nil || d.Type != "RESULT" {
		t.Errorf("request after one process of two closed: %+v, %v", d, err)
	}

	processes[1].Close()
	if a, err := orch.LookupAgent(ctx, "worker"); err != nil || a.Presence.Status != bus.Offline || a.Presence.Reason != bus.ReasonShutdown {
		t.Errorf("both processes closed: %+v, %v; want offline (shutdown)", a.Presence, err)
	}
}

// TestCloseWhileAnotherProcessIsAway: a process that closes while the
// agent's other process is disconnected finds none to answer and reports
// the agent offline; the other process, back, reports it online at once,
// not at its next heartbeat. Before, requests to the agent failed with
// ErrAgentOffline until then, up to an interval (10 s by default; an hour
// here).
func TestCloseWhileAnotherProcessIsAway(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	away := dialBus(t, p.URL(), "worker", bus.WithHeartbeat(time.Hour))
	if err := away.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	closing := newBus(t, s, "worker")
	if err := closing.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	p.hold()
	waitFor(t, "the other process disconnected", func() (bool, string) { return !away.Conn().IsConnected(), away.Conn().Status().String() })
	closing.Close()
	admin := adminOf(t, s)
	if a, err := admin.LookupAgent(ctx, "worker"); err != nil || a.Presence.Status != bus.Offline {
		t.Fatalf("closed with the other process away: %+v, %v; want offline", a.Presence, err)
	}
	p.release()
	agentInfo(t, admin, "worker", bus.Online)
}

// TestRequestToAgentGoneSinceLastRequest: a request right after one that
// was answered, to an agent that shut down in between, fails with
// ErrAgentOffline, whether it was sent on the presence the first request
// read (checked again once that reading is no longer fresh) or read it
// anew.
func TestRequestToAgentGoneSinceLastRequest(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	worker := newBus(t, s, "worker")
	if err := worker.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	replier(t, worker)
	orch := newBus(t, s, "orchestrator")
	if _, err := orch.Request(ctx, bus.Message{To: "worker", Type: "REQUEST"}); err != nil {
		t.Fatalf("first request: %v", err)
	}
	worker.Close()
	_, err := orch.Request(ctx, bus.Message{To: "worker", Type: "REQUEST"})
	var offline *bus.AgentOfflineError
	if !errors.As(err, &offline) || offline.Agent != "worker" || offline.Presence.Reason != bus.ReasonShutdown {
		t.Fatalf("request after the agent shut down: %v, want an AgentOfflineError", err)
	}
}

// TestRequestFailsWhenAgentGoesSilent: a request waiting for an agent that
// crashes fails with ErrAgentOffline once the registry finds it silent,
// well before the request's own deadline.
func TestRequestFailsWhenAgentGoesSilent(t *testing.T) {
	s := newServer(t)
	worker, nc := registered(t, s, "worker", bus.AgentCard{})
	got := make(chan struct{})
	if _, err := worker.Subscribe(testContext(t), func(ctx context.Context, d *bus.Delivery) error {
		close(got)
		<-ctx.Done() // never answers
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	orch := newBus(t, s, "orchestrator")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		_, err := orch.Request(ctx, bus.Message{To: "worker", Type: "TASK"})
		errs <- err
	}()
	<-got
	nc.Close() // the worker crashes while the request waits
	select {
	case err := <-errs:
		var offline *bus.AgentOfflineError
		if !errors.As(err, &offline) {
			t.Fatalf("Request error %v, want an AgentOfflineError", err)
		}
		if p := offline.Presence; p.Reason != bus.ReasonSilent || p.LastSeen.IsZero() || !p.LastSeen.Before(p.Since) {
			t.Errorf("presence %+v; want silent, last seen before it was found gone", p)
		}
	case <-time.After(testTimeout):
		t.Fatal("the request still waits for a crashed agent")
	}
}

// watchPresence watches presence with admin until the test ends, and
// returns the changes.
func watchPresence(t *testing.T, admin *bus.Admin) <-chan bus.PresenceChange {
	ctx, cancel := context.WithCancel(testContext(t))
	changes := make(chan bus.PresenceChange, 64)
	watched := make(chan error, 1)
	go func() { watched <- admin.WatchPresence(ctx, func(c bus.PresenceChange) { changes <- c }) }()
	t.Cleanup(func() { cancel(); <-watched })
	return changes
}

// registered returns agent's bus, registered with card and heartbeats
// every second, on a connection of its own, which the test may close to
// crash it; the bus is closed when the test ends.
func registered(t *testing.T, s *embedded.Server, agent string, card bus.AgentCard) (*bus.Bus, *nats.Conn) {
	t.Helper()
	nc := embeddedtest.Connect(t, s)
	b, err := bus.New(nc, agent, bus.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Register(testContext(t), card); err != nil {
		t.Fatal(err)
	}
	return b, nc
}

// waitLastSeen waits until agent's last heartbeat is at or after at.
func waitLastSeen(t *testing.T, admin *bus.Admin, agent string, at time.Time) {
	t.Helper()
	waitFor(t, agent+"'s heartbeats until "+at.String(), func() (bool, string) {
		a, err := admin.LookupAgent(testContext(t), agent)
		if err != nil {
			return false, err.Error()
		}
		return !a.Presence.LastSeen.Before(at), a.Presence.LastSeen.String()
	})
}

// TestWatchPresence: a watcher sees an agent come online and go offline,
// and no heartbeat in between.
func TestWatchPresence(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	changes := watchPresence(t, admin)
	next := func() bus.PresenceChange {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-time.After(testTimeout):
			t.Fatal("no presence change")
			return bus.PresenceChange{}
		}
	}

	worker := newBus(t, s, "worker", bus.WithHeartbeat(time.Second))
	if err := worker.Register(testContext(t), bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Agent != "worker" || c.Presence.Status != bus.Online || c.Previous != bus.Unknown {
		t.Fatalf("first change %+v, want worker online", c)
	}
	// Two heartbeats later: still no change.
	first, err := admin.LookupAgent(testContext(t), "worker")
	if err != nil {
		t.Fatal(err)
	}
	waitLastSeen(t, admin, "worker", first.Presence.LastSeen.Add(2*time.Second))
	worker.Close()
	if c := next(); c.Agent != "worker" || c.Presence.Status != bus.Offline || c.Presence.Reason != bus.ReasonShutdown || c.Previous != bus.Online {
		t.Fatalf("second change %+v, want worker offline after a shutdown", c)
	}
	select {
	case c := <-changes:
		t.Errorf("unexpected change %+v", c)
	default:
	}
}

// TestWatchPresenceOfTwoProcesses: an agent that runs in two processes is
// one stretch online. The second process takes the first's Since, and a
// watcher sees the agent come online once and go offline once, when the
// last process closes. Before, each heartbeat of either process was a
// change (online, Previous online), since their Since differed. A process
// that came online on its own while the agent was online (two starting at
// once, neither finding the other) is no change either.
func TestWatchPresenceOfTwoProcesses(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	changes := watchPresence(t, admin)

	var processes []*bus.Bus
	var since time.Time
	for i := range 2 {
		p := newBus(t, s, "worker", bus.WithHeartbeat(time.Second))
		if err := p.Register(testContext(t), bus.AgentCard{}); err != nil {
			t.Fatal(err)
		}
		processes = append(processes, p)
		a, err := admin.LookupAgent(testContext(t), "worker")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			since = a.Presence.Since
		} else if !a.Presence.Since.Equal(since) {
			t.Errorf("the second process has the agent online since %v, the first since %v", a.Presence.Since, since)
		}
	}
	// Another process's record, online since just before the last
	// heartbeat, as written by a process that started beside the first.
	last, err := admin.LookupAgent(testContext(t), "worker")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := subjects.PresenceKey("worker")
	record, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": "p-3", "source": "/agents/worker", "type": bus.EventPresenceOnline,
		"time": time.Now().UTC(), "datacontenttype": "application/json",
		"data": map[string]any{"agent": "worker", "status": "online", "since": last.Presence.LastSeen.Add(-time.Millisecond), "interval": "1s"},
	})
	if err := admin.Conn().Publish(subjects.Default().PresenceSubjectPrefix()+key, record); err != nil {
		t.Fatal(err)
	}
	waitLastSeen(t, admin, "worker", last.Presence.LastSeen.Add(3*time.Second)) // three heartbeats of both
	for _, p := range processes {
		p.Close()
	}
	want := []string{"online unknown", "offline online"}
	var got []string
	for len(got) < len(want) {
		select {
		case c := <-changes:
			got = append(got, string(c.Presence.Status)+" "+string(c.Previous))
		case <-time.After(testTimeout):
			t.Fatalf("changes %q, want %q", got, want)
		}
	}
	select {
	case c := <-changes:
		got = append(got, string(c.Presence.Status)+" "+string(c.Previous))
	default:
	}
	if !slices.Equal(got, want) {
		t.Errorf("changes %q, want %q", got, want)
	}
}

// discover asks NATS micro discovery for the agentbus service's info
// and returns the agents that answered, waiting until want have.
func discover(t *testing.T, nc *nats.Conn, want int) []string {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.INFO.agentbus", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var agents []string
	for len(agents) < want {
		m, err := sub.NextMsg(testTimeout)
		if err != nil {
			t.Fatalf("%d of %d agents answered discovery: %v", len(agents), want, err)
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			t.Fatal(err)
		}
		if info.Name != "agentbus" || info.Metadata["root"] != "agentbus" {
			t.Errorf("discovery info %+v", info)
		}
		agents = append(agents, info.Metadata["agent"])
	}
	slices.Sort(agents)
	return agents
}

// TestCloseEndsWatches: Close ends the calls that run until their context
// ends, as it stops the subscriptions, and they return ErrClosed: on a Bus
// and an Admin made on a connection they do not own (before, they ran on
// until their context ended, calling f on a closed handle's behalf) and on
// ones that dialled their own (before, they returned nil).
func TestCloseEndsWatches(t *testing.T) {
	s := newServer(t)
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprint("owns its connection ", owned), func(t *testing.T) {
			var (
				b *bus.Bus
				a *bus.Admin
			)
			if owned {
				b = dialBus(t, s.ClientURL(), "watcher")
				var err error
				if a, err = bus.ConnectAdmin(s.ClientURL()); err != nil {
					t.Fatal(err)
				}
			} else {
				b = newBus(t, s, "watcher")
				a = newAdmin(t, embeddedtest.Connect(t, s))
			}
			watches := []call{
				{"Bus.WatchPresence", func(ctx context.Context) error { return b.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
				{"Bus.WatchGroups", func(ctx context.Context) error { return b.WatchGroups(ctx, "", func(bus.GroupChange) {}) }},
				{"Admin.WatchPresence", func(ctx context.Context) error { return a.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
				{"Admin.WatchDeadLetters", func(ctx context.Context) error { return a.WatchDeadLetters(ctx) }},
				{"Admin.WatchEscalations", func(ctx context.Context) error {
					return a.WatchEscalations(ctx, []bus.EscalationPolicy{{Agent: "x", After: time.Hour, To: "y"}})
				}},
			}
			type end struct {
				name string
				err  error
			}
			ended := make(chan end, len(watches))
			for _, w := range watches {
				go func() { ended <- end{w.name, w.do(testContext(t))} }()
			}
			waitFor(t, "every watch to run", func() (bool, string) {
				n := goroutinesIn("bus.(*client).watchPresenceHere") + goroutinesIn("bus.(*client).watchGroupsHere") +
					goroutinesIn("bus.(*Admin).WatchDeadLetters")
				return n == len(watches), fmt.Sprint(n, " running")
			})
			b.Close()
			a.Close()
			for range watches {
				select {
				case e := <-ended:
					if !errors.Is(e.err, bus.ErrClosed) {
						t.Errorf("%s after Close: %v, want ErrClosed", e.name, e.err)
					}
				case <-time.After(testTimeout):
					t.Fatal("a watch runs on after Close")
				}
			}
		})
	}
}

// TestMicroDiscovery: registered agents answer NATS micro discovery, so
// "nats micro ls agentbus" lists them.
func TestMicroDiscovery(t *testing.T) {
	s := newServer(t)
	for _, a := range []string{"planner", "reviewer"} {
		if err := newBus(t, s, a).Register(testContext(t), bus.AgentCard{Version: "1.2.0", Description: a}); err != nil {
			t.Fatal(err)
		}
	}
	nc := embeddedtest.Connect(t, s)
	if got := discover(t, nc, 2); !slices.Equal(got, []string{"planner", "reviewer"}) {
		t.Errorf("discovered %v", got)
	}
}

// TestRegisterBlocksNoOtherCall: while Register waits for another process
// of the agent to answer (onlineSince), the bus's other calls go on.
// Register held the handle's lock over its network calls, and a Publish
// waited for it, up to a second for a process that answered late. The
// wait is an hour here, so that Register cannot give up on the answer
// before the Publish is done, however slowly the test runs.
// processAnsweringWhenTold stands for another process of agent on s: the
// questions on the agent's processes subject come on the channel, to be
// answered (Respond) when the test says.
func processAnsweringWhenTold(t *testing.T, s *embedded.Server, agent string) <-chan *nats.Msg {
	t.Helper()
	asked := make(chan *nats.Msg, 1)
	nc := embeddedtest.Connect(t, s)
	processes, err := subjects.Default().ProcessesSubject(agent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe(processes, func(m *nats.Msg) { asked <- m }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return asked
}

func TestRegisterBlocksNoOtherCall(t *testing.T) {
	bus.SetProcessesWait(t, time.Hour)
	s := newServer(t)
	ctx := testContext(t)
	b := newBus(t, s, "worker")
	asked := processAnsweringWhenTold(t, s, "worker")
	registered := make(chan error, 1)
	go func() { registered <- b.Register(ctx, bus.AgentCard{}) }()
	var q *nats.Msg
	select {
	case q = <-asked:
	case <-ctx.Done():
		t.Fatal("Register asked for no other process")
	}
	if _, err := b.Publish(ctx, bus.Message{To: "other", Type: "T"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-registered:
		t.Fatalf("Register returned (%v) before the Publish did: the Publish waited for it", err)
	default:
	}
	if err := q.Respond(nil); err != nil {
		t.Fatal(err)
	}
	if err := <-registered; err != nil {
		t.Fatal(err)
	}
}

// TestWatchesWhoseContextEndedFirst: a watch whose context was canceled
// before it started, or while it set up, returns nil, as when its context
// ends later (a deadline that passes before it starts is an error:
// TestReliabilityEveryCallWhileServerDown). The watches returned their
// set-up's error
// ("watch presence: context canceled"): `agentbus --shards 3 agents
// --watch`, stopped while one shard's watch set up, exited 1.
func TestWatchesWhoseContextEndedFirst(t *testing.T) {
	s := newServer(t)
	b, a := newBus(t, s, "watcher"), adminOf(t, s)
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	for _, w := range []call{
		{"Bus.WatchPresence", func(ctx context.Context) error { return b.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
		{"Bus.WatchGroups", func(ctx context.Context) error { return b.WatchGroups(ctx, "", func(bus.GroupChange) {}) }},
		{"Admin.WatchPresence", func(ctx context.Context) error { return a.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
		{"Admin.WatchGroups", func(ctx context.Context) error { return a.WatchGroups(ctx, "", func(bus.GroupChange) {}) }},
		{"Admin.WatchDeadLetters", func(ctx context.Context) error { return a.WatchDeadLetters(ctx) }},
		{"Admin.WatchEscalations", func(ctx context.Context) error {
			return a.WatchEscalations(ctx, []bus.EscalationPolicy{{Agent: "x", After: time.Hour, To: "y"}})
		}},
	} {
		if err := w.do(ctx); err != nil {
			t.Errorf("%s with its context ended: %v; want nil", w.name, err)
		}
	}
}

// TestWatchPresenceSilentLastSeen: the change WatchPresence reports for an
// agent gone silent has its LastSeen, the last heartbeat the watch saw, as
// LookupAgent has one. It had none (found by a helper session).
func TestWatchPresenceSilentLastSeen(t *testing.T) {
	s := newServer(t)
	admin := adminOf(t, s)
	changes := watchPresence(t, admin)
	_, nc := registered(t, s, "worker", bus.AgentCard{})
	timeout := time.After(testTimeout)
	for {
		select {
		case c := <-changes:
			switch {
			case c.Agent == "worker" && c.Presence.Status == bus.Online:
				nc.Close() // a crash
			case c.Agent == "worker" && c.Presence.Status == bus.Offline:
				looked, err := admin.LookupAgent(testContext(t), "worker")
				if err != nil {
					t.Fatal(err)
				}
				if c.Presence.LastSeen.IsZero() || c.Presence.LastSeen.After(c.Presence.Since) {
					t.Fatalf("WatchPresence: silent change %+v, want a LastSeen before it; LookupAgent says %v", c.Presence, looked.Presence.LastSeen)
				}
				return
			}
		case <-timeout:
			t.Fatal("no offline change")
		}
	}
}

// TestWatchPresenceBackFromASilence: an agent whose connection was held
// long enough for the server to find it silent, and then let go, comes
// back online in WatchPresence since after it went offline. Its heartbeats
// carry the Since of before, which the watch reported: online since before
// it went offline, and an escalation's recovery came at a time before the
// outage (found by a helper session). The registry's record keeps that
// Since: its process never saw the silence.
func TestWatchPresenceBackFromASilence(t *testing.T) {
	s := newServer(t)
	changes := watchPresence(t, adminOf(t, s))
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	worker := dialBus(t, p.URL(), "worker", bus.WithHeartbeat(time.Second))
	if err := worker.Register(testContext(t), bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	next := func(status bus.PresenceStatus) bus.PresenceChange {
		t.Helper()
		for {
			select {
			case c := <-changes:
				if c.Agent == "worker" && c.Presence.Status == status {
					return c
				}
			case <-testContext(t).Done():
				t.Fatalf("no change of worker to %s", status)
			}
		}
	}
	next(bus.Online)
	p.hold() // the worker's network goes away, its connection held
	gone := next(bus.Offline)
	p.release()
	if back := next(bus.Online); !back.Presence.Since.After(gone.Presence.Since) {
		t.Errorf("online again since %v, after offline since %v: want since after", back.Presence.Since, gone.Presence.Since)
	}
	// A lookup reads the record alone: its process dates the return
	// (before 2026-11-28 the record kept the Since of before the silence).
	waitFor(t, "the lookup's worker online since its return", func() (bool, string) {
		info, err := adminOf(t, s).LookupAgent(testContext(t), "worker")
		return err == nil && info.Presence.Status == bus.Online && info.Presence.Since.After(gone.Presence.Since), fmt.Sprintf("%+v %v", info.Presence, err)
	})
}

// TestProcessesWithDifferentHeartbeats: of two processes of an agent, one
// beating every 20 s and one every second, the second closes: the agent
// stays online, its presence record living as long as the first process's
// beats need. Before, the closed process's record, the last, expired three
// of its own seconds later, and the agent read offline until the other
// beat again (found by a helper session).
func TestProcessesWithDifferentHeartbeats(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	slow, err := bus.New(embeddedtest.Connect(t, s), "worker", bus.WithHeartbeat(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	if err := slow.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	fast, err := bus.New(embeddedtest.Connect(t, s), "worker", bus.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := fast.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	if err := fast.Close(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_"+subjects.Default().PresenceBucket())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := subjects.PresenceKey("worker")
	last, err := st.GetLastMsgForSubject(ctx, subjects.Default().PresenceSubjectPrefix()+key)
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := time.ParseDuration(last.Header.Get(jetstream.MsgTTLHeader)); err != nil || ttl < time.Minute {
		t.Errorf("the presence record after the 1 s process closed expires in %q; want three of the other's 20 s intervals", last.Header.Get(jetstream.MsgTTLHeader))
	}
	if info, err := adminOf(t, s).LookupAgent(ctx, "worker"); err != nil || info.Presence.Status != bus.Online {
		t.Errorf("LookupAgent = %+v, %v; want online", info.Presence, err)
	}
}

// TestRegisterAgainTellsTheNewCard: a second Register replaces the card
// in the registry and in NATS micro discovery. Before, discovery kept the
// first card's version and description (found by a helper session).
func TestRegisterAgainTellsTheNewCard(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	b := newBus(t, s, "reviewer")
	for _, card := range []bus.AgentCard{{Version: "1.0.0", Description: "old"}, {Version: "2.0.0", Description: "new"}} {
		if err := b.Register(ctx, card); err != nil {
			t.Fatal(err)
		}
	}
	m, err := embeddedtest.Connect(t, s).Request("$SRV.INFO.agentbus", nil, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Version != "2.0.0" || info.Metadata["card_version"] != "2.0.0" || info.Description != "new" {
		t.Errorf("discovery after the second Register: version %q, card_version %q, description %q; want 2.0.0, 2.0.0, new",
			info.Version, info.Metadata["card_version"], info.Description)
	}
}

// TestRegisterWhileRegistering: a Register while another call of the bus
// registers returns once the agent is online, with its outcome. Before, it
// returned nil at once, the agent not yet online (found by a helper
// session).
func TestRegisterWhileRegistering(t *testing.T) {
	bus.SetProcessesWait(t, time.Hour)
	s := newServer(t)
	ctx := testContext(t)
	b := newBus(t, s, "worker")
	asked := processAnsweringWhenTold(t, s, "worker") // the first Register waits for it
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- b.Register(ctx, bus.AgentCard{Description: "first"}) }()
	q := <-asked
	go func() { second <- b.Register(ctx, bus.AgentCard{Description: "second"}) }()
	select {
	case err := <-second:
		t.Fatalf("the second Register returned (%v) before the first had the agent online", err)
	case <-time.After(100 * time.Millisecond): // it waits: nothing to poll for
	}
	if err := q.Respond(nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []chan error{first, second} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if info, err := adminOf(t, s).LookupAgent(ctx, "worker"); err != nil || info.Presence.Status != bus.Online {
		t.Errorf("LookupAgent = %+v, %v; want online", info.Presence, err)
	}
}
