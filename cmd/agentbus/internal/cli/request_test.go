package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// agentBus connects to url as agent with the bus library, closed when the
// test ends.
func agentBus(t *testing.T, url, agent string) *bus.Bus {
	t.Helper()
	b, err := bus.Connect(url, agent, bus.WithErrorHandler(func(err error) { t.Logf("%s: %v", agent, err) }))
	if err != nil {
		t.Fatalf("connect %s: %v", agent, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// handle subscribes b with h until the test ends.
func handle(t *testing.T, b *bus.Bus, h bus.Handler) {
	t.Helper()
	sub, err := b.Subscribe(testContext(t), h)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() {
		sub.Stop()
		<-sub.Done()
	})
}

// replyWorker runs agent as a worker that answers every message with a
// RESULT whose data is "re: " and the request's data.
func replyWorker(t *testing.T, url, agent string) {
	t.Helper()
	b := agentBus(t, url, agent)
	handle(t, b, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "RESULT", ContentType: "text/plain", Data: append([]byte("re: "), d.Data...)})
		return err
	})
}

func TestRequestReplyRoundTrip(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	replyWorker(t, url, "worker")
	req := []string{"--server", url, "request", "--from", "lead", "--to", "worker", "--type", "REVIEW", "--timeout", "1m"}

	t.Run("human", func(t *testing.T) {
		out := mustRun(t, append(req, "--data", "PR 42", "--priority", "2")...)
		re := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z p2 worker -> lead RESULT id=\S+ data="re: PR 42"\n$`)
		if !re.MatchString(out) {
			t.Errorf("request printed %q, want a line matching %s", out, re)
		}
	})
	t.Run("json", func(t *testing.T) {
		evs := events(t, mustRun(t, append(req, "--id", "req-json", "--correlation-id", "conv-json", "--data", "PR 43", "--json")...))
		if len(evs) != 1 {
			t.Fatalf("got %d events, want 1", len(evs))
		}
		m := evs[0].msg
		if m.Type != "RESULT" || m.From != "worker" || m.To != "lead" || m.CausationID != "req-json" || m.CorrelationID != "conv-json" || string(m.Data) != "re: PR 43" {
			t.Errorf("reply = %+v, want the worker's RESULT to req-json in conv-json", m)
		}
	})
}

// TestRequestDeadLettered: a request its handler rejects exits 1 at once,
// saying it was dead-lettered, why, and where to look. It waited out its
// --timeout.
func TestRequestDeadLettered(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	handle(t, agentBus(t, url, "worker"), func(context.Context, *bus.Delivery) error {
		return bus.Permanent(errors.New("no such tool"))
	})
	r := runIn(t, "", "--server", url, "request", "--from", "lead", "--to", "worker", "--id", "doomed", "--type", "RUN", "--timeout", "10m")
	checkOneErrorLine(t, r)
	want := "request doomed dead-lettered at worker: rejected: no such tool; 'agentbus dlq list --agent worker' shows it"
	if r.code != exitError || r.stdout != "" || !strings.Contains(r.stderr, want) {
		t.Errorf("request rejected: exit %d, stdout %q, stderr %q; want exit 1 and %q", r.code, r.stdout, r.stderr, want)
	}
}

// TestRequestProfile sends a native coordination question with its
// addressing overridden by the flags, and prints the native reply.
func TestRequestProfile(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	question := "../../../../codec/profiles/testdata/coordination/question.json"
	answer, err := os.ReadFile("../../../../codec/profiles/testdata/coordination/result.json")
	if err != nil {
		t.Fatal(err)
	}
	coordination, _ := profiles.Lookup("coordination")
	worker := agentBus(t, url, "worker")
	asked := make(chan *bus.Delivery, 1)
	handle(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		select {
		case asked <- d:
		default: // a redelivery
		}
		m, err := profiles.Prepare(coordination, answer, profiles.Addressing{})
		if err != nil {
			return err
		}
		m.From, m.To = "", "" // the replier and the requester
		_, err = d.Reply(ctx, *m)
		return err
	})

	out := mustRun(t, "--server", url, "request", "--profile", "coordination", "--from", "lead", "--to", "worker", "--file", question)
	var want bytes.Buffer
	if err := json.Compact(&want, answer); err != nil {
		t.Fatal(err)
	}
	if out != want.String()+"\n" {
		t.Errorf("request --profile printed\n%s\nwant\n%s", out, want.String())
	}
	var d *bus.Delivery
	select {
	case d = <-asked:
	default:
		t.Fatal("the worker answered without being asked")
	}
	native, err := os.ReadFile(question)
	if err != nil {
		t.Fatal(err)
	}
	if d.From != "lead" || d.To != "worker" || !bytes.Equal(d.Data, native) {
		t.Errorf("worker got %s -> %s %q, want lead -> worker with the native question unchanged", d.From, d.To, d.Data)
	}
}

// TestRequestTimeoutExpires: a request nobody answers in time fails with
// its ID; still queued, it expires unread, and a reply from the command
// line no longer finds it. attach says how it ended.
func TestRequestTimeoutExpires(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	r := runIn(t, "", "--server", url, "request", "--from", "lead", "--to", "worker", "--type", "REVIEW", "--data", "PR 7", "--timeout", "200ms")
	checkOneErrorLine(t, r)
	if r.code != exitError || r.stdout != "" {
		t.Fatalf("request without a worker: exit %d, stdout %q; want exit 1 and no output", r.code, r.stdout)
	}
	match := regexp.MustCompile(`request (\S+): no reply within 200ms; a request still queued expires unread, and 'agentbus status (\S+)'`).FindStringSubmatch(r.stderr)
	if match == nil || match[1] != match[2] {
		t.Fatalf("stderr %q does not name the request and how to look it up", r.stderr)
	}
	id := match[1]

	// Only its recipient could answer it.
	r = runIn(t, "", "--server", url, "reply", "--from", "bystander", "--to-message", id, "--type", "RESULT", "--data", "x")
	checkOneErrorLine(t, r)
	if r.code != exitError || !strings.Contains(r.stderr, "no message "+id+" to bystander") {
		t.Errorf("reply from a bystander: exit %d, stderr %q", r.code, r.stderr)
	}
	waitFor(t, "the request expired", func() (bool, string) {
		out := mustRun(t, "--server", url, "status", id)
		return strings.HasPrefix(out, id+" lead -> worker expired "), out
	})
	r = runIn(t, "", "--server", url, "reply", "--from", "worker", "--to-message", id, "--type", "RESULT", "--data", "merged")
	if r.code != exitError {
		t.Errorf("reply to the expired request: exit %d, stdout %q", r.code, r.stdout)
	}
	r = runIn(t, "", "--server", url, "attach", id, "--agent", "lead")
	if r.code != exitError || !strings.Contains(r.stderr, "request "+id) {
		t.Errorf("attach to the expired request: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestRequestReplyUsageErrors(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	request := []string{"--server", url, "request", "--from", "a", "--to", "b", "--type", "T", "--data", "x"}
	reply := []string{"--server", url, "reply", "--from", "b", "--type", "T", "--data", "x"}
	tests := []struct {
		name    string
		args    []string
		wantErr string // a part of the error line
	}{
		{name: "request bad timeout", args: append(request, "--timeout", "soon"), wantErr: "timeout"},
		{name: "request zero timeout", args: append(request, "--timeout", "0s"), wantErr: "--timeout"},
		{name: "request broadcast", args: append(request[:6:6], "*", "--type", "T", "--data", "x"), wantErr: "--to"},
		{name: "request missing to", args: []string{"--server", url, "request", "--from", "a", "--type", "T", "--data", "x"}, wantErr: `"to"`},
		{name: "request profile and json", args: append(request, "--profile", "pipeline", "--json"), wantErr: "--json"},
		{name: "request unknown profile", args: append(request, "--profile", "nope"), wantErr: "nope"},
		{name: "request bad priority", args: append(request, "--priority", "0"), wantErr: "--priority"},
		{name: "reply missing to-message", args: reply, wantErr: `"to-message"`},
		{name: "reply missing from", args: []string{"--server", url, "reply", "--to-message", "m", "--type", "T", "--data", "x"}, wantErr: `"from"`},
		{name: "reply missing type", args: []string{"--server", url, "reply", "--from", "b", "--to-message", "m", "--data", "x"}, wantErr: `"type"`},
		{name: "reply invalid from", args: []string{"--server", url, "reply", "--from", "*", "--to-message", "m", "--type", "T", "--data", "x"}, wantErr: "--from"},
		{name: "reply bad priority", args: append(reply, "--to-message", "m", "--priority", "9"), wantErr: "--priority"},
		{name: "reply positional argument", args: append(reply, "--to-message", "m", "extra"), wantErr: "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runIn(t, "", tt.args...)
			checkOneErrorLine(t, r)
			if r.code != exitUsage {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, exitUsage, r.stderr)
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

// TestRequestFollow: request --follow prints the recipient's progress
// updates as they arrive, then the reply.
func TestRequestFollow(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	b := agentBus(t, url, "worker")
	handle(t, b, func(ctx context.Context, d *bus.Delivery) error {
		for i, step := range []string{"cloning", "testing", "writing the review"} {
			pct := (i + 1) * 30
			if err := d.Progress(ctx, bus.Progress{Message: step, Percent: &pct}); err != nil {
				return err
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "RESULT", ContentType: "text/plain", Data: []byte("approved")})
		return err
	})
	out := mustRun(t, "--server", url, "request", "--from", "lead", "--to", "worker", "--type", "REVIEW", "--timeout", "1m", "--follow")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"progress 1 30% cloning", "progress 2 60% testing", "progress 3 90% writing the review"}
	if len(lines) != 4 || strings.Join(lines[:3], "\n") != strings.Join(want, "\n") || !strings.Contains(lines[3], `RESULT`) || !strings.Contains(lines[3], `data="approved"`) {
		t.Errorf("request --follow printed\n%s", out)
	}
}

// TestCancel: agentbus cancel cancels a queued message as its sender, and
// says how a message that already ended ended.
func TestCancel(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := strings.TrimPrefix(strings.Fields(mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "worker", "--type", "T", "--data", "x"))[0], "id=")
	out := mustRun(t, "--server", url, "cancel", id, "--agent", "lead")
	if !strings.HasPrefix(out, id+" lead -> worker canceled ") {
		t.Errorf("cancel printed %q", out)
	}
	r := runIn(t, "", "--server", url, "cancel", id)
	if r.code != exitError || !strings.Contains(r.stderr, "already ended: "+id+" lead -> worker canceled") {
		t.Errorf("cancel again: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runIn(t, "", "--server", url, "cancel", id, "--agent", "bystander"); r.code != exitError || !strings.Contains(r.stderr, "no status recorded") {
		t.Errorf("cancel as a bystander: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestAttach: attach takes a request up again by ID and prints its past
// progress updates and its reply.
func TestAttach(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	b := agentBus(t, url, "worker")
	handle(t, b, func(ctx context.Context, d *bus.Delivery) error {
		for _, step := range []string{"cloning", "testing"} {
			if err := d.Progress(ctx, bus.Progress{Message: step}); err != nil {
				return err
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "RESULT", ContentType: "text/plain", Data: []byte("approved")})
		return err
	})
	evs := events(t, mustRun(t, "--server", url, "request", "--from", "lead", "--to", "worker", "--type", "REVIEW", "--json"))
	if len(evs) != 1 {
		t.Fatalf("request printed %+v", evs)
	}
	id := evs[0].msg.CausationID
	out := mustRun(t, "--server", url, "attach", id, "--agent", "lead", "--follow")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "progress 1 cloning" || lines[1] != "progress 2 testing" || !strings.Contains(lines[2], `data="approved"`) {
		t.Errorf("attach printed\n%s", out)
	}
	if r := runIn(t, "", "--server", url, "attach", "nope", "--agent", "lead"); r.code != exitError || !strings.Contains(r.stderr, "no status recorded") {
		t.Errorf("attach to an unknown request: exit %d, stderr %q", r.code, r.stderr)
	}
	// Its recipient is told who may attach.
	if r := runIn(t, "", "--server", url, "attach", id, "--agent", "worker"); r.code != exitError || !strings.Contains(r.stderr, "it was sent to worker by lead, who may attach to it") {
		t.Errorf("attach as the recipient: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestAttachToAnExpiredRequest: attach to a request that expired unread
// says it expired, and when; before, it said no reply came within its own
// --timeout, a wait that never happened (found by hunt h13).
func TestAttachToAnExpiredRequest(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	if r := runIn(t, "", "--server", url, "request", "--from", "lead", "--to", "away", "--type", "Q", "--id", "rq-exp", "--timeout", "200ms"); r.code != exitError {
		t.Fatalf("request: exit %d, stderr %q", r.code, r.stderr)
	}
	waitFor(t, "the request to read expired", func() (bool, string) {
		st := mustRun(t, "--server", url, "status", "rq-exp")
		return strings.Contains(st, " expired "), st
	})
	r := runIn(t, "", "--server", url, "attach", "rq-exp", "--agent", "lead", "--timeout", "1h")
	if r.code != exitError || !strings.Contains(r.stderr, "request rq-exp to away: expired at ") || strings.Contains(r.stderr, "1h") {
		t.Errorf("attach to an expired request: exit %d, stderr %q; want it to say it expired", r.code, r.stderr)
	}
}
