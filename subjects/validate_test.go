package subjects

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// nameCases are the inputs every name check is run against. invalid is false
// when the name is valid as both an agent ID and a message type; the one
// difference, "*", is tested separately.
var nameCases = []struct {
	name    string
	in      string
	invalid bool
}{
	{name: "plain", in: "orchestrator"},
	{name: "space", in: "build orchestrator"},
	{name: "at sign", in: "@agent-cto"},
	{name: "upper snake", in: "TASK_ASSIGNMENT"},
	{name: "camel case", in: "ComponentHandoff"},
	{name: "japanese", in: "日本語"},
	{name: "dot", in: "a.b"},
	{name: "star inside", in: "a*b"},
	{name: "greater than", in: "a>b"},
	{name: "looks escaped", in: "%41"},
	{name: "only a space", in: " "},
	{name: "emoji", in: "🤖"},
	{name: "128 plain bytes", in: strings.Repeat("a", 128)},
	{name: "128 encoded bytes", in: strings.Repeat(".", 42) + "ab"},
	{name: "128 encoded bytes of UTF-8", in: strings.Repeat("日", 14) + "ab"},

	{name: "empty", in: "", invalid: true},
	{name: "newline", in: "a\nb", invalid: true},
	{name: "NUL", in: "a\x00", invalid: true},
	{name: "tab", in: "a\tb", invalid: true},
	{name: "DEL", in: "a\x7f", invalid: true},
	{name: "C1 control", in: "a\u0085", invalid: true},
	{name: "invalid UTF-8", in: "\xff", invalid: true},
	{name: "truncated UTF-8", in: "\xe6\x97", invalid: true},
	{name: "129 plain bytes", in: strings.Repeat("a", 129), invalid: true},
	{name: "129 encoded bytes", in: strings.Repeat(".", 43), invalid: true},
	{name: "129 encoded bytes of UTF-8", in: strings.Repeat("日", 14) + "abc", invalid: true},
}

func TestValidateID(t *testing.T) {
	for _, tt := range nameCases {
		t.Run(tt.name, func(t *testing.T) {
			var wantErr error
			if tt.invalid {
				wantErr = ErrInvalidAgentID
			}
			err := ValidateID(tt.in)
			if !errors.Is(err, wantErr) {
				t.Fatalf("ValidateID(%q) = %v, want %v", tt.in, err, wantErr)
			}
			if err != nil && errors.Is(err, ErrInvalidType) {
				t.Errorf("ValidateID(%q) = %v, which also matches ErrInvalidType", tt.in, err)
			}
		})
	}
	t.Run("broadcast is reserved", func(t *testing.T) {
		err := ValidateID(Broadcast)
		if !errors.Is(err, ErrInvalidAgentID) {
			t.Fatalf("ValidateID(%q) = %v, want %v", Broadcast, err, ErrInvalidAgentID)
		}
		if !strings.Contains(err.Error(), `"*"`) {
			t.Errorf("ValidateID(%q) = %v, want the value in the message", Broadcast, err)
		}
	})
}

func TestValidateType(t *testing.T) {
	for _, tt := range nameCases {
		t.Run(tt.name, func(t *testing.T) {
			var wantErr error
			if tt.invalid {
				wantErr = ErrInvalidType
			}
			if err := ValidateType(tt.in); !errors.Is(err, wantErr) {
				t.Fatalf("ValidateType(%q) = %v, want %v", tt.in, err, wantErr)
			}
		})
	}
	t.Run("star is a valid type", func(t *testing.T) {
		if err := ValidateType("*"); err != nil {
			t.Fatalf("ValidateType(%q) = %v, want nil", "*", err)
		}
	})
}

func TestValidatePriority(t *testing.T) {
	tests := []struct {
		name    string
		in      int
		wantErr error
	}{
		{name: "highest", in: HighestPriority},
		{name: "default", in: DefaultPriority},
		{name: "lowest", in: LowestPriority},
		{name: "two", in: 2},
		{name: "zero", in: 0, wantErr: ErrInvalidPriority},
		{name: "six", in: 6, wantErr: ErrInvalidPriority},
		{name: "negative", in: -1, wantErr: ErrInvalidPriority},
		{name: "digit overflow", in: 10, wantErr: ErrInvalidPriority},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := ValidatePriority(tt.in); !errors.Is(err, tt.wantErr) {
				t.Fatalf("ValidatePriority(%d) = %v, want %v", tt.in, err, tt.wantErr)
			}
		})
	}
}

func TestValidationErrorsNameTheValue(t *testing.T) {
	for _, in := range []string{"a\nb", "\xff", strings.Repeat(".", 43)} {
		err := ValidateID(in)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ValidateID(%q) = %v, want the value in the message", in, err)
		}
	}
}
