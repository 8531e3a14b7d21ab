package profiles_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
)

func TestLookupAndNames(t *testing.T) {
	want := []string{"frontmatter", "basemessage", "swarm", "coordination", "pipeline"}
	if got := profiles.Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range want {
		p, ok := profiles.Lookup(name)
		if !ok || p.Name() != name || p.Version() != "1.0" {
			t.Errorf("Lookup(%q) = %v, %v", name, p, ok)
		}
		if got := p.DataSchema(); got != "urn:agentbus:profile:"+name+":1.0" {
			t.Errorf("%s DataSchema = %q", name, got)
		}
		if p.Strict() != (name != "coordination") {
			t.Errorf("%s Strict = %v", name, p.Strict())
		}
	}
	if _, ok := profiles.Lookup("nope"); ok {
		t.Error("Lookup(nope) succeeded")
	}
	d := profiles.BaseMessage{}.Defaults()
	if d.RequestTimeout != 5*time.Minute || d.PublishAttempts != 3 || d.DedupWindow != time.Hour || d.Retention != 30*24*time.Hour {
		t.Errorf("basemessage Defaults = %+v", d)
	}
}

// The schemas published in docs/schemas are the ones the package embeds.
func TestDocsSchemasMatchEmbedded(t *testing.T) {
	for _, name := range profiles.Names() {
		embedded, ok := profiles.SchemaJSON(name)
		if !ok {
			t.Fatalf("no embedded schema for %s", name)
		}
		var v map[string]any
		if err := json.Unmarshal(embedded, &v); err != nil || v["$id"] != "urn:agentbus:profile:"+name+":1.0" {
			t.Errorf("%s schema: $id %v, err %v", name, v["$id"], err)
		}
		docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "schemas", name+".schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(docs, embedded) {
			t.Errorf("docs/schemas/%s.schema.json differs from codec/profiles/schemas; copy it over", name)
		}
	}
}

func TestDecodeAddressing(t *testing.T) {
	bm := []byte(`{"messageId":"b1","correlationId":"c","timestamp":"2024-01-01T12:00:00Z","from":"orchestrator","to":"*","type":"ESCALATION_REQUEST","version":"1.0","payload":{}}`)
	tests := []struct {
		name         string
		profile      string
		native       []byte
		addr         profiles.Addressing
		wantFrom     string
		wantTo       string
		wantPriority int
		wantErr      bool
		wantField    string
	}{
		{"native wins", "basemessage", bm, profiles.Addressing{From: "x", To: "y"}, "orchestrator", "*", 1, false, ""},
		{"priority override", "basemessage", bm, profiles.Addressing{Priority: 5}, "orchestrator", "*", 5, false, ""},
		{"bad priority override", "basemessage", bm, profiles.Addressing{Priority: 9}, "", "", 0, true, "Addressing.Priority"},
		{"native missing from", "coordination", []byte(`{"type":"question","to":"o","content":{}}`), profiles.Addressing{From: "w"}, "w", "o", 2, false, ""},
		{"no sender anywhere", "coordination", []byte(`{"type":"question","to":"o"}`), profiles.Addressing{}, "", "", 0, true, "Addressing.From"},
		{"swarm needs recipient", "swarm", []byte(`{"schema":"HandoffRequest"}`), profiles.Addressing{From: "lead"}, "", "", 0, true, "Addressing.To"},
		{"swarm broadcast", "swarm", []byte(`{"schema":"HandoffRequest"}`), profiles.Addressing{From: "lead", To: "*"}, "lead", "*", 2, false, ""},
		{"pipeline own priority", "pipeline", []byte(`{"id":"1","from":"pm","to":"dev","subject":"info","priority":1,"body":{}}`), profiles.Addressing{}, "pm", "dev", 1, false, ""},
		{"pipeline table priority", "pipeline", []byte(`{"id":"1","from":"pm","to":"dev","subject":"info","body":{}}`), profiles.Addressing{}, "pm", "dev", 5, false, ""},
		{"pipeline bad priority uses table", "pipeline", []byte(`{"id":"1","from":"pm","to":"dev","subject":"alert","priority":"high","body":{}}`), profiles.Addressing{}, "pm", "dev", 2, false, ""},
		{"frontmatter escalate", "frontmatter", []byte("---\ntype: worker_submission\nsignal: escalate\n---\n"), profiles.Addressing{From: "w", To: "o"}, "w", "o", 1, false, ""},
		{"frontmatter blockers", "frontmatter", []byte("---\ntype: plan_result\nsignal: plan_complete\nhas_blockers: true\n---\n"), profiles.Addressing{From: "a", To: "o"}, "a", "o", 2, false, ""},
		{"no type", "basemessage", []byte(`{"from":"a","to":"b"}`), profiles.Addressing{}, "", "", 0, true, "/type"},
		{"control character in sender", "pipeline", []byte(`{"id":"1","from":"p\u0000m","to":"dev","subject":"info","body":{}}`), profiles.Addressing{}, "", "", 0, true, "/from"},
		{"not an object", "pipeline", []byte(`[1]`), profiles.Addressing{}, "", "", 0, true, ""},
		{"null", "coordination", []byte(`null`), profiles.Addressing{From: "a", To: "b"}, "", "", 0, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := profiles.Lookup(tt.profile)
			m, err := p.Decode(tt.native, tt.addr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Decode error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				ve, ok := errors.AsType[*profiles.ValidationError](err)
				if !ok || !errors.Is(err, profiles.ErrInvalid) || ve.Findings[0].Field != tt.wantField {
					t.Errorf("Decode error = %#v, want a *ValidationError at %q", err, tt.wantField)
				}
				return
			}
			if m.From != tt.wantFrom || m.To != tt.wantTo || m.Priority != tt.wantPriority {
				t.Errorf("Decode = from %q to %q p%d, want %q %q p%d", m.From, m.To, m.Priority, tt.wantFrom, tt.wantTo, tt.wantPriority)
			}
		})
	}
}

func TestPrepare(t *testing.T) {
	blocked := []byte(`{"type":"status_update","from":"w","to":"o","timestamp":"2026-02-05T10:35:00Z","content":{"taskId":"t","status":"blocked"}}`)
	m, err := profiles.Prepare(profiles.Coordination{}, blocked, profiles.Addressing{})
	if err != nil {
		t.Fatalf("lenient Prepare: %v", err)
	}
	fs, err := profiles.AttachedFindings(m)
	if err != nil || len(fs) != 1 || fs[0].Field != "/content/blockedBy" {
		t.Fatalf("AttachedFindings = %v, %v", fs, err)
	}
	m.SetDefaults(time.Now())
	if err := m.Validate(); err != nil {
		t.Errorf("a message with findings attached does not validate: %v", err)
	}

	ok := []byte(`{"type":"question","from":"w","to":"o","timestamp":"2026-02-05T10:35:00Z","content":{"taskId":"t","question":"q?"}}`)
	m, err = profiles.Prepare(profiles.Coordination{}, ok, profiles.Addressing{})
	if err != nil || m.Extensions[profiles.ExtFindings] != "" {
		t.Errorf("valid Prepare = %v, %v", m, err)
	}

	bad := []byte(`{"id":"1","from":"pm","to":"dev","subject":"stop","body":{}}`)
	if _, err := profiles.Prepare(profiles.Pipeline{}, bad, profiles.Addressing{}); !errors.Is(err, profiles.ErrInvalid) {
		t.Errorf("strict Prepare error = %v, want ErrInvalid", err)
	}
}

func TestErrorCode(t *testing.T) {
	bm := profiles.BaseMessage{}
	tests := []struct {
		name   string
		native string
		want   string
	}{
		{"unknown type", `{` + bmHead + `,"type":"HELLO","payload":{}}`, profiles.CodeUnknownType},
		{"missing field", `{` + bmHead + `,"type":"STATUS_UPDATE","payload":{"status":"STARTED"}}`, profiles.CodeMissingField},
		{"bad enum", `{` + bmHead + `,"type":"STATUS_UPDATE","payload":{"taskId":"t","status":"x"}}`, profiles.CodeInvalidFormat},
		{"not json", `{`, profiles.CodeInvalidFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := profiles.ErrorCode(bm.Validate([]byte(tt.native))); got != tt.want {
				t.Errorf("ErrorCode = %q, want %q", got, tt.want)
			}
		})
	}
	if got := profiles.ErrorCode(errors.New("other")); got != "" {
		t.Errorf("ErrorCode(other) = %q", got)
	}
}

func TestErrorReply(t *testing.T) {
	bm := profiles.BaseMessage{}
	orig := []byte(`{"messageId":"req-123","correlationId":"task-001","from":"planner","type":"VALIDATION_REQUEST"}`)
	now := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name            string
		orig            *codec.Message
		code            string
		wantErr         bool
		wantTo, wantOID string
		wantCorrelation string
	}{
		// The event's sender, whom the bus checked, wins over the native from.
		{"native fields", &codec.Message{ID: "ce-1", From: "ce-sender", Data: orig}, profiles.CodeMissingField, false, "ce-sender", "req-123", "task-001"},
		{"native from without the event's", &codec.Message{ID: "ce-1", Data: orig}, profiles.CodeMissingField, false, "planner", "req-123", "task-001"},
		{"garbage falls back to event", &codec.Message{ID: "ce-1", From: "ce-sender", CorrelationID: "conv", Data: []byte("{nope")}, profiles.CodeInvalidFormat, false, "ce-sender", "ce-1", "conv"},
		{"bad code", &codec.Message{ID: "ce-1", From: "ce-sender", Data: orig}, "OOPS", true, "", "", ""},
		{"no sender", &codec.Message{ID: "ce-1", Data: []byte("x")}, profiles.CodeInvalidFormat, true, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := bm.ErrorReply(tt.orig, tt.code, "payload.taskId is missing", "validator", now)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ErrorReply error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, profiles.ErrInvalid) {
					t.Errorf("error %v does not wrap ErrInvalid", err)
				}
				return
			}
			if err := bm.Validate(b); err != nil {
				t.Fatalf("the reply is not a valid basemessage: %v\n%s", err, b)
			}
			m, err := bm.Decode(b, profiles.Addressing{})
			if err != nil {
				t.Fatal(err)
			}
			if m.Type != profiles.TypeMessageError || m.From != "validator" || m.To != tt.wantTo ||
				m.CorrelationID != tt.wantCorrelation || m.CausationID != tt.wantOID || !m.Time.Equal(now) || m.Priority != 2 {
				t.Errorf("reply decodes to %+v", m)
			}
			var r struct {
				Payload struct{ OriginalMessageID, ErrorType, Details string }
			}
			if err := json.Unmarshal(b, &r); err != nil || r.Payload.OriginalMessageID != tt.wantOID || r.Payload.ErrorType != tt.code {
				t.Errorf("payload = %+v, %v", r.Payload, err)
			}
		})
	}
}

// TestDecodeLowerCaseTimestamp: a native timestamp with a lower-case "t"
// or "z", which RFC 3339 and the schemas' date-time allow, becomes the
// Message's Time. Before, Decode left Time zero, and the bus stamped the
// message with its own clock instead.
func TestDecodeLowerCaseTimestamp(t *testing.T) {
	want := time.Date(2026, 4, 11, 1, 10, 0, 5e8, time.UTC)
	ts := "2026-04-11t03:10:00.5+02:00"
	for _, tt := range []struct{ profile, native string }{
		{"basemessage", `{"messageId":"m1","correlationId":"c1","timestamp":"` + ts + `","from":"a","to":"b","version":"1.0","type":"STATUS_UPDATE","payload":{"taskId":"T","status":"STARTED"}}`},
		{"coordination", `{"type":"question","from":"w","to":"o","timestamp":"` + ts + `","content":{"question":"q?","taskId":"t1"}}`},
		{"pipeline", `{"id":"m1","from":"pm","to":"dev","subject":"info","body":{"message":"x"},"timestamp":"` + ts + `"}`},
		{"swarm", `{"schema":"ReviewFindings","reviewer":"security","timestamp":"` + ts + `","summary":{"total_findings":0,"by_severity":{"critical":0,"high":0,"medium":0,"low":0,"informational":0},"verdict":"clean"},"findings":[]}`},
		{"pipeline", `{"id":"m1","from":"pm","to":"dev","subject":"info","body":{"message":"x"},"timestamp":"2026-04-11t01:10:00.5z"}`},
		{"pipeline", `{"id":"m1","from":"pm","to":"dev","subject":"info","body":{"message":"x"},"timestamp":"2026-04-11T01:10:00.5z"}`},
	} {
		p, _ := profiles.Lookup(tt.profile)
		if err := p.Validate([]byte(tt.native)); err != nil {
			t.Errorf("%s: %v", tt.profile, err)
		}
		m, err := p.Decode([]byte(tt.native), profiles.Addressing{From: "a", To: "b"})
		if err != nil {
			t.Fatalf("%s Decode: %v", tt.profile, err)
		}
		if !m.Time.Equal(want) {
			t.Errorf("%s: Time %v, want %v", tt.profile, m.Time, want)
		}
	}
	// A ',' before the fraction is not RFC 3339: no Time, as before.
	m, err := profiles.Pipeline{}.Decode([]byte(`{"id":"m1","from":"pm","to":"dev","subject":"info","body":{"message":"x"},"timestamp":"2026-04-11T01:10:00,5Z"}`), profiles.Addressing{})
	if err != nil || !m.Time.IsZero() {
		t.Errorf("timestamp with a comma fraction: Time %v, %v; want the zero Time", m.Time, err)
	}
}

// TestPipelinePriorityWholeNumber: a pipeline priority written as a whole
// number in another JSON spelling (1.0, 1e0), which the schema's "integer"
// accepts, is the message's priority; 1.5 is none. Before, only the
// spelling 1 was read, and 1.0 gave the subject's priority instead.
func TestPipelinePriorityWholeNumber(t *testing.T) {
	for _, tt := range []struct {
		priority string
		want     int
	}{
		{"1", 1}, {"1.0", 1}, {"1e0", 1}, {"2.000", 2}, {"0.2e1", 2}, {"10E-1", 1},
		{"1.5", 5}, {`"1"`, 5}, {"1e400", 5}, {"-0.0", 5},
	} {
		native := []byte(`{"id":"m1","from":"pm","to":"dev","subject":"info","body":{"message":"x"},"priority":` + tt.priority + `,"timestamp":"2026-04-11T01:10:00Z"}`)
		m, err := profiles.Pipeline{}.Decode(native, profiles.Addressing{})
		if err != nil {
			t.Fatalf("priority %s: %v", tt.priority, err)
		}
		if m.Priority != tt.want {
			t.Errorf("priority %s gave %d, want %d", tt.priority, m.Priority, tt.want)
		}
	}
}

// TestPrepareFindingsFitExtension: the findings Prepare attaches to a
// lenient message fit in one extension value (codec.MaxExtensionLen), each
// message cut short, and when some are left out the last one says how
// many. Before, a finding quoting a 5,000-character value made the
// extension too long, and the bus refused the message it should deliver.
func TestPrepareFindingsFitExtension(t *testing.T) {
	for _, tt := range []struct {
		name, native string
		more         string // the message of the last finding, or ""
	}{
		{"long timestamp", `{"type":"question","from":"w","to":"o","timestamp":"` + strings.Repeat("x", 5000) + `","content":{"taskId":"t1","question":"ready?"}}`, ""},
		{"long timestamp to escape", `{"type":"question","from":"w","to":"o","timestamp":"` + strings.Repeat("<é", 2000) + `","content":{"taskId":"t1","question":"ready?"}}`, ""},
		{"too many findings", `{"type":"question","from":"w","to":"o","timestamp":"` + strings.Repeat("x", 5000) +
			`","content":{"taskId":"t1","question":"ready?","options":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]}}`, "4 more findings not attached"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := profiles.Prepare(profiles.Coordination{}, []byte(tt.native), profiles.Addressing{})
			if err != nil {
				t.Fatalf("lenient Prepare: %v", err)
			}
			if n := len(m.Extensions[profiles.ExtFindings]); n > codec.MaxExtensionLen {
				t.Errorf("findings extension is %d bytes, over %d", n, codec.MaxExtensionLen)
			}
			m.SetDefaults(time.Now())
			if err := m.Validate(); err != nil {
				t.Errorf("a message with findings attached does not validate: %v", err)
			}
			fs, err := profiles.AttachedFindings(m)
			if err != nil || len(fs) == 0 || len(fs) > profiles.MaxAttachedFindings {
				t.Fatalf("AttachedFindings = %d findings, %v", len(fs), err)
			}
			for _, f := range fs {
				if len(f.Message) > 256 || !utf8.ValidString(f.Message) {
					t.Errorf("finding %s %s: message of %d bytes, valid UTF-8 %v", f.Field, f.Rule, len(f.Message), utf8.ValidString(f.Message))
				}
			}
			var ve *profiles.ValidationError
			if !errors.As(profiles.Coordination{}.Validate([]byte(tt.native)), &ve) {
				t.Fatal("Validate found nothing")
			}
			if got := profiles.CountFindings(fs); got != len(ve.Findings) {
				t.Errorf("CountFindings = %d; Validate found %d", got, len(ve.Findings))
			}
			last := fs[len(fs)-1]
			switch {
			case tt.more != "" && (last.Rule != "truncated" || last.Message != tt.more):
				t.Errorf("last finding %+v, want rule truncated, message %q", last, tt.more)
			case tt.more == "" && (last.Field != "/timestamp" || last.Rule != "format" || !strings.HasSuffix(last.Message, "…")):
				t.Errorf("last finding %s %s (message of %d bytes), want the timestamp's format, cut short with …", last.Field, last.Rule, len(last.Message))
			}
		})
	}
}
