package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestEmptyOrZeroFlagRefused: an explicit "" (more likely an unset shell
// variable than a wish) or 0 that would mean a default is a usage error,
// and changes nothing. Before (found by a helper session): subscribe
// --exec "" consumed the inbox with no handler run and --card "" registered
// nothing; --server "" dialed nats.go's default URL; publish --id "" made a
// random ID, so a retry stored a new message each time; provision
// --max-age 0 (NATS's "no limit") shrank a longer retention to the default,
// and --dedup-window 0 took the default's hour.
func TestEmptyOrZeroFlagRefused(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := publish(t, url, "--from", "lead", "--to", "ex1", "--type", "TASK", "--data", "build it")
	for _, args := range [][]string{
		{"--server", url, "subscribe", "--agent", "ex1", "--exec", "", "--count", "1", "--timeout", "5s"},
		{"--server", url, "subscribe", "--agent", "ex1", "--card", "", "--timeout", "200ms"},
		{"--server", "", "status", "m1"},
		{"--server", url, "publish", "--from", "a", "--to", "b", "--type", "T", "--id", "", "--data", "x"},
		{"--server", url, "publish", "--from", "a", "--to", "b", "--type", "T", "--correlation-id", "", "--data", "x"},
		{"--server", url, "provision", "--max-age", "0"},
		{"--server", url, "provision", "--dedup-window", "0"},
		{"--server", url, "provision", "--max-consumers", "0"},
	} {
		r := runIn(t, "", args...)
		if r.code != exitUsage {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error", args, r.code, r.stdout, r.stderr)
		}
	}
	if out := mustRun(t, "--server", url, "status", id); strings.Contains(out, " completed ") {
		t.Errorf("the message was consumed without any handler running: %q", out)
	}
}

// TestFlagsThatDoNotGoTogether: request --to-group refuses --follow,
// --do-by and --idle-timeout, which a Gather cannot honour (they were
// ignored), and agents --watch refuses --json (it printed lines, not JSON).
func TestFlagsThatDoNotGoTogether(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	for _, args := range [][]string{
		{"--server", url, "request", "--from", "lead", "--to-group", "revs", "--type", "REVIEW", "--follow"},
		{"--server", url, "request", "--from", "lead", "--to-group", "revs", "--type", "REVIEW", "--do-by", "10s"},
		{"--server", url, "request", "--from", "lead", "--to-group", "revs", "--type", "REVIEW", "--idle-timeout", "10s"},
		{"--server", url, "agents", "--watch", "--json"},
	} {
		if r := runIn(t, "", args...); r.code != exitUsage {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want a usage error", args, r.code, r.stdout, r.stderr)
		}
	}
}

// TestOutputsAsPromised: publish --to-group marks a copy already stored
// " duplicate", as publish does; dlq list --json has the type and id its
// help lists; an interrupted request's hint is a command that runs. Before
// (found by a helper session), the duplicate was not marked, the JSON had
// neither member, and the hint left out attach's required --agent.
func TestOutputsAsPromised(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	mustRun(t, "--server", url, "group", "add", "gd", "m1")
	args := []string{"--server", url, "publish", "--from", "lead", "--to-group", "gd", "--type", "NOTE", "--id", "note-1", "--data", "x"}
	mustRun(t, args...)
	if second := mustRun(t, args...); !strings.HasSuffix(strings.TrimSpace(second), " duplicate") {
		t.Errorf("publish --to-group again with the same --id printed %q; want the copy marked duplicate", second)
	}

	id := publish(t, url, "--from", "planner", "--to", "dw", "--type", "TASK", "--data", "payload")
	mustRun(t, "--server", url, "subscribe", "--agent", "dw", "--exec", "exit 3", "--max-deliver", "1", "--timeout", "1s")
	var line string
	waitFor(t, "a dead letter", func() (bool, string) {
		line = strings.TrimSpace(mustRun(t, "--server", url, "dlq", "list", "--agent", "dw", "--json"))
		return line != "", line
	})
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	if m["type"] != "TASK" || m["id"] != id {
		t.Errorf("dlq list --json: type %v, id %v; want TASK and %s (line %s)", m["type"], m["id"], id, line)
	}

	ctx, cancel := context.WithCancel(testContext(t))
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"--server", url, "request", "--from", "lead", "--to", "nobody", "--type", "T", "--id", "rq-int", "--data", "x", "--timeout", "1m"},
			strings.NewReader(""), &out, &errOut)
	}()
	waitFor(t, "the request stored", func() (bool, string) {
		r := runIn(t, "", "--server", url, "status", "rq-int")
		return r.code == 0, r.stderr
	})
	cancel()
	if code := <-done; code != exitError {
		t.Fatalf("interrupted request: exit %d, stderr %q", code, errOut.String())
	}
	stderr := errOut.String()
	i := strings.Index(stderr, "'agentbus attach ")
	if i < 0 {
		t.Fatalf("no hint in %q", stderr)
	}
	hint := stderr[i+1:]
	hint = hint[:strings.Index(hint, "'")]
	hintArgs := append([]string{"--server", url}, strings.Fields(strings.TrimPrefix(hint, "agentbus "))...)
	if r := runIn(t, "", append(hintArgs, "--timeout", "300ms")...); r.code == exitUsage {
		t.Errorf("the hint %q is a usage error: %q", hint, r.stderr)
	}
}
