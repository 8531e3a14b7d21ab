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
