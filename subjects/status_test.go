package subjects

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// kvKey is nats.go's rule for KeyValue keys.
var kvKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func TestStatusKey(t *testing.T) {
	long := strings.Repeat("x.", 150)
	tests := []struct {
		name                string
		corr, id, from, to  string
		wantKey             string // "" means only checked for shape
		wantErr             error
		wantHashedID        bool
		wantFrom, wantTo    string
		wantParsedIDIsInput bool
	}{
		{name: "plain", corr: "conv-1", id: "m1", from: "orchestrator", to: "worker",
			wantKey: ConversationKey("conv-1") + ".m1.orchestrator.worker", wantParsedIDIsInput: true},
		{name: "escapes", corr: "c", id: "a.b=c%", from: "build bot", to: "rev@x",
			wantKey: ConversationKey("c") + ".a=2Eb=3Dc=25.build=20bot.rev=40x", wantParsedIDIsInput: true},
		{name: "broadcast", corr: "c", id: "m", from: "a", to: Broadcast,
			wantKey: ConversationKey("c") + ".m.a.=2A", wantParsedIDIsInput: true},
		{name: "long id is hashed", corr: "c", id: long, from: "a", to: "b", wantHashedID: true},
		{name: "empty id", corr: "c", id: "", from: "a", to: "b", wantErr: ErrInvalidToken},
		{name: "bad sender", corr: "c", id: "m", from: "*", to: "b", wantErr: ErrInvalidAgentID},
		{name: "bad recipient", corr: "c", id: "m", from: "a", to: "", wantErr: ErrInvalidAgentID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := StatusKey(tt.corr, tt.id, tt.from, tt.to)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("StatusKey error = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if tt.wantKey != "" && key != tt.wantKey {
				t.Errorf("StatusKey = %q, want %q", key, tt.wantKey)
			}
			if !kvKey.MatchString(key) {
				t.Errorf("StatusKey = %q is not a valid KeyValue key", key)
			}
			p, err := ParseStatusKey(key)
			if err != nil {
				t.Fatalf("ParseStatusKey(%q): %v", key, err)
			}
			if p.Conversation != ConversationKey(tt.corr) || p.From != tt.from || p.To != tt.to {
				t.Errorf("ParseStatusKey(%q) = %+v", key, p)
			}
			if tt.wantHashedID != (p.IDHash != "") || (!tt.wantHashedID && p.ID != tt.id) {
				t.Errorf("ParseStatusKey(%q) ID = %q, IDHash = %q", key, p.ID, p.IDHash)
			}
			if !strings.HasPrefix(key, strings.TrimSuffix(StatusKeysOfConversation(tt.corr), ">")) {
				t.Errorf("key %q is outside its conversation filter %q", key, StatusKeysOfConversation(tt.corr))
			}
			if got := strings.Split(key, ".")[1]; got != strings.Split(StatusKeysOfMessage(tt.id), ".")[1] {
				t.Errorf("key %q has ID token %q, message filter %q", key, got, StatusKeysOfMessage(tt.id))
			}
		})
	}
}

func TestConversationKeyIsTraceIDHex(t *testing.T) {
	// printf %s conv-1 | sha256sum | cut -c1-32
	if got, want := ConversationKey("conv-1"), "36524fd8f6747fc2712506d01fee0e18"; got != want {
		t.Fatalf("ConversationKey = %q, want %q", got, want)
	}
}

func TestStatusKeyPatterns(t *testing.T) {
	got, err := StatusKeyPatterns("build bot")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"*.*.build=20bot.*", "*.*.*.build=20bot"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("StatusKeyPatterns = %q, want %q", got, want)
	}
	if _, err := StatusKeyPatterns("*"); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("StatusKeyPatterns(*) error = %v, want ErrInvalidAgentID", err)
	}
	got, err = StatusKeysOfAgent("m.1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"*.m=2E1.a.*", "*.m=2E1.*.a"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("StatusKeysOfAgent = %q, want %q", got, want)
	}
	if got, want := (Scheme{}).StatusBucket(), "AGENTBUS_STATUS"; got != want {
		t.Errorf("StatusBucket = %q, want %q", got, want)
	}
}

func TestParseStatusKeyRejects(t *testing.T) {
	c := ConversationKey("c")
	for _, key := range []string{
		"", "a.b.c", c + ".m.a", c + ".m.a.b.c", "short.m.a.b",
		c + ".m%.a.b", c + ".m.=2a.b", c + ".m.a.=4A", c + ".=zz.a.b",
		// Decodable, but not what StatusKey writes: a '%' escape, an
		// upper-case conversation, a short hash, a long ID not hashed.
		c + ".%0A.a.b", c + ".m.a%20b.c", c + ".m.a.b%20c", strings.ToUpper(c) + ".m.a.b",
		c + ".=Habc.a.b", c + "." + strings.Repeat("m", 201) + ".a.b",
	} {
		if _, err := ParseStatusKey(key); err == nil {
			t.Errorf("ParseStatusKey(%q) = nil error", key)
		}
	}
}

func FuzzParseStatusKey(f *testing.F) {
	for _, s := range []string{ConversationKey("c") + ".m.a.b", ConversationKey("c") + ".a=2Eb.x=20y.=2A", "a.b.c.d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		p, err := ParseStatusKey(key)
		if err != nil || p.IDHash != "" {
			return
		}
		again, err := StatusKey("", p.ID, p.From, p.To)
		if err != nil {
			t.Fatalf("ParseStatusKey(%q) = %+v, which StatusKey refuses: %v", key, p, err)
		}
		if i := strings.IndexByte(key, '.'); again[i:] != key[i:] {
			t.Fatalf("ParseStatusKey(%q) = %+v, which StatusKey writes %q", key, p, again)
		}
	})
}

func TestRegistryKeys(t *testing.T) {
	for _, agent := range []string{"worker-1", "build orchestrator", "@agent-cto", "日本語", "a=b"} {
		card, err := CardKey(agent)
		if err != nil {
			t.Fatal(err)
		}
		presence, err := PresenceKey(agent)
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]RegistryKind{card: RegistryCard, presence: RegistryPresence} {
			if strings.Trim(key, "-/_=.ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") != "" {
				t.Errorf("key %q has characters a KeyValue key does not allow", key)
			}
			kind, got, err := ParseRegistryKey(key)
			if err != nil || kind != want || got != agent {
				t.Errorf("ParseRegistryKey(%q) = %v, %q, %v; want %v, %q", key, kind, got, err, want, agent)
			}
		}
	}
	if _, err := CardKey("*"); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("CardKey(*) error %v, want ErrInvalidAgentID", err)
	}
	for _, bad := range []string{"", "card.", "status.a", "card.a.b", "presence.a%20b", "card.=41"} {
		if _, _, err := ParseRegistryKey(bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("ParseRegistryKey(%q) error %v, want ErrInvalidToken", bad, err)
		}
	}
	if got := Default().RegistryBucket(); got != "AGENTBUS_AGENTS" {
		t.Errorf("RegistryBucket() = %q", got)
	}
	if got := Default().PresenceBucket(); got != "AGENTBUS_PRESENCE" {
		t.Errorf("PresenceBucket() = %q", got)
	}
}

func TestProcessesSubject(t *testing.T) {
	for agent, want := range map[string]string{"worker-1": "agentbus.processes.worker-1", "build orchestrator": "agentbus.processes.build%20orchestrator"} {
		if got, err := Default().ProcessesSubject(agent); got != want || err != nil {
			t.Errorf("ProcessesSubject(%q) = %q, %v; want %q", agent, got, err, want)
		}
	}
	if _, err := Default().ProcessesSubject("*"); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("ProcessesSubject(*) error %v, want ErrInvalidAgentID", err)
	}
}
