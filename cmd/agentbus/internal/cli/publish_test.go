package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPublishSubscribeJSON(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, []byte("from a file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		stdin    string
		wantData string
		wantJSON any // the "data" member, when the data is embedded as JSON
	}{
		{name: "data flag", args: []string{"--data", "hello"}, wantData: "hello"},
		{name: "data file", args: []string{"--data-file", file}, wantData: "from a file\n"},
		{name: "stdin", stdin: "from stdin", wantData: "from stdin"},
		{name: "empty stdin", wantData: ""},
		{
			name:     "json data",
			args:     []string{"--data", `{"task":"build"}`, "--content-type", "application/json"},
			wantData: `{"task":"build"}`,
			wantJSON: map[string]any{"task": "build"},
		},
		{
			name:     "text data",
			args:     []string{"--data", "plain text", "--content-type", "text/plain; charset=utf-8"},
			wantData: "plain text",
			wantJSON: "plain text",
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			to := "bob-" + string(rune('a'+i))
			args := append([]string{"--server", url, "publish", "--from", "alice", "--to", to, "--type", "GREETING", "--priority", "2"}, tt.args...)
			r := runIn(t, tt.stdin, args...)
			if r.code != 0 {
				t.Fatalf("publish: exit %d, stderr %q", r.code, r.stderr)
			}
			var id string
			var seq uint64
			if _, err := fmt.Sscanf(r.stdout, "id=%s seq=%d\n", &id, &seq); err != nil {
				t.Fatalf("publish printed %q, want id=<ID> seq=<N>", r.stdout)
			}

			r = runIn(t, "", "--server", url, "subscribe", "--agent", to, "--count", "1", "--json")
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("subscribe: exit %d, stderr %q", r.code, r.stderr)
			}
			if strings.Count(r.stdout, "\n") != 1 {
				t.Fatalf("subscribe printed %q, want exactly one line", r.stdout)
			}
			ev := events(t, r.stdout)[0]
			want := map[string]any{
				"specversion": "1.0",
				"id":          id,
				"source":      "/agents/alice",
				"type":        "GREETING",
				"to":          to,
				"priority":    float64(2),
			}
			for k, v := range want {
				if got := ev.members[k]; got != v {
					t.Errorf("member %s = %#v, want %#v", k, got, v)
				}
			}
			if got := string(ev.msg.Data); got != tt.wantData {
				t.Errorf("data = %q, want %q", got, tt.wantData)
			}
			if tt.wantJSON != nil {
				if got, want := jsonString(t, ev.members["data"]), jsonString(t, tt.wantJSON); got != want {
					t.Errorf(`"data" = %s, want %s`, got, want)
				}
			}
		})
	}
}

func TestPublishDuplicate(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	args := []string{"--server", url, "publish", "--from", "alice", "--to", "bob", "--type", "T", "--id", "msg-1", "--data", "x"}
	first := mustRun(t, args...)
	if first != "id=msg-1 seq=1\n" {
		t.Errorf("first publish printed %q, want %q", first, "id=msg-1 seq=1\n")
	}
	second := mustRun(t, args...)
	if second != "id=msg-1 seq=1 duplicate\n" {
		t.Errorf("second publish printed %q, want %q", second, "id=msg-1 seq=1 duplicate\n")
	}
}

func TestPublishBroadcast(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	// Agents set up after a broadcast do not get it; these two are set up
	// before.
	mustRun(t, "--server", url, "provision", "--agent", "w1", "--agent", "w2")
	id := publish(t, url, "--from", "lead", "--to", "*", "--type", "ANNOUNCE", "--data", "all hands")
	for _, agent := range []string{"w1", "w2"} {
		evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", agent, "--count", "1", "--json"))
		if len(evs) != 1 || evs[0].msg.ID != id || evs[0].msg.To != "*" {
			t.Errorf("%s got %+v, want the broadcast %s", agent, evs, id)
		}
	}
	// The sender does not get its own broadcast, nor does an agent that
	// first subscribes after it was sent.
	if out := mustRun(t, "--server", url, "subscribe", "--agent", "lead", "--json", "--timeout", "300ms"); out != "" {
		t.Errorf("sender got its own broadcast: %q", out)
	}
	if out := mustRun(t, "--server", url, "subscribe", "--agent", "newcomer", "--json", "--timeout", "300ms"); out != "" {
		t.Errorf("an agent new after the broadcast got it: %q", out)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub := func(args ...string) []string {
		return append([]string{"--server", url, "publish"}, args...)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string // a part of the error line
	}{
		{name: "missing to", args: pub("--from", "a", "--type", "T", "--data", "x"), wantCode: exitUsage, wantErr: `"to"`},
		{name: "priority 9", args: pub("--from", "a", "--to", "b", "--type", "T", "--priority", "9", "--data", "x"), wantCode: exitUsage, wantErr: "agentbus: --priority 9: invalid priority: 9 is outside 1..5\n"},
		{name: "priority 0", args: pub("--from", "a", "--to", "b", "--type", "T", "--priority", "0", "--data", "x"), wantCode: exitUsage, wantErr: "--priority"},
		{name: "priority not a number", args: pub("--from", "a", "--to", "b", "--type", "T", "--priority", "high", "--data", "x"), wantCode: exitUsage, wantErr: "priority"},
		{name: "invalid from", args: pub("--from", "*", "--to", "b", "--type", "T", "--data", "x"), wantCode: exitUsage, wantErr: "--from"},
		{name: "invalid to", args: pub("--from", "a", "--to", "b\nc", "--type", "T", "--data", "x"), wantCode: exitUsage, wantErr: `--to "b\nc": `},
		{name: "too long agent ID", args: pub("--from", strings.Repeat("a", 200), "--to", "b", "--type", "T", "--data", "x"), wantCode: exitUsage, wantErr: "--from"},
		{name: "bad ttl", args: pub("--from", "a", "--to", "b", "--type", "T", "--ttl", "soon", "--data", "x"), wantCode: exitUsage, wantErr: "ttl"},
		{name: "data and data file", args: pub("--from", "a", "--to", "b", "--type", "T", "--data", "x", "--data-file", file), wantCode: exitUsage, wantErr: "data"},
		{name: "empty data file", args: pub("--from", "a", "--to", "b", "--type", "T", "--data-file", ""), wantCode: exitUsage, wantErr: "agentbus: --data-file: must not be empty\n"},
		{name: "missing data file", args: pub("--from", "a", "--to", "b", "--type", "T", "--data-file", file+".missing"), wantCode: exitUsage, wantErr: "agentbus: --data-file: open " + file + ".missing: no such file or directory\n"},
		{name: "missing file", args: pub("--from", "a", "--to", "b", "--type", "T", "--file", file+".missing"), wantCode: exitUsage, wantErr: "agentbus: --file: open "},
		{name: "request missing data file", args: []string{"--server", url, "request", "--from", "a", "--to", "b", "--type", "T", "--data-file", file + ".missing"}, wantCode: exitUsage, wantErr: "--data-file: "},
		{name: "serve missing auth file", args: []string{"serve", "--listen", "127.0.0.1:0", "--store", t.TempDir(), "--auth", file + ".missing", "--user", "admin", "--password", "p"}, wantCode: exitUsage, wantErr: "agentbus: --auth: stat "},
		{name: "unknown flag", args: pub("--from", "a", "--to", "b", "--type", "T", "--colour", "red"), wantCode: exitUsage, wantErr: "--colour"},
		{name: "unknown command", args: []string{"pubish"}, wantCode: exitUsage, wantErr: "pubish"},
		{name: "positional argument", args: pub("--from", "a", "--to", "b", "--type", "T", "hello"), wantCode: exitUsage, wantErr: "hello"},
		{name: "publish unreachable", args: []string{"--server", "nats://127.0.0.1:1", "publish", "--from", "a", "--to", "b", "--type", "T", "--data", "x"}, wantCode: exitError, wantErr: "127.0.0.1:1"},
		{name: "subscribe unreachable", args: []string{"--server", "nats://127.0.0.1:1", "subscribe", "--agent", "b"}, wantCode: exitError, wantErr: "127.0.0.1:1"},
		{name: "provision unreachable", args: []string{"--server", "nats://127.0.0.1:1", "provision"}, wantCode: exitError, wantErr: "127.0.0.1:1"},
		{name: "subscribe invalid agent", args: []string{"--server", url, "subscribe", "--agent", "*"}, wantCode: exitUsage, wantErr: "--agent"},
		{name: "subscribe missing agent", args: []string{"--server", url, "subscribe"}, wantCode: exitUsage, wantErr: `"agent"`},
		{name: "subscribe json and exec", args: []string{"--server", url, "subscribe", "--agent", "b", "--json", "--exec", "true"}, wantCode: exitUsage, wantErr: "exec"},
		{name: "subscribe bad concurrency", args: []string{"--server", url, "subscribe", "--agent", "b", "--concurrency", "0"}, wantCode: exitUsage, wantErr: "--concurrency"},
		{name: "subscribe concurrency past what the consumers hand out", args: []string{"--server", url, "subscribe", "--agent", "b", "--concurrency", "6001"}, wantCode: exitUsage, wantErr: "--concurrency 6001: at most 6000"},
		{name: "subscribe bad ack wait", args: []string{"--server", url, "subscribe", "--agent", "b", "--ack-wait", "1ms"}, wantCode: exitUsage, wantErr: "ack wait"},
		{name: "subscribe bad root", args: []string{"--server", url, "--root", "a b", "subscribe", "--agent", "b"}, wantCode: exitUsage, wantErr: "root"},
		{name: "not provisioned", args: []string{"--server", url, "--root", "other", "publish", "--from", "a", "--to", "b", "--type", "T", "--data", "x"}, wantCode: exitError, wantErr: "not provisioned"},
		{name: "provision bad max age", args: []string{"--server", url, "provision", "--max-age", "-1h"}, wantCode: exitUsage, wantErr: "max age"},
		{name: "serve bad listen", args: []string{"serve", "--listen", "nonsense", "--store", t.TempDir()}, wantCode: exitUsage, wantErr: "--listen"},
		{name: "http server URL", args: []string{"--server", "http://127.0.0.1:8222", "publish", "--from", "a", "--to", "b", "--type", "T", "--data", "x"}, wantCode: exitUsage, wantErr: `scheme "http"`},
		{name: "reply to an empty ID", args: []string{"--server", url, "reply", "--from", "b", "--to-message", "", "--type", "T", "--data", "x"}, wantCode: exitUsage, wantErr: "--to-message: must not be empty"},
		{name: "data not JSON", args: pub("--from", "a", "--to", "b", "--type", "T", "--content-type", "application/json", "--data", "{bad"), wantCode: exitUsage, wantErr: "agentbus: --data: not valid JSON for application/json\n"},
		{name: "data not JSON for a +json type", args: pub("--from", "a", "--to", "b", "--type", "T", "--content-type", "application/vnd.api+json; charset=utf-8", "--data", "x"), wantCode: exitUsage, wantErr: "--data: not valid JSON for application/vnd.api+json"},
		{name: "data file not JSON", args: pub("--from", "a", "--to", "b", "--type", "T", "--content-type", "Application/JSON", "--data-file", file), wantCode: exitUsage, wantErr: "--data-file: not valid JSON"},
		{name: "reply data not JSON", args: []string{"--server", url, "reply", "--from", "b", "--to-message", "m1", "--type", "T", "--content-type", "application/json", "--data", "{bad"}, wantCode: exitUsage, wantErr: "--data: not valid JSON"},
		{name: "request data not JSON", args: []string{"--server", url, "request", "--from", "a", "--to", "b", "--type", "T", "--content-type", "application/json", "--data", "{bad"}, wantCode: exitUsage, wantErr: "--data: not valid JSON"},
		{name: "payload too large", args: pub("--from", "a", "--to", "b", "--type", "T", "--data", strings.Repeat("x", 2<<20)), wantCode: exitError, wantErr: "more than the server's max_payload of 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runIn(t, "", tt.args...)
			checkOneErrorLine(t, r)
			if r.code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tt.wantCode, r.stderr)
			}
			if !strings.Contains(r.stderr, tt.wantErr) {
				t.Errorf("stderr %q does not mention %q", r.stderr, tt.wantErr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestPublishAttributes(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "ANSWER", "--id", "m-2", "--correlation-id", "conv-1",
		"--causation-id", "m-1", "--ttl", "1h", "--content-type", "application/json", "--data", `[1,2]`)
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--json"))
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1", len(evs))
	}
	ev := evs[0]
	for k, v := range map[string]string{"id": "m-2", "correlationid": "conv-1", "causationid": "m-1", "datacontenttype": "application/json"} {
		if got := ev.members[k]; got != v {
			t.Errorf("member %s = %#v, want %q", k, got, v)
		}
	}
	if ev.msg.TTL != time.Hour {
		t.Errorf("TTL %v (expirytime %v), want 1h", ev.msg.TTL, ev.members["expirytime"])
	}
	if got := jsonString(t, ev.members["data"]); got != "[1,2]" {
		t.Errorf(`"data" = %s, want [1,2]`, got)
	}
}

// TestSubscribeCountShort: subscribe --count N that stops at --timeout with
// fewer messages handled exits 3 and says how many.
func TestSubscribeCountShort(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "a", "--to", "b", "--type", "T", "--data", "x")
	r := runIn(t, "", "--server", url, "subscribe", "--agent", "b", "--count", "2", "--timeout", "500ms", "--json")
	checkOneErrorLine(t, r)
	if r.code != exitShort || !strings.Contains(r.stderr, "1 of --count 2") {
		t.Errorf("exit %d, stderr %q; want exit %d naming 1 of 2", r.code, r.stderr, exitShort)
	}
	if evs := events(t, r.stdout); len(evs) != 1 {
		t.Errorf("printed %d events, want the 1 handled", len(evs))
	}
}

// TestPublishStdinNotATerminal: /dev/null on stdin is a character device
// but no terminal: publish reads it (an empty payload) without the hint
// it gives a person at a terminal.
func TestPublishStdinNotATerminal(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var stdout, stderr strings.Builder
	code := Main(testContext(t), []string{"--server", url, "publish", "--from", "a", "--to", "b", "--type", "T"}, null, &stdout, &stderr)
	if code != exitOK || stderr.String() != "" || !strings.HasPrefix(stdout.String(), "id=") {
		t.Errorf("exit %d, stdout %q, stderr %q; want a publish with no terminal hint", code, stdout.String(), stderr.String())
	}
}
