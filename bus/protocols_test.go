package bus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/embedded"
)

// Integration tests of the five agent protocols (docs/protocols.md) on an
// embedded server: agents exchange the documents' examples through the bus
// with PublishNative and Subscribe.

// protoTestdata holds the documents' examples as codec/profiles copied them
// from shared/protocols (codec/profiles/examples_test.go lists them);
// protoFixtures completes snippets of the documents (see its README.md).
const (
	protoTestdata = "../codec/profiles/testdata"
	protoFixtures = "testdata/protocols"
)

// protoExample is one native message of a protocol document, sent by one
// agent to another.
type protoExample struct {
	name string // subtest name; file when empty
	// file is the message, under protoTestdata/<profile>, or under
	// protoFixtures/<profile> when it starts with "fixture:".
	file string
	// edit, if set, derives the message from file the way the document
	// allows: another alternative of a template, a missing field filled in.
	edit func(t *testing.T, native []byte) []byte
	// from and to are the agents: the example's own from/to where the
	// format has them, the document's roles where it has none. to is "*"
	// for a broadcast.
	from, to string

	// Values read off the document, checked besides what the profile's own
	// Decode derives from the same bytes. id, correlation and replyTo are ""
	// where the message has none.
	typ                      string
	priority                 int
	id, correlation, replyTo string
	// joins is the conversation a reply without a correlation of its own
	// is delivered in: that of the message it answers (PublishNative).
	joins string

	// refused, if set, are findings (field, rule) of a message the document
	// itself breaks: a strict profile refuses it at publish, and nothing is
	// sent. With exact the findings are exactly these, else they include
	// them.
	refused [][2]string
	exact   bool
}

func (ex protoExample) label() string {
	if ex.name != "" {
		return ex.name
	}
	return strings.TrimPrefix(ex.file, "fixture:")
}

// native reads ex's message and applies its edit.
func (ex protoExample) native(t *testing.T, profile string) []byte {
	t.Helper()
	var b []byte
	if f, ok := strings.CutPrefix(ex.file, "fixture:"); ok {
		b = readFile(t, filepath.Join(protoFixtures, profile, f))
	} else {
		b = readFile(t, filepath.Join(protoTestdata, profile, ex.file))
	}
	if ex.edit != nil {
		b = ex.edit(t, b)
	}
	return b
}

// replaceOnce returns an edit replacing old, which must occur exactly once,
// by repl.
func replaceOnce(old, repl string) func(*testing.T, []byte) []byte {
	return func(t *testing.T, b []byte) []byte {
		t.Helper()
		if n := bytes.Count(b, []byte(old)); n != 1 {
			t.Fatalf("%q occurs %d times in the example, want once", old, n)
		}
		return bytes.Replace(b, []byte(old), []byte(repl), 1)
	}
}

// nativelyAddressed reports whether the format names its sender and
// recipient itself (docs/protocols.md); frontmatter and swarm take them from
// the transport.
func nativelyAddressed(p profiles.Profile) bool {
	switch p.Name() {
	case "basemessage", "coordination", "pipeline":
		return true
	}
	return false
}

// protoContentType is the content type docs/protocols.md gives each profile.
func protoContentType(profile string) string {
	if profile == "frontmatter" {
		return "text/markdown"
	}
	return "application/json"
}

// protoNet is one server with a bus per agent and the inbox of every agent
// that receives something.
type protoNet struct {
	s       *embedded.Server
	buses   map[string]*bus.Bus
	inboxes map[string]*recorder
}

// newProtoNet starts a server and connects the agents of examples, all of
// them before any message is sent, so that a broadcast reaches every
// recipient, and subscribes each recipient (default options: Strict,
// concurrency 1).
func newProtoNet(t *testing.T, examples []protoExample) *protoNet {
	t.Helper()
	n := &protoNet{s: newServer(t), buses: map[string]*bus.Bus{}, inboxes: map[string]*recorder{}}
	agent := func(name string) *bus.Bus {
		if b, ok := n.buses[name]; ok {
			return b
		}
		b := newBus(t, n.s, name)
		n.buses[name] = b
		return b
	}
	for _, ex := range examples {
		agent(ex.from)
		if ex.to != bus.Broadcast && n.inboxes[ex.to] == nil {
			r := newRecorder()
			subscribe(t, agent(ex.to), r.handle)
			n.inboxes[ex.to] = r
		}
	}
	return n
}

// recipients returns who receives ex: its recipient, or for a broadcast
// every agent with an inbox but the sender.
func (n *protoNet) recipients(ex protoExample) []string {
	if ex.to != bus.Broadcast {
		return []string{ex.to}
	}
	var out []string
	for a := range n.inboxes {
		if a != ex.from {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// runProtocolExchange sends every example of profile between its agents,
// in order, and checks each as exchange and refuse describe. At the end
// every inbox holds exactly the messages sent to it: nothing refused,
// nothing twice, no own broadcast.
func runProtocolExchange(t *testing.T, name string, examples []protoExample) {
	p := profile(t, name)
	n := newProtoNet(t, examples)
	want := map[string]int{}
	for _, ex := range examples {
		ok := t.Run(ex.label(), func(t *testing.T) {
			native := ex.native(t, name)
			if ex.refused != nil {
				n.refuse(t, p, ex, native)
				return
			}
			n.exchange(t, p, ex, native)
		})
		if !ok {
			t.FailNow() // later examples assume the earlier ones arrived
		}
		if ex.refused == nil {
			for _, r := range n.recipients(ex) {
				want[r]++
			}
		}
	}
	for a, r := range n.inboxes {
		if got := len(r.deliveries()); got != want[a] {
			t.Errorf("%s received %d messages %v, want %d", a, got, r.types(), want[a])
		}
	}
}

// exchange publishes ex with PublishNative as ex.from and checks what each
// recipient gets.
func (n *protoNet) exchange(t *testing.T, p profiles.Profile, ex protoExample, native []byte) {
	t.Helper()
	sent := bytes.Clone(native)
	// What the profile makes of the bytes: the expectation. A natively
	// addressed format is decoded with no addressing at all, so its own
	// from and to must name ex's agents.
	pub, dec := profiles.Addressing{}, profiles.Addressing{}
	if !nativelyAddressed(p) {
		pub.To = ex.to
		dec = profiles.Addressing{From: ex.from, To: ex.to}
	}
	want, err := p.Decode(native, dec)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if want.From != ex.from || want.To != ex.to {
		t.Fatalf("the message is from %q to %q, the test says %q to %q", want.From, want.To, ex.from, ex.to)
	}
	// The document's values, so that the test does not only compare the
	// profile with itself.
	if want.Type != ex.typ || want.Priority != ex.priority || want.ID != ex.id || want.CausationID != ex.replyTo ||
		(ex.correlation != "" && want.CorrelationID != ex.correlation) {
		t.Errorf("Decode: type %q priority %d id %q correlation %q reply-to %q; the document says %q, %d, %q, %q, %q",
			want.Type, want.Priority, want.ID, want.CorrelationID, want.CausationID, ex.typ, ex.priority, ex.id, ex.correlation, ex.replyTo)
	}

	ack, err := n.buses[ex.from].PublishNative(testContext(t), p, native, pub)
	if err != nil {
		t.Fatalf("PublishNative: %v", err)
	}
	if ack.Duplicate {
		t.Errorf("PublishNative: duplicate of a stored message %s", ack.ID)
	}
	if want.ID != "" && ack.ID != want.ID {
		t.Errorf("ack ID %q, want the native ID %q", ack.ID, want.ID)
	}
	wantCorrelation := want.CorrelationID
	switch {
	case wantCorrelation != "":
	case ex.joins != "":
		wantCorrelation = ex.joins
	default:
		wantCorrelation = ack.ID // a message without one starts its own conversation
	}

	for _, to := range n.recipients(ex) {
		d := waitDelivery(t, n.inboxes[to], ack.ID)
		if !bytes.Equal(d.Data, sent) {
			t.Errorf("%s got other bytes than sent:\n%s\nwant\n%s", to, d.Data, sent)
		}
		if d.ContentType != protoContentType(p.Name()) || d.ContentType != want.ContentType {
			t.Errorf("%s: content type %q, want %q", to, d.ContentType, protoContentType(p.Name()))
		}
		if schema := "urn:agentbus:profile:" + p.Name() + ":1.0"; d.DataSchema != schema || d.DataSchema != p.DataSchema() {
			t.Errorf("%s: dataschema %q, want %q", to, d.DataSchema, schema)
		}
		if q, ok := profiles.ForDataSchema(d.DataSchema); !ok || q.Name() != p.Name() {
			t.Errorf("%s: ForDataSchema(%q) = %v, %v", to, d.DataSchema, q, ok)
		}
		if d.From != want.From || d.To != want.To || d.Type != want.Type || d.Priority != want.Priority ||
			d.CorrelationID != wantCorrelation || d.CausationID != want.CausationID {
			t.Errorf("%s got from %q to %q type %q priority %d correlation %q reply-to %q;\nwant %q %q %q %d %q %q", to,
				d.From, d.To, d.Type, d.Priority, d.CorrelationID, d.CausationID,
				want.From, want.To, want.Type, want.Priority, wantCorrelation, want.CausationID)
		}
		if !want.Time.IsZero() && !d.Time.Equal(want.Time) {
			t.Errorf("%s: time %v, want the native %v", to, d.Time, want.Time)
		}
		if fs, err := profiles.AttachedFindings(&d.Message); fs != nil || err != nil {
			t.Errorf("%s: findings attached to a valid message: %v %v", to, fs, err)
		}
		if d.Late || d.Replayed || d.Deliveries != 1 {
			t.Errorf("%s: late %v replayed %v deliveries %d", to, d.Late, d.Replayed, d.Deliveries)
		}

		st := waitState(t, n.buses[to], ack.ID, bus.StateCompleted)
		if st.From != ex.from || st.To != to || st.Type != want.Type || st.Priority != want.Priority ||
			st.CorrelationID != wantCorrelation || st.By != to || st.Sequence != ack.Sequence {
			t.Errorf("%s: lifecycle record %+v", to, st)
		}
	}
}

// refuse checks that PublishNative refuses ex, which the document itself
// breaks, with ErrInvalidMessage and the findings ex lists.
func (n *protoNet) refuse(t *testing.T, p profiles.Profile, ex protoExample, native []byte) {
	t.Helper()
	if !p.Strict() {
		t.Fatalf("%s is lenient: it refuses nothing", p.Name())
	}
	pub := profiles.Addressing{}
	if !nativelyAddressed(p) {
		pub.To = ex.to
	}
	ack, err := n.buses[ex.from].PublishNative(testContext(t), p, native, pub)
	if err == nil {
		t.Fatalf("PublishNative sent it (%s), want it refused", ack.ID)
	}
	checkRefused(t, p, err, ex.refused, ex.exact)
}

// checkRefused checks that err refuses a message of p at publish with the
// findings want (exactly these with exact).
func checkRefused(t *testing.T, p profiles.Profile, err error, want [][2]string, exact bool) {
	t.Helper()
	if !errors.Is(err, bus.ErrInvalidMessage) || !errors.Is(err, profiles.ErrInvalid) {
		t.Fatalf("PublishNative error %v, want ErrInvalidMessage wrapping profiles.ErrInvalid", err)
	}
	ve, ok := errors.AsType[*profiles.ValidationError](err)
	if !ok {
		t.Fatalf("PublishNative error %v has no *profiles.ValidationError", err)
	}
	if ve.Profile != p.Name() {
		t.Errorf("findings of profile %q, want %q", ve.Profile, p.Name())
	}
	for _, fr := range want {
		if !ve.Has(fr[0], fr[1]) {
			t.Errorf("findings %v lack %s %s", ve.Findings, fr[0], fr[1])
		}
	}
	if exact && len(ve.Findings) != len(want) {
		t.Errorf("findings %v, want exactly %v", ve.Findings, want)
	}
}

// waitDelivery waits until r got message id and returns it.
func waitDelivery(t *testing.T, r *recorder, id string) *bus.Delivery {
	t.Helper()
	var got *bus.Delivery
	waitFor(t, "delivery of "+id, func() (bool, string) {
		for _, d := range r.deliveries() {
			if d.ID == id {
				got = d
				return true, ""
			}
		}
		return false, fmt.Sprintf("got %v", r.types())
	})
	return got
}

// TestProtocolFrontmatterExchange: the envelopes of
// frontmatter-envelope.md between orchestrator, worker, reviewer, auditor,
// architect and researcher, as the document routes them. The format has
// no addressing: the sender is the publishing agent, the recipient the
// caller's. The five examples with values and the seven templates with
// their first alternative chosen are delivered at priority 3, the other
// alternatives that the priority mapping ranks (signal blocked, escalate,
// has_blockers) at theirs; the seven templates as the document prints them
// ("signal: pass | fail") are refused.
func TestProtocolFrontmatterExchange(t *testing.T) {
	runProtocolExchange(t, "frontmatter", []protoExample{
		{file: "task_assignment.md", from: "orchestrator", to: "worker", typ: "task_assignment", priority: 3},
		{file: "approval.md", from: "orchestrator", to: "worker", typ: "approval", priority: 3},
		{file: "triage_request.md", from: "orchestrator", to: "architect", typ: "triage_request", priority: 3},
		{file: "architecture_request.md", from: "orchestrator", to: "architect", typ: "architecture_request", priority: 3},
		{file: "research_request.md", from: "orchestrator", to: "researcher", typ: "research_request", priority: 3},
		{file: "instances/worker_submission.md", from: "worker", to: "orchestrator", typ: "worker_submission", priority: 3},
		{name: "worker_submission signal blocked", file: "instances/worker_submission.md", edit: replaceOnce("signal: rfr", "signal: blocked"),
			from: "worker", to: "orchestrator", typ: "worker_submission", priority: 2},
		{name: "worker_submission signal escalate", file: "instances/worker_submission.md", edit: replaceOnce("signal: rfr", "signal: escalate"),
			from: "worker", to: "orchestrator", typ: "worker_submission", priority: 1},
		{file: "instances/review_verdict.md", from: "reviewer", to: "orchestrator", typ: "review_verdict", priority: 3},
		{file: "instances/audit_verdict.md", from: "auditor", to: "orchestrator", typ: "audit_verdict", priority: 3},
		{file: "instances/triage_result.md", from: "architect", to: "orchestrator", typ: "triage_result", priority: 3},
		{file: "instances/plan_result.md", from: "architect", to: "orchestrator", typ: "plan_result", priority: 3},
		{name: "plan_result has_blockers", file: "instances/plan_result.md", edit: replaceOnce("has_blockers: false", "has_blockers: true"),
			from: "architect", to: "orchestrator", typ: "plan_result", priority: 2},
		{file: "instances/research_result.md", from: "researcher", to: "orchestrator", typ: "research_result", priority: 3},
		{file: "instances/revision_request.md", from: "orchestrator", to: "worker", typ: "revision_request", priority: 3},

		{file: "templates/worker_submission.md", from: "worker", to: "orchestrator", refused: [][2]string{{"/signal", "enum"}, {"/qa_check", "enum"}}},
		{file: "templates/review_verdict.md", from: "reviewer", to: "orchestrator", refused: [][2]string{{"/signal", "enum"}, {"/ac_coverage/AC1", "enum"}}},
		{file: "templates/audit_verdict.md", from: "auditor", to: "orchestrator", refused: [][2]string{{"/signal", "enum"}, {"/build_status", "enum"}}},
		{file: "templates/triage_result.md", from: "architect", to: "orchestrator", refused: [][2]string{{"/tier", "enum"}, {"/research_needed", "type"}}, exact: true},
		{file: "templates/plan_result.md", from: "architect", to: "orchestrator", refused: [][2]string{{"/signal", "enum"}}},
		{file: "templates/research_result.md", from: "researcher", to: "orchestrator", refused: [][2]string{{"/verified", "type"}, {"/has_gotchas", "type"}}, exact: true},
		{file: "templates/revision_request.md", from: "orchestrator", to: "worker", refused: [][2]string{{"/fix_severity", "enum"}}, exact: true},
	})
}

// TestProtocolBasemessageExchange: base-message.md's examples between the
// agents they name. The CTO review example, which omits the
// findings.codeQuality its own interface requires, is refused; the same
// message with codeQuality added then goes through under the same
// messageId, not as a duplicate, so the refused one was never stored. The
// event and broadcast patterns, completed with the payloads their types
// require, cross too: the broadcast reaches every other agent.
func TestProtocolBasemessageExchange(t *testing.T) {
	const codeQuality = `"codeQuality": {
        "technicalDebt": ["Class components mixed with hooks"],
        "patterns": ["Repository pattern for data access"],
        "dependencies": ["react@17"]
      },
      "documentation": {`
	runProtocolExchange(t, "basemessage", []protoExample{
		{file: "task_assignment.json", from: "build orchestrator", to: "@agent-fullstack-developer",
			typ: "TASK_ASSIGNMENT", priority: 3, id: "msg-123", correlation: "task-001"},
		{file: "cto_review.json", from: "@agent-cto", to: "build orchestrator",
			refused: [][2]string{{"/payload/findings/codeQuality", "required"}}, exact: true},
		{name: "cto_review.json with codeQuality", file: "cto_review.json", edit: replaceOnce(`"documentation": {`, codeQuality),
			from: "@agent-cto", to: "build orchestrator",
			typ: "CODEBASE_REVIEW_REPORT", priority: 3, id: "msg-456", correlation: "project-review"},
		{file: "fixture:event_state_transition.json", from: "plan-manager", to: "build-orchestrator",
			typ: "STATE_TRANSITION", priority: 3, id: "event-321", correlation: "task-001"},
		{file: "fixture:broadcast_status_update.json", from: "build-orchestrator", to: bus.Broadcast,
			typ: "STATUS_UPDATE", priority: 4, id: "broadcast-789", correlation: "task-001"},
	})
}

// TestProtocolSwarmExchange: swarm.md's handoffs between lead,
// implementer, reviewer, test-runner and fixer, as its headings route them
// (Lead -> Implementer, ...). Addressing comes from the transport; the
// component_id threads the conversation. The three examples with values
// and the three templates whose fields are all strings are delivered;
// the other templates ("integer — ...") are refused.
func TestProtocolSwarmExchange(t *testing.T) {
	runProtocolExchange(t, "swarm", []protoExample{
		{file: "component_assignment.json", from: "lead", to: "implementer", typ: "ComponentAssignment", priority: 3, correlation: "C1"},
		{file: "component_handoff_turns.json", from: "implementer", to: "lead", typ: "ComponentHandoff", priority: 3, correlation: "auth-middleware"},
		{file: "handoff_request.json", from: "lead", to: "reviewer", typ: "HandoffRequest", priority: 2},
		{file: "templates/context_bundle.json", from: "lead", to: "implementer", typ: "ContextBundle", priority: 3},
		{file: "templates/test_execution.json", from: "lead", to: "test-runner", typ: "TestExecution", priority: 3,
			correlation: "string — matches TestHandoff component_id"},
		{file: "templates/fix_summary.json", from: "fixer", to: "lead", typ: "FixSummary", priority: 3},

		{file: "templates/architect_plan.json", from: "architect", to: "lead", refused: [][2]string{{"/pipeline_feasible", "type"}}},
		{file: "templates/component_handoff.json", from: "implementer", to: "lead", refused: [][2]string{{"/status", "enum"}, {"/attempt", "type"}}},
		{file: "templates/review_result.json", from: "reviewer", to: "lead", refused: [][2]string{{"/verdict", "enum"}}},
		{file: "templates/test_request.json", from: "lead", to: "test-writer", refused: [][2]string{{"/testing_strategy", "enum"}}, exact: true},
		{file: "templates/test_handoff.json", from: "test-writer", to: "lead", refused: [][2]string{{"/test_count", "type"}, {"/turn_count", "type"}}, exact: true},
		{file: "templates/test_result.json", from: "test-runner", to: "lead", refused: [][2]string{{"/status", "enum"}}},
		{file: "templates/review_findings.json", from: "reviewer", to: "lead", refused: [][2]string{{"/reviewer", "enum"}, {"/timestamp", "format"}}},
		{file: "templates/verification_result.json", from: "verifier", to: "lead", refused: [][2]string{{"/lint", "enum"}}},
		{file: "templates/handoff_summary.json", from: "implementer", to: "lead", refused: [][2]string{{"/agent_role", "enum"}}},
	})
}

// TestProtocolCoordinationExchange: coordination.md's five examples between
// the agents they name, each at the priority the mapping gives its type and
// status (question 2, in-progress status update 4, the rest 3), taskId as
// the conversation; the result, which has no taskId, starts its own.
func TestProtocolCoordinationExchange(t *testing.T) {
	runProtocolExchange(t, "coordination", []protoExample{
		{file: "task_assignment.json", from: "orchestrator-agent", to: "worker-agent", typ: "task_assignment", priority: 3, correlation: "task-001"},
		{file: "status_update.json", from: "database-build-agent", to: "orchestrator", typ: "status_update", priority: 4, correlation: "task-001"},
		{file: "question.json", from: "database-build-agent", to: "orchestrator", typ: "question", priority: 2, correlation: "task-001"},
		{file: "result.json", from: "database-build-agent", to: "orchestrator", typ: "result", priority: 3},
		{file: "worker_to_worker.json", from: "database-plan-agent", to: "database-build-agent", typ: "task_assignment", priority: 3, correlation: "task-002"},
	})
}

// TestProtocolPipelineExchange: pipeline.md's messages between pm and dev.
// The tracker.json message, whose develop body lacks three of the fields
// the subject table lists, is refused; with them filled in it goes through
// under the same id, not as a duplicate. dev's issue_complete answers the
// develop message (replyTo is the causation, and the reply joins the
// develop message's conversation), and a broker stop "-> All"
// reaches both at the table's priority 1.
func TestProtocolPipelineExchange(t *testing.T) {
	runProtocolExchange(t, "pipeline", []protoExample{
		{file: "message.json", from: "pm", to: "dev", typ: "develop", priority: 4, id: "msg-uuid-v4"},
		{file: "tracker_message.json", from: "pm", to: "dev",
			refused: [][2]string{{"/body/phase", "required"}, {"/body/totalIssues", "required"}, {"/body/currentIndex", "required"}}, exact: true},
		{name: "tracker_message.json with the body filled in", file: "tracker_message.json",
			edit: replaceOnce(`"body": { "issue": "JOP-240" }`, `"body": { "issue": "JOP-240", "phase": 2, "totalIssues": 4, "currentIndex": 1 }`),
			from: "pm", to: "dev", typ: "develop", priority: 4, id: "msg-abc-123"},
		{file: "fixture:issue_complete.json", from: "dev", to: "pm", typ: "issue_complete", priority: 4, id: "msg-dev-001", replyTo: "msg-uuid-v4", joins: "msg-uuid-v4"},
		{file: "fixture:stop_broadcast.json", from: "pipeline", to: bus.Broadcast, typ: "stop", priority: 1, id: "msg-broker-stop"},
	})
}

// TestProtocolPipelineOfflineByPriority: pipeline.md's delivery rule. pm is
// offline while dev sends ten messages of four priorities, interleaved,
// some with a priority member and some leaving it to the subject table;
// they are queued (pending). When pm subscribes (Strict, concurrency 1)
// they arrive by priority, FIFO within a priority, byte for byte, and end
// completed.
func TestProtocolPipelineOfflineByPriority(t *testing.T) {
	s := newServer(t)
	p := profile(t, "pipeline")
	dev := newBus(t, s, "dev")
	pm := newBus(t, s, "pm") // connected, not subscribed: offline for the broker

	msgs := []struct {
		subject, body string
		native        int // the priority member, 0 for none
		want          int
	}{
		{"issue_complete", `{"issue":"JOP-240","phase":2,"summary":"Login page","branch":"feature/JOP-240","testResults":"42 passed"}`, 4, 4},
		{"ready", `{"nextPhase":3}`, 0, 5},
		{"alert", `{"message":"CI queue is slow","severity":"warning"}`, 0, 2},
		{"issue_failed", `{"issue":"JOP-241","error":"2 tests fail","attempt":1,"failCount":1}`, 0, 4},
		{"alert", `{"message":"disk almost full","severity":"critical"}`, 1, 1},
		{"ready", `{"nextPhase":4}`, 5, 5},
		{"needs_human", `{"reason":"merge conflict on main","type":"conflict"}`, 0, 2},
		{"issue_complete", `{"issue":"JOP-242","phase":2,"summary":"Logout","branch":"feature/JOP-242","testResults":"12 passed"}`, 0, 4},
		{"issue_failed", `{"issue":"JOP-243","error":"build fails","attempt":2,"failCount":2}`, 3, 3},
		{"needs_human", `{"reason":"credentials expired","type":"auth"}`, 1, 1},
	}
	sent := map[string][]byte{}
	index := map[string]int{}
	var order []string // the expected arrival order
	for prio := 1; prio <= 5; prio++ {
		for i, m := range msgs {
			if m.want == prio {
				order = append(order, fmt.Sprintf("msg-off-%02d", i))
			}
		}
	}
	for i, m := range msgs {
		id := fmt.Sprintf("msg-off-%02d", i)
		priority := ""
		if m.native != 0 {
			priority = fmt.Sprintf(`"priority": %d, `, m.native)
		}
		native := fmt.Appendf(nil, `{"id": %q, "from": "dev", "to": "pm", "subject": %q, "body": %s, %s"timestamp": "2026-04-11T02:%02d:00Z", "replyTo": null, "status": "pending"}`,
			id, m.subject, m.body, priority, i)
		sent[id] = bytes.Clone(native)
		index[id] = i
		ack, err := dev.PublishNative(testContext(t), p, native, profiles.Addressing{})
		if err != nil {
			t.Fatalf("PublishNative %s: %v", native, err)
		}
		if ack.ID != id {
			t.Fatalf("ack ID %q, want %q", ack.ID, id)
		}
	}
	for id := range sent {
		if st := waitState(t, dev, id, bus.StatePending); st.To != "pm" {
			t.Errorf("queued record %+v", st)
		}
	}

	r := newRecorder()
	subscribe(t, pm, r.handle)
	got := r.waitCount(t, len(msgs))
	var ids []string
	for i, d := range got {
		ids = append(ids, d.ID)
		if !bytes.Equal(d.Data, sent[d.ID]) {
			t.Errorf("%s: got other bytes than sent:\n%s\nwant\n%s", d.ID, d.Data, sent[d.ID])
		}
		k := index[d.ID]
		if d.Priority != msgs[k].want || d.Type != msgs[k].subject || d.From != "dev" || d.To != "pm" {
			t.Errorf("delivery %d: %s %s priority %d from %q to %q, want %s priority %d from dev to pm",
				i, d.ID, d.Type, d.Priority, d.From, d.To, msgs[k].subject, msgs[k].want)
		}
	}
	if !slices.Equal(ids, order) {
		t.Errorf("arrived in order\n%v\nwant\n%v", ids, order)
	}
	for _, id := range order {
		waitState(t, pm, id, bus.StateCompleted)
	}
}

// basemessage is the envelope of base-message.md, in its field order.
type basemessage struct {
	MessageID     string          `json:"messageId"`
	CorrelationID string          `json:"correlationId"`
	ReplyTo       string          `json:"replyTo,omitempty"`
	Timestamp     string          `json:"timestamp"`
	From          string          `json:"from"`
	To            string          `json:"to"`
	Type          string          `json:"type"`
	Version       string          `json:"version"`
	Payload       json.RawMessage `json:"payload"`
}

// validationResponse is the VALIDATION_RESPONSE the CTO sends to request
// (a native VALIDATION_REQUEST) as base-message.md's request-response
// pattern shows it: messageId res-456, the request's correlationId, replyTo
// the request's messageId.
func validationResponse(request []byte) ([]byte, error) {
	var req basemessage
	if err := json.Unmarshal(request, &req); err != nil {
		return nil, err
	}
	var task struct {
		TaskID string `json:"taskId"`
	}
	if err := json.Unmarshal(req.Payload, &task); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(map[string]any{
		"taskId":      task.TaskID,
		"decision":    "CONDITIONAL",
		"reasons":     []string{"Design follows the approved OAuth2 approach"},
		"conditions":  []string{"Document the callback URL in docs/auth/oauth-guide.md"},
		"suggestions": []string{"Add a global error boundary"},
	})
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(basemessage{
		MessageID:     "res-456",
		CorrelationID: req.CorrelationID,
		ReplyTo:       req.MessageID,
		Timestamp:     "2024-01-01T12:05:00Z",
		From:          req.To,
		To:            req.From,
		Type:          "VALIDATION_RESPONSE",
		Version:       "1.0",
		Payload:       payload,
	}, "", "  ")
}

// ctoReplier is the CTO's handler: it answers every VALIDATION_REQUEST with
// the native validationResponse through Bus.Reply, once released is closed
// (nil: at once).
func ctoReplier(t *testing.T, cto *bus.Bus, released <-chan struct{}) bus.Handler {
	p := profile(t, "basemessage")
	return func(ctx context.Context, d *bus.Delivery) error {
		if d.Type != "VALIDATION_REQUEST" {
			return nil
		}
		if released != nil {
			select {
			case <-released:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		native, err := validationResponse(d.Data)
		if err != nil {
			t.Errorf("build the response to %s: %v", d.ID, err)
			return bus.Permanent(err)
		}
		m, err := profiles.Prepare(p, native, profiles.Addressing{})
		if err != nil {
			t.Errorf("the response to %s: %v", d.ID, err)
			return bus.Permanent(err)
		}
		_, err = d.Reply(ctx, *m)
		return err
	}
}

// checkValidationResponse checks the reply to request: the native response
// byte for byte, and the conversation and causation it carries.
func checkValidationResponse(t *testing.T, d *bus.Delivery, request []byte) {
	t.Helper()
	want, err := validationResponse(request)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.Data, want) {
		t.Errorf("reply bytes\n%s\nwant\n%s", d.Data, want)
	}
	if d.ID != "res-456" || d.Type != "VALIDATION_RESPONSE" || d.From != "@agent-cto" || d.To != "build orchestrator" ||
		d.CorrelationID != "task-001" || d.CausationID != "req-123" || d.Priority != 3 ||
		d.DataSchema != "urn:agentbus:profile:basemessage:1.0" || d.ContentType != "application/json" {
		t.Errorf("reply: id %q type %q from %q to %q correlation %q causation %q priority %d schema %q content type %q",
			d.ID, d.Type, d.From, d.To, d.CorrelationID, d.CausationID, d.Priority, d.DataSchema, d.ContentType)
	}
	if d.Extensions[bus.ExtReplyBy] == "" {
		t.Errorf("reply lacks %s", bus.ExtReplyBy)
	}
}

// validationExchange is the basemessage document's validation exchange
// set up on a fresh server: the orchestrator and the CTO subscribed, the
// CTO answering with ctoReplier, and the document's request prepared.
type validationExchange struct {
	orch, cto *bus.Bus
	r         *recorder // the orchestrator's handler
	request   []byte    // the native request
	m         *bus.Message
}

// newValidationExchange sets up the exchange; gaveUp, if not nil, holds
// the CTO's reply until it is closed (see ctoReplier).
func newValidationExchange(t *testing.T, gaveUp chan struct{}) *validationExchange {
	t.Helper()
	s := newServer(t)
	x := &validationExchange{orch: newBus(t, s, "build orchestrator"), cto: newBus(t, s, "@agent-cto"), r: newRecorder()}
	subscribe(t, x.cto, ctoReplier(t, x.cto, gaveUp))
	subscribe(t, x.orch, x.r.handle)
	x.request = readFile(t, filepath.Join(protoFixtures, "basemessage", "validation_request.json"))
	m, err := profiles.Prepare(profile(t, "basemessage"), x.request, profiles.Addressing{})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	x.m = m
	return x
}

// TestProtocolBasemessageRequestReply: base-message.md's request-response
// pattern. The build orchestrator sends the VALIDATION_REQUEST req-123 with
// Bus.Request and a timeout; the CTO answers with the native
// VALIDATION_RESPONSE res-456 (same correlationId, replyTo req-123)
// through Bus.Reply. The request gets it as correlation task-001 and
// causation req-123; the request's record is replied with the reply's ID,
// the reply's completed, the conversation holds both, and the
// orchestrator's own subscription never handles the reply a second time.
func TestProtocolBasemessageRequestReply(t *testing.T) {
	x := newValidationExchange(t, nil)
	orch, cto, r, request, m := x.orch, x.cto, x.r, x.request, x.m
	if m.ID != "req-123" || m.CorrelationID != "task-001" || m.To != "@agent-cto" || m.Priority != 3 {
		t.Fatalf("request %+v", m)
	}
	ctx, cancel := context.WithTimeout(testContext(t), 15*time.Second)
	defer cancel()
	d, err := orch.Request(ctx, *m)
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	checkValidationResponse(t, d, request)
	if d.Late {
		t.Error("a reply within the timeout is marked late")
	}

	if st := waitState(t, orch, "req-123", bus.StateReplied); st.ReplyID != "res-456" || st.By != "@agent-cto" ||
		st.CorrelationID != "task-001" || st.Type != "VALIDATION_REQUEST" {
		t.Errorf("request record %+v, want replied by @agent-cto with res-456", st)
	}
	if st := waitState(t, orch, "res-456", bus.StateCompleted); st.CausationID != "req-123" || st.CorrelationID != "task-001" {
		t.Errorf("reply record %+v", st)
	}
	conv, err := newAdmin(t, orch.Conn()).Conversation(testContext(t), "task-001")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, st := range conv {
		ids = append(ids, st.ID+"="+string(st.State))
	}
	if want := []string{"req-123=replied", "res-456=completed"}; !slices.Equal(ids, want) {
		t.Errorf("conversation task-001 = %v, want %v", ids, want)
	}
	handledOnlySentinel(t, cto, "build orchestrator", r)
}

// TestProtocolBasemessageLateReply: the CTO answers req-123 only after the
// orchestrator's Request gave up (the test releases it once Request has
// returned ErrRequestTimeout). Meanwhile the request, delivered and not
// answered by its expiry, reads expired; the native reply then reaches the
// orchestrator's handler marked Late, and the request ends replied.
func TestProtocolBasemessageLateReply(t *testing.T) {
	gaveUp := make(chan struct{})
	x := newValidationExchange(t, gaveUp)
	orch, r, request, m := x.orch, x.r, x.request, x.m
	ctx, cancel := context.WithTimeout(testContext(t), 500*time.Millisecond)
	defer cancel()
	if d, err := orch.Request(ctx, *m); !errors.Is(err, bus.ErrRequestTimeout) {
		t.Fatalf("Request = %+v, %v; want ErrRequestTimeout", d, err)
	}
	// The CTO holds the request in its handler past its expiry.
	if st := waitState(t, orch, "req-123", bus.StateExpired); st.Deliveries != 1 {
		t.Errorf("request status %+v, want expired after one delivery", st)
	}
	close(gaveUp)

	late := waitDelivery(t, r, "res-456")
	if !late.Late {
		t.Errorf("the reply after the timeout is not marked late: %+v", late.Message)
	}
	checkValidationResponse(t, late, request)
	if st := waitState(t, orch, "req-123", bus.StateReplied); st.ReplyID != "res-456" {
		t.Errorf("request record %+v, want replied with res-456", st)
	}
	waitState(t, orch, "res-456", bus.StateCompleted)
	if got := r.types(); len(got) != 1 {
		t.Errorf("orchestrator handled %v, want only the late reply", got)
	}
}

// TestProtocolInvalidInput: one invalid native message per profile. The
// strict profiles refuse it at publish with ErrInvalidMessage and a
// *profiles.ValidationError naming the field and the rule, and the stream
// stays as it was; basemessage's finding maps to the MESSAGE_ERROR code
// the document prescribes. Coordination, lenient, delivers its invalid
// message (a blocked status update with blockedBy null) intact, with the
// finding attached, at the priority of a blocked status, and it completes.
func TestProtocolInvalidInput(t *testing.T) {
	s := newServer(t)
	tests := []struct {
		profile, file string
		edit          func(*testing.T, []byte) []byte
		from, to      string
		field, rule   string
		code          string // basemessage: the MESSAGE_ERROR errorType
	}{
		{"frontmatter", "instances/review_verdict.md", replaceOnce("critical_count: 0", "critical_count: 1"),
			"reviewer", "orchestrator", "/signal", "critical_count>0 requires signal=fail", ""},
		{"basemessage", "task_assignment.json", replaceOnce(`"phase": 2,`, ""),
			"build orchestrator", "@agent-fullstack-developer", "/payload/phase", "required", profiles.CodeMissingField},
		{"basemessage", "task_assignment.json", replaceOnce(`"TASK_ASSIGNMENT"`, `"TASK_ASSIGNED"`),
			"build orchestrator", "@agent-fullstack-developer", "/type", "enum", profiles.CodeUnknownType},
		{"basemessage", "task_assignment.json", replaceOnce(`"version": "1.0"`, `"version": "2.0"`),
			"build orchestrator", "@agent-fullstack-developer", "/version", "pattern", profiles.CodeInvalidFormat},
		{"swarm", "component_handoff_turns.json", replaceOnce(`"status": "complete"`, `"status": "done"`),
			"implementer", "lead", "/status", "enum", ""},
		{"pipeline", "message.json", replaceOnce(`"priority": 4`, `"priority": 9`),
			"pm", "dev", "/priority", "maximum", ""},
		{"coordination", "status_update.json", replaceOnce(`"in_progress"`, `"blocked"`),
			"database-build-agent", "orchestrator", "/content/blockedBy", "status=blocked requires blockedBy", ""},
	}
	for _, tt := range tests {
		t.Run(tt.profile+tt.field, func(t *testing.T) {
			p := profile(t, tt.profile)
			native := tt.edit(t, readFile(t, filepath.Join(protoTestdata, tt.profile, tt.file)))
			sent := bytes.Clone(native)
			from := newBus(t, s, tt.from)
			addr := profiles.Addressing{}
			if !nativelyAddressed(p) {
				addr.To = tt.to
			}
			before := streamMsgs(t, from)
			ack, err := from.PublishNative(testContext(t), p, native, addr)

			if p.Strict() {
				if err == nil {
					t.Fatalf("PublishNative sent %s, want it refused", ack.ID)
				}
				checkRefused(t, p, err, [][2]string{{tt.field, tt.rule}}, true)
				if tt.code != "" {
					if got := profiles.ErrorCode(err); got != tt.code {
						t.Errorf("ErrorCode = %q, want %q", got, tt.code)
					}
				}
				if after := streamMsgs(t, from); after != before {
					t.Errorf("the stream went from %d to %d messages: the refused message was stored", before, after)
				}
				return
			}

			if err != nil {
				t.Fatalf("lenient PublishNative: %v", err)
			}
			to := newBus(t, s, tt.to)
			r := newRecorder()
			subscribe(t, to, r.handle)
			d := waitDelivery(t, r, ack.ID)
			if !bytes.Equal(d.Data, sent) {
				t.Errorf("got other bytes than sent:\n%s\nwant\n%s", d.Data, sent)
			}
			fs, err := profiles.AttachedFindings(&d.Message)
			if err != nil || len(fs) != 1 || fs[0].Field != tt.field || fs[0].Rule != tt.rule || fs[0].Message == "" {
				t.Errorf("attached findings %+v (%v), want one: %s %s", fs, err, tt.field, tt.rule)
			}
			if d.Priority != 2 || d.Type != "status_update" || d.CorrelationID != "task-001" {
				t.Errorf("delivered type %q priority %d correlation %q, want status_update 2 task-001", d.Type, d.Priority, d.CorrelationID)
			}
			waitState(t, to, ack.ID, bus.StateCompleted)
		})
	}
}

// TestProtocolLifecycleExpired: pipeline messages with a TTL to dev while
// it is offline end expired. PublishNative takes no TTL, so the message
// goes through profiles.Prepare and Publish with its TTL set. The TTL
// counts from the native timestamp: a develop message stamped now with a
// TTL of one second expires while queued; the document's example itself,
// stamped 2026-04-11, with a TTL of an hour had expired before it was
// sent, and ends expired as well. When dev comes online only the message
// sent after them without a TTL reaches its handler; nothing is
// dead-lettered, and dev sees both records expired.
func TestProtocolLifecycleExpired(t *testing.T) {
	s := newServer(t)
	p := profile(t, "pipeline")
	pm := newBus(t, s, "pm")
	dev := newBus(t, s, "dev")
	example := readFile(t, filepath.Join(protoTestdata, "pipeline", "message.json"))

	now := time.Now().UTC().Truncate(time.Millisecond)
	fresh := replaceOnce(`"timestamp": "2026-04-11T01:10:00.000Z"`, `"timestamp": "`+now.Format(time.RFC3339Nano)+`"`)(t, example)
	fresh = replaceOnce(`"id": "msg-uuid-v4"`, `"id": "msg-ttl-fresh"`)(t, fresh)
	sentinel := replaceOnce(`"id": "msg-uuid-v4"`, `"id": "msg-after"`)(t, example)

	var acks []bus.PubAck
	for _, c := range []struct {
		native []byte
		ttl    time.Duration
	}{{fresh, time.Second}, {example, time.Hour}} {
		m, err := profiles.Prepare(p, c.native, profiles.Addressing{})
		if err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		m.TTL = c.ttl
		ack := publish(t, pm, *m)
		st := waitState(t, pm, ack.ID, bus.StateExpired)
		if st.To != "dev" || st.By != "pm" || !st.ExpiresAt.Equal(m.Time.Add(c.ttl)) {
			t.Errorf("expired record %+v, want pm's record for dev expiring at %v", st, m.Time.Add(c.ttl))
		}
		acks = append(acks, ack)
	}
	if acks[0].ID != "msg-ttl-fresh" || acks[1].ID != "msg-uuid-v4" {
		t.Fatalf("acks %+v", acks)
	}
	after, err := pm.PublishNative(testContext(t), p, sentinel, profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}

	r := newRecorder()
	subscribe(t, dev, r.handle)
	waitDelivery(t, r, after.ID)
	// Same priority, published earlier: had an expired message reached the
	// handler it would have come first.
	if got := r.deliveries(); len(got) != 1 {
		t.Errorf("dev handled %v, want only %s", r.types(), after.ID)
	}
	for _, ack := range acks {
		if st := waitState(t, dev, ack.ID, bus.StateExpired); st.To != "dev" {
			t.Errorf("dev's record %+v", st)
		}
	}
	waitState(t, dev, after.ID, bus.StateCompleted)
	if dl := deadLetters(t, dev); len(dl) != 0 {
		t.Errorf("%d dead letters, want none: an expired message is not dead-lettered", len(dl))
	}
}

// TestProtocolPipelineReplyThreads: a pipeline message whose replyTo names a
// message the sender received, going back to that message's sender, is
// its reply: it joins the conversation of the message it answers, and that
// message is recorded replied. It holds when dev answers from outside its
// handler while the develop message is still queued (as "agentbus publish
// --profile pipeline" does), and from inside the handler.
func TestProtocolPipelineReplyThreads(t *testing.T) {
	s := newServer(t)
	p := profile(t, "pipeline")
	pm := newBus(t, s, "pm")
	dev := newBus(t, s, "dev")
	got := newRecorder()
	subscribe(t, pm, got.handle)
	develop := func(id string) {
		t.Helper()
		native := `{"id":"` + id + `","from":"pm","to":"dev","subject":"develop","body":{"issue":"JOP-1","phase":1,"totalIssues":1,"currentIndex":0},"priority":4,"timestamp":"2026-04-11T01:10:00.000Z","replyTo":null,"status":"pending"}`
		if _, err := pm.PublishNative(testContext(t), p, []byte(native), profiles.Addressing{}); err != nil {
			t.Fatal(err)
		}
	}
	complete := func(id, replyTo string) []byte {
		return []byte(`{"id":"` + id + `","from":"dev","to":"pm","subject":"issue_complete","body":{"issue":"JOP-1","phase":1,"summary":"done","branch":"b","testResults":"ok"},"priority":4,"timestamp":"2026-04-11T02:00:00.000Z","replyTo":"` + replyTo + `","status":"pending"}`)
	}
	check := func(reply, request string) {
		t.Helper()
		var d *bus.Delivery
		waitFor(t, "the reply "+reply, func() (bool, string) {
			for _, x := range got.deliveries() {
				if x.ID == reply {
					d = x
					return true, ""
				}
			}
			return false, fmt.Sprint(got.types())
		})
		if d.CorrelationID != request || d.CausationID != request {
			t.Errorf("reply correlation %q, causation %q; want the request's conversation %q and its ID", d.CorrelationID, d.CausationID, request)
		}
		if st := waitState(t, pm, request, bus.StateReplied); st.ReplyID != reply || st.By != "dev" {
			t.Errorf("request status %+v, want replied by dev with %s", st, reply)
		}
	}

	// Queued: dev has not subscribed; the record finds the request, once
	// the sender's pending record is stored (just after the publish).
	develop("dev-queued")
	waitState(t, pm, "dev-queued", bus.StatePending)
	if _, err := dev.PublishNative(testContext(t), p, complete("done-queued", "dev-queued"), profiles.Addressing{}); err != nil {
		t.Fatal(err)
	}
	check("done-queued", "dev-queued")

	// Handled: dev answers from its handler.
	subscribe(t, dev, func(ctx context.Context, d *bus.Delivery) error {
		if d.ID != "dev-handled" {
			return nil
		}
		_, err := dev.PublishNative(ctx, p, complete("done-handled", d.ID), profiles.Addressing{})
		return err
	})
	develop("dev-handled")
	check("done-handled", "dev-handled")

	// A replyTo naming no message dev received is kept as the causation only.
	if _, err := dev.PublishNative(testContext(t), p, complete("done-unknown", "never-sent"), profiles.Addressing{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "done-unknown", func() (bool, string) {
		for _, x := range got.deliveries() {
			if x.ID == "done-unknown" {
				if x.CausationID != "never-sent" || x.CorrelationID != "done-unknown" {
					t.Errorf("unthreaded reply: causation %q, correlation %q; want never-sent and its own", x.CausationID, x.CorrelationID)
				}
				return true, ""
			}
		}
		return false, fmt.Sprint(got.types())
	})
}
