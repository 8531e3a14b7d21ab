package subjects

import (
	"errors"
	"strings"
	"testing"
)

func TestEncodeToken(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "plain", in: "orchestrator", want: "orchestrator"},
		{name: "all unreserved", in: "Az09_-", want: "Az09_-"},
		{name: "space", in: "build orchestrator", want: "build%20orchestrator"},
		{name: "at sign", in: "@agent-cto", want: "%40agent-cto"},
		{name: "upper and underscore", in: "TASK_ASSIGNMENT", want: "TASK_ASSIGNMENT"},
		{name: "camel case", in: "ComponentHandoff", want: "ComponentHandoff"},
		{name: "dot", in: "a.b", want: "a%2Eb"},
		{name: "star", in: "a*b", want: "a%2Ab"},
		{name: "broadcast", in: "*", want: "%2A"},
		{name: "greater than", in: "a>b", want: "a%3Eb"},
		{name: "percent", in: "%41", want: "%2541"},
		{name: "slash and backslash", in: `a/b\c`, want: "a%2Fb%5Cc"},
		{name: "tilde is escaped", in: "a~b", want: "a%7Eb"},
		{name: "japanese", in: "日本語", want: "%E6%97%A5%E6%9C%AC%E8%AA%9E"},
		{name: "empty", in: "", want: ""},
		{name: "control bytes are still encoded", in: "a\nb\x00", want: "a%0Ab%00"},
		{name: "invalid UTF-8 is still encoded", in: "\xff", want: "%FF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := EncodeToken(tt.in); got != tt.want {
				t.Errorf("EncodeToken(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestDecodeToken(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr error
	}{
		{name: "plain", in: "orchestrator", want: "orchestrator"},
		{name: "space", in: "build%20orchestrator", want: "build orchestrator"},
		{name: "at sign", in: "%40agent-cto", want: "@agent-cto"},
		{name: "dot", in: "a%2Eb", want: "a.b"},
		{name: "broadcast", in: "%2A", want: "*"},
		{name: "percent", in: "%2541", want: "%41"},
		{name: "japanese", in: "%E6%97%A5%E6%9C%AC%E8%AA%9E", want: "日本語"},
		{name: "control byte", in: "a%0Ab", want: "a\nb"},

		{name: "empty", in: "", wantErr: ErrInvalidToken},
		{name: "escaped unreserved", in: "%41", wantErr: ErrInvalidToken},
		{name: "escaped underscore", in: "%5F", wantErr: ErrInvalidToken},
		{name: "lower-case hex", in: "%2a", wantErr: ErrInvalidToken},
		{name: "truncated escape", in: "a%2", wantErr: ErrInvalidToken},
		{name: "lone percent", in: "%", wantErr: ErrInvalidToken},
		{name: "percent at end", in: "ab%", wantErr: ErrInvalidToken},
		{name: "not hex", in: "%G1", wantErr: ErrInvalidToken},
		{name: "raw space", in: "a b", wantErr: ErrInvalidToken},
		{name: "raw dot", in: "a.b", wantErr: ErrInvalidToken},
		{name: "raw star", in: "*", wantErr: ErrInvalidToken},
		{name: "raw greater than", in: ">", wantErr: ErrInvalidToken},
		{name: "raw byte next to escape", in: "%20 ", wantErr: ErrInvalidToken},
		{name: "raw non-ASCII", in: "日本語", wantErr: ErrInvalidToken},
		{name: "invalid UTF-8", in: "%FF", wantErr: ErrInvalidToken},
		{name: "truncated UTF-8", in: "%E6%97", wantErr: ErrInvalidToken},
		{name: "overlong UTF-8", in: "%C0%AE", wantErr: ErrInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeToken(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("DecodeToken(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("DecodeToken(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// realIDs are IDs and types taken from the protocols agentbus carries, plus
// the awkward cases the encoding exists for.
var realIDs = []string{
	"orchestrator", "build orchestrator", "build-orchestrator", "@agent-cto",
	"@agent-fullstack-developer", "TASK_ASSIGNMENT", "ComponentHandoff",
	"task_assignment", "review_verdict", "needs_human", "pm", "dev",
	"日本語", "開發者", "a.b", "a*b", "a>b", "%41", "a b", "a\tb", " ",
	"**", "a*", ">", "$JS.API", "a/b", `a\b`, "🤖 agent",
	strings.Repeat("a", MaxTokenLen), strings.Repeat("é", MaxTokenLen/6),
}

func TestTokenRoundTrip(t *testing.T) {
	for _, id := range realIDs {
		tok := EncodeToken(id)
		got, err := DecodeToken(tok)
		if err != nil {
			t.Errorf("DecodeToken(EncodeToken(%q)) = %q: %v", id, tok, err)
			continue
		}
		if got != id {
			t.Errorf("DecodeToken(EncodeToken(%q)) = %q, want the input", id, got)
		}
		if strings.ContainsAny(tok, " \t\r\n\f.*>/\\") {
			t.Errorf("EncodeToken(%q) = %q holds a character that is special in subjects or names", id, tok)
		}
	}
}

// TestTokenInjective checks that distinct names get distinct tokens, including
// names that look like tokens themselves.
func TestTokenInjective(t *testing.T) {
	names := append([]string{
		"A", "%41", "%2541", "a%2Eb", "a%2eb", "*", "%2A", "_", "%5F", "-", "%2D",
	}, realIDs...)
	seen := make(map[string]string)
	for _, n := range names {
		tok := EncodeToken(n)
		if prev, ok := seen[tok]; ok && prev != n {
			t.Errorf("EncodeToken(%q) = EncodeToken(%q) = %q", n, prev, tok)
		}
		seen[tok] = n
	}
}

func TestIsPlain(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"orchestrator", true},
		{strings.Repeat("a", MaxTokenLen), true},
		{strings.Repeat("a", MaxTokenLen+1), false},
		{"", false},
		{"a b", false},
		{"%41", false},
	}
	for _, tt := range tests {
		if got := isPlain(tt.in); got != tt.want {
			t.Errorf("isPlain(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
