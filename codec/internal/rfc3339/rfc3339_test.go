package rfc3339

import (
	"strings"
	"testing"
	"time"
)

// TestParse: Parse reads RFC 3339 in either case and refuses what the RFC
// does not allow, whatever time.Parse accepts.
func TestParse(t *testing.T) {
	tests := []struct {
		name, in string
		want     time.Time // zero: Parse must refuse in
	}{
		{"Z", "2025-03-14T15:09:26Z", time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)},
		{"lower-case t and z", "2025-03-14t15:09:26z", time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)},
		{"lower-case t, offset", "2025-03-14t16:09:26+01:00", time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)},
		{"fraction", "2025-03-14T15:09:26.535897932Z", time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)},
		{"long fraction", "2025-03-14T15:09:26.1234567891234z", time.Date(2025, 3, 14, 15, 9, 26, 123456789, time.UTC)},
		{"negative offset", "2025-03-14T10:39:26-04:30", time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)},
		{"offset 23:59", "2025-03-14T15:09:26+23:59", time.Date(2025, 3, 13, 15, 10, 26, 0, time.UTC)},
		{"year 0", "0000-01-01T00:00:00Z", time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"comma fraction", "2025-03-14T15:09:26,5Z", time.Time{}},
		{"empty fraction", "2025-03-14T15:09:26.Z", time.Time{}},
		{"no zone", "2025-03-14T15:09:26", time.Time{}},
		{"one-digit hour", "2025-03-14T5:09:26Z", time.Time{}},
		{"space for T", "2025-03-14 15:09:26Z", time.Time{}},
		{"hour 24", "2025-03-14T24:00:00Z", time.Time{}},
		{"leap second", "2016-12-31T23:59:60Z", time.Time{}},
		{"February 30", "2025-02-30T15:09:26Z", time.Time{}},
		{"offset hour 24", "2025-03-14T15:09:26+24:00", time.Time{}},
		{"offset minute 60", "2025-03-14T15:09:26+00:60", time.Time{}},
		{"offset without colon", "2025-03-14T15:09:26+0100", time.Time{}},
		{"zone name", "2025-03-14T15:09:26UTC", time.Time{}},
		{"other letter", "2025-03-14X15:09:26Z", time.Time{}},
		{"empty", "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Parse(tt.in)
			if ok != !tt.want.IsZero() || !got.Equal(tt.want) {
				t.Errorf("Parse(%q) = %v, %v; want %v", tt.in, got, ok, tt.want)
			}
		})
	}
}

// TestParseAllocatesOnlyForLowerCase: the usual upper-case time, which
// every decoded event has, costs no allocation.
func TestParseAllocatesOnlyForLowerCase(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { Parse("2025-03-14T15:09:26.5+01:00") }); n != 0 {
		t.Errorf("Parse of an upper-case time: %v allocations, want 0", n)
	}
}

// FuzzParse: what Parse accepts, time.Parse reads alike once upper-cased,
// and what time.Format writes, Parse reads back.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"2025-03-14T15:09:26Z", "2025-03-14t15:09:26.5z", "2025-03-14T15:09:26,5Z", "2025-03-14T15:09:26+01:00"} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, s string, unixNano int64) {
		if got, ok := Parse(s); ok {
			want, err := time.Parse(time.RFC3339, strings.ToUpper(s))
			if err != nil || !got.Equal(want) {
				t.Fatalf("Parse(%q) = %v, time.Parse = %v, %v", s, got, want, err)
			}
		}
		tm := time.Unix(0, unixNano).In(time.FixedZone("", int(unixNano%(24*3600))/60*60))
		for _, layout := range []string{time.RFC3339, time.RFC3339Nano} {
			v, want := tm.Format(layout), tm
			if layout == time.RFC3339 {
				want = tm.Truncate(time.Second)
			}
			if got, ok := Parse(v); !ok || !got.Equal(want) {
				t.Fatalf("Parse(%q) = %v, %v; want %v", v, got, ok, want)
			}
		}
	})
}
