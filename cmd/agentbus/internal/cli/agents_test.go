package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestAgents: subscribe --card registers the agent; agents lists it with
// its skills and, once the subscription ended, offline after a shutdown;
// agents show prints its card; a bad card file is a usage error.
func TestAgents(t *testing.T) {
	url := newServer(t)
	dir := t.TempDir()
	card := filepath.Join(dir, "card.json")
	if err := os.WriteFile(card, []byte(`{"description":"reviews pull requests","skills":[{"id":"code-review","tags":["go"]}],"accepts":["review_pr"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "reviewer", "--type", "review_pr", "--data", "x")
	mustRun(t, "--server", url, "subscribe", "--agent", "reviewer", "--card", card, "--count", "1")
	// Two more wait for it, at priorities 1 and 4.
	mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "reviewer", "--type", "review_pr", "--priority", "1", "--data", "y")
	mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "reviewer", "--type", "review_pr", "--priority", "4", "--data", "z")

	out := mustRun(t, "--server", url, "agents")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("agents printed\n%s", out)
	}
	if f := strings.Fields(lines[1]); f[0] != "reviewer" || f[1] != "offline" || f[2] != "(shutdown)" || f[4] != "1/0/0/1/0" || f[5] != "code-review" {
		t.Errorf("row %q", lines[1])
	}

	var all []struct {
		Card struct {
			Name   string   `json:"name"`
			Accept []string `json:"accepts"`
		} `json:"card"`
		Status   string `json:"status"`
		LastSeen string `json:"lastSeen"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "--server", url, "agents", "--json")), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Card.Name != "reviewer" || all[0].Status != "offline" || all[0].LastSeen == "" || all[0].Card.Accept[0] != "review_pr" {
		t.Errorf("agents --json: %+v", all)
	}
	if show := mustRun(t, "--server", url, "agents", "show", "reviewer"); !strings.Contains(show, `"description":"reviews pull requests"`) {
		t.Errorf("agents show printed %s", show)
	}
	if r := runIn(t, "", "--server", url, "agents", "show", "nobody"); r.code != exitError || !strings.Contains(r.stderr, "not registered") {
		t.Errorf("agents show nobody: exit %d, stderr %q", r.code, r.stderr)
	}

	bad := filepath.Join(dir, "bad.json")
	for _, content := range []string{`{"skills":[{"name":"no id"}]}`, `{"unknown":1}`, `not json`} {
		if err := os.WriteFile(bad, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := runIn(t, "", "--server", url, "subscribe", "--agent", "x", "--card", bad, "--count", "1", "--timeout", "1s"); r.code != 2 {
			t.Errorf("card %s: exit %d, stderr %q; want a usage error", content, r.code, r.stderr)
		}
	}
}

// agentsWatch is a run of agents --watch on the server at url, which it
// returns once the watch shows a probe agent, so that it runs: what it
// prints, and stop, which interrupts it and returns its exit code.
type agentsWatch struct {
	out, errOut embeddedtest.SyncBuffer
	stop        func() int
}

func startAgentsWatch(t *testing.T, url string) *agentsWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	t.Cleanup(cancel)
	w := &agentsWatch{}
	exited := make(chan int, 1)
	go func() {
		exited <- Main(ctx, []string{"--server", url, "agents", "--watch"}, strings.NewReader(""), &w.out, &w.errOut)
	}()
	w.stop = func() int {
		cancel()
		return <-exited
	}
	probe, err := bus.Connect(url, "probe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { probe.Close() })
	if err := probe.Register(ctx, bus.AgentCard{}); err != nil {
		t.Fatal(err)
	}
	w.waitOut(t, " probe online since ")
	return w
}

// waitOut waits until the watch has printed s.
func (w *agentsWatch) waitOut(t *testing.T, s string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("agents --watch to print %q", s), func() (bool, string) {
		return strings.Contains(w.out.String(), s), fmt.Sprintf("stdout %q, stderr %q", w.out.String(), w.errOut.String())
	})
}

// TestAgentsWatch: agents --watch prints an agent coming online and going
// offline, and exits 0 when interrupted.
func TestAgentsWatch(t *testing.T) {
	url := newServer(t)
	card := filepath.Join(t.TempDir(), "card.json")
	if err := os.WriteFile(card, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The probe shows that the watch runs before the reviewer starts.
	w := startAgentsWatch(t, url)

	mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "reviewer", "--type", "T", "--data", "x")
	mustRun(t, "--server", url, "subscribe", "--agent", "reviewer", "--card", card, "--count", "1")
	w.waitOut(t, "reviewer offline (shutdown)")
	if code := w.stop(); code != 0 {
		t.Errorf("agents --watch exited %d, stderr %q", code, w.errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(w.out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], " reviewer online since ") || !strings.Contains(lines[2], " reviewer offline (shutdown) since ") {
		t.Errorf("agents --watch printed\n%s", w.out.String())
	}
}

// TestAgentsEscalateUsage: escalate checks its flags before it watches,
// naming the one at fault; an agent that cannot exist would be watched
// forever.
func TestAgentsEscalateUsage(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	esc := func(args ...string) []string {
		return append([]string{"--server", url, "agents", "escalate"}, args...)
	}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "no agent or tag", args: esc("--after", "1m", "--to", "human"), wantErr: `required flag "agent" or "tag" not set`},
		{name: "agent and tag", args: esc("--agent", "dev", "--tag", "t", "--after", "1m", "--to", "human"), wantErr: "--agent and --tag cannot be used together"},
		{name: "no after", args: esc("--agent", "dev", "--to", "human"), wantErr: "--after 0s: must be > 0"},
		{name: "negative after", args: esc("--agent", "dev", "--after", "-1m", "--to", "human"), wantErr: "--after -1m0s: must be > 0"},
		{name: "no to", args: esc("--agent", "dev", "--after", "1m"), wantErr: `required flag "to" not set`},
		{name: "broadcast to", args: esc("--agent", "dev", "--after", "1m", "--to", "*"), wantErr: "--to: "},
		{name: "broadcast agent", args: esc("--agent", "*", "--after", "1m", "--to", "human"), wantErr: "--agent: "},
		{name: "empty agent", args: esc("--agent", "", "--after", "1m", "--to", "human"), wantErr: "--agent: "},
		{name: "too long agent", args: esc("--agent", strings.Repeat("a", 300), "--after", "1m", "--to", "human"), wantErr: "--agent: "},
		{name: "control character agent", args: esc("--agent", "a\x01b", "--after", "1m", "--to", "human"), wantErr: `--agent: `},
		{name: "empty tag", args: esc("--tag", "", "--after", "1m", "--to", "human"), wantErr: "--tag: empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runIn(t, "", tt.args...)
			checkOneErrorLine(t, r)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d naming %q", r.code, r.stderr, exitUsage, tt.wantErr)
			}
		})
	}
}
