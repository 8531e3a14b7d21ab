package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// TestLifecycleFinalStatesOfAMix: a mix of messages sent with the
// defaults, by Publish and PublishAsync, at every priority, handled by two
// processes of one agent with four handlers each, ends each message in the
// state its handling earns: completed (at once, after a failure, with a
// TTL, as a broadcast), replied (with its progress updates counted),
// dead_lettered, canceled while queued, and expired while queued. Each
// state is read back from the sender, which wrote none of them.
func TestLifecycleFinalStatesOfAMix(t *testing.T) {
	s := newServer(t)
	lifecycleMix(t, newBus(t, s, "orchestrator"), "worker", func() *bus.Bus { return newBus(t, s, "worker") })
}

// TestShardsLifecycleFinalStatesOfAMix: the same mix between agents on two
// shards of three. The shards are provisioned once, before: handles that
// provision each at once meet a data race inside nats-server (v2.15.2,
// checkStreamCfgLocked reads a source stream's configuration unlocked
// while another update writes it), which -race reports.
func TestShardsLifecycleFinalStatesOfAMix(t *testing.T) {
	inst := newSharded(t, 3)
	admin := newAdmin(t, embeddedtest.Connect(t, inst.s))
	for k := range inst.n {
		root, err := subjects.ShardRoot("", k, inst.n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Provision(testContext(t), bus.StreamConfig{Root: root}); err != nil {
			t.Fatal(err)
		}
	}
	handle := func(agent string) *bus.Bus {
		return newShards(t, embeddedtest.Connect(t, inst.s), agent, inst.n).Bus()
	}
	worker := inst.agents[1]
	lifecycleMix(t, handle(inst.agents[0]), worker, func() *bus.Bus { return handle(worker) })
}

// lifecycleMix sends the mix from orch to agent worker, whose processes
// newWorker makes, and checks where each message ends.
func lifecycleMix(t *testing.T, orch *bus.Bus, worker string, newWorker func() *bus.Bus) {
	ctx := testContext(t)

	type sent struct {
		id      string
		want    bus.State
		retried bool // handled on its second delivery
		updates int  // progress updates its reply counts
	}
	var (
		mu   sync.Mutex
		msgs []sent
	)
	add := func(id string, want bus.State) {
		mu.Lock()
		defer mu.Unlock()
		msgs = append(msgs, sent{id: id, want: want})
	}
	markRetried := func(retried bool) { msgs[len(msgs)-1].retried = retried }

	// Queued before the worker ever subscribes: canceled, and expired.
	for i := range 3 {
		ack := publish(t, orch, bus.Message{To: worker, Type: "DOOMED", Priority: i + 1})
		if _, err := orch.Cancel(ctx, ack.ID); err != nil {
			t.Fatal(err)
		}
		add(ack.ID, bus.StateCanceled)
	}
	var expiring []string
	for i := range 3 {
		ack := publish(t, orch, bus.Message{To: worker, Type: "LATE", Priority: i + 3, TTL: time.Second})
		expiring = append(expiring, ack.ID)
		add(ack.ID, bus.StateExpired)
	}
	// The broadcast consumer exists before the broadcasts are sent.
	if err := newWorker().EnsureConsumers(ctx); err != nil {
		t.Fatal(err)
	}

	kinds := []struct {
		typ  string
		ttl  time.Duration
		want bus.State
	}{
		{"OK", 0, bus.StateCompleted},
		{"OK", time.Hour, bus.StateCompleted},
		{"FLAKY", 0, bus.StateCompleted},
		{"REJECT", 0, bus.StateDeadLettered},
	}
	for i := range 40 {
		k := kinds[i%len(kinds)]
		m := bus.Message{To: worker, Type: k.typ, Priority: i%5 + 1, TTL: k.ttl}
		if i%2 == 0 {
			add(publish(t, orch, m).ID, k.want)
			markRetried(k.typ == "FLAKY")
			continue
		}
		f, err := orch.PublishAsync(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := f.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		add(ack.ID, k.want)
		markRetried(k.typ == "FLAKY")
	}
	var broadcasts []string
	for i := range 3 {
		broadcasts = append(broadcasts, publish(t, orch, bus.Message{To: bus.Broadcast, Type: "OK", Priority: i + 1}).ID)
	}
	waitAllInState(t, orch, bus.StateExpired, expiring) // unread

	handled := make(map[string]int) // by ID: deliveries handled
	var hmu sync.Mutex
	handler := func(ctx context.Context, d *bus.Delivery) error {
		hmu.Lock()
		handled[d.ID]++
		hmu.Unlock()
		switch d.Type {
		case "FLAKY":
			if d.Deliveries == 1 {
				return errors.New("try again")
			}
		case "REJECT":
			return bus.Permanent(errors.New("not for me"))
		case "ASK":
			for n := range 3 {
				if err := d.Progress(ctx, bus.Progress{Message: fmt.Sprint("step ", n)}); err != nil {
					return err
				}
			}
			_, err := d.Reply(ctx, bus.Message{Type: "ANSWER"})
			return err
		}
		return nil
	}
	for range 2 {
		subscribe(t, newWorker(), handler, bus.WithConcurrency(4), bus.WithBackoff(func(int) time.Duration { return 0 }))
	}

	// Requests, while the mix is being handled.
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			m := bus.Message{ID: fmt.Sprint("ask-", i), To: worker, Type: "ASK", Priority: i%5 + 1}
			if _, err := orch.Request(ctx, m); err != nil {
				t.Errorf("request %s: %v", m.ID, err)
			}
			mu.Lock()
			msgs = append(msgs, sent{id: m.ID, want: bus.StateReplied, updates: 3})
			mu.Unlock()
		})
	}
	wg.Wait()

	for _, m := range msgs {
		waitFor(t, fmt.Sprintf("%s %s", m.id, m.want), func() (bool, string) {
			sts, err := orch.Status(ctx, m.id)
			if err != nil || len(sts) != 1 {
				return false, fmt.Sprintf("%+v %v", sts, err)
			}
			st := sts[0]
			ok := st.State == m.want && (!m.retried || st.Deliveries == 2) && st.Progress == m.updates
			return ok, fmt.Sprintf("%s, %d deliveries, %d updates", st.State, st.Deliveries, st.Progress)
		})
	}
	for _, id := range broadcasts {
		waitFor(t, "broadcast "+id+" completed at the worker", func() (bool, string) {
			sts, err := orch.Status(ctx, id)
			for _, st := range sts {
				if st.To == worker {
					return st.State == bus.StateCompleted, string(st.State)
				}
			}
			return false, fmt.Sprintf("%+v %v", sts, err)
		})
	}
	hmu.Lock()
	defer hmu.Unlock()
	for _, m := range msgs {
		switch n := handled[m.id]; {
		case (m.want == bus.StateCanceled || m.want == bus.StateExpired) && n != 0:
			sts, _ := orch.Status(ctx, m.id)
			t.Errorf("%s, %s, was handled %d times (%+v)", m.id, m.want, n, sts)
		case m.want != bus.StateCanceled && m.want != bus.StateExpired && n == 0:
			t.Errorf("%s, %s, was never handled", m.id, m.want)
		}
	}
}
