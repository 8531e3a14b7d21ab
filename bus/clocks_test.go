package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// Agents' clocks may disagree with the server's and each other's
// (docs/operations.md#clocks). These tests write records as an agent on a
// skewed clock writes them.

// TestOfflineSinceIsTheServers: an agent that closes on a clock two
// minutes behind (or ahead) is offline since the server stored its
// record. Before 2026-11-28 its own clock gave Since: an escalation due
// after a minute went out at once (or came late), and a Request to an
// agent whose clock ran ahead said it "has been offline for -2m0s".
func TestOfflineSinceIsTheServers(t *testing.T) {
	s := newServer(t)
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	orch := newBus(t, s, "orchestrator")
	for agent, skew := range map[string]time.Duration{"behind": -2 * time.Minute, "ahead": 2 * time.Minute} {
		_, wnc := registered(t, s, agent, bus.AgentCard{})
		agentInfo(t, orch, agent, bus.Online)
		wnc.Close() // its heartbeats stop; the record below is its Close's

		at := time.Now().UTC().Add(skew)
		rec, err := json.Marshal(map[string]any{
			"specversion": "1.0", "id": codec.NewID(), "source": "/agents/" + agent,
			"type": bus.EventPresenceOffline, "time": at, "datacontenttype": "application/json",
			"data": map[string]any{"agent": agent, "status": "offline", "since": at, "interval": "1s", "reason": bus.ReasonShutdown},
		})
		if err != nil {
			t.Fatal(err)
		}
		key, err := subjects.PresenceKey(agent)
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		if _, err := js.Publish(testContext(t), orch.Subjects().PresenceSubjectPrefix()+key, rec); err != nil {
			t.Fatal(err)
		}
		after := time.Now()

		// LookupAgent reads it as a watch does (WatchPresence, escalations).
		info := agentInfo(t, orch, agent, bus.Offline)
		if since := info.Presence.Since; since.Before(before.Add(-time.Second)) || since.After(after.Add(time.Second)) {
			t.Errorf("clock %v: LookupAgent reads offline since %s, want the server's store time, about %s", skew, since, before.UTC())
		}
		// A Request reads it directly.
		_, err = orch.Request(testContext(t), bus.Message{To: agent, Type: "PING"})
		var off *bus.AgentOfflineError
		if !errors.As(err, &off) || strings.Contains(err.Error(), "offline for -") ||
			off.Presence.Since.Before(before.Add(-time.Second)) || off.Presence.Since.After(after.Add(time.Second)) {
			t.Errorf("clock %v: Request: %v; want an AgentOfflineError since about %s", skew, err, before.UTC())
		}
	}
}

// TestDeadLetterTimeIsTheServers: DeadLetter.Time is the store time that
// DeadLetterFilter.Since selects by. Before 2026-11-28 it was the
// dead-lettering agent's clock (HeaderDeadLetterTime): for an agent two
// minutes ahead, the dead letters since a dead letter's own Time left it
// out.
func TestDeadLetterTimeIsTheServers(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	sender, agent := newBus(t, s, "sender"), newBus(t, s, "agent")
	publish(t, sender, bus.Message{To: "agent", Type: "poison"})
	subscribe(t, agent, func(context.Context, *bus.Delivery) error { return bus.Permanent(errors.New("poison")) })
	raw := waitDeadLetters(t, agent, 1)[0]

	// Stored again as the agent's bus stores it on a clock two minutes ahead.
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, agent.Subjects().DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(raw.Subject)
	m.Data, m.Header = raw.Data, raw.Header
	m.Header.Set(bus.HeaderDeadLetterTime, time.Now().UTC().Add(2*time.Minute).Format(time.RFC3339Nano))
	m.Header.Del(jetstream.MsgIDHeader)
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}

	admin := adminOf(t, s)
	all, err := admin.DeadLetters(ctx, bus.DeadLetterFilter{})
	if err != nil || len(all) != 1 {
		t.Fatalf("DeadLetters: %d, %v; want the one", len(all), err)
	}
	one, err := admin.DeadLetter(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if !all[0].Time.Equal(stored.Time) || !one.Time.Equal(stored.Time) {
		t.Errorf("DeadLetters reads Time %s, DeadLetter %s; want the store time %s", all[0].Time, one.Time, stored.Time)
	}
	since, err := admin.DeadLetters(ctx, bus.DeadLetterFilter{Since: all[0].Time})
	if err != nil || len(since) != 1 {
		t.Errorf("DeadLetters(Since: its Time %s): %d, %v; want it", all[0].Time, len(since), err)
	}
}
