package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
)

// TestGroupCommands: agents join, an operator adds one; list shows them;
// publish --to-group sends each its copy; request --to-group gathers the
// replies it wants and says who did what.
func TestGroupCommands(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	mustRun(t, "--server", url, "group", "join", "reviewers", "--agent", "r1")
	mustRun(t, "--server", url, "group", "join", "reviewers", "--agent", "r2")
	mustRun(t, "--server", url, "group", "add", "reviewers", "r3")
	if out := mustRun(t, "--server", url, "group", "list"); out != "reviewers r1 r2 r3\n" {
		t.Errorf("group list printed %q", out)
	}
	out := mustRun(t, "--server", url, "publish", "--from", "lead", "--to-group", "reviewers", "--type", "NOTE", "--data", "hi")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "member=r1 id=") {
		t.Errorf("publish --to-group printed %q", out)
	}
	for _, r := range []string{"r1", "r2"} {
		handle(t, agentBus(t, url, r), func(ctx context.Context, d *bus.Delivery) error {
			if d.Type != "REVIEW" {
				return nil
			}
			_, err := d.Reply(ctx, bus.Message{Type: "VERDICT", ContentType: "text/plain", Data: []byte("ok")})
			return err
		})
	}
	r := runIn(t, "", "--server", url, "request", "--from", "lead", "--to-group", "reviewers", "--type", "REVIEW", "--want", "2", "--timeout", "1m")
	if r.code != exitOK || strings.Count(r.stdout, "VERDICT") != 2 || !strings.Contains(r.stderr, "2 replied") || !strings.Contains(r.stderr, "timed out [r3]") {
		t.Errorf("request --to-group: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	mustRun(t, "--server", url, "group", "remove", "reviewers", "r3")
	mustRun(t, "--server", url, "group", "leave", "reviewers", "--agent", "r2")
	if out := mustRun(t, "--server", url, "group", "list", "reviewers"); out != "r1\n" {
		t.Errorf("group list reviewers printed %q", out)
	}
}

// TestGroupAddBySkill: group add --skill and --tag add the registered
// agents that have the skill, or a skill with the tag, and print them;
// a query that finds nobody exits 1, one without agents or a query is a
// usage error.
func TestGroupAddBySkill(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	ctx := testContext(t)
	for name, skill := range map[string]bus.Skill{
		"sec":     {ID: "review", Tags: []string{"security"}},
		"qa":      {ID: "review"},
		"builder": {ID: "build", Tags: []string{"security"}},
	} {
		if err := agentBus(t, url, name).Register(ctx, bus.AgentCard{Skills: []bus.Skill{skill}}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   string
		inStderr string
	}{
		{name: "skill", args: []string{"reviewers", "--skill", "review"}, stdout: "qa\nsec\n"},
		{name: "tag and an agent", args: []string{"security", "lead", "--tag", "security"}, stdout: "builder\nsec\n"},
		{name: "nobody", args: []string{"deployers", "--skill", "deploy"}, code: exitError, inStderr: "no registered agent has skill deploy"},
		{name: "no agents", args: []string{"reviewers"}, code: exitUsage, inStderr: "--skill or --tag"},
	}
	for _, tt := range tests {
		r := runIn(t, "", append([]string{"--server", url, "group", "add"}, tt.args...)...)
		if r.code != tt.code || r.stdout != tt.stdout || !strings.Contains(r.stderr, tt.inStderr) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q", tt.name, r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.inStderr)
		}
	}
	if out := mustRun(t, "--server", url, "group", "list"); out != "reviewers qa sec\nsecurity builder lead sec\n" {
		t.Errorf("group list printed %q", out)
	}
}

// TestNamesWithSpacesAreQuoted: agent and group IDs may hold spaces and
// quotes; the text lines write such a name as a quoted Go string, so that
// a line still splits into its fields. Before, "night shift code reviewer
// lead" could be any of several groups and members.
func TestNamesWithSpacesAreQuoted(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	mustRun(t, "--server", url, "group", "add", "night shift", "code reviewer", "lead")
	if out := mustRun(t, "--server", url, "group", "list"); out != `"night shift" "code reviewer" lead`+"\n" {
		t.Errorf("group list printed %q", out)
	}
	out := mustRun(t, "--server", url, "publish", "--from", `say "hi"`, "--to-group", "night shift", "--type", "NOTE")
	if !strings.HasPrefix(out, `member="code reviewer" id=`) {
		t.Errorf("publish --to-group printed %q", out)
	}
	id := strings.Fields(strings.TrimPrefix(out, `member="code reviewer" `))[0]
	if out := mustRun(t, "--server", url, "status", strings.TrimPrefix(id, "id=")); !strings.Contains(out, ` "say \"hi\"" -> "code reviewer" pending`) {
		t.Errorf("status printed %q", out)
	}
}
