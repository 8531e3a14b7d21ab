package demo_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/demo"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, embeddedtest.IgnoreServerGoroutines()...)
}

// TestRun runs the whole demo once, writing both output modes, and checks
// that every scene succeeded and showed its events. It asserts nothing
// about timing.
func TestRun(t *testing.T) {
	tmp := embeddedtest.TempDir(t)
	var text, jsonl bytes.Buffer
	textOut, jsonOut := demo.NewPrinter(&text, false), demo.NewPrinter(&jsonl, true)
	var events []demo.Event
	rep, err := demo.Run(context.Background(), demo.Options{Events: func(e demo.Event) {
		events = append(events, e)
		textOut.Event(e)
		jsonOut.Event(e)
	}})
	textOut.Report(rep)
	jsonOut.Report(rep)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, text.String())
	}
	if perr := errors.Join(textOut.Err(), jsonOut.Err()); perr != nil {
		t.Fatal(perr)
	}
	embeddedtest.CheckEmpty(t, tmp)
	t.Logf("timeline:\n%s", text.String())

	if !rep.OK || rep.Error != "" {
		t.Errorf("report OK %t, error %q", rep.OK, rep.Error)
	}
	// What ExampleRun prints.
	if rep.Conversation != "release-42" || rep.TraceID != "717e81e2c69e106ad7cb5c8c712e0921" {
		t.Errorf("report conversation %q trace %q, want release-42 and its trace 717e81e2c69e106ad7cb5c8c712e0921", rep.Conversation, rep.TraceID)
	}
	var ran []string
	for _, s := range rep.Scenes {
		ran = append(ran, s.Scene)
		if !s.OK || s.Detail == "" {
			t.Errorf("scene %s: ok %t, detail %q", s.Scene, s.OK, s.Detail)
		}
	}
	if want := []string{"priority", "crash", "duplicate", "ttl", "request", "poison", "presence", "tasks", "review", "trace"}; !slices.Equal(ran, want) || !slices.Equal(demo.Scenes(), want) {
		t.Errorf("scenes %v, Scenes() %v, want %v", ran, demo.Scenes(), want)
	}

	// Every scene shows its events.
	kinds := map[string]map[string]bool{}
	for _, e := range events {
		if kinds[e.Scene] == nil {
			kinds[e.Scene] = map[string]bool{}
		}
		kinds[e.Scene][e.Event] = true
		if e.Event == demo.EventWarning || e.Event == demo.EventFail {
			t.Errorf("%s event: %s", e.Event, e.Detail)
		}
	}
	want := map[string][]string{
		"setup":     {demo.EventStart},
		"priority":  {demo.EventScene, demo.EventQueued, demo.EventOnline, demo.EventHandled, demo.EventOK},
		"crash":     {demo.EventScene, demo.EventPublished, demo.EventTaken, demo.EventCrashed, demo.EventOnline, demo.EventRedelivered, demo.EventOK},
		"duplicate": {demo.EventScene, demo.EventPublished, demo.EventDuplicate, demo.EventHandled, demo.EventOK},
		"ttl":       {demo.EventScene, demo.EventQueued, demo.EventExpired, demo.EventOK},
		"request":   {demo.EventScene, demo.EventOnline, demo.EventRequest, demo.EventHandled, demo.EventReply, demo.EventReplied, demo.EventOK},
		"poison":    {demo.EventScene, demo.EventPublished, demo.EventFailed, demo.EventHandled, demo.EventDeadLettered, demo.EventOK},
		"presence": {demo.EventScene, demo.EventStart, demo.EventOnline, demo.EventCrashed, demo.EventOffline, demo.EventRequest,
			demo.EventQueued, demo.EventEscalated, demo.EventHandled, demo.EventRecovered, demo.EventOK},
		"tasks": {demo.EventScene, demo.EventRequest, demo.EventProgress, demo.EventCancel, demo.EventCanceled, demo.EventOffline,
			demo.EventDeadline, demo.EventExpired, demo.EventQueued, demo.EventOnline, demo.EventHandled, demo.EventOK},
		"review": {demo.EventScene, demo.EventOnline, demo.EventRequest, demo.EventCrashed, demo.EventReplied, demo.EventGathered,
			demo.EventReply, demo.EventDeadline, demo.EventExpired, demo.EventOK},
		"trace":    {demo.EventScene, demo.EventTrace, demo.EventRecord, demo.EventOK},
		"teardown": {demo.EventStop},
	}
	for scene, ks := range want {
		for _, k := range ks {
			if !kinds[scene][k] {
				t.Errorf("scene %s has no %q event", scene, k)
			}
		}
	}

	// The escalation, queued last, is handled first.
	var handled []string
	for _, e := range events {
		if e.Scene == "priority" && e.Event == demo.EventHandled {
			handled = append(handled, e.ID)
		}
	}
	if want := []string{"esc-1", "dev-101", "dev-102", "dev-103"}; !slices.Equal(handled, want) {
		t.Errorf("priority scene handled %v, want %v", handled, want)
	}
	// The worker back from its outage drains its queue by priority.
	handled = nil
	for _, e := range events {
		if e.Scene == "presence" && e.Event == demo.EventHandled {
			handled = append(handled, e.ID)
		}
	}
	if want := []string{"dev-202", "dev-201"}; !slices.Equal(handled, want) {
		t.Errorf("presence scene handled %v, want %v", handled, want)
	}
	checkTasks(t, events)
	checkReview(t, events)
	// The messages of two protocols reach the trace, with their priorities.
	records := map[string]demo.Event{}
	for _, e := range events {
		if e.Event == demo.EventRecord {
			records[e.ID] = e
		}
	}
	for id, want := range map[string]struct {
		typ      string
		priority int
		state    string
	}{
		"esc-1":   {"ESCALATION_REQUEST", 1, "completed"},
		"dev-104": {"develop", 3, "completed after 2 deliveries"},
		"pr-7":    {"review_pr", 2, "expired"},
		"val-1":   {"VALIDATION_REQUEST", 3, "replied"},
		"dev-666": {"develop", 3, "dead_lettered"},
		"pr-8":    {"review_pr", 3, "canceled"},
		"pr-9":    {"review_pr", 2, "expired"},
		"info-1":  {"info", 5, "completed"},
	} {
		r, ok := records[id]
		if !ok || r.Type != want.typ || r.Priority != want.priority || !strings.HasPrefix(r.Detail, want.state) {
			t.Errorf("trace record of %s = %+v, want %s p%d %s", id, r, want.typ, want.priority, want.state)
		}
	}

	checkJSONLines(t, jsonl.Bytes(), len(events))
	checkText(t, text.String(), len(events))
}

// checkTasks checks the tasks scene: the orchestrator shows pr-8's progress
// updates in order, cancels it during the tests and is told so, the
// reviewer's handler stops with bus.ErrCanceled and the record reads
// canceled; pr-9's do-by passes while the reviewer is offline, its record
// reads expired, and the reviewer, back, handles info-1 and never pr-9. The
// trace holds pr-8's three updates and its cancel notice.
func checkTasks(t *testing.T, events []demo.Event) {
	t.Helper()
	var lines, pr9 []string
	for _, e := range events {
		if e.ID == "pr-9" {
			pr9 = append(pr9, e.Event)
		}
		if e.Scene != "tasks" {
			continue
		}
		switch e.Event {
		case demo.EventProgress:
			lines = append(lines, e.From+" -> "+e.To+" "+e.Type+": "+e.Detail)
		case demo.EventCancel, demo.EventCanceled, demo.EventDeadline, demo.EventExpired, demo.EventHandled:
			lines = append(lines, e.Event+" "+e.ID+": "+e.Detail)
		}
	}
	want := []string{
		"reviewer -> orchestrator agentbus.progress: update 1 on pr-8: cloning acme/app",
		"reviewer -> orchestrator agentbus.progress: update 2 on pr-8: 20% building",
		"reviewer -> orchestrator agentbus.progress: update 3 on pr-8: 40% running tests",
		"cancel pr-8: a newer commit makes the review moot: the orchestrator cancels it while the tests run (Bus.Cancel); record canceled by orchestrator",
		`canceled pr-8: the orchestrator's Request returns at once: *bus.CanceledError "request pr-8 canceled by orchestrator"`,
		`canceled pr-8: the reviewer stops "running tests": a priority-1 cancel notice ended its handler's context, whose cause is bus.ErrCanceled`,
		"canceled pr-8: lifecycle record canceled; it is not delivered again",
		"deadline pr-9: the orchestrator's Request returns *bus.DeadlineError, kind do-by, ",
		"expired pr-9: expired unread: lifecycle record expired",
		"handled info-1: handled by the reviewer, its first message since it came back: the expired pr-9, at p2, never arrived",
	}
	if len(lines) != len(want) {
		t.Errorf("tasks scene:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	} else {
		for i := range want {
			if !strings.HasPrefix(lines[i], want[i]) {
				t.Errorf("tasks scene line %d:\n%s\nwant:\n%s", i+1, lines[i], want[i])
			}
		}
	}
	// pr-9 never reached a handler: no event says more of it than that it
	// was sent, missed its deadline and expired.
	if want := []string{demo.EventRequest, demo.EventDeadline, demo.EventExpired, demo.EventRecord}; !slices.Equal(pr9, want) {
		t.Errorf("events of pr-9 %v, want %v", pr9, want)
	}
	// The bus's own messages for pr-8 are in the conversation too: the
	// reviewer took its cancel notice; the orchestrator's waits unread, as
	// it takes no inbox.
	types := map[string]int{}
	for _, e := range events {
		if e.Event == demo.EventRecord && strings.HasPrefix(e.Type, "agentbus.") {
			types[e.Type]++
			want := "completed"
			if e.Type == "agentbus.cancel" && e.To == "orchestrator" {
				want = "pending"
			}
			if e.Detail != want {
				t.Errorf("trace record of %s %s to %s: %s, want %s", e.Type, e.ID, e.To, e.Detail, want)
			}
		}
	}
	if types["agentbus.progress"] != 3 || types["agentbus.cancel"] != 2 || len(types) != 2 {
		t.Errorf("trace records of the bus's own messages %v, want 3 agentbus.progress and 2 agentbus.cancel", types)
	}
}

// checkReview checks the review scene: five reviewers join; two verdicts
// and ui's crash come before api's verdict; the lead proceeds with those
// three, perf and ui timed out; perf answers after that and the lead reads
// its verdict with Attach; Attach to ui's copy returns at the reply-by and
// the copy expires. None of the round's messages is in the trace of
// release-42: the round is the component's conversation.
func checkReview(t *testing.T, events []demo.Event) {
	t.Helper()
	var lines []string
	for _, e := range events {
		if e.Scene == "review" && e.Event != demo.EventScene && e.Event != demo.EventOK {
			lines = append(lines, e.Event+" "+e.From)
		}
		if e.Event == demo.EventRecord && (e.Type == "ComponentHandoff" || e.Type == "ReviewResult") {
			t.Errorf("trace record of the review round: %+v", e)
		}
	}
	// security and qa answer at once, and ui crashes meanwhile, in any order.
	if len(lines) > 9 {
		slices.Sort(lines[6:9])
	}
	want := []string{
		"online security", "online qa", "online api", "online perf", "online ui",
		"request orchestrator",
		"crashed ui", "replied qa", "replied security",
		"replied api",
		"gathered orchestrator",
		"replied perf", "reply perf",
		"deadline orchestrator", "expired orchestrator",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("review scene:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for _, e := range events {
		if e.Event == demo.EventGathered && !strings.HasSuffix(e.Detail, "replied api (approved), qa (approved), security (approved); failed none; offline none; timed out perf, ui") {
			t.Errorf("the lead's round: %s", e.Detail)
		}
	}
}

// checkJSONLines checks the --json output: n event lines with every member,
// then the summary.
func checkJSONLines(t *testing.T, out []byte, n int) {
	t.Helper()
	members := []string{"elapsed_ms", "scene", "from", "to", "type", "priority", "id", "event", "detail"}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var lines []map[string]any
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", len(lines)+1, err, sc.Bytes())
		}
		lines = append(lines, v)
	}
	if len(lines) != n+1 {
		t.Fatalf("%d JSON lines, want %d events and the summary", len(lines), n)
	}
	for i, v := range lines[:n] {
		for _, m := range members {
			if _, ok := v[m]; !ok {
				t.Errorf("line %d has no %q: %v", i+1, m, v)
			}
		}
	}
	sum := lines[n]
	if sum["event"] != "summary" || sum["ok"] != true || sum["conversation"] != demo.Conversation || sum["trace_id"] == "" {
		t.Errorf("summary %v", sum)
	}
	if scenes, _ := sum["scenes"].([]any); len(scenes) != len(demo.Scenes()) {
		t.Errorf("summary has %d scenes, want %d", len(scenes), len(demo.Scenes()))
	}
}

// checkText checks the human output: a heading, a line per event (a
// scene's heading with a blank line before it), and the closing line.
func checkText(t *testing.T, out string, n int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "agentbus demo:") {
		t.Errorf("first line %q", lines[0])
	}
	// The heading, n events, a blank line before each scene and before the
	// closing line.
	if want := 1 + n + len(demo.Scenes()) + 2; len(lines) != want {
		t.Errorf("%d lines, want %d:\n%s", len(lines), want, out)
	}
	for _, s := range demo.Scenes() {
		if !strings.Contains(out, "\n["+s+"] ") {
			t.Errorf("no heading for scene %s", s)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, fmt.Sprintf("agentbus demo: all %d scenes ok in ", len(demo.Scenes()))) {
		t.Errorf("last line %q", last)
	}
}

// TestRunTimeout: a run that cannot finish in time fails, says why, and
// still removes everything it started.
func TestRunTimeout(t *testing.T) {
	tmp := embeddedtest.TempDir(t)
	var events []demo.Event
	rep, err := demo.Run(context.Background(), demo.Options{
		Timeout: 500 * time.Millisecond, // less than the crash scene's ack wait
		Events:  func(e demo.Event) { events = append(events, e) },
	})
	if err == nil || !strings.Contains(err.Error(), "did not finish within 500ms") {
		t.Fatalf("Run error %v, want it not to finish within 500ms", err)
	}
	if rep.OK || rep.Error != err.Error() {
		t.Errorf("report OK %t, error %q", rep.OK, rep.Error)
	}
	if last := events[len(events)-1]; last.Event != demo.EventStop {
		t.Errorf("last event %+v, want the teardown", last)
	}
	embeddedtest.CheckEmpty(t, tmp)
}

// TestRunCancelled: cancelling the context stops the demo with the
// context's error.
func TestRunCancelled(t *testing.T) {
	embeddedtest.TempDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, err := demo.Run(ctx, demo.Options{Events: func(e demo.Event) {
		if e.Event == demo.EventCrashed {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || rep.OK {
		t.Fatalf("Run error %v, OK %t; want context.Canceled", err, rep.OK)
	}
	if n := len(rep.Scenes); n != 2 || rep.Scenes[1].OK {
		t.Errorf("scenes %+v, want priority ok and crash failed", rep.Scenes)
	}
}
