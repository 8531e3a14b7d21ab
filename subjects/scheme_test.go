package subjects

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	tests := []struct {
		name     string
		root     string
		wantRoot string
		wantErr  error
	}{
		{name: "empty means default", root: "", wantRoot: DefaultRoot},
		{name: "default", root: "agentbus", wantRoot: "agentbus"},
		{name: "two tokens", root: "prod.bus-1", wantRoot: "prod.bus-1"},
		{name: "mixed case", root: "Prod_Bus", wantRoot: "Prod_Bus"},
		{name: "64 bytes", root: strings.Repeat("a", 64), wantRoot: strings.Repeat("a", 64)},

		{name: "65 bytes", root: strings.Repeat("a", 65), wantErr: ErrInvalidRoot},
		{name: "leading dot", root: ".agentbus", wantErr: ErrInvalidRoot},
		{name: "trailing dot", root: "agentbus.", wantErr: ErrInvalidRoot},
		{name: "empty token", root: "a..b", wantErr: ErrInvalidRoot},
		{name: "only a dot", root: ".", wantErr: ErrInvalidRoot},
		{name: "star", root: "agent*", wantErr: ErrInvalidRoot},
		{name: "wildcard token", root: "a.>", wantErr: ErrInvalidRoot},
		{name: "space", root: "agent bus", wantErr: ErrInvalidRoot},
		{name: "percent", root: "a%2E", wantErr: ErrInvalidRoot},
		{name: "dollar", root: "$JS", wantErr: ErrInvalidRoot},
		{name: "non-ASCII", root: "日本", wantErr: ErrInvalidRoot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.root)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("New(%q) error = %v, want %v", tt.root, err, tt.wantErr)
			}
			if err == nil && s.Root() != tt.wantRoot {
				t.Errorf("New(%q).Root() = %q, want %q", tt.root, s.Root(), tt.wantRoot)
			}
		})
	}
}

func TestDefaultAndZeroScheme(t *testing.T) {
	if got := Default().Root(); got != DefaultRoot {
		t.Errorf("Default().Root() = %q, want %q", got, DefaultRoot)
	}
	var zero Scheme
	want, _ := Default().Direct("a", "b", "c", 1)
	got, err := zero.Direct("a", "b", "c", 1)
	if err != nil || got != want {
		t.Errorf("Scheme{}.Direct = %q, %v, want %q as Default()", got, err, want)
	}
}

func mustNew(t testing.TB, root string) Scheme {
	t.Helper()
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDirect(t *testing.T) {
	long := strings.Repeat("a", MaxTokenLen)
	tests := []struct {
		name      string
		root      string
		to, from  string
		typ       string
		priority  int
		want      string
		wantErr   error
		wantInMsg string
	}{
		{name: "plain", to: "reviewer", from: "orchestrator", typ: "review_request", priority: 2,
			want: "agentbus.agent.reviewer.p2.orchestrator.review_request"},
		{name: "escaped IDs", to: "build orchestrator", from: "@agent-cto", typ: "TASK_ASSIGNMENT", priority: 1,
			want: "agentbus.agent.build%20orchestrator.p1.%40agent-cto.TASK_ASSIGNMENT"},
		{name: "japanese", to: "日本語", from: "a.b", typ: "ComponentHandoff", priority: 5,
			want: "agentbus.agent.%E6%97%A5%E6%9C%AC%E8%AA%9E.p5.a%2Eb.ComponentHandoff"},
		{name: "wildcards escaped", to: "a*b", from: "a>b", typ: "*", priority: 3,
			want: "agentbus.agent.a%2Ab.p3.a%3Eb.%2A"},
		{name: "looks escaped", to: "%41", from: "x", typ: "y", priority: 3,
			want: "agentbus.agent.%2541.p3.x.y"},
		{name: "other root", root: "prod.bus-1", to: "a", from: "b", typ: "c", priority: 4,
			want: "prod.bus-1.agent.a.p4.b.c"},
		{name: "128-byte tokens", to: long, from: long, typ: long, priority: 1,
			want: "agentbus.agent." + long + ".p1." + long + "." + long},

		{name: "broadcast recipient", to: "*", from: "a", typ: "t", priority: 1, wantErr: ErrInvalidAgentID, wantInMsg: `"*"`},
		{name: "empty recipient", to: "", from: "a", typ: "t", priority: 1, wantErr: ErrInvalidAgentID, wantInMsg: "recipient"},
		{name: "empty sender", to: "a", from: "", typ: "t", priority: 1, wantErr: ErrInvalidAgentID, wantInMsg: "sender"},
		{name: "broadcast sender", to: "a", from: "*", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "control in sender", to: "a", from: "a\nb", typ: "t", priority: 1, wantErr: ErrInvalidAgentID, wantInMsg: `"a\nb"`},
		{name: "NUL in recipient", to: "a\x00", from: "b", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "invalid UTF-8 recipient", to: "\xff", from: "b", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "129-byte recipient", to: long + "a", from: "b", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "empty type", to: "a", from: "b", typ: "", priority: 1, wantErr: ErrInvalidType},
		{name: "129-byte type", to: "a", from: "b", typ: strings.Repeat(".", 43), priority: 1, wantErr: ErrInvalidType},
		{name: "priority 0", to: "a", from: "b", typ: "t", priority: 0, wantErr: ErrInvalidPriority, wantInMsg: "0"},
		{name: "priority 6", to: "a", from: "b", typ: "t", priority: 6, wantErr: ErrInvalidPriority, wantInMsg: "6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustNew(t, tt.root)
			got, err := s.Direct(tt.to, tt.from, tt.typ, tt.priority)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Direct(%q, %q, %q, %d) error = %v, want %v", tt.to, tt.from, tt.typ, tt.priority, err, tt.wantErr)
			}
			if err != nil {
				if got != "" {
					t.Errorf("Direct returned %q with an error", got)
				}
				if !strings.Contains(err.Error(), tt.wantInMsg) {
					t.Errorf("Direct error %q does not mention %q", err, tt.wantInMsg)
				}
				return
			}
			if got != tt.want {
				t.Errorf("Direct(%q, %q, %q, %d) = %q, want %q", tt.to, tt.from, tt.typ, tt.priority, got, tt.want)
			}
		})
	}
}

func TestBroadcast(t *testing.T) {
	tests := []struct {
		name     string
		root     string
		from     string
		typ      string
		priority int
		want     string
		wantErr  error
	}{
		{name: "plain", from: "orchestrator", typ: "shutdown", priority: 3,
			want: "agentbus.all.p3.orchestrator.shutdown"},
		{name: "escaped", from: "build orchestrator", typ: "status update", priority: 1,
			want: "agentbus.all.p1.build%20orchestrator.status%20update"},
		{name: "other root", root: "x.y", from: "a", typ: "b", priority: 5,
			want: "x.y.all.p5.a.b"},

		{name: "broadcast sender", from: "*", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "empty sender", from: "", typ: "t", priority: 1, wantErr: ErrInvalidAgentID},
		{name: "control in type", from: "a", typ: "a\nb", priority: 1, wantErr: ErrInvalidType},
		{name: "invalid UTF-8 type", from: "a", typ: "\xff", priority: 1, wantErr: ErrInvalidType},
		{name: "priority 0", from: "a", typ: "t", priority: 0, wantErr: ErrInvalidPriority},
		{name: "priority 6", from: "a", typ: "t", priority: 6, wantErr: ErrInvalidPriority},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustNew(t, tt.root)
			got, err := s.Broadcast(tt.from, tt.typ, tt.priority)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Broadcast(%q, %q, %d) error = %v, want %v", tt.from, tt.typ, tt.priority, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("Broadcast(%q, %q, %d) = %q, want %q", tt.from, tt.typ, tt.priority, got, tt.want)
			}
		})
	}
}

func TestDeadLetter(t *testing.T) {
	tests := []struct {
		name     string
		to, from string
		typ      string
		want     string
		wantErr  error
	}{
		{name: "plain", to: "reviewer", from: "orchestrator", typ: "review_request",
			want: "agentbus.dlq.reviewer.orchestrator.review_request"},
		{name: "escaped", to: "@agent-cto", from: "build orchestrator", typ: "a.b",
			want: "agentbus.dlq.%40agent-cto.build%20orchestrator.a%2Eb"},

		{name: "empty recipient", to: "", from: "a", typ: "t", wantErr: ErrInvalidAgentID},
		{name: "control in recipient", to: "a\nb", from: "a", typ: "t", wantErr: ErrInvalidAgentID},
		{name: "broadcast recipient", to: "*", from: "orchestrator", typ: "shutdown", wantErr: ErrInvalidAgentID},
		{name: "broadcast sender", to: "a", from: "*", typ: "t", wantErr: ErrInvalidAgentID},
		{name: "empty type", to: "a", from: "b", typ: "", wantErr: ErrInvalidType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Default().DeadLetter(tt.to, tt.from, tt.typ)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("DeadLetter(%q, %q, %q) error = %v, want %v", tt.to, tt.from, tt.typ, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("DeadLetter(%q, %q, %q) = %q, want %q", tt.to, tt.from, tt.typ, got, tt.want)
			}
		})
	}
	if broadcastToken != EncodeToken(Broadcast) {
		t.Errorf("broadcastToken = %q, want EncodeToken(Broadcast) = %q", broadcastToken, EncodeToken(Broadcast))
	}
}

// streamSubjects spells out the stream subjects of root.
func streamSubjects(root string) []string {
	var out []string
	for _, p := range []string{"1", "2", "3", "4", "5"} {
		out = append(out, root+".agent.*.p"+p+".*.*")
	}
	for _, p := range []string{"1", "2", "3", "4", "5"} {
		out = append(out, root+".agent.*.p"+p+".*.*.*.*")
	}
	for _, p := range []string{"1", "2", "3", "4", "5"} {
		out = append(out, root+".all.p"+p+".*.*")
	}
	return out
}

// TestStreamSubjectsCaptureTheScheme: every subject Direct and Broadcast
// build is captured by a stream subject, and subjects of another shape
// (a priority outside 1..5, a token too many or too few) by none.
func TestStreamSubjectsCaptureTheScheme(t *testing.T) {
	s := Default()
	captured := func(subject string) bool {
		for _, f := range s.StreamSubjects() {
			if subjectMatches(f, subject) {
				return true
			}
		}
		return false
	}
	for p := HighestPriority; p <= LowestPriority; p++ {
		d, _ := s.Direct("build orchestrator", "a.b", "TASK ASSIGNMENT", p)
		ix, _ := s.IndexedDirect("build orchestrator", "a.b", "TASK ASSIGNMENT", p, "id 1", "conv")
		b, _ := s.Broadcast("a", "t", p)
		for _, subj := range []string{d, ix, b} {
			if !captured(subj) {
				t.Errorf("%s is not captured by %q", subj, s.StreamSubjects())
			}
		}
	}
	for _, subj := range []string{
		"agentbus.agent.x.p0.a.t", "agentbus.agent.x.p9.a.t", "agentbus.agent.x.p1.a", "agentbus.agent.x.p1.a.t.u", "agentbus.agent.x.p1.a.t.u.v.w",
		"agentbus.all.p7.a.t", "agentbus.all.p1.a", "agentbus.all.p1.a.t.u", "agentbus.agent.x.p12.a.t",
	} {
		if captured(subj) {
			t.Errorf("%s is captured, want no stream to take it", subj)
		}
	}
}

// subjectMatches reports whether the literal subject matches filter, with
// NATS's wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func TestStreams(t *testing.T) {
	tests := []struct {
		root        string
		stream      string
		dlq         string
		subjects    []string
		dlqSubjects []string
	}{
		{"agentbus", "AGENTBUS", "AGENTBUS_DLQ",
			[]string{
				"agentbus.agent.*.p1.*.*", "agentbus.agent.*.p2.*.*", "agentbus.agent.*.p3.*.*", "agentbus.agent.*.p4.*.*", "agentbus.agent.*.p5.*.*",
				"agentbus.agent.*.p1.*.*.*.*", "agentbus.agent.*.p2.*.*.*.*", "agentbus.agent.*.p3.*.*.*.*", "agentbus.agent.*.p4.*.*.*.*", "agentbus.agent.*.p5.*.*.*.*",
				"agentbus.all.p1.*.*", "agentbus.all.p2.*.*", "agentbus.all.p3.*.*", "agentbus.all.p4.*.*", "agentbus.all.p5.*.*",
			}, []string{"agentbus.dlq.>"}},
		{"prod.bus-1", "PROD_BUS-1", "PROD_BUS-1_DLQ",
			streamSubjects("prod.bus-1"), []string{"prod.bus-1.dlq.>"}},
		// Case and '.' against '_' are lost in the stream name.
		{"Prod_Bus-1", "PROD_BUS-1", "PROD_BUS-1_DLQ",
			streamSubjects("Prod_Bus-1"), []string{"Prod_Bus-1.dlq.>"}},
	}
	for _, tt := range tests {
		t.Run(tt.root, func(t *testing.T) {
			s := mustNew(t, tt.root)
			if got := s.Stream(); got != tt.stream {
				t.Errorf("Stream() = %q, want %q", got, tt.stream)
			}
			if got := s.DeadLetterStream(); got != tt.dlq {
				t.Errorf("DeadLetterStream() = %q, want %q", got, tt.dlq)
			}
			if got := s.StreamSubjects(); !slices.Equal(got, tt.subjects) {
				t.Errorf("StreamSubjects() = %q, want %q", got, tt.subjects)
			}
			if got := s.DeadLetterSubjects(); !slices.Equal(got, tt.dlqSubjects) {
				t.Errorf("DeadLetterSubjects() = %q, want %q", got, tt.dlqSubjects)
			}
			for _, name := range []string{s.Stream(), s.DeadLetterStream()} {
				if err := checkServerName(name); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// checkServerName applies the server's rule for stream and consumer names
// (nats-server isValidAssetName and JSMaxNameLen).
func checkServerName(name string) error {
	if name == "" || strings.ContainsAny(name, " \t\r\n\f.*>\\/") || len(name) > 255 {
		return errors.New("invalid server name: " + name)
	}
	return nil
}

func TestConsumers(t *testing.T) {
	tests := []struct {
		name    string
		root    string
		agent   string
		want    []string // name and filter of the first consumers, in order
		wantErr error
	}{
		{name: "plain", agent: "orchestrator", want: []string{
			"orchestrator_p1", "agentbus.agent.orchestrator.p1.>",
			"orchestrator_p2", "agentbus.agent.orchestrator.p2.>",
			"orchestrator_p3", "agentbus.agent.orchestrator.p3.>",
			"orchestrator_p4", "agentbus.agent.orchestrator.p4.>",
			"orchestrator_p5", "agentbus.agent.orchestrator.p5.>",
			"orchestrator_b", "agentbus.all.>",
		}},
		{name: "escaped", agent: "build orchestrator", want: []string{
			"build%20orchestrator_p1", "agentbus.agent.build%20orchestrator.p1.>",
		}},
		{name: "other root", root: "prod.bus-1", agent: "@agent-cto", want: []string{
			"%40agent-cto_p1", "prod.bus-1.agent.%40agent-cto.p1.>",
		}},
		{name: "ends like a consumer name", agent: "a_b", want: []string{
			"a_b_p1", "agentbus.agent.a_b.p1.>",
		}},

		{name: "broadcast", agent: "*", wantErr: ErrInvalidAgentID},
		{name: "empty", agent: "", wantErr: ErrInvalidAgentID},
		{name: "control", agent: "a\nb", wantErr: ErrInvalidAgentID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustNew(t, tt.root)
			cs, err := s.Consumers(tt.agent)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Consumers(%q) error = %v, want %v", tt.agent, err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if len(cs) != ConsumersPerAgent {
				t.Fatalf("Consumers(%q) returned %d consumers, want %d", tt.agent, len(cs), ConsumersPerAgent)
			}
			for i, c := range cs {
				want := Consumer{Agent: tt.agent, Priority: i + 1, Name: c.Name, Filter: c.Filter}
				if i == LowestPriority {
					want.Priority, want.Broadcast = 0, true
				}
				if 2*i+1 < len(tt.want) {
					want.Name, want.Filter = tt.want[2*i], tt.want[2*i+1]
				}
				if c != want {
					t.Errorf("Consumers(%q)[%d] = %+v, want %+v", tt.agent, i, c, want)
				}
			}
		})
	}
}

func TestParseConsumer(t *testing.T) {
	tests := []struct {
		name     string
		root     string
		consumer string
		want     Consumer
		wantErr  []error
	}{
		{name: "direct", consumer: "orchestrator_p1",
			want: Consumer{Agent: "orchestrator", Name: "orchestrator_p1", Filter: "agentbus.agent.orchestrator.p1.>", Priority: 1}},
		{name: "broadcast", consumer: "orchestrator_b",
			want: Consumer{Agent: "orchestrator", Name: "orchestrator_b", Filter: "agentbus.all.>", Broadcast: true}},
		{name: "escaped, other root", root: "prod.bus-1", consumer: "build%20orchestrator_b",
			want: Consumer{Agent: "build orchestrator", Name: "build%20orchestrator_b", Filter: "prod.bus-1.all.>", Broadcast: true}},
		{name: "agent ends like a consumer name", consumer: "a_p1_b",
			want: Consumer{Agent: "a_p1", Name: "a_p1_b", Filter: "agentbus.all.>", Broadcast: true}},
		{name: "agent ends like a broadcast name", consumer: "a_b_p3",
			want: Consumer{Agent: "a_b", Name: "a_b_p3", Filter: "agentbus.agent.a_b.p3.>", Priority: 3}},
		{name: "one-byte agent", consumer: "a_p4",
			want: Consumer{Agent: "a", Name: "a_p4", Filter: "agentbus.agent.a.p4.>", Priority: 4}},

		{name: "empty", consumer: "", wantErr: []error{ErrInvalidToken}},
		{name: "suffix only", consumer: "_p1", wantErr: []error{ErrInvalidToken}},
		{name: "no suffix", consumer: "orchestrator", wantErr: []error{ErrInvalidToken}},
		{name: "other kind", consumer: "a_x1", wantErr: []error{ErrInvalidToken}},
		{name: "upper-case kind", consumer: "a_P1", wantErr: []error{ErrInvalidToken}},
		{name: "two-digit priority", consumer: "a_p10", wantErr: []error{ErrInvalidToken}},
		{name: "priority 0", consumer: "a_p0", wantErr: []error{ErrInvalidToken, ErrInvalidPriority}},
		{name: "priority 6", consumer: "a_p6", wantErr: []error{ErrInvalidToken, ErrInvalidPriority}},
		{name: "not a digit", consumer: "a_px", wantErr: []error{ErrInvalidToken, ErrInvalidPriority}},
		{name: "old broadcast name", consumer: "a_b1", wantErr: []error{ErrInvalidToken}},
		{name: "broadcast suffix only", consumer: "_b", wantErr: []error{ErrInvalidToken}},
		{name: "non-canonical token", consumer: "%41_p1", wantErr: []error{ErrInvalidToken}},
		{name: "raw dot", consumer: "a.b_p1", wantErr: []error{ErrInvalidToken}},
		{name: "broadcast agent", consumer: "%2A_b", wantErr: []error{ErrInvalidToken, ErrInvalidAgentID}},
		{name: "too long", consumer: strings.Repeat("a", MaxTokenLen+1) + "_p1", wantErr: []error{ErrInvalidToken, ErrInvalidAgentID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := mustNew(t, tt.root).ParseConsumer(tt.consumer)
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("ParseConsumer(%q) error = %v, want it to wrap %v", tt.consumer, err, want)
				}
			}
			if tt.wantErr == nil && err != nil {
				t.Errorf("ParseConsumer(%q) error = %v", tt.consumer, err)
			}
			if got != tt.want {
				t.Errorf("ParseConsumer(%q) = %+v, want %+v", tt.consumer, got, tt.want)
			}
		})
	}
}

// TestConsumerNamesValid checks every consumer name against the server's
// rule, for IDs up to the longest allowed, that names are unique per (agent,
// priority, kind), including for IDs that end like a consumer name, and that
// ParseConsumer inverts Consumers.
func TestConsumerNamesValid(t *testing.T) {
	ids := append([]string{
		strings.Repeat("a", MaxTokenLen),
		strings.Repeat(".", MaxTokenLen/3),
		strings.Repeat("日", MaxTokenLen/9),
		" .*>\\/",
		"x", "x_p1", "x_b", "x_b1", "x_p1_b", "x_b_p1", "_p1", "_b",
	}, realIDs...)
	type key struct {
		agent     string
		priority  int
		broadcast bool
	}
	seen := make(map[string]key)
	for _, id := range ids {
		if ValidateID(id) != nil {
			continue
		}
		cs, err := Default().Consumers(id)
		if err != nil {
			t.Fatalf("Consumers(%q): %v", id, err)
		}
		for _, c := range cs {
			if err := checkServerName(c.Name); err != nil {
				t.Errorf("Consumers(%q): %v", id, err)
			}
			if len(c.Name) > MaxTokenLen+3 {
				t.Errorf("consumer name %q is %d bytes, more than MaxTokenLen+3", c.Name, len(c.Name))
			}
			k := key{id, c.Priority, c.Broadcast}
			if prev, ok := seen[c.Name]; ok && prev != k {
				t.Errorf("consumer name %q is shared by %+v and %+v", c.Name, prev, k)
			}
			seen[c.Name] = k
			if back, err := Default().ParseConsumer(c.Name); err != nil || back != c {
				t.Errorf("ParseConsumer(%q) = %+v, %v, want %+v", c.Name, back, err, c)
			}
		}
	}
}

func TestAgentFilter(t *testing.T) {
	tests := []struct {
		name    string
		agent   string
		want    string
		wantErr error
	}{
		{name: "plain", agent: "orchestrator", want: "agentbus.agent.orchestrator.>"},
		{name: "escaped", agent: "a.b", want: "agentbus.agent.a%2Eb.>"},
		{name: "broadcast", agent: "*", wantErr: ErrInvalidAgentID},
		{name: "empty", agent: "", wantErr: ErrInvalidAgentID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Default().AgentFilter(tt.agent)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("AgentFilter(%q) error = %v, want %v", tt.agent, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("AgentFilter(%q) = %q, want %q", tt.agent, got, tt.want)
			}
		})
	}
}

func TestPriorityOf(t *testing.T) {
	tests := []struct {
		root, subject string
		want          int
	}{
		{"", "agentbus.all.p3.orchestrator.shutdown", 3},
		{"", "agentbus.agent.reviewer.p1.orchestrator.review", 1},
		{"prod.bus-1", "prod.bus-1.all.p5.a.t", 5},
		{"", "agentbus.all.p0.a.t", 0},
		{"", "agentbus.all.p6.a.t", 0},
		{"", "agentbus.all.p12.a.t", 0},
		{"", "agentbus.all.x3.a.t", 0},
		{"", "agentbus.all.p3", 0},
		{"", "agentbus.agent.reviewer", 0},
		{"", "agentbus.dlq.a.b.t", 0},
		{"", "other.all.p3.a.t", 0},
		{"", "agentbusx.all.p3.a.t", 0},
		{"", "", 0},
	}
	for _, tt := range tests {
		if got := mustNew(t, tt.root).PriorityOf(tt.subject); got != tt.want {
			t.Errorf("PriorityOf(%q) = %d, want %d", tt.subject, got, tt.want)
		}
	}
}

func TestRouteTemplateAndFilters(t *testing.T) {
	s, err := New("prod.bus-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		subject  string
		kind     Kind
		priority int
	}{
		{"prod.bus-1.agent.a.p2.b.T", KindDirect, 2},
		{"prod.bus-1.all.p5.b.T", KindBroadcast, 5},
		{"prod.bus-1.dlq.a.b.T", 0, 0},
		{"prod.bus-1.agent.a.p6.b.T", 0, 0},
		{"prod.bus-1.all.q1.b.T", 0, 0},
		{"agentbus.agent.a.p2.b.T", 0, 0},
		{"prod.bus-1", 0, 0},
	} {
		if kind, p := s.Route(c.subject); kind != c.kind || p != c.priority {
			t.Errorf("Route(%q) = %v, %d; want %v, %d", c.subject, kind, p, c.kind, c.priority)
		}
	}
	if got, err := s.TypeFilters("a b", "x.y", 1); err != nil || !slices.Equal(got, []string{"prod.bus-1.agent.a%20b.p1.*.x%2Ey", "prod.bus-1.agent.a%20b.p1.*.x%2Ey.*.*"}) {
		t.Errorf("TypeFilters = %q, %v", got, err)
	}
	if _, err := s.TypeFilters("a", "x", 0); !errors.Is(err, ErrInvalidPriority) {
		t.Errorf("TypeFilters at priority 0: %v", err)
	}
	if got := s.Template(KindDirect, 2); got != "prod.bus-1.agent.{to}.p2.{from}.{type}" {
		t.Errorf("direct template %q", got)
	}
	if got := s.Template(KindBroadcast, 1); got != "prod.bus-1.all.p1.{from}.{type}" {
		t.Errorf("broadcast template %q", got)
	}
	for _, c := range []struct{ agent, typ, want string }{
		{"", "", "prod.bus-1.dlq.*.*.*"},
		{"build orchestrator", "", "prod.bus-1.dlq.build%20orchestrator.*.*"},
		{"", "a.b", "prod.bus-1.dlq.*.*.a%2Eb"},
	} {
		if got, err := s.DeadLetterFilter(c.agent, c.typ); err != nil || got != c.want {
			t.Errorf("DeadLetterFilter(%q, %q) = %q, %v; want %q", c.agent, c.typ, got, err, c.want)
		}
	}
	if _, err := s.DeadLetterFilter("*", ""); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("DeadLetterFilter(*) error %v, want ErrInvalidAgentID", err)
	}
	if got := s.MaxDeliveriesAdvisories(); got != "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.PROD_BUS-1.*" {
		t.Errorf("advisories %q", got)
	}
	if got := s.StatusSubjectPrefix(); got != "$KV.PROD_BUS-1_STATUS." {
		t.Errorf("status prefix %q", got)
	}
	if got := s.RegistryDirectGetPrefix(); got != "$JS.API.DIRECT.GET.KV_PROD_BUS-1_AGENTS.$KV.PROD_BUS-1_AGENTS." {
		t.Errorf("registry direct get prefix %q", got)
	}
	if got := s.PresenceDirectGetPrefix(); got != "$JS.API.DIRECT.GET.KV_PROD_BUS-1_PRESENCE.$KV.PROD_BUS-1_PRESENCE." {
		t.Errorf("presence direct get prefix %q", got)
	}
	if got := s.PresenceSubjectPrefix(); got != "$KV.PROD_BUS-1_PRESENCE." {
		t.Errorf("presence prefix %q", got)
	}
	if got := s.StatusDirectGetPrefix(); got != "$JS.API.DIRECT.GET.KV_PROD_BUS-1_STATUS.$KV.PROD_BUS-1_STATUS." {
		t.Errorf("direct get prefix %q", got)
	}
}

// TestIndexedDirect: an indexed subject is the direct one followed by the
// message's ID token and conversation key (an ID that is not a UUID
// version 7: TestIndexedDirectWindows has those), parses back to them, and the
// lookup filters find it: by ID, by ID for its sender and its recipient
// (and for no other agent), by conversation; as do the sent history and
// type filters.
func TestIndexedDirect(t *testing.T) {
	s := mustNew(t, "prod.bus-1")
	id, conv := "msg 1.x", "conversation-7"
	subj, err := s.IndexedDirect("re viewer", "lead", "review.request", 2, id, conv)
	if err != nil {
		t.Fatal(err)
	}
	direct, _ := s.Direct("re viewer", "lead", "review.request", 2)
	if want := direct + ".msg=201=2Ex." + ConversationKey(conv); subj != want {
		t.Fatalf("IndexedDirect = %q, want %q", subj, want)
	}
	a, err := s.Parse(subj)
	if err != nil {
		t.Fatal(err)
	}
	if a.Index != (Index{ID: IDToken(id), Conversation: ConversationKey(conv)}) || a.To != "re viewer" || a.From != "lead" {
		t.Errorf("Parse = %+v", a)
	}
	if got := s.WithoutIndex(subj); got != direct {
		t.Errorf("WithoutIndex(%q) = %q, want %q", subj, got, direct)
	}
	b, _ := s.Broadcast("lead", "x", 1)
	for _, other := range []string{direct, b, "other.agent.a.p1.b.c.d.e"} {
		if got := s.WithoutIndex(other); got != other {
			t.Errorf("WithoutIndex(%q) = %q, want it unchanged", other, got)
		}
	}
	matches := func(f string) bool { return subjectMatches(f, subj) }
	if fs := s.MessageFilters(id); len(fs) != 1 || !matches(fs[0]) {
		t.Errorf("MessageFilters = %q, want one that matches %q", fs, subj)
	}
	if fs := s.MessageFilters("msg 2"); matches(fs[0]) {
		t.Errorf("MessageFilters of another ID %q match %q", fs, subj)
	}
	for _, agent := range []string{"re viewer", "lead"} {
		fs, err := s.MessageFiltersOfAgent(id, agent)
		if err != nil {
			t.Fatal(err)
		}
		if !matches(fs[0]) && !matches(fs[1]) {
			t.Errorf("MessageFiltersOfAgent(%q) = %q, neither matches %q", agent, fs, subj)
		}
	}
	if fs, _ := s.MessageFiltersOfAgent(id, "other"); matches(fs[0]) || matches(fs[1]) {
		t.Errorf("MessageFiltersOfAgent(other) = %q matches %q", fs, subj)
	}
	if f, err := s.MessageFilterBetween(id, "re viewer", "lead"); err != nil || !matches(f) {
		t.Errorf("MessageFilterBetween = %q, %v; does not match %q", f, err, subj)
	}
	if f, _ := s.MessageFilterBetween(id, "lead", "re viewer"); matches(f) {
		t.Errorf("MessageFilterBetween the other way = %q matches %q", f, subj)
	}
	if _, err := s.MessageFilterBetween(id, "re viewer", ""); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("MessageFilterBetween from an invalid agent: %v, want ErrInvalidAgentID", err)
	}
	if fs := s.ConversationFilters(conv); len(fs) != 1 || !matches(fs[0]) {
		t.Errorf("ConversationFilters = %q, want one that matches %q", fs, subj)
	}
	for _, agent := range []string{"re viewer", "lead"} {
		fs, err := s.ConversationFiltersOfAgent(conv, agent)
		if err != nil {
			t.Fatal(err)
		}
		if !matches(fs[0]) && !matches(fs[1]) {
			t.Errorf("ConversationFiltersOfAgent(%q) = %q, neither matches %q", agent, fs, subj)
		}
		// Within the agent's history consumers' filters, which its
		// permissions pin.
		_, received, _ := s.ReceivedHistoryConsumer(agent)
		_, sent, _ := s.SentHistoryConsumer(agent)
		if !strings.HasPrefix(fs[0], strings.TrimSuffix(received, ">")) || !strings.HasPrefix(fs[1], strings.TrimSuffix(sent, ">")) {
			t.Errorf("ConversationFiltersOfAgent(%q) = %q, not within %q and %q", agent, fs, received, sent)
		}
	}
	if fs, _ := s.ConversationFiltersOfAgent(conv, "other"); matches(fs[0]) || matches(fs[1]) {
		t.Errorf("ConversationFiltersOfAgent(other) = %q matches %q", fs, subj)
	}
	if _, f, _ := s.SentHistoryConsumer("lead"); !matches(f) || !subjectMatches(f, direct) {
		t.Errorf("SentHistoryConsumer filter %q does not match both %q and %q", f, direct, subj)
	}
	if fs, _ := s.TypeFilters("re viewer", "review.request", 2); !subjectMatches(fs[0], direct) || !matches(fs[1]) {
		t.Errorf("TypeFilters = %q, want them to match %q and %q", fs, direct, subj)
	}
	if _, err := s.IndexedDirect("a", "b", "c", 1, "", conv); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("IndexedDirect with an empty ID: %v, want ErrInvalidToken", err)
	}
	if _, err := s.IndexedDirect("*", "b", "c", 1, id, conv); !errors.Is(err, ErrInvalidAgentID) {
		t.Errorf("IndexedDirect to Broadcast: %v, want ErrInvalidAgentID", err)
	}
	long := strings.Repeat("x", 300)
	subj, _ = s.IndexedDirect("a", "b", "c", 1, long, conv)
	if a, err := s.Parse(subj); err != nil || a.Index.ID != IDToken(long) || !strings.HasPrefix(a.Index.ID, "=H") {
		t.Errorf("Parse of a long ID's subject = %+v, %v", a, err)
	}
}

// TestIndexedDirectWindows: a UUID version 7, as ID and as correlation ID,
// is named by the 4 ms window of its time, which the IDs made in it
// share and no other ID's token or conversation key can be; the subject
// parses back to the windows, and each lookup filter matches the window's
// subject first and the ID's own token's (the earlier form) second.
func TestIndexedDirectWindows(t *testing.T) {
	s := Default()
	// 0x019ab1c2d3e4 ms, a time of 2025; 0x019ab1c2d3e4 >> 2 = 0x66ac70b4f9.
	id, sameWindow, nextWindow := "019ab1c2-d3e4-7abc-8def-0123456789ab", "019AB1C2-D3E7-7000-B000-000000000000", "019ab1c2-d3e8-7abc-8def-0123456789ab"
	if got := IndexToken(id); got != "=T66ac70b4f9" {
		t.Errorf("IndexToken(%s) = %q, want =T66ac70b4f9", id, got)
	}
	if IndexToken(sameWindow) != IndexToken(id) || ConversationToken(sameWindow) != IndexToken(id) {
		t.Errorf("IDs of one window have tokens %q, %q and %q", IndexToken(id), IndexToken(sameWindow), ConversationToken(sameWindow))
	}
	if IndexToken(nextWindow) == IndexToken(id) {
		t.Errorf("IDs 4 ms apart share the token %q", IndexToken(id))
	}
	for _, other := range []string{
		"019ab1c2-d3e4-4abc-8def-0123456789ab",  // version 4
		"019ab1c2-d3e4-7abc-cdef-0123456789ab",  // another variant
		"019ab1c2-d3e4-7abc-8def-0123456789aZ",  // not hex
		"019ab1c2d3e47abc8def0123456789ab",      // no hyphens
		"019ab1c2-d3e4-7abc-8def-0123456789ab0", // too long
	} {
		if tok := IndexToken(other); Windowed(tok) || tok != IDToken(other) {
			t.Errorf("IndexToken(%q) = %q, want its IDToken", other, tok)
		}
		if tok := ConversationToken(other); Windowed(tok) || tok != ConversationKey(other) {
			t.Errorf("ConversationToken(%q) = %q, want its ConversationKey", other, tok)
		}
	}
	subj, err := s.IndexedDirect("bob", "alice", "task", 3, id, sameWindow)
	if err != nil {
		t.Fatal(err)
	}
	if want := "agentbus.agent.bob.p3.alice.task.=T66ac70b4f9.=T66ac70b4f9"; subj != want {
		t.Fatalf("IndexedDirect = %q, want %q", subj, want)
	}
	a, err := s.Parse(subj)
	if err != nil || a.Index != (Index{ID: "=T66ac70b4f9", Conversation: "=T66ac70b4f9"}) || !Windowed(a.Index.ID) {
		t.Fatalf("Parse(%q) = %+v, %v", subj, a, err)
	}
	if got, err := a.Subject(s); err != nil || got != subj {
		t.Errorf("Subject() = %q, %v, want %q", got, err, subj)
	}
	earlier := "agentbus.agent.bob.p3.alice.task." + IDToken(id) + "." + ConversationKey(sameWindow)
	matches := func(f, subj string) bool { return subjectMatches(f, subj) }
	pairs := func(name string, fs []string, err error, n int) {
		t.Helper()
		if err != nil || len(fs) != 2*n {
			t.Fatalf("%s = %q, %v, want %d", name, fs, err, 2*n)
		}
		if !matches(fs[0], subj) && !matches(fs[1], subj) || !matches(fs[2], earlier) && !matches(fs[3], earlier) {
			t.Errorf("%s = %q: the first pair does not match %q or the second %q", name, fs, subj, earlier)
		}
	}
	if fs := s.MessageFilters(id); len(fs) != 2 || !matches(fs[0], subj) || !matches(fs[1], earlier) || matches(fs[1], subj) {
		t.Errorf("MessageFilters = %q, want the window's, then the ID's own", fs)
	}
	fs, err := s.MessageFiltersOfAgent(id, "bob")
	pairs("MessageFiltersOfAgent", fs, err, 2)
	if fs := s.ConversationFilters(sameWindow); len(fs) != 2 || !matches(fs[0], subj) || !matches(fs[1], earlier) {
		t.Errorf("ConversationFilters = %q, want the window's, then the key's", fs)
	}
	fs, err = s.ConversationFiltersOfAgent(sameWindow, "alice")
	pairs("ConversationFiltersOfAgent", fs, err, 2)
	if f, err := s.MessageFilterBetween(id, "bob", "alice"); err != nil || !matches(f, subj) {
		t.Errorf("MessageFilterBetween = %q, %v; does not match %q", f, err, subj)
	}
	for _, bad := range []string{"=T", "=T019ab", "=T19AB", "=T12345678901234567", "=Tg1"} {
		if _, err := s.Parse("agentbus.agent.bob.p3.alice.task." + bad + ".=T1"); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("Parse with ID token %q: %v, want ErrInvalidToken", bad, err)
		}
		if _, err := s.Parse("agentbus.agent.bob.p3.alice.task.=T1." + bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("Parse with conversation token %q: %v, want ErrInvalidToken", bad, err)
		}
	}
}
