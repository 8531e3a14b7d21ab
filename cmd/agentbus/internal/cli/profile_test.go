package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func TestPublishSubscribeProfiles(t *testing.T) {
	url := newServer(t)
	pipeline := "../../../../codec/profiles/testdata/pipeline/message.json"
	native, err := os.ReadFile(pipeline)
	if err != nil {
		t.Fatal(err)
	}
	// Addressing and priority come from the native message (pm -> dev, p4).
	out := mustRun(t, "--server", url, "publish", "--profile", "pipeline", "--file", pipeline)
	if !strings.HasPrefix(out, "id=msg-uuid-v4 ") {
		t.Errorf("publish --profile printed %q", out)
	}
	got := mustRun(t, "--server", url, "subscribe", "--agent", "dev", "--profile", "pipeline", "--count", "1")
	var want bytes.Buffer
	if err := json.Compact(&want, native); err != nil {
		t.Fatal(err)
	}
	if got != want.String()+"\n" {
		t.Errorf("subscribe --profile printed\n%s\nwant\n%s", got, want.String())
	}

	// Front matter carries no addressing: --from and --to supply it.
	doc := "../../../../codec/profiles/testdata/frontmatter/task_assignment.md"
	mustRun(t, "--server", url, "publish", "--profile", "frontmatter", "--from", "orchestrator", "--to", "worker", "--file", doc)
	md, _ := os.ReadFile(doc)
	got = mustRun(t, "--server", url, "subscribe", "--agent", "worker", "--profile", "frontmatter", "--count", "1")
	if !strings.HasPrefix(got, string(md)) || !strings.HasSuffix(got, "\n"+frontMatterSeparator+"\n") {
		t.Errorf("front matter printed %q", got)
	}

	for _, args := range [][]string{
		{"publish", "--profile", "nope", "--data", "{}"},
		{"publish", "--profile", "pipeline", "--data", "not json"},
		{"subscribe", "--agent", "dev", "--profile", "nope"},
		{"subscribe", "--agent", "dev", "--profile", "pipeline", "--json"},
	} {
		if r := runIn(t, "", append([]string{"--server", url}, args...)...); r.code != 2 || !strings.HasPrefix(r.stderr, "agentbus: ") {
			t.Errorf("agentbus %v: exit %d stderr %q, want a usage error", args, r.code, r.stderr)
		}
	}
	// A strict profile refuses an invalid message at publish.
	bad := `{"id":"x","from":"pm","to":"dev","subject":"develop","body":{},"priority":9,"timestamp":"2026-04-11T01:10:00.000Z","status":"pending"}`
	if r := runIn(t, "", "--server", url, "publish", "--profile", "pipeline", "--data", bad); r.code == 0 || !strings.Contains(r.stderr, "priority") {
		t.Errorf("invalid pipeline message: exit %d stderr %q", r.code, r.stderr)
	}
}

// TestPublishProfileTTL: --ttl applies to a native message too (it used to
// be dropped silently): the event carries its expiry.
func TestPublishProfileTTL(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	// Front matter has no timestamp, so the event's time is now and the
	// expiry an hour from now.
	mustRun(t, "--server", url, "publish", "--profile", "frontmatter", "--from", "orchestrator", "--to", "dev",
		"--file", "../../../../codec/profiles/testdata/frontmatter/task_assignment.md", "--ttl", "1h")
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "dev", "--json", "--count", "1", "--timeout", "10s"))
	if len(evs) != 1 || evs[0].msg.TTL != time.Hour {
		t.Errorf("got %+v, want one event with a TTL of 1h", evs)
	}
}

// TestPublishProfileReplyThreads: a pipeline message whose replyTo names a
// message its sender has queued, going back to that message's sender, is
// sent as its reply: in its conversation, and the message is recorded
// replied (issue: the reply used to start a conversation of its own).
func TestPublishProfileReplyThreads(t *testing.T) {
	url := newServer(t)
	mustRun(t, "--server", url, "publish", "--profile", "pipeline", "--file", "../../../../codec/profiles/testdata/pipeline/message.json")
	done := `{"id":"done-1","from":"dev","to":"pm","subject":"issue_complete","body":{"issue":"JOP-240","phase":2,"summary":"s","branch":"b","testResults":"ok"},"priority":4,"timestamp":"2026-04-11T02:00:00.000Z","replyTo":"msg-uuid-v4","status":"pending"}`
	mustRun(t, "--server", url, "publish", "--profile", "pipeline", "--data", done)
	out := mustRun(t, "--server", url, "status", "--agent", "pm", "msg-uuid-v4")
	if !strings.Contains(out, "replied") || !strings.Contains(out, "done-1") {
		t.Errorf("status of the develop message:\n%s\nwant replied with done-1", out)
	}
	got := mustRun(t, "--server", url, "subscribe", "--agent", "pm", "--json", "--count", "1")
	var m struct {
		ID            string `json:"id"`
		CorrelationID string `json:"correlationid"`
		CausationID   string `json:"causationid"`
	}
	if err := json.Unmarshal([]byte(got), &m); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	if m.ID != "done-1" || m.CorrelationID != "msg-uuid-v4" || m.CausationID != "msg-uuid-v4" {
		t.Errorf("pm got %s, want done-1 in the develop message's conversation", got)
	}
}
