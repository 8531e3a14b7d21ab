package subjects

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxTokenLen is the longest encoded token, in bytes, that an agent ID or a
// message type may produce. It keeps every consumer name well below the
// server's 255-byte limit and subjects short enough to read.
const MaxTokenLen = 128

const upperhex = "0123456789ABCDEF"

// unreserved reports whether b stands for itself in a token. A table, not
// a chain of comparisons: every byte of every ID and type the bus sends or
// receives passes here, several times (validate, measure, write).
func unreserved(b byte) bool { return unreservedBytes[b] }

var unreservedBytes = func() (t [256]bool) {
	for c := range t {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
	}
	return t
}()

// EncodeToken encodes s as one subject token. Bytes in [A-Za-z0-9_-] are kept;
// every other byte of the UTF-8 encoding is written as %XX with upper-case hex.
// The result is valid as a NATS subject token, a JetStream consumer name and a
// URI path segment. EncodeToken does not validate s; use [ValidateID] first.
func EncodeToken(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	writeToken(&b, s)
	return b.String()
}

// writeToken writes EncodeToken(s) to b. Runs of unreserved bytes are copied
// in one call, so an ID that needs no escaping costs a single WriteString.
func writeToken(b *strings.Builder, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			continue
		}
		b.WriteString(s[start:i])
		b.WriteByte('%')
		b.WriteByte(upperhex[c>>4])
		b.WriteByte(upperhex[c&15])
		start = i + 1
	}
	b.WriteString(s[start:])
}

// isPlain reports whether s is a name that is its own token: 1 to MaxTokenLen
// bytes, all unreserved. Such a name is valid UTF-8 without control
// characters, so it passes every name check; the validators and Parse use it
// as their fast path.
func isPlain(s string) bool {
	if s == "" || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			return false
		}
	}
	return true
}

// DecodeToken reverses [EncodeToken]. It accepts only the canonical encoding
// (upper-case hex, no escape of an unreserved byte, valid UTF-8), so that
// exactly one token stands for each string. Any other input returns an error
// wrapping [ErrInvalidToken].
func DecodeToken(tok string) (string, error) {
	if tok == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidToken)
	}
	if !strings.Contains(tok, "%") {
		for i := 0; i < len(tok); i++ {
			if !unreserved(tok[i]) {
				return "", fmt.Errorf("%w: %q: byte %q at %d must be escaped", ErrInvalidToken, tok, tok[i], i)
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case unreserved(c):
			out = append(out, c)
		case c == '%':
			if i+2 >= len(tok) {
				return "", fmt.Errorf("%w: %q: truncated escape at %d", ErrInvalidToken, tok, i)
			}
			hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("%w: %q: escape at %d is not upper-case hex", ErrInvalidToken, tok, i)
			}
			v := byte(hi<<4 | lo)
			if unreserved(v) {
				return "", fmt.Errorf("%w: %q: escape at %d encodes %q, which is written as is", ErrInvalidToken, tok, i, v)
			}
			out = append(out, v)
			i += 2
		default:
			return "", fmt.Errorf("%w: %q: byte %q at %d must be escaped", ErrInvalidToken, tok, c, i)
		}
	}
	if !utf8.Valid(out) {
		return "", fmt.Errorf("%w: %q: decodes to invalid UTF-8", ErrInvalidToken, tok)
	}
	return string(out), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// validateName checks an agent ID or message type: non-empty, valid UTF-8, no
// control characters, and an encoded token of at most MaxTokenLen bytes.
// sentinel is the error it wraps.
func validateName(kind, s string, sentinel error) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", sentinel, kind)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s %q is not valid UTF-8", sentinel, kind, s)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s %q has control character %U at byte %d", sentinel, kind, s, r, i)
		}
	}
	if n := encodedLen(s); n > MaxTokenLen {
		return fmt.Errorf("%w: %s %q encodes to %d bytes, more than %d", sentinel, kind, s, n, MaxTokenLen)
	}
	return nil
}

func encodedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			n += 2
		}
	}
	return n
}
