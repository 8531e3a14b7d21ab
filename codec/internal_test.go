package codec

import (
	"errors"
	"mime"
	"strings"
	"testing"
)

// mimeMediaType is the rule validMediaType implements: mime.ParseMediaType
// accepts ct and it has a subtype.
func mimeMediaType(ct string) bool {
	_, _, err := mime.ParseMediaType(ct)
	return err == nil && strings.Contains(mediaType(ct), "/")
}

var mediaTypeSeeds = []string{
	"application/json", "text/plain; charset=utf-8", `text/plain; charset="utf-8"`, "application/vnd.a+json",
	"json", "a/", "/b", "a/b/c", "a b/c", "a/b;", "a/b; x", "a/b; x=1; x=2", " text/plain ", "text/plain\t",
	"a/b c", "application/x-www-form-urlencoded", "*/*", "a/b;c*=utf-8''%41", "é/b", "",
}

func TestValidMediaType(t *testing.T) {
	for _, ct := range mediaTypeSeeds {
		if got, want := validMediaType(ct), mimeMediaType(ct); got != want {
			t.Errorf("validMediaType(%q) = %v, want %v", ct, got, want)
		}
	}
}

func FuzzValidMediaType(f *testing.F) {
	for _, ct := range mediaTypeSeeds {
		f.Add(ct)
	}
	f.Fuzz(func(t *testing.T, ct string) {
		if got, want := validMediaType(ct), mimeMediaType(ct); got != want {
			t.Errorf("validMediaType(%q) = %v, want %v", ct, got, want)
		}
	})
}

func TestUnescapeHeader(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"plain", "plain", nil},
		{"Euro%20%E2%82%AC%20%F0%9F%98%80", "Euro € 😀", nil},
		{"Euro%20%e2%82%ac", "Euro €", nil},
		{"Euro € 😀", "Euro € 😀", nil},
		{`"quoted \"x\" \\"`, `quoted "x" \`, nil},
		{`"%41"`, "A", nil},
		{`"`, `"`, nil},     // too short to be quoted: raw
		{`a"b`, `a"b`, nil}, // a raw quote inside is taken as is
		{`""`, "", nil},
		{"%C0%A0", "", errUTF8},
		{"%FF", "", errUTF8},
		{"\xff", "", errUTF8},
		{"%", "", errPercent},
		{"%4", "", errPercent},
		{"%4G", "", errPercent},
		{`"a"b"`, "", errQuoted},
		{`"a\"`, "", errQuoted},
	} {
		got, err := unescapeHeader(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("unescapeHeader(%q) = %q, %v; want %q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
