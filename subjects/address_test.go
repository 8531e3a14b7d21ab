package subjects

import (
	"errors"
	"strings"
	"testing"
)

func TestKindString(t *testing.T) {
	tests := []struct {
		k    Kind
		want string
	}{
		{KindDirect, "direct"},
		{KindBroadcast, "broadcast"},
		{KindDeadLetter, "dead-letter"},
		{0, "Kind(0)"},
		{42, "Kind(42)"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(tt.k), got, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	long := strings.Repeat("a", MaxTokenLen)
	tests := []struct {
		name    string
		root    string
		subject string
		want    Address
		wantErr []error // all must match; nil means success
	}{
		{name: "direct", subject: "agentbus.agent.reviewer.p2.orchestrator.review_request",
			want: Address{Kind: KindDirect, To: "reviewer", From: "orchestrator", Type: "review_request", Priority: 2}},
		{name: "direct escaped", subject: "agentbus.agent.build%20orchestrator.p1.%40agent-cto.a%2Eb",
			want: Address{Kind: KindDirect, To: "build orchestrator", From: "@agent-cto", Type: "a.b", Priority: 1}},
		{name: "direct japanese", subject: "agentbus.agent.%E6%97%A5%E6%9C%AC%E8%AA%9E.p5.x.%2A",
			want: Address{Kind: KindDirect, To: "日本語", From: "x", Type: "*", Priority: 5}},
		{name: "direct 128-byte tokens", subject: "agentbus.agent." + long + ".p3." + long + "." + long,
			want: Address{Kind: KindDirect, To: long, From: long, Type: long, Priority: 3}},
		{name: "indexed", subject: "agentbus.agent.reviewer.p2.orchestrator.review_request.m-1.0123456789abcdef0123456789abcdef",
			want: Address{Kind: KindDirect, To: "reviewer", From: "orchestrator", Type: "review_request", Priority: 2,
				Index: Index{ID: "m-1", Conversation: "0123456789abcdef0123456789abcdef"}}},
		{name: "indexed escaped ID", subject: "agentbus.agent.a.p1.b.c.a=20b=3D.0123456789abcdef0123456789abcdef",
			want: Address{Kind: KindDirect, To: "a", From: "b", Type: "c", Priority: 1,
				Index: Index{ID: "a=20b=3D", Conversation: "0123456789abcdef0123456789abcdef"}}},
		{name: "indexed hashed ID", subject: "agentbus.agent.a.p1.b.c.=H" + strings.Repeat("ab", 32) + ".0123456789abcdef0123456789abcdef",
			want: Address{Kind: KindDirect, To: "a", From: "b", Type: "c", Priority: 1,
				Index: Index{ID: "=H" + strings.Repeat("ab", 32), Conversation: "0123456789abcdef0123456789abcdef"}}},
		{name: "broadcast", subject: "agentbus.all.p3.orchestrator.shutdown",
			want: Address{Kind: KindBroadcast, To: Broadcast, From: "orchestrator", Type: "shutdown", Priority: 3}},
		{name: "dead letter", subject: "agentbus.dlq.reviewer.orchestrator.review_request",
			want: Address{Kind: KindDeadLetter, To: "reviewer", From: "orchestrator", Type: "review_request"}},
		{name: "two-token root", root: "prod.bus-1", subject: "prod.bus-1.agent.a.p4.b.c",
			want: Address{Kind: KindDirect, To: "a", From: "b", Type: "c", Priority: 4}},
		{name: "root word as ID", subject: "agentbus.agent.agent.p1.all.dlq",
			want: Address{Kind: KindDirect, To: "agent", From: "all", Type: "dlq", Priority: 1}},

		{name: "empty", subject: "", wantErr: []error{ErrInvalidSubject}},
		{name: "root only", subject: "agentbus", wantErr: []error{ErrInvalidSubject}},
		{name: "root and dot", subject: "agentbus.", wantErr: []error{ErrInvalidSubject}},
		{name: "wrong root", subject: "other.agent.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "root prefix", subject: "agentbus2.agent.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "root case", subject: "AGENTBUS.agent.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "default root under other scheme", root: "prod", subject: "agentbus.agent.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "nested root", root: "agentbus.x", subject: "agentbus.agent.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "unknown form", subject: "agentbus.agents.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "direct too short", subject: "agentbus.agent.a.p1.b", wantErr: []error{ErrInvalidSubject}},
		{name: "direct too long", subject: "agentbus.agent.a.p1.b.c.d", wantErr: []error{ErrInvalidSubject}},
		{name: "indexed too long", subject: "agentbus.agent.a.p1.b.c.d.0123456789abcdef0123456789abcdef.e", wantErr: []error{ErrInvalidSubject}},
		{name: "indexed short conversation", subject: "agentbus.agent.a.p1.b.c.d.0123", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "indexed upper-case conversation", subject: "agentbus.agent.a.p1.b.c.d.0123456789ABCDEF0123456789abcdef", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "indexed percent ID", subject: "agentbus.agent.a.p1.b.c.a%20b.0123456789abcdef0123456789abcdef", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "indexed escaped unreserved ID", subject: "agentbus.agent.a.p1.b.c.=41.0123456789abcdef0123456789abcdef", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "indexed short hash", subject: "agentbus.agent.a.p1.b.c.=Habc.0123456789abcdef0123456789abcdef", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "indexed broadcast", subject: "agentbus.all.p1.b.c.d.0123456789abcdef0123456789abcdef", wantErr: []error{ErrInvalidSubject}},
		{name: "broadcast too short", subject: "agentbus.all.p1.b", wantErr: []error{ErrInvalidSubject}},
		{name: "broadcast too long", subject: "agentbus.all.p1.b.c.d", wantErr: []error{ErrInvalidSubject}},
		{name: "dead letter with priority", subject: "agentbus.dlq.a.p1.b.c", wantErr: []error{ErrInvalidSubject}},
		{name: "filter", subject: "agentbus.agent.>", wantErr: []error{ErrInvalidSubject}},
		{name: "trailing dot", subject: "agentbus.all.p1.b.c.", wantErr: []error{ErrInvalidSubject}},
		{name: "empty token", subject: "agentbus.agent..p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},

		{name: "priority p0", subject: "agentbus.agent.a.p0.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority p6", subject: "agentbus.agent.a.p6.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority px", subject: "agentbus.all.px.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority p01", subject: "agentbus.all.p01.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority P1", subject: "agentbus.all.P1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority 1", subject: "agentbus.all.1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},
		{name: "priority p", subject: "agentbus.all.p.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidPriority}},

		{name: "escaped unreserved", subject: "agentbus.agent.%41.p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "lower-case hex", subject: "agentbus.agent.a%2eb.p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "truncated escape", subject: "agentbus.agent.a.p1.a%2.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "raw space", subject: "agentbus.agent.a b.p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "wildcard token", subject: "agentbus.agent.*.p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "invalid UTF-8 type", subject: "agentbus.agent.a.p1.b.%FF", wantErr: []error{ErrInvalidSubject, ErrInvalidToken}},
		{name: "broadcast recipient of direct", subject: "agentbus.agent.%2A.p1.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "broadcast sender", subject: "agentbus.all.p1.%2A.c", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "control in sender", subject: "agentbus.all.p1.a%0Ab.c", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "broadcast sender of dead letter", subject: "agentbus.dlq.a.%2A.c", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "broadcast recipient of dead letter", subject: "agentbus.dlq.%2A.orchestrator.shutdown", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "NUL in type", subject: "agentbus.all.p1.a.b%00", wantErr: []error{ErrInvalidSubject, ErrInvalidType}},
		{name: "129-byte recipient", subject: "agentbus.dlq." + long + "a.b.c", wantErr: []error{ErrInvalidSubject, ErrInvalidAgentID}},
		{name: "129-byte type", subject: "agentbus.all.p1.b." + long + "a", wantErr: []error{ErrInvalidSubject, ErrInvalidType}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustNew(t, tt.root)
			got, err := s.Parse(tt.subject)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Parse(%q) error = %v", tt.subject, err)
				}
				if got != tt.want {
					t.Fatalf("Parse(%q) = %+v, want %+v", tt.subject, got, tt.want)
				}
				back, err := got.Subject(s)
				if err != nil || back != tt.subject {
					t.Errorf("Parse(%q).Subject() = %q, %v, want the input", tt.subject, back, err)
				}
				return
			}
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Parse(%q) error = %v, want it to match %v", tt.subject, err, want)
				}
			}
			if got != (Address{}) {
				t.Errorf("Parse(%q) = %+v with an error, want the zero Address", tt.subject, got)
			}
		})
	}
}

func TestAddressSubject(t *testing.T) {
	tests := []struct {
		name    string
		addr    Address
		want    string
		wantErr error
	}{
		{name: "direct", addr: Address{Kind: KindDirect, To: "a b", From: "c", Type: "d", Priority: 1},
			want: "agentbus.agent.a%20b.p1.c.d"},
		{name: "broadcast", addr: Address{Kind: KindBroadcast, To: Broadcast, From: "c", Type: "d", Priority: 5},
			want: "agentbus.all.p5.c.d"},
		{name: "dead letter", addr: Address{Kind: KindDeadLetter, To: "a", From: "c", Type: "d"},
			want: "agentbus.dlq.a.c.d"},

		{name: "zero", addr: Address{}, wantErr: ErrInvalidSubject},
		{name: "unknown kind", addr: Address{Kind: 9, To: "a", From: "b", Type: "c", Priority: 1}, wantErr: ErrInvalidSubject},
		{name: "direct to broadcast", addr: Address{Kind: KindDirect, To: Broadcast, From: "c", Type: "d", Priority: 1}, wantErr: ErrInvalidAgentID},
		{name: "direct without priority", addr: Address{Kind: KindDirect, To: "a", From: "c", Type: "d"}, wantErr: ErrInvalidPriority},
		{name: "broadcast without To", addr: Address{Kind: KindBroadcast, From: "c", Type: "d", Priority: 1}, wantErr: ErrInvalidAgentID},
		{name: "broadcast to an agent", addr: Address{Kind: KindBroadcast, To: "a", From: "c", Type: "d", Priority: 1}, wantErr: ErrInvalidAgentID},
		{name: "dead letter with priority", addr: Address{Kind: KindDeadLetter, To: "a", From: "c", Type: "d", Priority: 1}, wantErr: ErrInvalidPriority},
		{name: "dead letter without type", addr: Address{Kind: KindDeadLetter, To: "a", From: "c"}, wantErr: ErrInvalidType},
		{name: "dead letter of every agent", addr: Address{Kind: KindDeadLetter, To: Broadcast, From: "c", Type: "d"}, wantErr: ErrInvalidAgentID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.addr.Subject(Default())
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("%+v.Subject() error = %v, want %v", tt.addr, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got != tt.want {
				t.Errorf("%+v.Subject() = %q, want %q", tt.addr, got, tt.want)
			}
			back, err := Default().Parse(got)
			if err != nil || back != tt.addr {
				t.Errorf("Parse(%q) = %+v, %v, want %+v", got, back, err, tt.addr)
			}
		})
	}
}

// TestAddressRoundTrip builds every form for every pair of IDs in realIDs
// and checks that Parse inverts it.
func TestAddressRoundTrip(t *testing.T) {
	schemes := []Scheme{Default(), mustNew(t, "prod.bus-1")}
	for _, s := range schemes {
		for _, to := range realIDs {
			for _, from := range realIDs {
				for _, a := range []Address{
					{Kind: KindDirect, To: to, From: from, Type: from, Priority: 2},
					{Kind: KindBroadcast, To: Broadcast, From: from, Type: to, Priority: 4},
					{Kind: KindDeadLetter, To: to, From: from, Type: to},
				} {
					subj, err := a.Subject(s)
					if ValidateID(to) != nil || ValidateID(from) != nil {
						if err == nil && a.Kind != KindBroadcast {
							t.Errorf("%+v.Subject() = %q, want an error", a, subj)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%+v.Subject(): %v", a, err)
					}
					got, err := s.Parse(subj)
					if err != nil || got != a {
						t.Fatalf("Parse(%q) = %+v, %v, want %+v", subj, got, err, a)
					}
				}
			}
		}
	}
}
