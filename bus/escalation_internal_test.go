package bus

import (
	"context"
	"testing"
	"time"
)

// TestEscalationsStopAfterANewerOutage: an outage replaced by a newer one
// (the agent found offline again, since a later time, with no online
// report between) before its escalation was due no longer counts as
// running, so stopping the watch does not wait for it forever.
func TestEscalationsStopAfterANewerOutage(t *testing.T) {
	w := &escalations{policies: []EscalationPolicy{{Agent: "a", After: time.Hour, To: "ops"}}, outages: map[string]*outage{}}
	now := time.Now()
	for _, since := range []time.Time{now, now.Add(time.Second)} {
		w.change(context.Background(), PresenceChange{Agent: "a", Presence: Presence{Status: Offline, Since: since}})
	}
	stopped := make(chan struct{})
	go func() {
		w.stopAll()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stopAll still waiting for the replaced outage's escalation")
	}
}
