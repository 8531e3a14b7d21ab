package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestSubscribePriorityOrder(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	for _, p := range []string{"5", "1", "3"} {
		publish(t, url, "--from", "alice", "--to", "bob", "--type", "T", "--priority", p, "--data", "p"+p)
	}
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "3", "--json"))
	var got []string
	for _, ev := range evs {
		got = append(got, strconv.Itoa(ev.msg.Priority)+":"+string(ev.msg.Data))
	}
	if want := "1:p1 3:p3 5:p5"; strings.Join(got, " ") != want {
		t.Errorf("order %q, want %q", strings.Join(got, " "), want)
	}
}

func TestSubscribeHumanOutput(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := publish(t, url, "--from", "alice", "--to", "bob", "--type", "TASK", "--priority", "1", "--data", "do the thing")
	out := mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1")
	re := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z p1 alice -> bob TASK id=` + regexp.QuoteMeta(id) + ` data="do the thing"\n$`)
	if !re.MatchString(out) {
		t.Errorf("output %q does not match %s", out, re)
	}
}

func TestSubscribeTimeout(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	r := runIn(t, "", "--server", url, "subscribe", "--agent", "bob", "--timeout", "500ms")
	if r.code != 0 || r.stdout != "" || r.stderr != "" {
		t.Errorf("got exit %d, stdout %q, stderr %q; want exit 0 and no output", r.code, r.stdout, r.stderr)
	}
}

// TestSubscribeCountWithConcurrency checks that messages beyond --count are
// not handled, and not lost either.
func TestSubscribeCountWithConcurrency(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	want := map[string]bool{}
	for range 8 {
		want[publish(t, url, "--from", "alice", "--to", "bob", "--type", "T", "--data", "x")] = true
	}
	got := map[string]int{}
	for _, count := range []string{"2", "4", "2"} {
		out := mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", count, "--concurrency", "3", "--json")
		evs := events(t, out)
		if strconv.Itoa(len(evs)) != count {
			t.Fatalf("--count %s printed %d messages: %q", count, len(evs), out)
		}
		for _, ev := range evs {
			got[ev.msg.ID]++
		}
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("message %s handled %d times, want 1", id, got[id])
		}
	}
}

func TestSubscribeExec(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "REPORT", "--data", "payload\nline 2")
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	script := `OUT=` + shellQuote(out) + `; cat > "$OUT"; printf '|%s|%s|%s|%s|%s' "$AGENTBUS_TYPE" "$AGENTBUS_FROM" "$AGENTBUS_TO" "$AGENTBUS_PRIORITY" "$AGENTBUS_DELIVERY" >> "$OUT"; echo handled`
	r := runIn(t, "", "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--exec", script)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("subscribe: exit %d, stderr %q", r.code, r.stderr)
	}
	if r.stdout != "handled\n" {
		t.Errorf("stdout %q, want the command's output %q", r.stdout, "handled\n")
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := "payload\nline 2|REPORT|alice|bob|3|1"; string(got) != want {
		t.Errorf("the command saw %q, want %q", got, want)
	}
}

func TestSubscribeExecEnvironment(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := publish(t, url, "--from", "alice", "--to", "bob", "--type", "Q", "--correlation-id", "conv-1",
		"--causation-id", "m-0", "--content-type", "text/plain", "--data", "?")
	out := mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--exec", "env | grep ^AGENTBUS_ | sort")
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	want := map[string]string{
		"AGENTBUS_ID":             id,
		"AGENTBUS_FROM":           "alice",
		"AGENTBUS_TO":             "bob",
		"AGENTBUS_TYPE":           "Q",
		"AGENTBUS_PRIORITY":       "3",
		"AGENTBUS_CORRELATION_ID": "conv-1",
		"AGENTBUS_CAUSATION_ID":   "m-0",
		"AGENTBUS_CONTENT_TYPE":   "text/plain",
		"AGENTBUS_SEQUENCE":       "1",
		"AGENTBUS_DELIVERY":       "1",
		"AGENTBUS_PROGRESS_FD":    "3",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	if !strings.HasPrefix(env["AGENTBUS_SUBJECT"], "agentbus.") {
		t.Errorf("AGENTBUS_SUBJECT=%q, want a subject under agentbus.", env["AGENTBUS_SUBJECT"])
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`).MatchString(env["AGENTBUS_TIME"]) {
		t.Errorf("AGENTBUS_TIME=%q, want RFC 3339 in UTC", env["AGENTBUS_TIME"])
	}
}

// TestSubscribeExecRetry: a command that fails on the first delivery gets
// the message again, and subscribe counts only the success.
func TestSubscribeExecRetry(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	publish(t, url, "--from", "alice", "--to", "bob", "--type", "JOB", "--data", "work")
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "delivery $AGENTBUS_DELIVERY" >> ` + shellQuote(log) + `; test "$AGENTBUS_DELIVERY" != 1`
	r := runIn(t, "", "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--exec", script)
	if r.code != 0 {
		t.Fatalf("subscribe: exit %d, stderr %q", r.code, r.stderr)
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if want := "delivery 1\ndelivery 2\n"; string(got) != want {
		t.Errorf("deliveries %q, want %q", got, want)
	}
	if !strings.Contains(r.stderr, "agentbus: warning: ") || !strings.Contains(r.stderr, "exit status 1") {
		t.Errorf("stderr %q, want a warning about the failed delivery", r.stderr)
	}
	// Acked: nothing is left for bob.
	if out := mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--json", "--timeout", "300ms"); out != "" {
		t.Errorf("message left after it was handled: %q", out)
	}
}

// TestSubscribeJSONWithoutTo: a valid event from a foreign producer that
// leaves out the to extension (docs/cloudevents.md: readers accept it) is
// printed by subscribe --json with the recipient its subject names, not
// dead-lettered.
func TestSubscribeJSONWithoutTo(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	h := nats.Header{}
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "foreign-1", "ce-source": "alice", "ce-type": "T", "Nats-Msg-Id": "foreign-1"} {
		h[k] = []string{v}
	}
	if _, err := js.PublishMsg(testContext(t), &nats.Msg{Subject: "agentbus.agent.bob.p3.alice.T", Header: h, Data: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--json", "--timeout", "10s"))
	if len(evs) != 1 || evs[0].msg.ID != "foreign-1" || evs[0].msg.To != "bob" || evs[0].msg.From != "alice" {
		t.Errorf("printed %+v, want foreign-1 from alice to bob", evs)
	}
}

// TestSubscribeExecProgress: the lines an --exec command writes to file
// descriptor 3 reach the message's sender as progress updates, in order.
func TestSubscribeExecProgress(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := publish(t, url, "--from", "alice", "--to", "bob", "--type", "REVIEW", "--data", "x")
	script := `echo '40% half way' >&3; echo '{"message":"all done","percent":100}' >&3; echo >&3; echo 'just text' >&3`
	mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1", "--exec", script)

	alice := agentBus(t, url, "alice")
	got := make(chan *bus.Delivery, 8)
	handle(t, alice, func(_ context.Context, d *bus.Delivery) error {
		got <- d
		return nil
	})
	want := []string{"1 40 half way", "2 100 all done", "3 -1 just text"}
	for i, w := range want {
		d := <-got
		p, n, ok := d.ProgressUpdate()
		pct := -1
		if p.Percent != nil {
			pct = *p.Percent
		}
		if line := fmt.Sprintf("%d %d %s", n, pct, p.Message); !ok || d.CausationID != id || line != w {
			t.Fatalf("update %d: %q (causation %s), want %q", i+1, line, d.CausationID, w)
		}
	}
}

func TestParseProgress(t *testing.T) {
	for line, want := range map[string]string{
		"40% tests pass":              "40 tests pass",
		"  100%  ":                    "100 ",
		"140% too much":               "-1 140% too much",
		"compiling":                   "-1 compiling",
		`{"message":"m","percent":5}`: "5 m",
		`{"percent":101}`:             "",
		`{not json`:                   "",
		"   ":                         "",
	} {
		p, ok := parseProgress(line)
		got := ""
		if ok {
			pct := -1
			if p.Percent != nil {
				pct = *p.Percent
			}
			got = fmt.Sprintf("%d %s", pct, p.Message)
		}
		if got != want {
			t.Errorf("parseProgress(%q) = %q, want %q", line, got, want)
		}
	}
}

// TestSubscribeCountGivesBackTheSurplus checks that a message received
// beyond --count is given back unhandled (bus.GiveBack), not failed: before,
// the handler's error counted as a failed delivery, recorded failed and
// redelivered after the backoff, and with --max-deliver 1 the message was
// dead-lettered, never handled.
func TestSubscribeCountGivesBackTheSurplus(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	const n = 8
	var ids []string
	for i := range n {
		ids = append(ids, publish(t, url, "--from", "lead", "--to", "sp", "--type", "T", "--data", strconv.Itoa(i)))
	}
	handled := map[string]int{}
	for i := range n {
		evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "sp", "--count", "1", "--json"))
		if len(evs) != 1 {
			t.Fatalf("run %d printed %d messages", i, len(evs))
		}
		handled[evs[0].msg.ID]++
		for _, id := range ids {
			if st := mustRun(t, "--server", url, "status", id); strings.Contains(st, " failed ") {
				t.Fatalf("after run %d, a message given back as beyond --count reads failed: %s", i, st)
			}
		}
	}
	for _, id := range ids {
		if handled[id] != 1 {
			t.Errorf("message %s handled %d times, want 1", id, handled[id])
		}
	}
	if dl := mustRun(t, "--server", url, "dlq", "list", "--agent", "sp"); dl != "" {
		t.Errorf("dead-lettered:\n%s", dl)
	}
}

// TestExecLongProgressLine: an --exec command that writes a progress line
// over 64 KiB on fd 3, then more, runs to its end. Before, the reader
// stopped at the long line and the command blocked in a write for good
// once the pipe filled: the message was neither handled nor redelivered
// (found by a helper session).
func TestExecLongProgressLine(t *testing.T) {
	url := newServer(t)
	publish(t, url, "--from", "lead", "--to", "rev", "--type", "JOB", "--data", "x")
	script := `head -c 70000 /dev/zero | tr '\0' a >&3; echo >&3; ` +
		`i=0; while [ $i -lt 200 ]; do echo "$i% step" >&3; head -c 1000 /dev/zero | tr '\0' b >&3; echo >&3; i=$((i+1)); done; echo done`
	r := runIn(t, "", "--server", url, "subscribe", "--agent", "rev", "--count", "1", "--exec", script)
	if r.code != exitOK || !strings.Contains(r.stdout, "done") || !strings.Contains(r.stderr, "the rest of its progress is ignored") {
		t.Errorf("subscribe: exit %d, stdout %q, stderr %q; want the command run to its end, and a warning", r.code, r.stdout, r.stderr)
	}
}

// TestExecCommandReachesTheSameBus: an --exec command is told how
// subscribe reached the bus (NATS_URL, AGENTBUS_ROOT, AGENTBUS_SHARDS,
// and the agent it handles as), and agentbus reads AGENTBUS_ROOT as
// --root's default, so 'agentbus reply' run by --exec answers on the same
// bus. Before, a subscribe given --server or --root ran commands whose
// reply dialled the default server or looked under the default root, and
// the request was dead-lettered (found by a helper session).
func TestExecCommandReachesTheSameBus(t *testing.T) {
	url := newServer(t)
	mustRun(t, "--server", url, "--root", "team.a", "provision")
	id := publish(t, url, "--root", "team.a", "--from", "lead", "--to", "rev", "--type", "JOB", "--data", "x")
	out := mustRun(t, "--server", url, "--root", "team.a", "subscribe", "--agent", "rev", "--count", "1",
		"--exec", `env | grep -E '^(NATS_URL|AGENTBUS_ROOT|AGENTBUS_SHARDS|AGENTBUS_AGENT)=' | sort`)
	want := "AGENTBUS_AGENT=rev\nAGENTBUS_ROOT=team.a\nAGENTBUS_SHARDS=1\nNATS_URL=" + url + "\n"
	if out != want {
		t.Errorf("--exec's environment:\n%s\nwant:\n%s", out, want)
	}
	t.Setenv("AGENTBUS_ROOT", "team.a")
	if st := mustRun(t, "--server", url, "status", id); !strings.Contains(st, id) {
		t.Errorf("status with $AGENTBUS_ROOT=team.a printed %q", st)
	}
}

// TestExecCommandOnATLSFirstServer: against a server that starts with the
// TLS handshake, an --exec command is told so (AGENTBUS_TLSFIRST, read as
// --tlsfirst's default), and an agentbus command run with the environment
// subscribe handed it, and no flags, reaches the bus. Before, it timed out
// connecting (found by hunt h13).
func TestExecCommandOnATLSFirstServer(t *testing.T) {
	certs := embeddedtest.GenerateCerts(t)
	s := embeddedtest.RunServer(t, func(o *embedded.Options) {
		o.TLS = certs.ServerTLS(false)
		o.Configure = func(so *server.Options) { so.TLSHandshakeFirst = true }
	})
	flags := []string{"--server", s.ClientURL(), "--tlsca", certs.CAFile, "--tlsfirst"}
	mustRun(t, append(flags, "provision")...)
	id := strings.TrimPrefix(strings.Fields(mustRun(t, append(flags, "publish", "--from", "lead", "--to", "rev", "--type", "JOB", "--data", "x")...))[0], "id=")
	env := mustRun(t, append(flags, "subscribe", "--agent", "rev", "--count", "1", "--exec", `env | grep -E '^(NATS_|AGENTBUS_)'`)...)
	for _, kv := range os.Environ() { // as CMD would run it: with that environment alone
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "AGENTBUS_") {
			t.Setenv(k, "")
		}
	}
	for line := range strings.Lines(env) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			t.Setenv(k, v)
		}
	}
	if r := runIn(t, "", "status", id); r.code != exitOK {
		t.Errorf("status with --exec's environment %q: exit %d, stderr %q", env, r.code, r.stderr)
	}
}
