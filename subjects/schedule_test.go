package subjects

import (
	"errors"
	"testing"
)

// TestFiringNotice: the schedule stream's republish of a fired direct
// message names its recipient and priority where FiringFilter and
// FiringPriority read them; other subjects have no firing priority.
func TestFiringNotice(t *testing.T) {
	s, err := New("prod.bus")
	if err != nil {
		t.Fatal(err)
	}
	source, dest := s.FiringRePublish()
	if source != "prod.bus.fired.*.agent.*.*.>" || dest != "prod.bus.firing.agent.{{wildcard(2)}}.{{wildcard(3)}}.>" {
		t.Errorf("FiringRePublish = %q -> %q", source, dest)
	}
	filter, err := s.FiringFilter("build orchestrator")
	if err != nil {
		t.Fatal(err)
	}
	if filter != "prod.bus.firing.agent.build%20orchestrator.>" {
		t.Errorf("FiringFilter = %q", filter)
	}
	if _, err := s.FiringFilter("*"); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("FiringFilter(*) error = %v, want ErrInvalidAgentID", err)
	}
	// The republished subject of a fired message to the agent at
	// priority 2: the destination with the fired subject's wildcards.
	direct, err := s.Direct("build orchestrator", "lead", "REMINDER", 2)
	if err != nil {
		t.Fatal(err)
	}
	fired, err := s.Fired("415a1b2e", direct)
	if err != nil {
		t.Fatal(err)
	}
	notice := "prod.bus.firing" + fired[len("prod.bus.fired.415a1b2e"):]
	if notice != "prod.bus.firing.agent.build%20orchestrator.p2.lead.REMINDER" {
		t.Fatalf("notice %q", notice)
	}
	for _, tt := range []struct {
		subject string
		want    int
	}{
		{notice, 2},
		{notice + ".415a1b2e.c0nv", 2}, // the indexed form
		{direct, 0},
		{"prod.bus.firing.agent.x.p9.lead.T", 0},
		{"other.firing.agent.x.p2.lead.T", 0},
		{"prod.bus.firing", 0},
	} {
		if got := s.FiringPriority(tt.subject); got != tt.want {
			t.Errorf("FiringPriority(%q) = %d, want %d", tt.subject, got, tt.want)
		}
	}
}
