package subjects

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestHistoryConsumers: the three short-lived consumers an agent reads its
// part of a conversation with have names of their own, which no durable
// consumer name and no other agent's name can take, and the filters the
// agent's permissions pin.
func TestHistoryConsumers(t *testing.T) {
	s := mustNew(t, "prod.bus-1")
	for _, tt := range []struct {
		name       string
		build      func(string) (string, string, error)
		agent      string
		wantName   string
		wantFilter string
		wantErr    error
	}{
		{"received", s.ReceivedHistoryConsumer, "build bot", "build%20bot_h", "prod.bus-1.agent.build%20bot.>", nil},
		{"sent", s.SentHistoryConsumer, "build bot", "build%20bot_hs", "prod.bus-1.agent.*.*.build%20bot.>", nil},
		{"broadcasts", s.BroadcastHistoryConsumer, "build bot", "build%20bot_ha", "prod.bus-1.all.>", nil},
		{"received, invalid", s.ReceivedHistoryConsumer, "*", "", "", ErrInvalidAgentID},
		{"sent, invalid", s.SentHistoryConsumer, "", "", "", ErrInvalidAgentID},
		{"broadcasts, invalid", s.BroadcastHistoryConsumer, "a\nb", "", "", ErrInvalidAgentID},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name, filter, err := tt.build(tt.agent)
			if !errors.Is(err, tt.wantErr) || name != tt.wantName || filter != tt.wantFilter {
				t.Errorf("= %q, %q, %v; want %q, %q, %v", name, filter, err, tt.wantName, tt.wantFilter, tt.wantErr)
			}
		})
	}

	// The received consumer is the history consumer of Attach; none of the
	// three is a durable consumer's name, of this agent or another.
	attach, _, _ := s.HistoryConsumer("a", "b")
	received, _, _ := s.ReceivedHistoryConsumer("a")
	if received != attach {
		t.Errorf("received %q, Attach's %q: want one name", received, attach)
	}
	sent, _, _ := s.SentHistoryConsumer("a")
	all, _, _ := s.BroadcastHistoryConsumer("a")
	for _, name := range []string{received, sent, all} {
		if _, err := s.ParseConsumer(name); err == nil {
			t.Errorf("ParseConsumer(%q) takes it for a durable consumer", name)
		}
	}
	var names []string
	for _, agent := range []string{"a", "a_h", "a_hs", "a_ha", "a_b", "a_p1"} {
		cs, err := s.Consumers(agent)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			names = append(names, c.Name)
		}
		for _, f := range []func(string) (string, string, error){s.ReceivedHistoryConsumer, s.SentHistoryConsumer, s.BroadcastHistoryConsumer} {
			n, _, _ := f(agent)
			names = append(names, n)
		}
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	if len(slices.Compact(sorted)) != len(names) {
		t.Errorf("names repeat: %q", names)
	}
}

// TestStatusKeysOfAgentInConversation: the two filters match the agent's
// keys of the conversation, and lie within what its permissions allow.
func TestStatusKeysOfAgentInConversation(t *testing.T) {
	got, err := StatusKeysOfAgentInConversation("conv-1", "build bot")
	if err != nil {
		t.Fatal(err)
	}
	c := ConversationKey("conv-1")
	if want := []string{c + ".*.build=20bot.*", c + ".*.*.build=20bot"}; !slices.Equal(got, want) {
		t.Errorf("= %q, want %q", got, want)
	}
	sent, _ := StatusKey("conv-1", "m-1", "build bot", "reviewer")
	received, _ := StatusKey("conv-1", "m-2", "reviewer", "build bot")
	other, _ := StatusKey("conv-2", "m-3", "build bot", "reviewer")
	patterns, _ := StatusKeyPatterns("build bot")
	for _, tt := range []struct {
		key  string
		want bool
	}{{sent, true}, {received, true}, {other, false}} {
		if matched := keyMatches(got[0], tt.key) || keyMatches(got[1], tt.key); matched != tt.want {
			t.Errorf("key %s matched %v, want %v", tt.key, matched, tt.want)
		}
	}
	for i, f := range got {
		if !keyMatches(patterns[i], f) {
			t.Errorf("filter %s is not within the permission %s", f, patterns[i])
		}
	}
	if _, err := StatusKeysOfAgentInConversation("conv-1", "*"); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("broadcast agent: error %v, want ErrInvalidAgentID", err)
	}
}

// keyMatches reports whether key, whose tokens may be "*", matches the
// pattern, where "*" stands for any one token.
func keyMatches(pattern, key string) bool {
	p, k := strings.Split(pattern, "."), strings.Split(key, ".")
	if len(p) != len(k) {
		return false
	}
	for i := range p {
		if p[i] != "*" && p[i] != k[i] {
			return false
		}
	}
	return true
}
