package profiles_test

import (
	"os"
	"testing"
	"time"

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
