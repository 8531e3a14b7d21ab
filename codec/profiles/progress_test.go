package profiles_test

import (
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentbus/agentbus/codec/profiles"
)

// TestStatusUpdate: the status updates the progressing profiles make are
// valid messages of their protocol, addressed back to the task's sender,
// tied to the task, and read back as they were made.
func TestStatusUpdate(t *testing.T) {
	for _, tt := range []struct {
		profile, task string
	}{
		{"basemessage", "testdata/basemessage/task_assignment.json"},
		{"coordination", "testdata/coordination/task_assignment.json"},
	} {
		t.Run(tt.profile, func(t *testing.T) {
			p, _ := profiles.Lookup(tt.profile)
			pr, ok := p.(profiles.Progresser)
			if !ok {
				t.Fatalf("%s is not a Progresser", tt.profile)
			}
			native, err := os.ReadFile(tt.task)
			if err != nil {
				t.Fatal(err)
			}
			task, err := profiles.Prepare(p, native, profiles.Addressing{})
			if err != nil {
				t.Fatal(err)
			}
			task.SetDefaults(time.Now())
			pct := 40
			for _, u := range []profiles.Update{{Message: "tests pass", Percent: &pct}, {Message: "reviewing"}} {
				up, err := pr.StatusUpdate(task, u, task.To, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Validate(up); err != nil {
					t.Fatalf("%s: %v", up, err)
				}
				m, err := p.Decode(up, profiles.Addressing{})
				if err != nil || m.From != task.To || m.To != task.From {
					t.Fatalf("decoded %+v, %v", m, err)
				}
				got, ok := pr.ReadUpdate(up)
				if !ok || got.Message != u.Message || (got.Percent == nil) != (u.Percent == nil) || got.Percent != nil && *got.Percent != *u.Percent {
					t.Errorf("read back %+v from %s, want %+v", got, up, u)
				}
			}
			if _, ok := pr.ReadUpdate(native); ok {
				t.Error("the task itself read as a status update")
			}
		})
	}
}

// TestCoordinationStatusUpdateProgressFits: a coordination status update
// made from a long progress message keeps content.progress within the
// document's 200 characters, cut short with an ellipsis, so it is valid.
// Before, the whole message was sent, breaking the limit.
func TestCoordinationStatusUpdateProgressFits(t *testing.T) {
	task, err := profiles.Prepare(profiles.Coordination{}, []byte(`{"type":"task_assignment","from":"lead","to":"w",`+
		`"timestamp":"2026-01-01T00:00:00Z","content":{"taskId":"t1","agentName":"w","objective":"do it"}}`), profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	pct := 40
	for _, u := range []profiles.Update{
		{Message: strings.Repeat("step ", 50), Percent: &pct},
		{Message: strings.Repeat("é", 250)},
		{Message: strings.Repeat("x", 199) + "😀", Percent: &pct},
		{Message: strings.Repeat("x", 200)}, // fits: kept whole
	} {
		native, err := profiles.Coordination{}.StatusUpdate(task, u, "w", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := (profiles.Coordination{}).Validate(native); err != nil {
			t.Errorf("status update from a %d-character message: %v", utf8.RuneCountInString(u.Message), err)
		}
		got, ok := profiles.Coordination{}.ReadUpdate(native)
		if !ok {
			t.Fatalf("ReadUpdate(%s) not ok", native)
		}
		fits := utf8.RuneCountInString(u.Message) <= 200 && u.Percent == nil
		if fits && got.Message != u.Message || !fits && !strings.HasSuffix(got.Message, "…") {
			t.Errorf("progress of %d characters read back as %d: %q", utf8.RuneCountInString(u.Message), utf8.RuneCountInString(got.Message), got.Message)
		}
	}
}
