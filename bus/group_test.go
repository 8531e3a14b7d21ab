package bus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// TestGroupMembership: agents join and leave groups, an operator adds and
// removes others; members are read back sorted, and every change is an
// event to a watcher, in order.
func TestGroupMembership(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	a, b := newBus(t, s, "alice"), newBus(t, s, "bob")
	admin := adminOf(t, s)

	if err := a.JoinGroup(ctx, "reviewers"); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	w := watchGroups(t, wctx, a, "reviewers")
	w.next("alice true alice") // what stands: the watch has begun

	for _, err := range []error{
		b.JoinGroup(ctx, "reviewers"), admin.AddToGroup(ctx, "reviewers", "carol"),
		b.JoinGroup(ctx, "builders"), a.LeaveGroup(ctx, "reviewers"), admin.RemoveFromGroup(ctx, "builders", "bob"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m, err := b.GroupMembers(ctx, "reviewers"); err != nil || !slices.Equal(m, []string{"bob", "carol"}) {
		t.Errorf("reviewers = %v, %v", m, err)
	}
	if gs, err := admin.Groups(ctx); err != nil || len(gs) != 1 || len(gs["builders"]) != 0 {
		t.Errorf("Groups = %v, %v; want only reviewers", gs, err)
	}
	w.next("alice false ")
	if want := []string{"alice true alice", "bob true bob", "carol true agentbus", "alice false "}; !slices.Equal(w.got, want) {
		t.Errorf("changes %q, want %q", w.got, want)
	}
	stop()
	if err := <-w.done; err != nil {
		t.Errorf("WatchGroups: %v", err)
	}
	if err := a.JoinGroup(ctx, "bad group\n"); err == nil {
		t.Error("joined a group with an invalid name")
	}
}

// TestPublishGroup: a message to a group reaches each member's own inbox,
// an offline member's included, once, in one conversation; a member that
// joins later does not get it; the sender is skipped.
func TestPublishGroup(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead")
	for _, m := range []string{"lead", "r1", "r2", "away"} {
		if err := newBus(t, s, m).JoinGroup(ctx, "reviewers"); err != nil {
			t.Fatal(err)
		}
	}
	msg := bus.Message{ID: "round-1", Type: "REVIEW", Priority: 2, Data: []byte("PR 42")}
	acks, err := lead.PublishGroup(ctx, "reviewers", msg)
	if err != nil || len(acks) != 3 {
		t.Fatalf("PublishGroup = %+v, %v", acks, err)
	}
	// Again: the copies' IDs are derived, so nothing is stored twice.
	again, err := lead.PublishGroup(ctx, "reviewers", msg)
	if err != nil || !again[0].Duplicate {
		t.Errorf("PublishGroup again = %+v, %v; want duplicates", again, err)
	}
	late := newBus(t, s, "late")
	if err := late.JoinGroup(ctx, "reviewers"); err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{"r1", "r2", "away"} {
		r := newRecorder()
		subscribe(t, newBus(t, s, member), r.handle)
		d := r.waitCount(t, 1)[0]
		if d.To != member || d.CorrelationID != "round-1" || d.Extensions[bus.ExtGroup] != "reviewers" || d.Priority != 2 || string(d.Data) != "PR 42" {
			t.Errorf("%s got %+v", member, d.Message)
		}
	}
	r := newRecorder()
	subscribe(t, late, r.handle)
	publish(t, lead, bus.Message{To: "late", Type: "MARKER"})
	if d := r.waitCount(t, 1)[0]; d.Type != "MARKER" {
		t.Errorf("a later member got %s, the group message sent before it joined", d.Type)
	}
	if _, err := lead.PublishGroup(ctx, "nobody", msg); !errors.Is(err, bus.ErrNoMembers) {
		t.Errorf("PublishGroup to an empty group: %v, want ErrNoMembers", err)
	}
}

// TestGatherReviewRound: the swarm protocol's review round. The lead asks
// six reviewers for verdicts and proceeds at three: two answer at once,
// one slowly; one fails for good, one crashes, one is offline (not asked),
// one answers after the round ended, and its late verdict stays readable.
func TestGatherReviewRound(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead")
	admin := adminOf(t, s)
	verdict := func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "VERDICT", Data: []byte("approve")})
		return err
	}
	failedCopy := make(chan string, 1)
	releaseSlow, releaseLate := make(chan struct{}), make(chan struct{})
	handlers := map[string]bus.Handler{
		"fast-1": verdict,
		"fast-2": verdict,
		"slow": func(ctx context.Context, d *bus.Delivery) error {
			<-releaseSlow
			return verdict(ctx, d)
		},
		"failing": func(ctx context.Context, d *bus.Delivery) error {
			failedCopy <- d.ID
			return bus.Permanent(errors.New("cannot review binaries"))
		},
		"late": func(ctx context.Context, d *bus.Delivery) error {
			<-releaseLate
			return verdict(ctx, d)
		},
	}
	joinReviewers(t, s, handlers)
	// The crashing reviewer dies in its handler.
	crashingReviewer(t, s, func(*bus.Delivery) {})
	// The offline reviewer registered and left.
	gone := newBus(t, s, "gone", bus.WithHeartbeat(time.Second))
	if err := gone.JoinGroup(ctx, "reviewers"); err != nil {
		t.Fatal(err)
	}
	if err := gone.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	gone.Close()

	// The slow reviewer answers once the failing one's copy is recorded
	// dead-lettered, so the round sees the failure.
	go func() {
		id := <-failedCopy
		waitFor(t, "the failing copy dead-lettered", func() (bool, string) {
			sts, err := admin.Status(ctx, id)
			return err == nil && sts[0].State == bus.StateDeadLettered, fmt.Sprint(sts, err)
		})
		close(releaseSlow)
	}()
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := lead.GatherGroup(rctx, "reviewers", bus.Message{Type: "REVIEW_REQUEST", Data: []byte("PR 42")}, bus.Want(3))
	if err != nil {
		t.Fatalf("GatherGroup: %v (%+v)", err, res)
	}
	var replied []string
	for _, d := range res.Replies {
		replied = append(replied, d.From)
		if d.CorrelationID != res.ID || string(d.Data) != "approve" {
			t.Errorf("reply %+v", d.Message)
		}
	}
	slices.Sort(replied)
	if !slices.Equal(replied, []string{"fast-1", "fast-2", "slow"}) {
		t.Errorf("replied %v", replied)
	}
	if len(res.Failed) != 1 || res.Failed[0].To != "failing" || res.Failed[0].State != bus.StateDeadLettered {
		t.Errorf("failed %+v", res.Failed)
	}
	if !slices.Equal(res.Offline, []string{"gone"}) {
		t.Errorf("offline %v", res.Offline)
	}
	if !slices.Equal(res.TimedOut, []string{"crashy", "late"}) {
		t.Errorf("timed out %v", res.TimedOut)
	}

	// The late verdict stays readable by its copy's ID.
	close(releaseLate)
	d, err := lead.Attach(ctx, res.Requests["late"])
	if err != nil || d.From != "late" || string(d.Data) != "approve" {
		t.Errorf("Attach to the late copy = %+v, %v", d, err)
	}

	// Wanting more than can come: the round ends with what it got once
	// every copy replied or was dead-lettered, before its stall timeout.
	res, err = lead.Gather(rctx, bus.Message{Type: "REVIEW_REQUEST"}, []string{"fast-1", "fast-2", "failing"}, bus.StallTimeout(500*time.Millisecond))
	if !errors.Is(err, bus.ErrTooFewReplies) || errors.Is(err, context.DeadlineExceeded) || len(res.Replies) != 2 || rctx.Err() != nil {
		t.Errorf("Gather wanting 3 of which 2 can = %+v, %v", res, err)
	}

	// Ended by its context's deadline, the copies' reply-by, with an
	// agent that never answers: the error says so too.
	dctx, cancel := context.WithTimeout(rctx, 2*time.Second)
	defer cancel()
	res, err = lead.Gather(dctx, bus.Message{Type: "REVIEW_REQUEST"}, []string{"fast-1", "fast-2", "absent"})
	if !errors.Is(err, bus.ErrTooFewReplies) || !errors.Is(err, context.DeadlineExceeded) || len(res.Replies) != 2 {
		t.Errorf("Gather to its deadline = %+v, %v; want 2 replies, ErrTooFewReplies and context.DeadlineExceeded", res, err)
	}
}

// TestGatherReviewRoundSwarm: the review round in the swarm protocol's own
// messages, end to end. The lead forwards an implementer's
// ComponentHandoff to five reviewers with GatherGroup and Want(3): each
// gets its own copy, the native message byte for byte and valid by the
// protocol's rules, and answers with a ReviewResult, prepared with the
// swarm profile and sent with Reply. Two answer at once; one crashes on
// its copy; one answers after the crash; the lead proceeds with those
// three.
// The slow one answers after the round, and the process that replaces the
// crashed one gets the copy again after the ack wait and answers it too:
// both late verdicts are read with Attach by their copies' IDs.
func TestGatherReviewRoundSwarm(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead")
	swarm := profiles.Swarm{}
	handoff := []byte(`{"schema":"ComponentHandoff","component_id":"C7","status":"complete",` +
		`"files_created":["config/load.go"],"files_modified":["cmd/app/main.go"],` +
		`"summary":"config loader with defaults","notes":null,"attempt":1,"turn_count":12}`)

	var mu sync.Mutex
	copies := map[string][]*bus.Delivery{} // by reviewer, in the order they came
	took := func(d *bus.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		copies[d.To] = append(copies[d.To], d)
	}
	verdict := func(ctx context.Context, d *bus.Delivery) error {
		native := fmt.Sprintf(`{"schema":"ReviewResult","component_id":"C7","verdict":"approved","issues":[],"notes":"by %s","turn_count":3}`, d.To)
		m, err := profiles.Prepare(swarm, []byte(native), profiles.Addressing{From: d.To, To: d.From})
		if err != nil {
			return bus.Permanent(err)
		}
		_, err = d.Reply(ctx, *m)
		return err
	}
	// after answers once ch is closed.
	after := func(ctx context.Context, ch <-chan struct{}, d *bus.Delivery) error {
		select {
		case <-ch:
			return verdict(ctx, d)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	crashed, releaseSlow := make(chan struct{}), make(chan struct{})
	const ackWait = 500 * time.Millisecond // the time to notice the crash
	joinReviewers(t, s, map[string]bus.Handler{
		"fast-1": func(ctx context.Context, d *bus.Delivery) error { took(d); return verdict(ctx, d) },
		"fast-2": func(ctx context.Context, d *bus.Delivery) error { took(d); return verdict(ctx, d) },
		"steady": func(ctx context.Context, d *bus.Delivery) error {
			took(d)
			return after(ctx, crashed, d)
		},
		"slow": func(ctx context.Context, d *bus.Delivery) error {
			took(d)
			return after(ctx, releaseSlow, d)
		},
	})
	// The crashing reviewer dies in its handler: its connection closes
	// with the copy unacknowledged.
	crashingReviewer(t, s, func(d *bus.Delivery) {
		took(d)
		close(crashed)
	}, bus.WithAckWait(ackWait))

	m, err := profiles.Prepare(swarm, handoff, profiles.Addressing{From: "lead", To: "reviewers"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := lead.GatherGroup(ctx, "reviewers", *m, bus.Want(3))
	if err != nil {
		t.Fatalf("GatherGroup: %v (%+v)", err, res)
	}
	checkVerdict := func(d *bus.Delivery, from string) {
		t.Helper()
		if d.From != from || d.Type != "ReviewResult" || d.DataSchema != swarm.DataSchema() || d.CorrelationID != "C7" || d.CausationID != res.Requests[from] {
			t.Errorf("verdict %+v, want %s's ReviewResult answering its copy %s in conversation C7", d.Message, from, res.Requests[from])
		}
		if err := swarm.Validate(d.Data); err != nil {
			t.Errorf("verdict of %s: %v", from, err)
		}
	}
	var replied []string
	for _, d := range res.Replies {
		replied = append(replied, d.From)
		checkVerdict(d, d.From)
	}
	slices.Sort(replied)
	if !slices.Equal(replied, []string{"fast-1", "fast-2", "steady"}) {
		t.Errorf("replied %v", replied)
	}
	if len(res.Failed) != 0 || len(res.Offline) != 0 || !slices.Equal(res.TimedOut, []string{"crashy", "slow"}) || len(res.Requests) != 5 {
		t.Errorf("failed %+v, offline %v, timed out %v, asked %v", res.Failed, res.Offline, res.TimedOut, res.Requests)
	}

	// The slow verdict, after the round.
	close(releaseSlow)
	d, err := lead.Attach(ctx, res.Requests["slow"])
	if err != nil {
		t.Fatalf("Attach to the slow copy: %v", err)
	}
	checkVerdict(d, "slow")

	// The crashed reviewer's copy waits, unacknowledged, for the ack wait;
	// the process that takes its place gets it again and answers.
	again := newBus(t, s, "crashy")
	subscribe(t, again, func(ctx context.Context, d *bus.Delivery) error { took(d); return verdict(ctx, d) }, bus.WithAckWait(ackWait))
	d, err = lead.Attach(ctx, res.Requests["crashy"])
	if err != nil {
		t.Fatalf("Attach to the crashed reviewer's copy: %v", err)
	}
	checkVerdict(d, "crashy")

	// Every copy is the lead's native message, byte for byte, to its
	// reviewer, in the component's conversation, from the group.
	mu.Lock()
	defer mu.Unlock()
	for name, id := range res.Requests {
		want := 1
		if name == "crashy" {
			want = 2
		}
		if len(copies[name]) != want {
			t.Errorf("%s got %d copies, want %d", name, len(copies[name]), want)
			continue
		}
		for i, c := range copies[name] {
			if c.ID != id || c.To != name || c.From != "lead" || c.Type != "ComponentHandoff" || c.DataSchema != swarm.DataSchema() ||
				c.CorrelationID != "C7" || c.Extensions[bus.ExtGroup] != "reviewers" || c.Deliveries != i+1 || !bytes.Equal(c.Data, handoff) {
				t.Errorf("%s's copy %d: %+v (delivery %d), want %s, the handoff from lead in C7 of group reviewers", name, i+1, c.Message, c.Deliveries, id)
			}
			if err := swarm.Validate(c.Data); err != nil {
				t.Errorf("%s's copy: %v", name, err)
			}
		}
	}
}

// TestAddMatchingToGroup: an operator makes the registered agents with a
// skill, or a tag, members of a group; an agent without it, or registered
// later, is not added; a query that selects nobody adds nobody.
func TestAddMatchingToGroup(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	admin := adminOf(t, s)
	for name, skills := range map[string][]bus.Skill{
		"sec":     {{ID: "review", Tags: []string{"security"}}},
		"qa":      {{ID: "review", Tags: []string{"tests"}}, {ID: "test"}},
		"builder": {{ID: "build", Tags: []string{"security"}}},
		"nocard":  nil,
	} {
		if err := newBus(t, s, name).Register(ctx, bus.AgentCard{Skills: skills}); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name    string
		group   string
		q       bus.AgentQuery
		added   []string
		members []string
		wantErr error
	}{
		{name: "skill", group: "reviewers", q: bus.AgentQuery{Skill: "review"}, added: []string{"qa", "sec"}, members: []string{"qa", "sec"}},
		{name: "tag", group: "security", q: bus.AgentQuery{Tag: "security"}, added: []string{"builder", "sec"}, members: []string{"builder", "sec"}},
		{name: "skill and tag", group: "testers", q: bus.AgentQuery{Skill: "review", Tag: "tests"}, added: []string{"qa"}, members: []string{"qa"}},
		{name: "nobody", group: "deployers", q: bus.AgentQuery{Skill: "deploy"}},
		{name: "invalid group", group: "bad group\n", q: bus.AgentQuery{Skill: "review"}, wantErr: subjects.ErrInvalidAgentID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			added, err := admin.AddMatchingToGroup(ctx, tt.group, tt.q)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("AddMatchingToGroup = %v, %v; want error %v", added, err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if !slices.Equal(added, tt.added) {
				t.Errorf("added %v, want %v", added, tt.added)
			}
			if m, err := admin.GroupMembers(ctx, tt.group); err != nil || !slices.Equal(m, tt.members) {
				t.Errorf("members %v, %v; want %v", m, err, tt.members)
			}
		})
	}

	// The membership is the operator's, and a later reviewer is not in it.
	if err := newBus(t, s, "late").Register(ctx, bus.AgentCard{Skills: []bus.Skill{{ID: "review"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := admin.GroupMembers(ctx, "reviewers"); err != nil || !slices.Equal(m, []string{"qa", "sec"}) {
		t.Errorf("reviewers after a later registration: %v, %v", m, err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var by []string
	if err := admin.WatchGroups(wctx, "reviewers", func(c bus.GroupChange) {
		by = append(by, c.Agent+" "+c.By)
		if len(by) == 2 {
			stop()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(by, []string{"qa agentbus", "sec agentbus"}) {
		t.Errorf("memberships %v, want qa and sec added by the operator", by)
	}
}

// joinReviewers makes each agent of handlers a member of group "reviewers",
// subscribed with its handler.
func joinReviewers(t *testing.T, s *embedded.Server, handlers map[string]bus.Handler) {
	t.Helper()
	for name, h := range handlers {
		b := newBus(t, s, name)
		if err := b.JoinGroup(testContext(t), "reviewers"); err != nil {
			t.Fatal(err)
		}
		subscribe(t, b, h)
	}
}

// crashingReviewer makes agent "crashy" a member of group "reviewers" whose
// handler calls took, then closes its connection with the message
// unacknowledged and waits to be stopped.
func crashingReviewer(t *testing.T, s *embedded.Server, took func(*bus.Delivery), opts ...bus.SubscribeOption) {
	t.Helper()
	nc := embeddedtest.Connect(t, s)
	crashy, err := bus.New(nc, "crashy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { crashy.Close() })
	if err := crashy.JoinGroup(testContext(t), "reviewers"); err != nil {
		t.Fatal(err)
	}
	if _, err := crashy.Subscribe(testContext(t), func(ctx context.Context, d *bus.Delivery) error {
		took(d)
		nc.Close()
		<-ctx.Done()
		return ctx.Err()
	}, opts...); err != nil {
		t.Fatal(err)
	}
}

// TestGatherAllOffline: a Gather whose agents are all offline asks nobody
// and fails with ErrNoMembers (and ErrTooFewReplies), the result naming
// them offline. It returned no error and no reply, as if every wanted
// reply had come.
func TestGatherAllOffline(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead")
	for _, name := range []string{"gone-1", "gone-2"} {
		g := newBus(t, s, name)
		if err := g.Register(ctx, bus.AgentCard{}); err != nil {
			t.Fatal(err)
		}
		g.Close() // offline: shut down
	}
	res, err := lead.Gather(ctx, bus.Message{Type: "REVIEW"}, []string{"gone-1", "gone-2"})
	if !errors.Is(err, bus.ErrNoMembers) || !errors.Is(err, bus.ErrTooFewReplies) {
		t.Fatalf("Gather to offline agents = %+v, %v; want ErrNoMembers and ErrTooFewReplies", res, err)
	}
	if res == nil || len(res.Replies) != 0 || !slices.Equal(res.Offline, []string{"gone-1", "gone-2"}) || len(res.Requests) != 0 {
		t.Errorf("result %+v; want the two offline, nobody asked", res)
	}
}

// TestGatherTakesRepliesOnlyFromTheAsked: a member that knows another's
// copy (its ID is derived from the request's, which every member sees)
// cannot answer in its place. The Gather took a's message caused by b's
// copy as b's reply: complete, without error, while b had not answered.
func TestGatherTakesRepliesOnlyFromTheAsked(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead := newBus(t, s, "lead")
	forged := make(chan string, 1)
	a := newBus(t, s, "a")
	subscribe(t, a, func(hctx context.Context, d *bus.Delivery) error {
		if _, err := d.Reply(hctx, bus.Message{Type: "VERDICT", Data: []byte("a says yes")}); err != nil {
			return err
		}
		bCopy := <-forged
		// Outside the handler's context: the causation given stands.
		_, err := a.Publish(ctx, bus.Message{To: "lead", Type: "VERDICT", CausationID: bCopy,
			CorrelationID: d.CorrelationID, Data: []byte("b says yes (really a)")})
		return err
	})
	b := newBus(t, s, "b")
	bAsked := make(chan *bus.Delivery, 1)
	release := make(chan struct{})
	subscribe(t, b, func(ctx context.Context, d *bus.Delivery) error {
		bAsked <- d
		<-release // answers nothing while the Gather waits
		return nil
	})
	gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	go func() {
		d := <-bAsked
		forged <- d.ID
	}()
	res, err := lead.Gather(gctx, bus.Message{Type: "REVIEW"}, []string{"a", "b"})
	close(release)
	if !errors.Is(err, bus.ErrTooFewReplies) || res == nil {
		t.Fatalf("Gather = %+v, %v; want ErrTooFewReplies (b never replied)", res, err)
	}
	for _, d := range res.Replies {
		if d.From != "a" || string(d.Data) != "a says yes" {
			t.Errorf("reply from %s: %q; want only a's own", d.From, d.Data)
		}
	}
	if res.Replied("b") || !slices.Equal(res.TimedOut, []string{"b"}) {
		t.Errorf("result %+v; want b timed out", res)
	}
}

// TestJoiningAgainChangesNothing: a member joining again, an operator
// adding a member, and leaving a group one is not a member of change
// nothing: no write, no change to a watcher, the membership's since and by
// as they were. Each was written, and each was a change.
func TestJoiningAgainChangesNothing(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob, admin := newBus(t, s, "alice"), newBus(t, s, "bob"), adminOf(t, s)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changes := make(chan bus.GroupChange, 16)
	watched := make(chan error, 1)
	go func() { watched <- admin.WatchGroups(wctx, "g", func(c bus.GroupChange) { changes <- c }) }()
	next := func() bus.GroupChange {
		select {
		case c := <-changes:
			return c
		case <-ctx.Done():
			t.Fatal("no change came")
			return bus.GroupChange{}
		}
	}
	if err := alice.JoinGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Agent != "alice" || !c.Joined {
		t.Fatalf("first change %+v; want alice joined", c)
	}
	if err := alice.JoinGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if err := admin.AddToGroup(ctx, "g", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := admin.RemoveFromGroup(ctx, "g", "carol"); err != nil {
		t.Fatal(err)
	}
	if err := bob.JoinGroup(ctx, "g"); err != nil { // the last change
		t.Fatal(err)
	}
	if c := next(); c.Agent != "bob" || !c.Joined {
		t.Errorf("change after alice's join %+v; want bob's join, nothing between", c)
	}
	stop()
	<-watched
}

// TestOperatorsGroupChangeChecksFirst: an operator's AddToGroup or
// RemoveFromGroup with an invalid agent or group is refused before any
// membership is written. Before, the agents ahead of the invalid one were
// added, and an invalid group without agents was not refused at all
// (found by a helper session).
func TestOperatorsGroupChangeChecksFirst(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	admin := adminOf(t, s)
	if err := admin.AddToGroup(ctx, "reviewers", "perf", "bad\nagent", "ui"); !errors.Is(err, bus.ErrInvalidAgentID) {
		t.Fatalf("AddToGroup with an invalid agent = %v, want ErrInvalidAgentID", err)
	}
	if m, err := admin.GroupMembers(ctx, "reviewers"); err != nil || len(m) != 0 {
		t.Errorf("after a refused AddToGroup the group has members %v (%v); want none", m, err)
	}
	if err := admin.AddToGroup(ctx, "bad group\n"); !errors.Is(err, bus.ErrInvalidAgentID) {
		t.Errorf("AddToGroup of an invalid group = %v, want ErrInvalidAgentID", err)
	}
	if err := admin.RemoveFromGroup(ctx, "*"); !errors.Is(err, bus.ErrInvalidAgentID) {
		t.Errorf("RemoveFromGroup of group * = %v, want ErrInvalidAgentID", err)
	}
}

// TestWatchGroupsStartsWithTheMembers: a watch started after alice joined
// and left, and bob joined, reports bob's membership, then the changes:
// not alice's leave of long ago. Before, every member who ever left was
// reported to every new watcher, the bucket keeping the delete markers
// (found by a helper session).
func TestWatchGroupsStartsWithTheMembers(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	admin := adminOf(t, s)
	for _, err := range []error{alice.JoinGroup(ctx, "g"), bob.JoinGroup(ctx, "g"), alice.LeaveGroup(ctx, "g")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	w := watchGroups(t, ctx, admin, "g")
	w.next("bob true bob") // what stands
	if err := admin.AddToGroup(ctx, "g", "marker"); err != nil {
		t.Fatal(err)
	}
	w.next("marker true agentbus")
	if err := admin.RemoveFromGroup(ctx, "g", "bob"); err != nil { // a live leave is news
		t.Fatal(err)
	}
	w.next("bob false ")
	if want := []string{"bob true bob", "marker true agentbus", "bob false "}; !slices.Equal(w.got, want) {
		t.Errorf("changes %q; want %q", w.got, want)
	}
}

// groupWatch is a WatchGroups running for a test: the changes it reported,
// each "<agent> <joined> <by>", and its end.
type groupWatch struct {
	t       *testing.T
	ctx     context.Context
	changes chan bus.GroupChange
	done    chan error
	got     []string
}

// watchGroups starts watching group with w until ctx ends, or the test
// does: it waits for the watch to end then.
func watchGroups(t *testing.T, ctx context.Context, w interface {
	WatchGroups(context.Context, string, func(bus.GroupChange)) error
}, group string) *groupWatch {
	ctx, cancel := context.WithCancel(ctx)
	g := &groupWatch{t: t, ctx: testContext(t), changes: make(chan bus.GroupChange, 64), done: make(chan error, 1)}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		g.done <- w.WatchGroups(ctx, group, func(c bus.GroupChange) { g.changes <- c })
	}()
	t.Cleanup(func() { cancel(); <-ended })
	return g
}

// next waits until the watch reported want.
func (g *groupWatch) next(want string) {
	g.t.Helper()
	for !slices.Contains(g.got, want) {
		select {
		case c := <-g.changes:
			g.got = append(g.got, fmt.Sprintf("%s %v %s", c.Agent, c.Joined, c.By))
		case err := <-g.done:
			g.t.Fatalf("WatchGroups ended after %q: %v", g.got, err)
		case <-g.ctx.Done():
			g.t.Fatalf("changes %q, then none", g.got)
		}
	}
}
