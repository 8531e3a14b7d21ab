package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
)

// coordinationResult returns the path and the bytes of a native
// coordination result from database-build-agent to orchestrator.
func coordinationResult(t *testing.T) (file string, native []byte) {
	t.Helper()
	file = "../../../../codec/profiles/testdata/coordination/result.json"
	native, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return file, native
}

// TestPublishProfileOverridesAddressing: with --profile, an explicit --to
// (and --from) replaces the native message's addressing on the envelope,
// while the native bytes travel unchanged.
func TestPublishProfileOverridesAddressing(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	file, native := coordinationResult(t)
	got := make(chan *bus.Delivery, 2)
	handle(t, agentBus(t, url, "reviewer"), func(_ context.Context, d *bus.Delivery) error {
		got <- d
		return nil
	})

	for _, tt := range []struct {
		args     []string
		wantFrom string
	}{
		{args: []string{"--to", "reviewer"}, wantFrom: "database-build-agent"},
		{args: []string{"--to", "reviewer", "--from", "lead"}, wantFrom: "lead"},
	} {
		id := publish(t, url, append([]string{"--profile", "coordination", "--file", file}, tt.args...)...)
		var d *bus.Delivery
		select {
		case d = <-got:
		case <-testContext(t).Done():
			t.Fatalf("publish %v: reviewer got nothing", tt.args)
		}
		if d.ID != id || d.From != tt.wantFrom || d.To != "reviewer" || !bytes.Equal(d.Data, native) {
			t.Errorf("publish %v: reviewer got %s %s -> %s %q, want %s from %s with the native bytes", tt.args, d.ID, d.From, d.To, d.Data, id, tt.wantFrom)
		}
		// Its one record names the new addressing, not the native recipient.
		want := id + " " + tt.wantFrom + " -> reviewer "
		waitFor(t, "the record of "+id, func() (bool, string) {
			r := runIn(t, "", "--server", url, "status", id)
			return r.code == exitOK && strings.Count(r.stdout, "\n") == 1 && strings.HasPrefix(r.stdout, want), r.stdout + r.stderr
		})
	}
	// An invalid override is a usage error naming the flag.
	r := runIn(t, "", "--server", url, "publish", "--profile", "coordination", "--file", file, "--to", "b\nc")
	checkOneErrorLine(t, r)
	if r.code != exitUsage || !strings.Contains(r.stderr, "--to") {
		t.Errorf("invalid --to: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestReplyProfile answers a request with a native message: it goes to the
// requester, from the replier, whatever the native message names.
func TestReplyProfile(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	file, native := coordinationResult(t)
	publish(t, url, "--from", "lead", "--to", "worker", "--type", "QUESTION", "--id", "q-1", "--correlation-id", "conv-q")
	waitFor(t, "the reply to q-1", func() (bool, string) {
		r := runIn(t, "", "--server", url, "reply", "--profile", "coordination", "--from", "worker", "--to-message", "q-1", "--file", file)
		return r.code == exitOK, r.stderr
	})
	evs := events(t, mustRun(t, "--server", url, "subscribe", "--agent", "lead", "--count", "1", "--json"))
	if len(evs) != 1 {
		t.Fatalf("lead got %d messages, want the reply", len(evs))
	}
	m := evs[0].msg
	if m.From != "worker" || m.To != "lead" || m.CausationID != "q-1" || m.CorrelationID != "conv-q" || m.Type != "result" || !bytes.Equal(m.Data, native) {
		t.Errorf("reply = %+v, want the native result from worker to lead answering q-1 in conv-q", m)
	}
}

// TestPublishProfileIDFlags: with --profile, --id, --correlation-id and
// --causation-id fill in what the native message leaves out, so that a
// native message without an ID can be retried safely, and must agree with
// what it gives; --type and --content-type are refused. Before 2026-11-28
// each was passed over: a retry with one --id stored the message twice.
func TestPublishProfileIDFlags(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	// A coordination result has no ID and no taskId; this basemessage has
	// messageId msg-123 and correlationId task-001.
	file, _ := coordinationResult(t)
	base := "../../../../codec/profiles/testdata/basemessage/task_assignment.json"
	args := func(extra ...string) []string {
		return append([]string{"--server", url, "publish", "--profile", "coordination", "--file", file, "--to", "reviewer"}, extra...)
	}

	first := mustRun(t, args("--id", "retry-1", "--correlation-id", "conv-1")...)
	again := mustRun(t, args("--id", "retry-1", "--correlation-id", "conv-1")...)
	if !strings.HasPrefix(first, "id=retry-1 ") || strings.Contains(first, "duplicate") || !strings.HasSuffix(again, " duplicate\n") {
		t.Errorf("publish twice with --id retry-1: %q, then %q; want it stored once, then a duplicate", first, again)
	}
	st := mustRun(t, "--server", url, "status", "retry-1", "--json")
	if !strings.Contains(st, `"correlationId":"conv-1"`) {
		t.Errorf("status of retry-1 = %s, want conversation conv-1", st)
	}

	// The basemessage's own IDs may be repeated, not contradicted.
	mustRun(t, "--server", url, "publish", "--profile", "basemessage", "--file", base, "--to", "reviewer", "--id", "msg-123", "--correlation-id", "task-001")
	for _, tt := range []struct {
		args []string
		flag string
	}{
		{[]string{"--profile", "basemessage", "--file", base, "--to", "reviewer", "--id", "other"}, "--id"},
		{[]string{"--profile", "basemessage", "--file", base, "--to", "reviewer", "--correlation-id", "other"}, "--correlation-id"},
		{[]string{"--profile", "coordination", "--file", file, "--to", "reviewer", "--type", "ping"}, "--type"},
		{[]string{"--profile", "coordination", "--file", file, "--to", "reviewer", "--content-type", "text/plain"}, "--content-type"},
	} {
		r := runIn(t, "", append([]string{"--server", url, "publish"}, tt.args...)...)
		checkOneErrorLine(t, r)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.flag) {
			t.Errorf("publish %v: exit %d, stderr %q; want a usage error naming %s", tt.args, r.code, r.stderr, tt.flag)
		}
	}
}
