package profiles_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
)

// want is what Decode must return for a document example. Fields the
// format does not have stay zero.
type want struct {
	id, from, to, typ, correlation, replyTo string
	priority                                int
	time                                    string // RFC 3339, "" for none
	// invalid lists the findings Validate must report, field then rule,
	// for examples that break their own document's rules; nil means valid.
	invalid [][2]string
}

// The examples, copied from shared/protocols/*.md into testdata/<profile>:
//
//   - basemessage: the two JSON examples of base-message.md. Its other
//     snippets (request/response, broadcast, event) carry "// ... rest of
//     message" comments and are not JSON.
//   - coordination: all five JSON examples.
//   - pipeline: the message structure example and the message inside the
//     tracker.json example (pipeline.md has no code fences; the JSON lines
//     are copied as they are).
//   - swarm: the three examples with real values (ComponentAssignment, the
//     ComponentHandoff "with turn tracking", HandoffRequest). The other
//     blocks are templates whose values describe the type ("integer — ...");
//     templateTests covers them. The turn_count fragment is not a message.
//   - frontmatter: the five envelopes with real values. The other seven are
//     templates listing the alternatives ("signal: pass | fail"): they are
//     in testdata/frontmatter/templates, and testdata/frontmatter/instances
//     has each with the first alternative chosen (fix_severity: all for
//     iteration 2, as the document maps it). The shared copy of
//     frontmatter-envelope.md is a scraped web page: every line is followed
//     by "|" separator lines and the indentation under ac_coverage and
//     security_findings is lost. testdata drops the separators and restores
//     that indentation; nothing else is changed.
var exampleTests = []struct {
	profile string
	file    string
	addr    profiles.Addressing
	want    want
}{
	{"basemessage", "task_assignment.json", profiles.Addressing{}, want{
		id: "msg-123", from: "build orchestrator", to: "@agent-fullstack-developer", typ: "TASK_ASSIGNMENT",
		correlation: "task-001", priority: 3, time: "2024-01-01T12:00:00Z",
	}},
	// The document's own CTO review example omits findings.codeQuality,
	// which its CodebaseReviewReport interface declares required. The rule
	// stays; the example is reported invalid.
	{"basemessage", "cto_review.json", profiles.Addressing{}, want{
		id: "msg-456", from: "@agent-cto", to: "build orchestrator", typ: "CODEBASE_REVIEW_REPORT",
		correlation: "project-review", priority: 3, time: "2024-01-01T12:00:00Z",
		invalid: [][2]string{{"/payload/findings/codeQuality", "required"}},
	}},

	{"coordination", "task_assignment.json", profiles.Addressing{}, want{
		from: "orchestrator-agent", to: "worker-agent", typ: "task_assignment", correlation: "task-001", priority: 3, time: "2026-02-05T10:30:00Z",
	}},
	{"coordination", "status_update.json", profiles.Addressing{}, want{
		from: "database-build-agent", to: "orchestrator", typ: "status_update", correlation: "task-001", priority: 4, time: "2026-02-05T10:35:00Z",
	}},
	{"coordination", "question.json", profiles.Addressing{}, want{
		from: "database-build-agent", to: "orchestrator", typ: "question", correlation: "task-001", priority: 2, time: "2026-02-05T10:40:00Z",
	}},
	{"coordination", "result.json", profiles.Addressing{}, want{
		from: "database-build-agent", to: "orchestrator", typ: "result", priority: 3, time: "2026-02-05T11:00:00Z",
	}},
	{"coordination", "worker_to_worker.json", profiles.Addressing{}, want{
		from: "database-plan-agent", to: "database-build-agent", typ: "task_assignment", correlation: "task-002", priority: 3, time: "2026-02-05T10:15:00Z",
	}},

	{"pipeline", "message.json", profiles.Addressing{}, want{
		id: "msg-uuid-v4", from: "pm", to: "dev", typ: "develop", priority: 4, time: "2026-04-11T01:10:00Z",
	}},
	// The tracker.json example stores a develop message whose body has only
	// issue, while the subject table requires issue, phase, totalIssues and
	// currentIndex.
	{"pipeline", "tracker_message.json", profiles.Addressing{}, want{
		id: "msg-abc-123", from: "pm", to: "dev", typ: "develop", priority: 4, time: "2026-04-11T01:10:00Z",
		invalid: [][2]string{{"/body/currentIndex", "required"}, {"/body/phase", "required"}, {"/body/totalIssues", "required"}},
	}},

	{"swarm", "component_assignment.json", profiles.Addressing{From: "lead", To: "implementer"}, want{
		from: "lead", to: "implementer", typ: "ComponentAssignment", correlation: "C1", priority: 3,
	}},
	{"swarm", "component_handoff_turns.json", profiles.Addressing{From: "implementer", To: "lead"}, want{
		from: "implementer", to: "lead", typ: "ComponentHandoff", correlation: "auth-middleware", priority: 3,
	}},
	{"swarm", "handoff_request.json", profiles.Addressing{From: "lead", To: "reviewer"}, want{
		from: "lead", to: "reviewer", typ: "HandoffRequest", priority: 2,
	}},

	{"frontmatter", "task_assignment.md", profiles.Addressing{From: "orchestrator", To: "worker"}, want{
		from: "orchestrator", to: "worker", typ: "task_assignment", priority: 3,
	}},
	{"frontmatter", "approval.md", profiles.Addressing{From: "orchestrator", To: "worker"}, want{
		from: "orchestrator", to: "worker", typ: "approval", priority: 3,
	}},
	{"frontmatter", "triage_request.md", profiles.Addressing{From: "orchestrator", To: "architect"}, want{
		from: "orchestrator", to: "architect", typ: "triage_request", priority: 3,
	}},
	{"frontmatter", "architecture_request.md", profiles.Addressing{From: "orchestrator", To: "architect"}, want{
		from: "orchestrator", to: "architect", typ: "architecture_request", priority: 3,
	}},
	{"frontmatter", "research_request.md", profiles.Addressing{From: "orchestrator", To: "researcher"}, want{
		from: "orchestrator", to: "researcher", typ: "research_request", priority: 3,
	}},
	{"frontmatter", "instances/worker_submission.md", profiles.Addressing{From: "worker", To: "orchestrator"}, want{
		from: "worker", to: "orchestrator", typ: "worker_submission", priority: 3,
	}},
	{"frontmatter", "instances/review_verdict.md", profiles.Addressing{From: "reviewer", To: "orchestrator"}, want{
		from: "reviewer", to: "orchestrator", typ: "review_verdict", priority: 3,
	}},
	{"frontmatter", "instances/audit_verdict.md", profiles.Addressing{From: "auditor", To: "orchestrator"}, want{
		from: "auditor", to: "orchestrator", typ: "audit_verdict", priority: 3,
	}},
	{"frontmatter", "instances/triage_result.md", profiles.Addressing{From: "architect", To: "orchestrator"}, want{
		from: "architect", to: "orchestrator", typ: "triage_result", priority: 3,
	}},
	{"frontmatter", "instances/plan_result.md", profiles.Addressing{From: "architect", To: "orchestrator"}, want{
		from: "architect", to: "orchestrator", typ: "plan_result", priority: 3,
	}},
	{"frontmatter", "instances/research_result.md", profiles.Addressing{From: "researcher", To: "architect"}, want{
		from: "researcher", to: "architect", typ: "research_result", priority: 3,
	}},
	{"frontmatter", "instances/revision_request.md", profiles.Addressing{From: "orchestrator", To: "worker"}, want{
		from: "orchestrator", to: "worker", typ: "revision_request", priority: 3,
	}},
}

func readTestdata(t *testing.T, profile, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", profile, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDocumentExamplesRoundTrip(t *testing.T) {
	for _, tt := range exampleTests {
		t.Run(tt.profile+"/"+tt.file, func(t *testing.T) {
			p, ok := profiles.Lookup(tt.profile)
			if !ok {
				t.Fatalf("Lookup(%q) failed", tt.profile)
			}
			native := readTestdata(t, tt.profile, tt.file)
			orig := bytes.Clone(native)
			m, err := p.Decode(native, tt.addr)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			got := want{
				id: m.ID, from: m.From, to: m.To, typ: m.Type, correlation: m.CorrelationID,
				replyTo: m.CausationID, priority: m.Priority,
			}
			if !m.Time.IsZero() {
				got.time = m.Time.UTC().Format(time.RFC3339Nano)
			}
			w := tt.want
			w.invalid = nil
			if !reflect.DeepEqual(got, w) {
				t.Errorf("Decode =\n %+v\nwant\n %+v", got, w)
			}
			if !bytes.Equal(m.Data, orig) {
				t.Error("Data differs from the native bytes")
			}
			if m.DataSchema != p.DataSchema() {
				t.Errorf("DataSchema = %q, want %q", m.DataSchema, p.DataSchema())
			}
			wantCT := profiles.ContentTypeJSON
			if tt.profile == "frontmatter" {
				wantCT = profiles.ContentTypeMarkdown
			}
			if m.ContentType != wantCT {
				t.Errorf("ContentType = %q, want %q", m.ContentType, wantCT)
			}

			// Through the wire and back: the receiver gets the same bytes.
			m.SetDefaults(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			h, data, err := codec.Binary{}.Encode(m)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			back, err := codec.Decode(h, data)
			if err != nil {
				t.Fatalf("codec.Decode: %v", err)
			}
			if !bytes.Equal(back.Data, orig) {
				t.Error("Data after the wire differs from the native bytes")
			}
			if q, ok := profiles.ForDataSchema(back.DataSchema); !ok || q.Name() != p.Name() {
				t.Errorf("ForDataSchema(%q) = %v, %v", back.DataSchema, q, ok)
			}

			err = p.Validate(native)
			if tt.want.invalid == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			ve, ok := errors.AsType[*profiles.ValidationError](err)
			if !ok {
				t.Fatalf("Validate = %v, want a *ValidationError", err)
			}
			if len(ve.Findings) != len(tt.want.invalid) {
				t.Errorf("Validate findings = %v, want %v", ve.Findings, tt.want.invalid)
			}
			for _, fr := range tt.want.invalid {
				if !ve.Has(fr[0], fr[1]) {
					t.Errorf("Validate findings = %v, want %s %s", ve.Findings, fr[0], fr[1])
				}
			}
		})
	}
}

// The template blocks of swarm.md and frontmatter-envelope.md describe each
// field ("integer — ...", "pass | fail") rather than give a value. They
// decode to the right type with the bytes intact; only ContextBundle,
// FixSummary and TestExecution, all of whose fields are strings, validate.
func TestDocumentTemplates(t *testing.T) {
	tests := []struct {
		profile, file, typ string
		valid              bool
	}{
		{"swarm", "templates/context_bundle.json", "ContextBundle", true},
		{"swarm", "templates/architect_plan.json", "ArchitectPlan", false},
		{"swarm", "templates/component_handoff.json", "ComponentHandoff", false},
		{"swarm", "templates/review_result.json", "ReviewResult", false},
		{"swarm", "templates/test_request.json", "TestRequest", false},
		{"swarm", "templates/test_handoff.json", "TestHandoff", false},
		{"swarm", "templates/test_execution.json", "TestExecution", true},
		{"swarm", "templates/test_result.json", "TestResult", false},
		{"swarm", "templates/review_findings.json", "ReviewFindings", false},
		{"swarm", "templates/fix_summary.json", "FixSummary", true},
		{"swarm", "templates/verification_result.json", "VerificationResult", false},
		{"swarm", "templates/handoff_summary.json", "HandoffSummary", false},
		{"frontmatter", "templates/worker_submission.md", "worker_submission", false},
		{"frontmatter", "templates/review_verdict.md", "review_verdict", false},
		{"frontmatter", "templates/audit_verdict.md", "audit_verdict", false},
		{"frontmatter", "templates/triage_result.md", "triage_result", false},
		{"frontmatter", "templates/plan_result.md", "plan_result", false},
		{"frontmatter", "templates/research_result.md", "research_result", false},
		{"frontmatter", "templates/revision_request.md", "revision_request", false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			p, _ := profiles.Lookup(tt.profile)
			native := readTestdata(t, tt.profile, tt.file)
			m, err := p.Decode(native, profiles.Addressing{From: "lead", To: "worker"})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if m.Type != tt.typ || !bytes.Equal(m.Data, native) {
				t.Errorf("Decode: Type %q, want %q; Data equal %v", m.Type, tt.typ, bytes.Equal(m.Data, native))
			}
			err = p.Validate(native)
			if tt.valid != (err == nil) {
				t.Errorf("Validate = %v, want valid %v", err, tt.valid)
			}
			if err != nil && !errors.Is(err, profiles.ErrInvalid) {
				t.Errorf("Validate error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestFrontmatterBodyKept(t *testing.T) {
	doc := []byte("---\r\ntype: approval\r\nsignal: lgtm\r\n---\r\n\r\n## Result\r\n\r\n---\r\nnot an envelope\r\n")
	env, body, err := profiles.Frontmatter{}.Envelope(doc)
	if err != nil {
		t.Fatal(err)
	}
	if env["type"] != "approval" || env["signal"] != "lgtm" {
		t.Errorf("envelope = %v", env)
	}
	if want := "\r\n## Result\r\n\r\n---\r\nnot an envelope\r\n"; string(body) != want {
		t.Errorf("body = %q, want %q", body, want)
	}
	if err := (profiles.Frontmatter{}).Validate(doc); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
