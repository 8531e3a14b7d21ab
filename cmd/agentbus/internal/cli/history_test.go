package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func TestHistory(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	const conv = "conv-h"
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "TASK", "--priority", "1", "--id", "h-1", "--correlation-id", conv, "--data", "build it")
	publish(t, url, "--from", "bob", "--to", "alice", "--type", "RESULT", "--id", "h-2", "--correlation-id", conv, "--causation-id", "h-1", "--data", "built")
	publish(t, url, "--from", "alice", "--to", "carol", "--type", "NOTE", "--priority", "5", "--id", "h-3", "--correlation-id", conv, "--data", "FYI")
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "OTHER", "--id", "o-1", "--correlation-id", "conv-other", "--data", "elsewhere")
	history := []string{"--server", url, "history", conv}

	var out string
	waitFor(t, "the three messages", func() (bool, string) {
		out = mustRun(t, history...)
		return strings.Count(out, "\n") == 3, out
	})
	wantLines := []string{
		`alice -> bob p1 TASK id=h-1 data="build it"`,
		`bob -> alice p3 RESULT id=h-2 data="built"`,
		`alice -> carol p5 NOTE id=h-3 data="FYI"`,
	}
	timeRE := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		when, rest, _ := strings.Cut(line, " ")
		if !timeRE.MatchString(when) || rest != wantLines[i] {
			t.Errorf("line %d %q, want <time> %s", i, line, wantLines[i])
		}
	}

	// Two a page: the next page's cursor, then the rest.
	lines := strings.Split(strings.TrimSuffix(mustRun(t, append(history, "--limit", "2")...), "\n"), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[1], wantLines[1]) || !strings.HasPrefix(lines[2], "next=") {
		t.Fatalf("history --limit 2 printed %q, want two messages and next=", lines)
	}
	rest := mustRun(t, append(history, "--limit", "2", "--after", strings.TrimPrefix(lines[2], "next="))...)
	if strings.Count(rest, "\n") != 1 || !strings.HasSuffix(rest, wantLines[2]+"\n") {
		t.Errorf("the second page %q, want %s alone", rest, wantLines[2])
	}

	// JSON: a line per message with the CloudEvent, then the cursor.
	jl := strings.Split(strings.TrimSuffix(mustRun(t, append(history, "--json", "--limit", "2")...), "\n"), "\n")
	if len(jl) != 3 {
		t.Fatalf("history --json printed %q, want two messages and the cursor", jl)
	}
	var first struct {
		ID, From, To, Type, Subject string
		Priority                    int
		Sequence                    uint64
		Event                       json.RawMessage
		Error                       string
	}
	if err := json.Unmarshal([]byte(jl[0]), &first); err != nil {
		t.Fatal(err)
	}
	ev, err := codec.UnmarshalJSON(first.Event)
	if err != nil || first.ID != "h-1" || first.From != "alice" || first.To != "bob" || first.Priority != 1 || first.Sequence != 1 ||
		first.Subject != "agentbus.agent.bob.p1.alice.TASK.h-1."+subjects.ConversationKey("conv-h") || first.Error != "" || ev.ID != "h-1" || string(ev.Data) != "build it" {
		t.Errorf("first JSON line %s (event %+v, %v), want h-1 with its event", jl[0], ev, err)
	}
	var next map[string]string
	if err := json.Unmarshal([]byte(jl[2]), &next); err != nil || next["next"] != strings.TrimPrefix(lines[2], "next=") {
		t.Errorf("last JSON line %s, want the next page's cursor", jl[2])
	}

	// As a participant, its own part; as a bystander, nothing.
	if got := mustRun(t, append(history, "--agent", "carol")...); !strings.HasSuffix(got, wantLines[2]+"\n") || strings.Count(got, "\n") != 1 {
		t.Errorf("history --agent carol printed %q, want h-3 alone", got)
	}
	if got := mustRun(t, append(history, "--agent", "bob")...); strings.Count(got, "\n") != 2 || strings.Contains(got, "h-3") {
		t.Errorf("history --agent bob printed %q, want h-1 and h-2", got)
	}
	r := runIn(t, "", append(history, "--agent", "dave")...)
	checkOneErrorLine(t, r)
	if r.code != exitError || r.stderr != "agentbus: agent dave sent or received no message of conversation "+conv+"\n" {
		t.Errorf("history --agent dave: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runIn(t, "", "--server", url, "history", "nope")
	checkOneErrorLine(t, r)
	if r.code != exitError || r.stderr != "agentbus: no messages recorded for conversation nope\n" {
		t.Errorf("history of an unknown conversation: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestRedeliver(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "TASK", "--priority", "2", "--id", "r-1", "--correlation-id", "conv-r", "--data", "the context")
	var out string
	waitFor(t, "the redelivery", func() (bool, string) {
		r := runIn(t, "", "--server", url, "redeliver", "r-1", "--to", "carol")
		out = r.stdout
		return r.code == exitOK, r.stdout + r.stderr
	})
	if !regexp.MustCompile(`^id=[0-9a-f-]{36} seq=2\n$`).MatchString(out) {
		t.Errorf("redeliver printed %q, want id=<new ID> seq=2", out)
	}
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "carol", "--count", "1", "--json"))
	if len(evs) != 1 {
		t.Fatalf("carol got %d events, want the redelivery", len(evs))
	}
	m := evs[0].msg
	if m.ID == "r-1" || "id="+m.ID+" seq=2\n" != out || m.Extensions[bus.ExtRedeliveryOf] != "r-1" || m.From != "alice" || m.To != "carol" ||
		m.Type != "TASK" || m.Priority != 2 || m.CorrelationID != "conv-r" || string(m.Data) != "the context" {
		t.Errorf("carol got %+v, want r-1 again from alice, marked %s=r-1", m, bus.ExtRedeliveryOf)
	}

	for _, tt := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"unknown message", []string{"redeliver", "nope", "--to", "bob"}, exitError, "agentbus: no status recorded for message nope\n"},
		{"no recipient", []string{"redeliver", "r-1"}, exitUsage, ""},
		{"to every agent", []string{"redeliver", "r-1", "--to", "*"}, exitUsage, ""},
		{"two IDs", []string{"redeliver", "r-1", "r-2", "--to", "bob"}, exitUsage, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runIn(t, "", append([]string{"--server", url}, tt.args...)...)
			checkOneErrorLine(t, r)
			if r.code != tt.code || r.stdout != "" || tt.err != "" && r.stderr != tt.err {
				t.Errorf("exit %d stdout %q stderr %q, want exit %d %q", r.code, r.stdout, r.stderr, tt.code, tt.err)
			}
		})
	}
}

func TestHistoryUsageErrors(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	for _, tt := range []struct {
		args  []string
		names string // the flag the error names, if one
	}{
		{args: []string{"history"}},
		{args: []string{"history", "a", "b"}},
		{args: []string{"history", "a", "--limit", "-1"}, names: "--limit: "},
		{args: []string{"history", "a", "--limit", "10001"}, names: "--limit: "},
		{args: []string{"history", "a", "--after", "yesterday"}, names: "--after: "},
		{args: []string{"history", "a", "--agent", "*"}, names: "--agent"},
	} {
		r := runIn(t, "", append([]string{"--server", url}, tt.args...)...)
		checkOneErrorLine(t, r)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, tt.names) {
			t.Errorf("agentbus %v: exit %d stdout %q stderr %q, want a usage error naming %q", tt.args, r.code, r.stdout, r.stderr, tt.names)
		}
	}
}

// TestHistoryOfAScheduleNotFired: a conversation whose one message is
// scheduled and not fired has no message in the stream: history says so
// and exits 1, as for a conversation with no message. It printed nothing
// and exited 0.
func TestHistoryOfAScheduleNotFired(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	mustRun(t, "--server", url, "publish", "--from", "a", "--to", "b", "--type", "T", "--correlation-id", "conv-s", "--in", "1h")
	for _, args := range [][]string{
		{"history", "conv-s"},
		{"history", "conv-s", "--agent", "a"},
	} {
		r := runIn(t, "", append([]string{"--server", url}, args...)...)
		if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "no message in the stream yet") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 saying there is no message yet", args, r.code, r.stdout, r.stderr)
		}
	}
}
