package cli

import (
	"regexp"
	"strings"
	"testing"
)

// TestPublishScheduled: publish --in schedules a message, which status
// shows scheduled and subscribe gets when it is due; publish --every
// repeats one until cancel removes it; conflicting or bad schedule flags
// are usage errors.
func TestPublishScheduled(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	out := mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "worker", "--type", "REMINDER", "--in", "1s", "--data", "check the deploy")
	m := regexp.MustCompile(`^id=(\S+) seq=\d+ scheduled="@at \S+Z"\n$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("publish --in printed %q", out)
	}
	id := m[1]
	if st := mustRun(t, "--server", url, "status", id); !strings.Contains(st, " scheduled ") || !strings.Contains(st, `schedule="@at `) {
		t.Errorf("status of a scheduled message: %q", st)
	}
	got := mustRun(t, "--server", url, "subscribe", "--agent", "worker", "--count", "1", "--timeout", "20s")
	if !strings.Contains(got, "REMINDER id="+id) || !strings.Contains(got, `data="check the deploy"`) {
		t.Errorf("subscribe printed %q", got)
	}

	out = mustRun(t, "--server", url, "publish", "--from", "lead", "--to", "worker", "--type", "TICK", "--every", "1s")
	tick := regexp.MustCompile(`^id=(\S+) `).FindStringSubmatch(out)[1]
	got = mustRun(t, "--server", url, "subscribe", "--agent", "worker", "--count", "2", "--timeout", "20s")
	if strings.Count(got, "TICK") != 2 {
		t.Errorf("subscribe to a recurring schedule printed %q", got)
	}
	mustRun(t, "--server", url, "cancel", tick, "--agent", "lead")
	if st := mustRun(t, "--server", url, "status", tick); !strings.Contains(st, " canceled ") {
		t.Errorf("status after cancel: %q", st)
	}

	for _, args := range [][]string{
		{"--in", "1s", "--every", "2s"},
		{"--at", "tomorrow"},
		{"--cron-tz", "UTC"},
		{"--cron", "@daily", "--cron-tz", "Nowhere/Atlantis"},
		{"--cron", "bad"}, // the server's refusal
		{"--in", "0s"},
		{"--every", "1500ms"},
		{"--every", "1m", "--ttl", "10s"},
	} {
		r := runIn(t, "", append([]string{"--server", url, "publish", "--from", "lead", "--to", "worker", "--type", "T"}, args...)...)
		if r.code != exitUsage {
			t.Errorf("publish %v: exit %d, want %d (usage); stderr %s", args, r.code, exitUsage, r.stderr)
		}
	}
	// Each says what is wrong: an empty --at or --cron said "must be more
	// than zero", the zero time "a schedule needs one of At, In, Every or
	// Cron", and --cron-tz Local was taken as the server's zone.
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--at", ""}, "--at: needs a time"},
		{[]string{"--at", "0001-01-01T00:00:00Z"}, "not an RFC 3339 time"},
		{[]string{"--cron", ""}, "--cron: needs an expression"},
		{[]string{"--cron", "@daily", "--cron-tz", "Local"}, "name the zone"},
	} {
		r := runIn(t, "", append([]string{"--server", url, "publish", "--from", "lead", "--to", "worker", "--type", "T"}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.says) {
			t.Errorf("publish %v: exit %d, stderr %q; want %d saying %q", c.args, r.code, r.stderr, exitUsage, c.says)
		}
	}
}
