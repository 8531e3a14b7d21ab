package profiles

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentbus/agentbus/codec"
)

// TestAttachFindingsFits: whatever the findings, their attached form is a
// JSON array of at most MaxAttachedFindings findings in at most
// codec.MaxExtensionLen bytes, the first of them in order, and a last
// "truncated" finding counts those left out.
func TestAttachFindingsFits(t *testing.T) {
	many := func(n int, field, msg string) []Finding {
		fs := make([]Finding, n)
		for i := range fs {
			fs[i] = Finding{Field: fmt.Sprintf("/%d%s", i, field), Rule: "r", Message: msg}
		}
		return fs
	}
	tests := []struct {
		name    string
		fs      []Finding
		want    int // findings attached, not counting the "truncated" one
		wantCut bool
	}{
		{"one", many(1, "", "m"), 1, false},
		{"sixteen", many(16, "", "m"), 16, false},
		{"seventeen", many(17, "", "m"), 15, false},
		{"long messages", many(16, "", strings.Repeat("é", 5000)), 13, true},
		{"messages to escape", many(16, "", strings.Repeat("<", 5000)), 2, true},
		{"long fields", many(16, strings.Repeat("f", 1500), "m"), 2, false},
		{"one field too long", many(1, strings.Repeat("f", 5000), "m"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := attachFindings(tt.fs)
			if err != nil {
				t.Fatal(err)
			}
			if len(v) > codec.MaxExtensionLen {
				t.Errorf("%d bytes, over %d", len(v), codec.MaxExtensionLen)
			}
			var got []Finding
			if err := json.Unmarshal([]byte(v), &got); err != nil || len(got) > MaxAttachedFindings {
				t.Fatalf("%d findings, %v", len(got), err)
			}
			if tt.want < len(tt.fs) {
				last := got[len(got)-1]
				got = got[:len(got)-1]
				if more := fmt.Sprintf("%d more ", len(tt.fs)-tt.want); last.Rule != ruleTruncated || !strings.HasPrefix(last.Message, more) {
					t.Errorf("last finding %+v, want rule %s, message %q...", last, ruleTruncated, more)
				}
			}
			if len(got) != tt.want {
				t.Fatalf("%d findings attached, want %d", len(got), tt.want)
			}
			for i, f := range got {
				cut := f.Message != tt.fs[i].Message
				if f.Field != tt.fs[i].Field || cut != tt.wantCut || len(f.Message) > maxAttachedMessageLen ||
					cut && (!strings.HasSuffix(f.Message, ellipsis) || !strings.HasPrefix(tt.fs[i].Message, strings.TrimSuffix(f.Message, ellipsis))) {
					t.Errorf("finding %d: %s with a message of %d bytes, from %s", i, f.Field, len(f.Message), tt.fs[i].Field)
				}
			}
		})
	}
}

// TestCut: cutBytes and cutRunes keep what fits, and cut the rest where a
// rune starts, with the ellipsis inside the limit.
func TestCut(t *testing.T) {
	for _, tt := range []struct {
		s, bytes5, runes3 string
	}{
		{"", "", ""},
		{"abc", "abc", "abc"},
		{"abcde", "abcde", "ab…"},
		{"abcdef", "ab…", "ab…"},
		{"éééé", "é…", "éé…"},
		{"aéééé", "a…", "aé…"},
		{"é😀", "é…", "é😀"},
		{"é😀x", "é…", "é😀x"},
		{"😀", "😀", "😀"},
		{"😀😀😀😀", "…", "😀😀…"},
	} {
		if got := cutBytes(tt.s, 5); got != tt.bytes5 || len(got) > 5 && got != tt.s {
			t.Errorf("cutBytes(%q, 5) = %q, want %q", tt.s, got, tt.bytes5)
		}
		if got := cutRunes(tt.s, 3); got != tt.runes3 || utf8.RuneCountInString(got) > 3 {
			t.Errorf("cutRunes(%q, 3) = %q, want %q", tt.s, got, tt.runes3)
		}
	}
}
