package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestGroupMembership: agents join and leave groups, an operator adds and
// removes others; members are read back sorted, and every change is an
// event to a watcher, in order.
func TestGroupMembership(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	a, b := newBus(t, s, "alice"), newBus(t, s, "bob")
	admin := adminOf(t, s)

	wctx, stop := context.WithCancel(ctx)
	changes := make(chan bus.GroupChange, 16)
	done := make(chan error, 1)
	go func() { done <- a.WatchGroups(wctx, "reviewers", func(c bus.GroupChange) { changes <- c }) }()

	for _, err := range []error{
		a.JoinGroup(ctx, "reviewers"), b.JoinGroup(ctx, "reviewers"), admin.AddToGroup(ctx, "reviewers", "carol"),
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
	var got []string
	for !slices.Contains(got, "alice false ") {
		select {
		case c := <-changes:
			got = append(got, fmt.Sprintf("%s %v %s", c.Agent, c.Joined, c.By))
		case err := <-done:
			t.Fatalf("WatchGroups ended after %q: %v", got, err)
		case <-ctx.Done():
			t.Fatalf("changes %q, then none", got)
		}
	}
	// The watch starts with what stands or with every change, depending
	// on when it began; bob and carol joined either way, before alice left.
	if i := slices.Index(got, "alice false "); !slices.Contains(got[:i], "bob true bob") || !slices.Contains(got[:i], "carol true agentbus") {
		t.Errorf("changes %q", got)
	}
	stop()
	if err := <-done; err != nil {
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
	for name, h := range handlers {
		b := newBus(t, s, name)
		if err := b.JoinGroup(ctx, "reviewers"); err != nil {
			t.Fatal(err)
		}
		subscribe(t, b, h)
	}
	// The crashing reviewer dies in its handler.
	nc := embeddedtest.Connect(t, s)
	crashy, err := bus.New(nc, "crashy")
	if err != nil {
		t.Fatal(err)
	}
	defer crashy.Close()
	if err := crashy.JoinGroup(ctx, "reviewers"); err != nil {
		t.Fatal(err)
	}
	if _, err := crashy.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		nc.Close()
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
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

	// Wanting more than can come: the round ends at its stall timeout
	// with what it got.
	res, err = lead.Gather(rctx, bus.Message{Type: "REVIEW_REQUEST"}, []string{"fast-1", "fast-2", "failing"}, bus.StallTimeout(500*time.Millisecond))
	if !errors.Is(err, bus.ErrTooFewReplies) || len(res.Replies) != 2 || rctx.Err() != nil {
		t.Errorf("Gather wanting 3 of which 2 can = %+v, %v", res, err)
	}
}
