package cli

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "TASK", "--id", "s-1", "--data", "x")
	status := []string{"--server", url, "status", "s-1"}

	pending := regexp.MustCompile(`^s-1 alice -> bob pending seq=1 updated=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n$`)
	waitFor(t, "the pending record", func() (bool, string) {
		r := runIn(t, "", status...)
		return r.code == exitOK && pending.MatchString(r.stdout), r.stdout + r.stderr
	})
	// The sender and the recipient see it too.
	for _, agent := range []string{"alice", "bob"} {
		if out := mustRun(t, append(status, "--agent", agent)...); !pending.MatchString(out) {
			t.Errorf("status --agent %s printed %q, want a line matching %s", agent, out, pending)
		}
	}
	// A bystander does not.
	r := runIn(t, "", append(status, "--agent", "carol")...)
	checkOneErrorLine(t, r)
	if r.code != exitError || !strings.Contains(r.stderr, "agentbus: no status recorded for message s-1") {
		t.Errorf("status --agent carol: exit %d, stderr %q; want exit 1, no status recorded", r.code, r.stderr)
	}

	var sts []bus.Status
	if err := json.Unmarshal([]byte(mustRun(t, append(status, "--json")...)), &sts); err != nil {
		t.Fatalf("status --json: %v", err)
	}
	if len(sts) != 1 || sts[0].ID != "s-1" || sts[0].From != "alice" || sts[0].To != "bob" || sts[0].Type != "TASK" || sts[0].State != bus.StatePending {
		t.Errorf("status --json = %+v, want the pending record of s-1", sts)
	}

	mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1")
	completed := regexp.MustCompile(`^s-1 alice -> bob completed deliveries=1 seq=1 updated=\S+\n$`)
	waitFor(t, "the completed record", func() (bool, string) {
		r := runIn(t, "", status...)
		// The first to read completed off bob's consumer writes it back as
		// it exits: no warning that the write failed.
		if r.code != exitOK || r.stderr != "" {
			t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
		}
		return completed.MatchString(r.stdout), r.stdout
	})

	r = runIn(t, "", "--server", url, "status", "nope")
	checkOneErrorLine(t, r)
	if r.code != exitError || r.stderr != "agentbus: no status recorded for message nope\n" {
		t.Errorf("status of an unknown message: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestTrace(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	const conv = "conv-t"
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "TASK", "--priority", "1", "--id", "t-1", "--correlation-id", conv)
	publish(t, url, "--from", "bob", "--to", "alice", "--type", "RESULT", "--priority", "2", "--id", "t-2", "--correlation-id", conv, "--causation-id", "t-1")
	publish(t, url, "--from", "alice", "--to", "carol", "--type", "NOTE", "--priority", "5", "--id", "t-3", "--correlation-id", conv)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "OTHER", "--id", "o-1", "--correlation-id", "conv-other")
	traceID := bus.ConversationTraceID(conv).String()

	var doc struct {
		CorrelationID string       `json:"correlationId"`
		TraceID       string       `json:"traceId"`
		Messages      []bus.Status `json:"messages"`
	}
	waitFor(t, "the three records", func() (bool, string) {
		out := mustRun(t, "--server", url, "trace", conv, "--json")
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("trace --json printed %q: %v", out, err)
		}
		return len(doc.Messages) == 3, out
	})
	if doc.CorrelationID != conv || doc.TraceID != traceID {
		t.Errorf("trace --json: correlationId %q traceId %q, want %q %q", doc.CorrelationID, doc.TraceID, conv, traceID)
	}
	var ids []string
	for _, st := range doc.Messages {
		ids = append(ids, st.ID)
	}
	if want := []string{"t-1", "t-2", "t-3"}; !slices.Equal(ids, want) {
		t.Errorf("trace --json messages %v, want %v", ids, want)
	}

	lines := strings.Split(strings.TrimSuffix(mustRun(t, "--server", url, "trace", conv), "\n"), "\n")
	if want := "conversation " + conv + " trace_id=" + traceID; lines[0] != want {
		t.Errorf("header %q, want %q", lines[0], want)
	}
	if len(lines) != 5 || !strings.HasPrefix(lines[1], "TIME ") {
		t.Fatalf("trace printed %q, want a header, column names and three rows", lines)
	}
	wantRows := []string{
		"alice -> bob TASK p1 pending 0 t-1",
		"bob -> alice RESULT p2 pending 0 t-2",
		"alice -> carol NOTE p5 pending 0 t-3",
	}
	timeRE := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	for i, line := range lines[2:] {
		f := strings.Fields(line)
		if !timeRE.MatchString(f[0]) || strings.Join(f[1:], " ") != wantRows[i] {
			t.Errorf("row %d %q, want <time> %s", i, line, wantRows[i])
		}
	}

	r := runIn(t, "", "--server", url, "trace", "nope")
	checkOneErrorLine(t, r)
	if r.code != exitError || r.stderr != "agentbus: no messages recorded for conversation nope\n" {
		t.Errorf("trace of an unknown conversation: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestStatusTraceUsageErrors(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	for _, args := range [][]string{
		{"status"},
		{"status", "a", "b"},
		{"status", "a", "--agent", "*"},
		{"trace"},
		{"trace", "a", "b"},
	} {
		r := runIn(t, "", append([]string{"--server", url}, args...)...)
		checkOneErrorLine(t, r)
		if r.code != exitUsage || r.stdout != "" {
			t.Errorf("agentbus %v: exit %d stdout %q stderr %q, want a usage error", args, r.code, r.stdout, r.stderr)
		}
	}
}
