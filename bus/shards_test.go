package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/bus/auth"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// onShards returns one agent ID named prefix-<i> on each of shards shards,
// in shard order.
func onShards(t *testing.T, prefix string, shards int) []string {
	t.Helper()
	out := make([]string, shards)
	for i, left := 0, shards; left > 0; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		k, err := subjects.ShardOf(id, shards)
		if err != nil {
			t.Fatal(err)
		}
		if out[k] == "" {
			out[k] = id
			left--
		}
	}
	return out
}

// newShards returns agent's handle on an installation of shards shards on
// nc, closed when the test ends.
func newShards(t *testing.T, nc *nats.Conn, agent string, shards int, opts ...bus.Option) *bus.Shards {
	t.Helper()
	s, err := bus.NewShards(nc, agent, shards, opts...)
	if err != nil {
		t.Fatalf("bus.NewShards(%q, %d): %v", agent, shards, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// sharded is an embedded server carrying an installation of n shards under
// the default root, each provisioned by the first bus made on it, and one
// agent ID on each shard, in shard order.
type sharded struct {
	t      *testing.T
	s      *embedded.Server
	n      int
	agents []string
}

func newSharded(t *testing.T, n int) *sharded {
	t.Helper()
	return &sharded{t: t, s: embeddedtest.RunServer(t), n: n, agents: onShards(t, "agent", n)}
}

// shards returns agent's handle on the installation, on a connection of its
// own, closed when the test ends.
func (i *sharded) shards(agent string) *bus.Shards {
	i.t.Helper()
	return newShards(i.t, embeddedtest.Connect(i.t, i.s), agent, i.n, bus.WithProvision(bus.StreamConfig{}))
}

// streamOf returns the message stream of shard k of n under the default
// root.
func streamOf(t *testing.T, k, n int) string {
	t.Helper()
	root, err := subjects.ShardRoot("", k, n)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := subjects.New(root)
	return s.Stream()
}

// TestShards: on an installation of three shards, agents on different
// shards exchange direct messages, requests and broadcasts, each message is
// stored on its recipient's shard only, and Status finds a message on
// whichever shard holds it.
func TestShards(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	handles := make([]*bus.Shards, n)
	recorders := make([]*recorder, n)
	for k, id := range agents {
		handles[k] = inst.shards(id)
		if handles[k].Bus().Subjects().Stream() != streamOf(t, k, n) {
			t.Fatalf("%s's home is %s, want shard %d", id, handles[k].Bus().Subjects().Stream(), k)
		}
		recorders[k] = newRecorder()
		h := recorders[k].handle
		if k == 2 {
			h = func(ctx context.Context, d *bus.Delivery) error {
				if d.Type == "REQUEST" {
					_, err := d.Reply(ctx, bus.Message{Type: "RESULT", Data: d.Data})
					return err
				}
				return recorders[2].handle(ctx, d)
			}
		}
		subscribe(t, handles[k].Bus(), h)
	}
	from := handles[0]

	ack, err := from.Bus().Publish(ctx, bus.Message{To: agents[1], Type: "TASK"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != streamOf(t, 1, n) {
		t.Errorf("a message to %s was stored on %s, want its shard's %s", agents[1], ack.Stream, streamOf(t, 1, n))
	}
	if d := recorders[1].waitCount(t, 1)[0]; d.ID != ack.ID || d.From != agents[0] {
		t.Errorf("%s got %s from %s, want %s from %s", agents[1], d.ID, d.From, ack.ID, agents[0])
	}

	reply, err := from.Bus().Request(ctx, bus.Message{To: agents[2], Type: "REQUEST", Data: []byte("ping")})
	if err != nil {
		t.Fatalf("request across shards: %v", err)
	}
	if reply.Type != "RESULT" || string(reply.Data) != "ping" {
		t.Errorf("reply %s %q, want RESULT \"ping\"", reply.Type, reply.Data)
	}

	// Status finds the message on its recipient's shard, from either end.
	for _, who := range []*bus.Shards{from, handles[1]} {
		waitFor(t, "the message completed", func() (bool, string) {
			st, err := who.Bus().Status(ctx, ack.ID)
			if err != nil {
				return false, err.Error()
			}
			return len(st) == 1 && st[0].State == bus.StateCompleted, fmt.Sprintf("%+v", st)
		})
	}
	if _, err := from.Bus().Status(ctx, "no-such-message"); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("status of an unknown message: %v, want ErrNoStatus", err)
	}

	// A broadcast reaches every other agent once, on its own shard.
	bcast, err := from.Bus().Publish(ctx, bus.Message{To: bus.Broadcast, Type: "STOP"})
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k < n; k++ {
		waitFor(t, fmt.Sprintf("%s's broadcast", agents[k]), func() (bool, string) {
			types := recorders[k].types()
			return slices.Contains(types, "STOP"), fmt.Sprint(types)
		})
	}
	// A sentinel sent after the broadcast comes after any second copy.
	for k := 1; k < n; k++ {
		if _, err := from.Bus().Publish(ctx, bus.Message{To: agents[k], Type: "SENTINEL", Priority: 5}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the sentinel", func() (bool, string) {
			types := recorders[k].types()
			return slices.Contains(types, "SENTINEL"), fmt.Sprint(types)
		})
		var stops int
		for _, d := range recorders[k].deliveries() {
			if d.Type == "STOP" {
				stops++
				if d.ID != bcast.ID {
					t.Errorf("%s got broadcast %s, want %s", agents[k], d.ID, bcast.ID)
				}
				if first := recorders[1].deliveries(); !d.Time.Equal(firstOf(first, "STOP").Time) {
					t.Errorf("%s's copy was made at %v, %s's at %v: not one message", agents[k], d.Time, agents[1], firstOf(first, "STOP").Time)
				}
			}
		}
		if stops != 1 {
			t.Errorf("%s got the broadcast %d times, want once", agents[k], stops)
		}
	}
	if len(recorders[0].deliveries()) != 0 {
		t.Errorf("the sender got %v", recorders[0].types())
	}
}

// firstOf returns the first of ds of type typ.
func firstOf(ds []*bus.Delivery, typ string) *bus.Delivery {
	for _, d := range ds {
		if d.Type == typ {
			return d
		}
	}
	return &bus.Delivery{}
}

func TestShardsRejects(t *testing.T) {
	s := embeddedtest.RunServer(t)
	nc := embeddedtest.Connect(t, s)
	for _, shards := range []int{0, -1, subjects.MaxShards + 1} {
		if _, err := bus.NewShards(nc, "worker", shards); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("%d shards: %v, want ErrInvalidOption", shards, err)
		}
	}
	for _, agent := range []string{"", "agentbus"} {
		if _, err := bus.NewShards(nc, agent, 3); !errors.Is(err, bus.ErrInvalidAgentID) {
			t.Errorf("agent %q: %v, want ErrInvalidAgentID", agent, err)
		}
	}
	// As New refuses it; before, the default root's shards were used.
	if _, err := bus.NewShards(nc, "worker", 2, bus.WithProvision(bus.StreamConfig{Root: "team"})); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("a provision root not the bus's: %v, want ErrInvalidOption", err)
	}
	if _, err := bus.NewShards(nil, "worker", 3); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("nil connection: %v, want ErrInvalidOption", err)
	}
	long := "r234567890123456789012345678901234567890123456789012345678901"
	if _, err := bus.NewShards(nc, "worker", 16, bus.WithRoot(long)); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("a root too long for its shards: %v, want ErrInvalidOption", err)
	}
	h := newShards(t, nc, "worker", 3)
	if _, err := h.Bus().Publish(testContext(t), bus.Message{To: "no\x00agent", Type: "T"}); !errors.Is(err, bus.ErrInvalidAgentID) {
		t.Errorf("an invalid recipient: %v, want ErrInvalidAgentID", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	for _, to := range onShards(t, "planner", 3) { // the worker's own shard, and shards never reached
		if _, err := h.Bus().Publish(testContext(t), bus.Message{To: to, Type: "T"}); !errors.Is(err, bus.ErrClosed) {
			t.Errorf("Publish to %s after Close: %v, want ErrClosed", to, err)
		}
	}
}

// TestClusterShardsPlacedByTags: on a 3-node cluster whose servers are
// tagged, each shard provisioned with its tag lives on its own server, and
// agents on different shards exchange messages across them.
func TestClusterShardsPlacedByTags(t *testing.T) {
	const n = 3
	c := embeddedtest.RunCluster(t, n, func(o *embedded.ClusterOptions) {
		o.Node.Configure = func(so *server.Options) { so.Tags = []string{"node:" + so.ServerName} }
	})
	nodes := c.Servers()
	ctx := testContext(t)
	admin := newAdmin(t, embeddedtest.Connect(t, nodes[0]))
	for k := range n {
		root, err := subjects.ShardRoot("", k, n)
		if err != nil {
			t.Fatal(err)
		}
		want := nodes[k].Options().ServerName
		info, err := admin.Provision(ctx, bus.StreamConfig{Root: root, Tags: []string{"node:" + want}})
		if err != nil {
			t.Fatalf("provision shard %d: %v", k, err)
		}
		leader, err := c.WaitForStreamLeader(ctx, "", info.Config.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := leader.Options().ServerName; got != want {
			t.Errorf("shard %d's stream is on %s, want %s by its tag", k, got, want)
		}
	}
	agents := onShards(t, "agent", n)
	r := newRecorder()
	subscribe(t, newShards(t, embeddedtest.Connect(t, nodes[1]), agents[2], n).Bus(), r.handle)
	ack, err := newShards(t, embeddedtest.Connect(t, nodes[2]), agents[0], n).Bus().Publish(ctx, bus.Message{To: agents[2], Type: "TASK"})
	if err != nil {
		t.Fatal(err)
	}
	if d := r.waitCount(t, 1)[0]; d.ID != ack.ID || ack.Stream != streamOf(t, 2, n) {
		t.Errorf("got %s, sent %s on %s", d.ID, ack.ID, ack.Stream)
	}
}

// TestStreamConfigTags: placement tags apply to every stream and bucket of
// the root, and an empty tag is refused.
func TestStreamConfigTags(t *testing.T) {
	c := bus.StreamConfig{Root: "agentbus.s1", Tags: []string{"node:n2", "ssd"}}
	main, err := c.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	dlq, _ := c.DeadLetterJetStream()
	sched, _ := c.ScheduleJetStream()
	status, _ := c.StatusBucketConfig()
	registry, _ := c.RegistryConfig()
	presence, _ := c.PresenceConfig()
	for name, p := range map[string]*jetstream.Placement{
		"stream": main.Placement, "dead letters": dlq.Placement, "schedules": sched.Placement,
		"status bucket": status.Placement, "registry": registry.Placement, "presence": presence.Placement,
	} {
		if p == nil || !slices.Equal(p.Tags, c.Tags) {
			t.Errorf("%s placed %+v, want tags %v", name, p, c.Tags)
		}
	}
	if untagged, _ := (bus.StreamConfig{}).JetStream(); untagged.Placement != nil {
		t.Errorf("no tags placed the stream %+v", untagged.Placement)
	}
	if err := (bus.StreamConfig{Tags: []string{"ssd", ""}}).Validate(); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("an empty tag: %v, want ErrInvalidOption", err)
	}
}

// TestShardsWithPermissions: with the permissions auth.Generate writes for
// an installation of three shards, agents on different shards, each on its
// own credentials, request and answer across shards, broadcast and look up
// what they sent.
func TestShardsWithPermissions(t *testing.T) {
	const n = 3
	agents := onShards(t, "agent", n)
	srv := newAuthServerConfig(t, auth.Config{Agents: agents, Shards: n})
	ctx := testContext(t)
	for k := range n {
		root, _ := subjects.ShardRoot("", k, n)
		if _, err := srv.admin.Provision(ctx, bus.StreamConfig{Root: root, Shards: n}); err != nil { // agents read the number
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var errs []error
	onError := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	handles := make([]*bus.Shards, n)
	for k, id := range agents {
		nc, err := nats.Connect(srv.s.ClientURL(), srv.identity(t, id).Option(), nats.CustomInboxPrefix(bus.InboxPrefix(id)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		handles[k] = newShards(t, nc, id, n, bus.WithErrorHandler(onError))
	}
	r := newRecorder()
	for k := 1; k < n; k++ {
		h := r.handle
		if k == 2 {
			h = func(ctx context.Context, d *bus.Delivery) error {
				if d.Type == "REQUEST" {
					_, err := d.Reply(ctx, bus.Message{Type: "RESULT"})
					return err
				}
				return r.handle(ctx, d)
			}
		}
		subscribe(t, handles[k].Bus(), h)
	}
	reply, err := handles[0].Bus().Request(ctx, bus.Message{To: agents[2], Type: "REQUEST"})
	if err != nil || reply.Type != "RESULT" {
		t.Fatalf("request across shards: %v, %v", reply, err)
	}
	bcast, err := handles[0].Bus().Publish(ctx, bus.Message{To: bus.Broadcast, Type: "STOP"})
	if err != nil {
		t.Fatalf("broadcast on every shard: %v", err)
	}
	r.waitCount(t, 2)
	waitFor(t, "the broadcast's records", func() (bool, string) {
		st, err := handles[0].Bus().Status(ctx, bcast.ID)
		return err == nil && len(st) > 0, fmt.Sprint(st, err)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Errorf("background errors: %v", errs)
	}
}

// TestShardsRouteEveryMessage: every way a message leaves an agent's bus
// reaches its recipient's shard: a reply to a plain message (not a
// Request) comes back to the sender's own shard and its subscription, a
// scheduled message fires on the recipient's shard, and a message queued
// for an agent of another shard is canceled there.
func TestShardsRouteEveryMessage(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	asker, answerer := inst.shards(agents[0]).Bus(), inst.shards(agents[1]).Bus()
	got := newRecorder()
	subscribe(t, asker, got.handle)
	subscribe(t, answerer, func(ctx context.Context, d *bus.Delivery) error {
		if d.Type == "QUESTION" {
			_, err := d.Reply(ctx, bus.Message{Type: "ANSWER"})
			return err
		}
		return nil
	})
	q, err := asker.Publish(ctx, bus.Message{To: agents[1], Type: "QUESTION"})
	if err != nil {
		t.Fatal(err)
	}
	if d := got.waitCount(t, 1)[0]; d.Type != "ANSWER" || d.CorrelationID != q.ID || d.Stream != streamOf(t, 0, n) {
		t.Errorf("got %s in %s on %s, want the ANSWER in %s on %s", d.Type, d.CorrelationID, d.Stream, q.ID, streamOf(t, 0, n))
	}

	sched, err := answerer.Schedule(ctx, bus.Message{To: agents[0], Type: "LATER"}, bus.In(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := got.waitCount(t, 2)[1]; d.ID != sched.ID || d.Stream != streamOf(t, 0, n) {
		t.Errorf("got %s on %s, want the scheduled %s on %s", d.ID, d.Stream, sched.ID, streamOf(t, 0, n))
	}

	// An asynchronous publish to another shard is among those Flush and
	// PublishAsyncComplete wait for.
	f, err := asker.PublishAsync(ctx, bus.Message{To: agents[2], Type: "NOTE"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-asker.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("PublishAsyncComplete never closed")
	}
	if err := asker.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if ack, err := f.Wait(ctx); err != nil || ack.Stream != streamOf(t, 2, n) {
		t.Errorf("async publish to %s: %+v, %v; want it on %s", agents[2], ack, err, streamOf(t, 2, n))
	}

	// agents[2] never subscribes: the message waits on its shard.
	queued, err := asker.Publish(ctx, bus.Message{To: agents[2], Type: "TASK"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := asker.Cancel(ctx, queued.ID)
	if err != nil {
		t.Fatalf("cancel on the recipient's shard: %v", err)
	}
	if st.State != bus.StateCanceled || st.To != agents[2] {
		t.Errorf("canceled %+v", st)
	}
	sts, err := asker.Status(ctx, queued.ID)
	if err != nil || len(sts) != 1 || sts[0].State != bus.StateCanceled {
		t.Errorf("status after cancel: %+v, %v", sts, err)
	}
}

// TestShardsPublishAsyncBroadcast: a broadcast sent with PublishAsync on
// an installation of three shards is one message on every shard: each
// other agent gets it once, under the ID and time the sender gave it; the
// future is the sender's own shard's, and PublishAsyncComplete waits for
// the copies of the other shards too.
func TestShardsPublishAsyncBroadcast(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	recorders := make([]*recorder, n)
	var from *bus.Bus
	for k, id := range agents {
		b := inst.shards(id).Bus()
		if k == 0 {
			from = b
		}
		recorders[k] = newRecorder()
		subscribe(t, b, recorders[k].handle)
	}
	f, err := from.PublishAsync(ctx, bus.Message{To: bus.Broadcast, Type: "STOP"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-from.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("PublishAsyncComplete never closed")
	}
	ack, err := f.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != streamOf(t, 0, n) {
		t.Errorf("the future's ack is from %s, want the sender's shard's %s", ack.Stream, streamOf(t, 0, n))
	}
	for k := 1; k < n; k++ {
		d := recorders[k].waitCount(t, 1)[0]
		if d.ID != ack.ID || d.Type != "STOP" || d.Stream != streamOf(t, k, n) {
			t.Errorf("%s got %s %s on %s, want %s STOP on %s", agents[k], d.ID, d.Type, d.Stream, ack.ID, streamOf(t, k, n))
		}
		if first := recorders[1].deliveries()[0]; !d.Time.Equal(first.Time) {
			t.Errorf("%s's copy was made at %v, %s's at %v: not one message", agents[k], d.Time, agents[1], first.Time)
		}
	}
	// A sentinel sent after the broadcast comes after any second copy.
	for k := 1; k < n; k++ {
		if _, err := from.Publish(ctx, bus.Message{To: agents[k], Type: "SENTINEL", Priority: 5}); err != nil {
			t.Fatal(err)
		}
		if got := recorders[k].waitCount(t, 2); got[1].Type != "SENTINEL" {
			t.Errorf("%s got %v, want the broadcast and the SENTINEL", agents[k], recorders[k].types())
		}
	}
	if len(recorders[0].deliveries()) != 0 {
		t.Errorf("the sender got %v", recorders[0].types())
	}
}

// TestShardsRegistry: an agent finds the agents and group members of
// every shard, each registered or joined on its own, and closing its Bus
// closes the buses of the other shards it sent on.
func TestShardsRegistry(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	handles := make([]*bus.Shards, n)
	for k, id := range agents {
		handles[k] = inst.shards(id)
		b := handles[k].Bus()
		if err := b.Register(ctx, bus.AgentCard{Name: id, Skills: []bus.Skill{{ID: "review"}}}); err != nil {
			t.Fatal(err)
		}
		if err := b.JoinGroup(ctx, "reviewers"); err != nil {
			t.Fatal(err)
		}
	}
	b := handles[0].Bus()
	all, err := b.Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range all {
		names = append(names, a.Card.Name)
	}
	if want := slices.Sorted(slices.Values(agents)); !slices.Equal(names, want) {
		t.Errorf("Agents = %v, want %v", names, want)
	}
	found, err := b.FindAgents(ctx, bus.AgentQuery{Skill: "review", Online: true})
	if err != nil || len(found) != n {
		t.Errorf("FindAgents found %d, %v; want %d", len(found), err, n)
	}
	if info, err := b.LookupAgent(ctx, agents[2]); err != nil || info.Presence.Status != bus.Online {
		t.Errorf("LookupAgent(%s) = %+v, %v", agents[2], info, err)
	}
	members, err := b.GroupMembers(ctx, "reviewers")
	if err != nil || !slices.Equal(members, slices.Sorted(slices.Values(agents))) {
		t.Errorf("GroupMembers = %v, %v; want %v", members, err, agents)
	}
	acks, err := b.PublishGroup(ctx, "reviewers", bus.Message{Type: "REVIEW"})
	if err != nil || len(acks) != n-1 { // every member but the sender
		t.Errorf("PublishGroup sent %d, %v; want %d", len(acks), err, n-1)
	}
	for _, a := range acks {
		if want := streamOf(t, slices.Index(agents, a.Member), n); a.Stream != want {
			t.Errorf("%s's copy went to %s, want %s", a.Member, a.Stream, want)
		}
	}
	// The watches see every shard's registry.
	wctx, stop := context.WithCancel(ctx)
	online, joined := map[string]bool{}, map[string]bool{}
	err = b.WatchPresence(wctx, func(c bus.PresenceChange) {
		if c.Presence.Status == bus.Online {
			online[c.Agent] = true
		}
		if len(online) == n {
			stop()
		}
	})
	if err != nil || len(online) != n {
		t.Errorf("WatchPresence saw %v online, %v; want all %d", online, err, n)
	}
	wctx, stop = context.WithCancel(ctx)
	err = b.WatchGroups(wctx, "reviewers", func(c bus.GroupChange) {
		if joined[c.Agent] = c.Joined; len(joined) == n {
			stop()
		}
	})
	if err != nil || len(joined) != n {
		t.Errorf("WatchGroups saw %v, %v; want all %d members", joined, err, n)
	}
	stop()

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Agents(ctx); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Agents after the Bus closed: %v, want ErrClosed", err)
	}
}

// TestShardsMadeAtOnce: a new handle sending from many goroutines to every
// shard at once, so that its shards' buses are made meanwhile, stores each
// message on its recipient's shard, without a data race (-race).
func TestShardsMadeAtOnce(t *testing.T) {
	const n = 8
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	sender := inst.shards("sender").Bus()
	acks, errs := make([]bus.PubAck, 4*n), make([]error, 4*n)
	var wg sync.WaitGroup
	for i := range acks {
		wg.Go(func() { acks[i], errs[i] = sender.Publish(ctx, bus.Message{To: agents[i%n], Type: "TASK"}) })
	}
	wg.Wait()
	for i := range acks {
		if want := streamOf(t, i%n, n); errs[i] != nil || acks[i].Stream != want {
			t.Errorf("message %d to %s: %+v, %v; want it on %s", i, agents[i%n], acks[i], errs[i], want)
		}
	}
}

// TestShardsHistory: an agent's history of a conversation holds what it
// sent to an agent of another shard and the reply it got on its own, in
// order.
func TestShardsHistory(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	asker := inst.shards(agents[0]).Bus()
	replier(t, inst.shards(agents[1]).Bus())
	reply, err := asker.Request(ctx, bus.Message{To: agents[1], Type: "REQUEST", Data: []byte("q")})
	if err != nil {
		t.Fatal(err)
	}
	page, err := asker.History(ctx, reply.CorrelationID, bus.HistoryQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Entries {
		if e.Err != nil {
			t.Errorf("entry %s: %v", e.ID, e.Err)
		}
		got = append(got, e.Type+"@"+e.Stream)
	}
	if want := []string{"REQUEST@" + streamOf(t, 1, n), "RESULT@" + streamOf(t, 0, n)}; !slices.Equal(got, want) {
		t.Errorf("history %v, want %v", got, want)
	}
}

// TestShardsStatusStreamUnread: a shard that cannot read its stream (here
// it has no room for the consumer that reads a window) and holds no record
// of a message does not hide the message another shard holds: Status and
// Cancel answer from the shard that has it. Where no shard has it, the
// shard that could not tell makes the answer an error, not ErrNoStatus.
func TestShardsStatusStreamUnread(t *testing.T) {
	const n = 2
	s := embeddedtest.RunServer(t)
	ctx := testContext(t)
	admin := adminOf(t, s)
	for k := range n {
		root, err := subjects.ShardRoot("", k, n)
		if err != nil {
			t.Fatal(err)
		}
		cfg := bus.StreamConfig{Root: root}
		if k == 0 {
			cfg.MaxConsumers = 1 // filled below
		}
		if _, err := admin.Provision(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	agents := onShards(t, "agent", n)
	a0 := newShards(t, embeddedtest.Connect(t, s), agents[0], n)
	a1 := newShards(t, embeddedtest.Connect(t, s), agents[1], n)
	id := windowID
	// The message looked up, to agents[1], on shard 1; in its window on
	// shard 0, one from agents[1], which makes shard 0 read the window.
	if _, err := a0.Bus().Publish(ctx, bus.Message{ID: id(0), To: agents[1], Type: "T"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a1.Bus().Publish(ctx, bus.Message{ID: id(1), To: agents[0], Type: "T"}); err != nil {
		t.Fatal(err)
	}
	takeLastConsumer(t, s, streamOf(t, 0, n))

	if sts, err := a1.Bus().Status(ctx, id(0)); err != nil || len(sts) != 1 || sts[0].ID != id(0) {
		t.Errorf("Status(%s) = %+v, %v; want it from shard 1", id(0), sts, err)
	}
	if st, err := a1.Bus().Cancel(ctx, id(0)); err != nil || st.State != bus.StateCanceled {
		t.Errorf("Cancel(%s) = %+v, %v; want it canceled on shard 1", id(0), st, err)
	}
	// An ID of the window that no shard holds: shard 0 cannot tell.
	if sts, err := a1.Bus().Status(ctx, id(2)); err == nil || errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Status(%s) = %+v, %v; want shard 0's error, not ErrNoStatus", id(2), sts, err)
	}
}

// shardsHeldDown provisions an installation of n shards and returns it,
// with the bus of its first agent, whose shards beside its own are not
// made yet, connected through p, held down (its connection lost).
func shardsHeldDown(t *testing.T, n int) (*sharded, *cutProxy, *bus.Bus) {
	t.Helper()
	inst := newSharded(t, n)
	for k := range n {
		inst.shards(inst.agents[k]) // provisions every shard
	}
	p := newCutProxy(t, strings.TrimPrefix(inst.s.ClientURL(), "nats://"))
	sh, err := bus.ConnectShards(p.URL(), inst.agents[0], n, bus.WithNATSOptions(nats.ReconnectWait(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	sender := sh.Bus()
	p.hold()
	waitFor(t, "the connection down", func() (bool, string) { return !sender.Conn().IsConnected(), sender.Conn().Status().String() })
	return inst, p, sender
}

// TestShardsMadeWhileReconnecting: a call that needs the bus of a shard
// not made yet, made while the connection is down, waits for the
// connection as a call on a made shard does (askAgain), and goes through
// once it is back. Before, making the bus failed at once: "server version
// unknown: nats: connection reconnecting", from a Publish, a Cancel or a
// lookup that happened to be the first to reach the shard.
func TestShardsMadeWhileReconnecting(t *testing.T) {
	const n = 3
	inst, p, sender := shardsHeldDown(t, n)
	ctx := testContext(t)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for k := 1; k < n; k++ {
		wg.Go(func() {
			_, errs[k] = sender.Publish(ctx, bus.Message{To: inst.agents[k], Type: "TASK"})
		})
	}
	waitFor(t, "both sends waiting for the connection", func() (bool, string) {
		n := goroutinesIn("bus.(*Shards).connected")
		return n == 2, fmt.Sprintf("%d waiting", n)
	})
	p.release()
	wg.Wait()
	for k := 1; k < n; k++ {
		if errs[k] != nil {
			t.Errorf("publish to %s on shard %d, not made yet, across a reconnect: %v", inst.agents[k], k, errs[k])
		}
	}
}

// TestShardsScheduledBroadcastTime: on an installation of shards, a
// broadcast scheduled once has its firing time as its time, as on one
// root, so that its TTL counts from the firing. It had the time it was
// scheduled: with a TTL shorter than the wait, it expired before it fired.
func TestShardsScheduledBroadcastTime(t *testing.T) {
	inst := newSharded(t, 2)
	a, b := inst.shards(inst.agents[0]), inst.shards(inst.agents[1])
	rec := newRecorder()
	subscribe(t, b.Bus(), rec.handle)
	before := time.Now()
	if _, err := a.Bus().Schedule(testContext(t), bus.Message{To: bus.Broadcast, Type: "all", TTL: time.Minute}, bus.In(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if d := rec.waitCount(t, 1)[0]; d.Time.Before(before.Add(2 * time.Second)) {
		t.Errorf("the broadcast's time %v, scheduled at %v to fire 2 s later; want its firing time", d.Time, before)
	}
}

// TestShardMakingHonoursEachCallersContext: while the connection is down,
// a send to a shard not made yet waits for it no longer than its own
// context, also when another send waits to make that shard. Before, the
// second waited behind the first's lock for the first's deadline (found
// by a helper session).
func TestShardMakingHonoursEachCallersContext(t *testing.T) {
	const n = 3
	inst, p, sender := shardsHeldDown(t, n)
	t.Cleanup(p.release)
	long, cancelLong := context.WithTimeout(context.Background(), time.Minute)
	defer cancelLong()
	go func() { _, _ = sender.Publish(long, bus.Message{To: inst.agents[2], Type: "task"}) }()
	waitFor(t, "the first send waiting for the connection", func() (bool, string) {
		n := goroutinesIn("bus.(*Shards).connected")
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := sender.Publish(short, bus.Message{To: inst.agents[2], Type: "task"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the second send: %v, want its deadline", err)
		}
	case <-time.After(testTimeout):
		t.Error("a send with a 300 ms deadline still waits, behind another send's wait for the connection")
		cancelLong()
		<-done
	}
}

// TestShardsBroadcastHistoryOnce: on an installation of shards, the
// sender's History lists its broadcast once: "a broadcast is one entry,
// whoever received it" (docs/history.md). Before, once per shard (found by
// a helper session).
func TestShardsBroadcastHistoryOnce(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	sender := inst.shards(agents[0]).Bus()
	for k := 1; k < n; k++ {
		r := newRecorder()
		subscribe(t, inst.shards(agents[k]).Bus(), r.handle)
	}
	ack, err := sender.Publish(ctx, bus.Message{To: bus.Broadcast, Type: "NOTE", CorrelationID: "conv-1", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sender.History(ctx, "conv-1", bus.HistoryQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Entries {
		got = append(got, fmt.Sprintf("%s@%s err=%v", e.ID, e.Stream, e.Err))
	}
	if len(p.Entries) != 1 || p.Entries[0].ID != ack.ID {
		t.Errorf("sender's history of one broadcast on %d shards: %d entries %v, want 1", n, len(p.Entries), got)
	}
}

// TestShardsBroadcastStatusOnce: the sender's Status of a broadcast on
// an installation of shards holds its own record once (docs/reliability:
// "a broadcast has its sender's, which stays pending, and one for each
// agent that received it").
func TestShardsBroadcastStatusOnce(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	agents := inst.agents
	sender := inst.shards(agents[0]).Bus()
	for k := 1; k < n; k++ {
		r := newRecorder()
		subscribe(t, inst.shards(agents[k]).Bus(), r.handle)
	}
	ack, err := sender.Publish(ctx, bus.Message{To: bus.Broadcast, Type: "NOTE"})
	if err != nil {
		t.Fatal(err)
	}
	var sts []bus.Status
	waitFor(t, "the recipients' records", func() (bool, string) {
		sts, err = sender.Status(ctx, ack.ID)
		recipients := 0
		for _, st := range sts {
			if st.To != bus.Broadcast {
				recipients++
			}
		}
		return err == nil && recipients == n-1, fmt.Sprintf("%+v %v", sts, err)
	})
	senders := 0
	for _, st := range sts {
		if st.To == bus.Broadcast {
			senders++
		}
	}
	if senders != 1 {
		t.Errorf("Status of a broadcast on %d shards: %d sender records (%d in all), want 1", n, senders, len(sts))
	}
}

// TestShardsBroadcastPagingEnds: paging the sender's History of a
// conversation holding one broadcast, on shards, one entry a page, ends.
// Before, the copies on each shard had the same time, ID and (fresh
// shards) the same sequence, so their cursors were equal and the page
// after the second was the second again, for ever.
func TestShardsBroadcastPagingEnds(t *testing.T) {
	const n = 3
	inst := newSharded(t, n)
	ctx := testContext(t)
	sender := inst.shards(inst.agents[0]).Bus()
	if _, err := sender.Publish(ctx, bus.Message{To: bus.Broadcast, Type: "NOTE", CorrelationID: "conv-1"}); err != nil {
		t.Fatal(err)
	}
	q := bus.HistoryQuery{Limit: 1}
	var cursors []string
	for pages := 1; ; pages++ {
		p, err := sender.History(ctx, "conv-1", q)
		if err != nil {
			t.Fatal(err)
		}
		if p.Next == "" {
			break
		}
		cursors = append(cursors, p.Next)
		if pages == 10 {
			t.Fatalf("paging one broadcast one entry a page did not end after %d pages; cursors %v", pages, cursors)
		}
		q.After = p.Next
	}
}

// TestShardCount: an installation provisioned as three shards records its
// number in every shard's registry, and a process given another number is
// refused at once (ErrShardCount); before, its messages went to shards
// where their recipients had no consumers. So is an agent's bus made on a
// shard's root that is not its shard, and a service provisioning as it
// starts (EnsureProvisioned) with another number. An installation with no
// record (provisioned before it was kept) is not checked.
func TestShardCount(t *testing.T) {
	s := embeddedtest.RunServer(t)
	nc := embeddedtest.Connect(t, s)
	ctx := testContext(t)
	admins := make([]*bus.Admin, 3)
	for k := range admins {
		root, _ := subjects.ShardRoot("", k, 3)
		admins[k] = newAdmin(t, nc, bus.WithRoot(root))
		if _, err := admins[k].Provision(ctx, bus.StreamConfig{Shards: 3}); err != nil {
			t.Fatal(err)
		}
	}
	// Every agent of two shards lives on shard 0 or 1 of three, which
	// exist; of four, on one that does (the error must not be the
	// missing stream's).
	for _, n := range []int{2, 4} {
		agent := onShards(t, "agent", n)[1]
		_, err := bus.NewShards(nc, agent, n)
		if !errors.Is(err, bus.ErrShardCount) || !strings.Contains(err.Error(), "one of 3 shards") {
			t.Errorf("NewShards(%q, %d) on three shards: %v, want ErrShardCount naming 3", agent, n, err)
		}
	}
	agents := onShards(t, "agent", 3)
	h := newShards(t, nc, agents[0], 3)
	if _, err := h.Bus().Publish(ctx, bus.Message{To: agents[2], Type: "T"}); err != nil {
		t.Errorf("three shards on three: %v", err)
	}
	// A bus on a shard's root: the agent's own, or refused.
	own, _ := subjects.ShardRoot("", 1, 3)
	b, err := bus.New(nc, agents[1], bus.WithRoot(own))
	if err != nil {
		t.Errorf("New on the agent's own shard: %v", err)
	} else {
		b.Close()
	}
	_, err = bus.New(nc, agents[2], bus.WithRoot(own))
	if !errors.Is(err, bus.ErrShardCount) || !strings.Contains(err.Error(), "agentbus.s2") {
		t.Errorf("New on another agent's shard: %v, want ErrShardCount naming agentbus.s2", err)
	}
	if err := admins[0].CheckShards(ctx, 3); err != nil {
		t.Errorf("CheckShards(3): %v", err)
	}
	if err := admins[0].CheckShards(ctx, 2); !errors.Is(err, bus.ErrShardCount) {
		t.Errorf("CheckShards(2): %v, want ErrShardCount", err)
	}
	// A service starting keeps the record; the operator may change it.
	if _, err := admins[0].EnsureProvisioned(ctx, bus.StreamConfig{Shards: 2}); !errors.Is(err, bus.ErrShardCount) {
		t.Errorf("EnsureProvisioned with 2 shards on one of 3: %v, want ErrShardCount", err)
	}
	if _, err := admins[0].Provision(ctx, bus.StreamConfig{Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if err := admins[0].CheckShards(ctx, 2); err != nil {
		t.Errorf("CheckShards(2) after the operator provisioned 2: %v", err)
	}

	// No record: nothing to check against.
	for k := range 3 {
		root, _ := subjects.ShardRoot("old", k, 3)
		if _, err := newAdmin(t, nc, bus.WithRoot(root)).Provision(ctx, bus.StreamConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	newShards(t, nc, onShards(t, "agent", 2)[0], 2, bus.WithRoot("old"))
}

func TestStreamConfigShards(t *testing.T) {
	for _, c := range []bus.StreamConfig{
		{Shards: -1},
		{Shards: subjects.MaxShards + 1},
		{Shards: 3},                         // the default root is no shard's
		{Root: "agentbus.s3", Shards: 3},    // shards 0 to 2
		{Root: "agentbus.s01", Shards: 3},   // not as ShardRoot writes it
		{Root: "agentbus.shard", Shards: 3}, // no number
	} {
		if err := c.Validate(); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("%+v: %v, want ErrInvalidOption", c, err)
		}
	}
	for _, c := range []bus.StreamConfig{{Shards: 1}, {Root: "agentbus.s2", Shards: 3}, {Root: "team.s0", Shards: 2}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
