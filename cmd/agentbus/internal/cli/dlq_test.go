package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDeadLetterCommands(t *testing.T) {
	url := newServer(t)
	id := publish(t, url, "--from", "planner", "--to", "worker", "--type", "TASK", "--data", "payload")

	// The handler fails on the only allowed delivery: the message is dead-lettered.
	mustRun(t, "--server", url, "subscribe", "--agent", "worker", "--exec", "exit 3", "--max-deliver", "1", "--timeout", "1s")

	var line string
	deadline := time.Now().Add(testTimeout)
	for line == "" && time.Now().Before(deadline) {
		if line = strings.TrimSpace(mustRun(t, "--server", url, "dlq", "list", "--json")); line == "" {
			time.Sleep(10 * time.Millisecond) // poll interval
		}
	}
	var dl struct {
		Sequence   uint64          `json:"sequence"`
		Reason     string          `json:"reason"`
		Agent      string          `json:"agent"`
		Deliveries uint64          `json:"deliveries"`
		Event      json.RawMessage `json:"event"`
	}
	if err := json.Unmarshal([]byte(line), &dl); err != nil {
		t.Fatalf("dlq list --json printed %q: %v", line, err)
	}
	if dl.Reason != "max_deliveries" || dl.Agent != "worker" || dl.Deliveries != 1 || !strings.Contains(string(dl.Event), id) {
		t.Errorf("dead letter %+v event %s", dl, dl.Event)
	}
	if out := mustRun(t, "--server", url, "dlq", "list", "--agent", "someone-else"); out != "" {
		t.Errorf("dlq list --agent someone-else printed %q, want nothing", out)
	}
	if out := mustRun(t, "--server", url, "dlq", "list"); !strings.Contains(out, "max_deliveries") || !strings.Contains(out, id) {
		t.Errorf("dlq list printed %q", out)
	}
	if out := mustRun(t, "--server", url, "dlq", "show", "1"); !strings.Contains(out, id) {
		t.Errorf("dlq show printed %q", out)
	}
	if out := mustRun(t, "--server", url, "dlq", "replay", "1"); !strings.HasPrefix(out, "id="+id+" ") {
		t.Errorf("dlq replay printed %q", out)
	}
	out := mustRun(t, "--server", url, "subscribe", "--agent", "worker", "--count", "1", "--json")
	if !strings.Contains(out, id) {
		t.Errorf("replayed message not received: %q", out)
	}
	// An empty filter is refused, not taken for none: it would purge every dead letter.
	if r := runIn(t, "", "--server", url, "dlq", "purge", "--agent", ""); r.code != exitUsage {
		t.Errorf("dlq purge --agent '': exit %d stderr %q, want a usage error", r.code, r.stderr)
	}
	if out := mustRun(t, "--server", url, "dlq", "purge", "--agent", "worker"); out != "purged 1\n" {
		t.Errorf("dlq purge printed %q", out)
	}
	for _, args := range [][]string{{"dlq", "show", "x"}, {"dlq", "show", "0"}, {"dlq", "replay"}} {
		if r := runIn(t, "", append([]string{"--server", url}, args...)...); r.code != 2 || !strings.HasPrefix(r.stderr, "agentbus: ") {
			t.Errorf("agentbus %v: exit %d stderr %q, want a usage error", args, r.code, r.stderr)
		}
	}
	if r := runIn(t, "", "--server", url, "dlq", "show", "99"); r.code != 1 {
		t.Errorf("dlq show 99: exit %d, want 1", r.code)
	}
}

// TestDeadLetterFilterFlags: an --agent or --type given to dlq list or
// purge must be valid; an empty one is not "no filter".
func TestDeadLetterFilterFlags(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "purge empty agent", args: []string{"dlq", "purge", "--agent", ""}, wantErr: "--agent: "},
		{name: "purge empty type", args: []string{"dlq", "purge", "--type", ""}, wantErr: "--type: "},
		{name: "purge broadcast agent", args: []string{"dlq", "purge", "--agent", "*"}, wantErr: "--agent: "},
		{name: "purge control character", args: []string{"dlq", "purge", "--type", "a\x01b"}, wantErr: `--type: `},
		{name: "list empty agent", args: []string{"dlq", "list", "--agent", ""}, wantErr: "--agent: "},
		{name: "list empty type", args: []string{"dlq", "list", "--type", ""}, wantErr: "--type: "},
		{name: "list too long agent", args: []string{"dlq", "list", "--agent", strings.Repeat("a", 300)}, wantErr: "--agent: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkUsageError(t, runIn(t, "", append([]string{"--server", url}, tt.args...)...), tt.wantErr)
		})
	}
}
