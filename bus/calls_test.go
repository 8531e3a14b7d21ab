package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
)

// call is one call of the public API, named for a test that makes every
// call under one condition (a closed handle, a server that is down or not
// provisioned) and checks what each returns.
type call struct {
	name string
	do   func(context.Context) error
}

// busCalls returns every call of b that reaches the server: messages to
// agent "other", lookups of message id, the group "crew". Flush is left out:
// with nothing under way it has nothing to wait for, whatever the server.
func busCalls(b *bus.Bus, id string) []call {
	msg := bus.Message{To: "other", Type: "TASK"}
	handler := func(context.Context, *bus.Delivery) error { return nil }
	return []call{
		{"Publish", func(ctx context.Context) error { _, err := b.Publish(ctx, msg); return err }},
		{"PublishAsync", func(ctx context.Context) error {
			f, err := b.PublishAsync(ctx, msg)
			if err == nil {
				_, err = f.Wait(ctx)
			}
			return err
		}},
		{"Request", func(ctx context.Context) error { _, err := b.Request(ctx, msg); return err }},
		{"Schedule", func(ctx context.Context) error { _, err := b.Schedule(ctx, msg, bus.In(time.Hour)); return err }},
		{"Subscribe", func(ctx context.Context) error {
			s, err := b.Subscribe(ctx, handler)
			if err == nil {
				s.Stop()
				<-s.Done()
			}
			return err
		}},
		{"EnsureConsumers", func(ctx context.Context) error { return b.EnsureConsumers(ctx) }},
		{"Status", func(ctx context.Context) error { _, err := b.Status(ctx, id); return err }},
		{"Cancel", func(ctx context.Context) error { _, err := b.Cancel(ctx, id); return err }},
		{"Received", func(ctx context.Context) error { _, err := b.Received(ctx, id); return err }},
		{"Attach", func(ctx context.Context) error { _, err := b.Attach(ctx, id); return err }},
		{"History", func(ctx context.Context) error { _, err := b.History(ctx, id, bus.HistoryQuery{}); return err }},
		{"Register", func(ctx context.Context) error { return b.Register(ctx, bus.AgentCard{}) }},
		{"Agents", func(ctx context.Context) error { _, err := b.Agents(ctx); return err }},
		{"LookupAgent", func(ctx context.Context) error { _, err := b.LookupAgent(ctx, "other"); return err }},
		{"FindAgents", func(ctx context.Context) error { _, err := b.FindAgents(ctx, bus.AgentQuery{}); return err }},
		{"WatchPresence", func(ctx context.Context) error { return b.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
		{"JoinGroup", func(ctx context.Context) error { return b.JoinGroup(ctx, "crew") }},
		{"LeaveGroup", func(ctx context.Context) error { return b.LeaveGroup(ctx, "crew") }},
		{"Groups", func(ctx context.Context) error { _, err := b.Groups(ctx); return err }},
		{"GroupMembers", func(ctx context.Context) error { _, err := b.GroupMembers(ctx, "crew"); return err }},
		{"WatchGroups", func(ctx context.Context) error { return b.WatchGroups(ctx, "crew", func(bus.GroupChange) {}) }},
		{"PublishGroup", func(ctx context.Context) error { _, err := b.PublishGroup(ctx, "crew", msg); return err }},
		{"Gather", func(ctx context.Context) error { _, err := b.Gather(ctx, msg, []string{"other"}); return err }},
	}
}

// adminCalls returns every call of a that reaches the server but
// Provision: on agent "other", message id, the group "crew", dead letter 1.
func adminCalls(a *bus.Admin, id string) []call {
	return []call{
		{"Status", func(ctx context.Context) error { _, err := a.Status(ctx, id); return err }},
		{"Cancel", func(ctx context.Context) error { _, err := a.Cancel(ctx, id); return err }},
		{"Conversation", func(ctx context.Context) error { _, err := a.Conversation(ctx, id); return err }},
		{"History", func(ctx context.Context) error { _, err := a.History(ctx, id, bus.HistoryQuery{}); return err }},
		{"Redeliver", func(ctx context.Context) error { _, err := a.Redeliver(ctx, id, "other"); return err }},
		{"Backlog", func(ctx context.Context) error { _, err := a.Backlog(ctx, "other"); return err }},
		{"EnsureConsumers", func(ctx context.Context) error { return a.EnsureConsumers(ctx, "other") }},
		{"DeadLetter", func(ctx context.Context) error { _, err := a.DeadLetter(ctx, 1); return err }},
		{"DeadLetters", func(ctx context.Context) error { _, err := a.DeadLetters(ctx, bus.DeadLetterFilter{}); return err }},
		{"ReplayDeadLetter", func(ctx context.Context) error { _, err := a.ReplayDeadLetter(ctx, 1); return err }},
		{"PurgeDeadLetters", func(ctx context.Context) error {
			_, err := a.PurgeDeadLetters(ctx, bus.DeadLetterFilter{Agent: "nobody"})
			return err
		}},
		{"Agents", func(ctx context.Context) error { _, err := a.Agents(ctx); return err }},
		{"LookupAgent", func(ctx context.Context) error { _, err := a.LookupAgent(ctx, "other"); return err }},
		{"FindAgents", func(ctx context.Context) error { _, err := a.FindAgents(ctx, bus.AgentQuery{}); return err }},
		{"WatchPresence", func(ctx context.Context) error { return a.WatchPresence(ctx, func(bus.PresenceChange) {}) }},
		{"WatchEscalations", func(ctx context.Context) error { return a.WatchEscalations(ctx, nil) }},
		{"WatchDeadLetters", func(ctx context.Context) error { return a.WatchDeadLetters(ctx) }},
		{"AddToGroup", func(ctx context.Context) error { return a.AddToGroup(ctx, "crew", "other") }},
		{"AddMatchingToGroup", func(ctx context.Context) error {
			_, err := a.AddMatchingToGroup(ctx, "crew", bus.AgentQuery{})
			return err
		}},
		{"RemoveFromGroup", func(ctx context.Context) error { return a.RemoveFromGroup(ctx, "crew", "other") }},
		{"Groups", func(ctx context.Context) error { _, err := a.Groups(ctx); return err }},
		{"GroupMembers", func(ctx context.Context) error { _, err := a.GroupMembers(ctx, "crew"); return err }},
		{"WatchGroups", func(ctx context.Context) error { return a.WatchGroups(ctx, "crew", func(bus.GroupChange) {}) }},
	}
}

// eachCall makes every call of calls at once, each with a context of
// timeout, and checks what it returned with check; it returns when every
// call has.
func eachCall(t *testing.T, calls []call, timeout time.Duration, check func(t *testing.T, err error)) {
	t.Helper()
	t.Run("calls", func(t *testing.T) {
		for _, c := range calls {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				check(t, c.do(ctx))
			})
		}
	})
}
