package profiles_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
