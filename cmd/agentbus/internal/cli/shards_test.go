package cli

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// onOtherShards returns two agent IDs of an installation of three shards,
// on two shards other than the first: the unsharded root's commands would
// find neither.
func onOtherShards(t *testing.T) (string, string) {
	t.Helper()
	var found []string
	used := map[int]bool{0: true}
	for _, id := range []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"} {
		k, err := subjects.ShardOf(id, 3)
		if err != nil {
			t.Fatal(err)
		}
		if !used[k] {
			used[k] = true
			found = append(found, id)
		}
	}
	if len(found) < 2 {
		t.Fatalf("no two agents on shards 1 and 2 among the candidates: %v", found)
	}
	return found[0], found[1]
}

// TestShardsOperatorCommands: with --shards, the operator's commands reach
// every shard, or the shard of the agent they name: agents lists and shows
// agents registered on other shards, group add and remove write each
// membership on its agent's shard, where the agents' own buses read it,
// group list merges the shards, cancel finds a message on its shard, and
// agents --watch and group watch print what stands on every shard.
// The commands that work on one shard's streams refuse --shards, naming the
// shards' roots, rather than read the unsharded root.
func TestShardsOperatorCommands(t *testing.T) {
	url := embeddedtest.RunServer(t).ClientURL()
	sharded := func(args ...string) []string { return append([]string{"--server", url, "--shards", "3"}, args...) }
	mustRun(t, sharded("provision")...)
	a1, a2 := onOtherShards(t)
	ctx := testContext(t)
	for _, id := range []string{a1, a2} {
		s, err := bus.ConnectShards(url, id, 3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Bus().Register(ctx, bus.AgentCard{Name: id, Skills: []bus.Skill{{ID: "review"}}}); err != nil {
			t.Fatal(err)
		}
	}

	var listed []struct {
		Card   bus.AgentCard `json:"card"`
		Status string        `json:"status"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, sharded("agents", "--json")...)), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 || listed[0].Card.Name != min(a1, a2) || listed[1].Card.Name != max(a1, a2) || listed[0].Status != "online" || listed[1].Status != "online" {
		t.Errorf("agents --json listed %+v, want %s and %s online", listed, a1, a2)
	}
	if out := mustRun(t, sharded("agents")...); !strings.Contains(out, "\n"+a1+" ") || !strings.Contains(out, "\n"+a2+" ") {
		t.Errorf("agents printed %q, want rows for %s and %s", out, a1, a2)
	}
	if out := mustRun(t, sharded("agents", "show", a2)...); !strings.Contains(out, `"name":"`+a2+`"`) {
		t.Errorf("agents show %s printed %q", a2, out)
	}
	// Memberships, read back by an agent's bus, which spans the shards.
	s, err := bus.ConnectShards(url, "reader", 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	members := func() []string {
		t.Helper()
		m, err := s.Bus().GroupMembers(ctx, "team")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	mustRun(t, sharded("group", "add", "team", a1, a2)...)
	if got, want := members(), []string{min(a1, a2), max(a1, a2)}; !slices.Equal(got, want) {
		t.Errorf("after group add: members %v, want %v", got, want)
	}
	if out, want := mustRun(t, sharded("group", "list")...), "team "+min(a1, a2)+" "+max(a1, a2)+"\n"; out != want {
		t.Errorf("group list printed %q, want %q", out, want)
	}
	if out, want := mustRun(t, sharded("group", "add", "reviewers", "--skill", "review")...), min(a1, a2)+"\n"+max(a1, a2)+"\n"; out != want {
		t.Errorf("group add --skill printed %q, want %q", out, want)
	}
	mustRun(t, sharded("group", "remove", "team", a1)...)
	if got := members(); !slices.Equal(got, []string{a2}) {
		t.Errorf("after group remove %s: members %v, want [%s]", a1, got, a2)
	}
	if out, want := mustRun(t, sharded("group", "list", "team")...), a2+"\n"; out != want {
		t.Errorf("group list team printed %q, want %q", out, want)
	}

	// A message queued for a2, on its shard, canceled by the operator.
	id := publish(t, url, "--shards", "3", "--from", a1, "--to", a2, "--type", "TASK", "--data", "x")
	if out := mustRun(t, sharded("cancel", id)...); !strings.Contains(out, id+" "+a1+" -> "+a2+" canceled") {
		t.Errorf("cancel %s printed %q, want it canceled", id, out)
	}
	if r := runIn(t, "", sharded("cancel", "no-such-message")...); r.code != 1 || !strings.Contains(r.stderr, "no status recorded") {
		t.Errorf("cancel of an unknown message: exit %d, stderr %q", r.code, r.stderr)
	}

	for _, c := range []struct {
		name string
		args []string
	}{
		{"dlq list", nil}, {"dlq show", []string{"1"}}, {"dlq replay", []string{"1"}}, {"dlq purge", nil},
		{"history", []string{"conv-1"}}, {"redeliver", []string{id, "--to", a1}},
		{"agents escalate", []string{"--agent", a1, "--after", "1m", "--to", a2}},
	} {
		r := runIn(t, "", sharded(append(strings.Fields(c.name), c.args...)...)...)
		checkUsageError(t, r, "--shards 3: agentbus "+c.name+" works on one shard at a time")
		checkUsageError(t, r, "(agentbus.s0 to agentbus.s2)")
	}
	// agents --watch and group watch print what stands on every shard.
	for _, watch := range [][]string{{"agents", "--watch"}, {"group", "watch"}} {
		wctx, stop := context.WithCancel(ctx)
		var stdout, stderr syncBuffer
		code := make(chan int, 1)
		go func() { code <- Main(wctx, sharded(watch...), strings.NewReader(""), &stdout, &stderr) }()
		if watch[0] == "group" {
			mustRun(t, sharded("group", "add", "watched", a1, a2)...)
		}
		waitFor(t, strings.Join(watch, " ")+" to print both agents", func() (bool, string) {
			out := stdout.String()
			return strings.Contains(out, " "+a1+" ") && strings.Contains(out, " "+a2+" "), out
		})
		stop()
		if c := <-code; c != 0 {
			t.Errorf("%s exited %d; stderr %q", strings.Join(watch, " "), c, stderr.String())
		}
	}
}

// TestShardsWatchDeadLetters: serve and dlq watch, given --shards, watch
// the unsettled stream of every shard (a watcher's pull waits on each), where
// a crashed subscriber's last delivery is announced; serve provisions every
// shard.
func TestShardsWatchDeadLetters(t *testing.T) {
	watching := func(t *testing.T, url string) {
		t.Helper()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		for k := range 3 {
			root, _ := subjects.ShardRoot("agentbus", k, 3)
			scheme, _ := subjects.New(root)
			waitFor(t, "a dead-letter watcher on "+scheme.UnsettledStream(), func() (bool, string) {
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				s, err := js.Stream(ctx, scheme.UnsettledStream())
				if err != nil {
					return false, err.Error()
				}
				for info := range s.ListConsumers(ctx).Info() {
					if info.NumWaiting > 0 { // a watcher's pull
						return true, ""
					}
				}
				return false, "no consumer with a pull waiting"
			})
		}
	}

	t.Run("serve", func(t *testing.T) {
		s := startServe(t, "", "--shards", "3")
		if !strings.Contains(s.stderr.String(), "stream AGENTBUS_S0, AGENTBUS_S1, AGENTBUS_S2, 0 messages") {
			t.Errorf("serve's stderr %q, want the three shards' streams", s.stderr.String())
		}
		watching(t, s.url)
		if code := s.stop(t); code != 0 {
			t.Errorf("serve exited %d; stderr %q", code, s.stderr.String())
		}
	})
	t.Run("dlq watch", func(t *testing.T) {
		url := embeddedtest.RunServer(t).ClientURL()
		mustRun(t, "--server", url, "--shards", "3", "provision")
		ctx, cancel := context.WithCancel(testContext(t))
		code := make(chan int, 1)
		var stdout, stderr syncBuffer
		go func() {
			code <- Main(ctx, []string{"--server", url, "--shards", "3", "dlq", "watch"}, strings.NewReader(""), &stdout, &stderr)
		}()
		watching(t, url)
		cancel()
		if c := <-code; c != 0 {
			t.Errorf("dlq watch exited %d; stderr %q", c, stderr.String())
		}
	})
}

// TestBroadcastOnShardsListedOnce: agentbus status --shards N of a
// broadcast prints its sender's record once ("A broadcast has its
// sender's, which stays pending, and one for each agent that received
// it"), and history --agent SENDER --shards N lists it once. Before, once
// per shard (found by a helper session).
func TestBroadcastOnShardsListedOnce(t *testing.T) {
	url := embeddedtest.RunServer(t).ClientURL()
	sharded := func(args ...string) []string { return append([]string{"--server", url, "--shards", "3"}, args...) }
	mustRun(t, sharded("provision")...)
	id := publish(t, url, "--shards", "3", "--from", "alice", "--to", "*", "--type", "NOTE", "--correlation-id", "conv-s", "--data", "x")
	out := mustRun(t, sharded("status", id)...)
	if n := strings.Count(out, "alice -> * pending"); n != 1 {
		t.Errorf("status --shards 3 of a broadcast printed the sender's record %d times:\n%s", n, out)
	}
	out = mustRun(t, sharded("history", "conv-s", "--agent", "alice")...)
	if n := strings.Count(out, "id="+id); n != 1 {
		t.Errorf("history --agent alice --shards 3 listed the broadcast %d times:\n%s", n, out)
	}
}
