package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// serving is a serve command running in the background.
type serving struct {
	url    string
	stderr *syncBuffer
	cancel context.CancelFunc
	code   chan int
}

// startServe runs serve on store (a fresh one if "") and a free port, with
// the extra args, and waits for it to print its URL, nats:// or tls://.
func startServe(t *testing.T, store string, args ...string) *serving {
	t.Helper()
	if store == "" {
		store = t.TempDir()
	}
	ctx, cancel := context.WithCancel(testContext(t))
	stdout, stderr := new(syncBuffer), new(syncBuffer)
	s := &serving{stderr: stderr, cancel: cancel, code: make(chan int, 1)}
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--store", store}, args...)
	go func() {
		s.code <- Main(ctx, args, strings.NewReader(""), stdout, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.code // after stop has taken it, the channel is empty
	})
	urlLine := regexp.MustCompile(`^((?:nats|tls)://127\.0\.0\.1:\d+)\n$`)
	waitFor(t, "serve to print its URL", func() (bool, string) {
		out := stdout.String()
		if m := urlLine.FindStringSubmatch(out); m != nil {
			s.url = m[1]
			return true, ""
		}
		select {
		case code := <-s.code:
			s.code <- code
			t.Fatalf("serve exited %d early; stdout %q, stderr %q", code, out, stderr.String())
		default:
		}
		return false, "stdout " + out
	})
	return s
}

// stop cancels serve and returns its exit code.
func (s *serving) stop(t *testing.T) int {
	t.Helper()
	s.cancel()
	code := <-s.code
	s.code <- code // for the cleanup
	return code
}

func TestServe(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	s := startServe(t, store)
	if !strings.Contains(s.stderr.String(), "agentbus serving on "+s.url) {
		t.Errorf("stderr %q, want the serving line", s.stderr.String())
	}
	// w1 and w2 are set up before the broadcast, so it waits for them.
	if out := mustRun(t, "--server", s.url, "provision", "--agent", "w1", "--agent", "w2"); !strings.HasSuffix(out, "agent w1 consumers=6\nagent w2 consumers=6\n") {
		t.Errorf("provision --agent printed %q", out)
	}
	id := publish(t, s.url, "--from", "lead", "--to", "*", "--type", "NOTE", "--data", "kept")
	evs := events(t, mustRun(t, "--server", s.url, "subscribe", "--agent", "w1", "--count", "1", "--json"))
	if len(evs) != 1 || evs[0].msg.ID != id {
		t.Fatalf("w1 got %+v, want message %s", evs, id)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d after cancel; stderr %q", code, s.stderr.String())
	}

	// Restarted on the same store, the message is still there for an agent
	// that has not consumed it.
	s = startServe(t, store)
	evs = events(t, mustRun(t, "--server", s.url, "subscribe", "--agent", "w2", "--count", "1", "--json"))
	if len(evs) != 1 || evs[0].msg.ID != id || string(evs[0].msg.Data) != "kept" {
		t.Fatalf("after restart w2 got %+v, want message %s", evs, id)
	}
	// And w1, which acked it, does not get it again.
	if out := mustRun(t, "--server", s.url, "subscribe", "--agent", "w1", "--json", "--timeout", "300ms"); out != "" {
		t.Errorf("after restart w1 got %q again", out)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d after cancel; stderr %q", code, s.stderr.String())
	}
}

func TestProvision(t *testing.T) {
	t.Parallel()
	url := newServer(t) // provisions with the defaults once
	out := mustRun(t, "--server", url, "provision")
	want := "stream AGENTBUS subjects=agentbus.agent.*.p1.*.*,agentbus.agent.*.p2.*.*,agentbus.agent.*.p3.*.*,agentbus.agent.*.p4.*.*,agentbus.agent.*.p5.*.*,agentbus.agent.*.p1.*.*.*.*,agentbus.agent.*.p2.*.*.*.*,agentbus.agent.*.p3.*.*.*.*,agentbus.agent.*.p4.*.*.*.*,agentbus.agent.*.p5.*.*.*.*,agentbus.all.p1.*.*,agentbus.all.p2.*.*,agentbus.all.p3.*.*,agentbus.all.p4.*.*,agentbus.all.p5.*.* storage=file replicas=1 max-age=720h dedup-window=1h max-consumers=120000 messages=0 schedules=AGENTBUS_SCHED\n"
	if out != want {
		t.Errorf("provision printed %q, want %q", out, want)
	}
	// A short max age alone shortens the dedup window with it.
	out = mustRun(t, "--server", url, "provision", "--max-age", "10m")
	if !strings.Contains(out, " max-age=10m dedup-window=10m ") {
		t.Errorf("provision printed %q, want max-age=10m dedup-window=10m", out)
	}
	for range 2 {
		out = mustRun(t, "--server", url, "provision", "--max-age", "48h", "--dedup-window", "10m", "--max-consumers", "100")
		if !strings.Contains(out, " max-age=48h ") || !strings.Contains(out, " dedup-window=10m ") || !strings.Contains(out, " max-consumers=100 ") {
			t.Errorf("provision printed %q, want max-age=48h dedup-window=10m max-consumers=100", out)
		}
	}
}

func TestProvisionRoot(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	out := mustRun(t, "--server", url, "--root", "team.a", "provision")
	if !strings.HasPrefix(out, "stream TEAM_A ") || !strings.Contains(out, "subjects=team.a.agent.*.p1.*.*,") || !strings.Contains(out, ",team.a.all.p5.*.* ") {
		t.Errorf("provision printed %q, want a stream on team.a's direct and broadcast subjects", out)
	}
	id := publish(t, url, "--root", "team.a", "--from", "a", "--to", "b", "--type", "T", "--data", "x")
	evs := events(t, mustRun(t, "--server", url, "--root", "team.a", "subscribe", "--agent", "b", "--count", "1", "--json"))
	if len(evs) != 1 || evs[0].msg.ID != id {
		t.Errorf("got %+v, want message %s", evs, id)
	}
}

// TestServeRestartKeepsProvisionedLimits: the limits an operator
// provisioned stay when serve restarts on the same store. Before, serve
// provisioned the defaults on each start: a 90-day retention was cut to
// 30, removing older messages at once (found by a helper session).
func TestServeRestartKeepsProvisionedLimits(t *testing.T) {
	store := t.TempDir()
	s := startServe(t, store)
	mustRun(t, "--server", s.url, "provision", "--max-age", "2160h", "--dedup-window", "10m", "--max-consumers", "200000")
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	s = startServe(t, store)
	nc, err := nats.Connect(s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(testContext(t), "AGENTBUS")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; cfg.MaxAge != 2160*time.Hour || cfg.Duplicates != 10*time.Minute || cfg.MaxConsumers != 200000 {
		t.Errorf("after serve restarted: max-age %v, dedup window %v, max consumers %d; want the operator's 2160h, 10m, 200000",
			cfg.MaxAge, cfg.Duplicates, cfg.MaxConsumers)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
}

// TestInterruptedWhileStarting: SIGINT or SIGTERM while serve or
// subscribe is still starting is a clean stop, exit 0, as their help
// says. Before, each exited 1 with "context canceled" (found by a helper
// session).
func TestInterruptedWhileStarting(t *testing.T) {
	url := newServer(t)
	for _, args := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--store", t.TempDir()},
		{"--server", url, "subscribe", "--agent", "bob"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the signal came before it had started
		var stdout, stderr syncBuffer
		if code := Main(ctx, args, strings.NewReader(""), &stdout, &stderr); code != exitOK {
			t.Errorf("%s interrupted while starting: exit %d, stderr %q; want 0", args[0], code, stderr.String())
		}
	}
}
