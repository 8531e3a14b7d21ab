package subjects

import (
	"strconv"
	"strings"
)

// The index tokens of an indexed direct subject ([Scheme.IndexedDirect]).
// An ID made as a UUID version 7 (the bus's own, codec.NewID) carries the
// time it was made, and the subject names it by that time's window:
// windowPrefix and the lower-case hex of its Unix milliseconds shifted
// right by windowShift. Every message from one agent to another of one type and
// priority made in one window then shares a subject, as does every message
// of the conversations begun in one window, so the stream keeps an entry
// per window where it kept one per message: that entry is what the server
// pays for on each publish and keeps in memory for the retention
// (docs/performance.md). A lookup reads the window's messages and keeps the
// one with the ID. Any other ID, and the conversation of any other
// correlation ID, keeps a token of its own: [IDToken] and [ConversationKey].
const (
	// windowPrefix starts a window token. '=' is the escape of IDToken,
	// where it is followed by two hex digits, so no ID's token starts so;
	// a conversation key is hex alone.
	windowPrefix = "=T"
	// windowShift is log2 of a window's width in milliseconds: 4 ms,
	// chosen by measurement (docs/performance-journal.md, the window's width).
	// Readers and writers must agree on it.
	windowShift = 2
	// windowTokenMaxLen is the longest window token.
	windowTokenMaxLen = len(windowPrefix) + 16
)

// IndexToken returns the token an indexed direct subject names message id
// by: for a UUID version 7, the window of the time it carries ("=T" and
// hex digits, see [Scheme.IndexedDirect]), which the messages made in the
// same 4 ms share; for any other ID, [IDToken] of it, its own.
func IndexToken(id string) string {
	if ms, ok := uuidV7Millis(id); ok {
		return windowToken(ms)
	}
	return IDToken(id)
}

// ConversationToken returns the token an indexed direct subject names the
// conversation of correlationID by: for a UUID version 7 (a conversation
// begun by a message of the bus, whose ID it is), the window of the time
// it carries, shared by the conversations begun in the same 4 ms; for any
// other correlation ID, its [ConversationKey].
func ConversationToken(correlationID string) string {
	if ms, ok := uuidV7Millis(correlationID); ok {
		return windowToken(ms)
	}
	return ConversationKey(correlationID)
}

// Windowed reports whether tok, an index token of an indexed direct
// subject, is a window shared by the messages, or conversations, begun in
// it ([IndexToken], [ConversationToken]) rather than a token of one.
func Windowed(tok string) bool { return strings.HasPrefix(tok, windowPrefix) }

// windowToken returns the token of the window that holds the Unix time ms.
func windowToken(ms uint64) string {
	var b strings.Builder
	writeWindow(&b, ms)
	return b.String()
}

// writeWindow writes the token of the window that holds the Unix time ms
// to b.
func writeWindow(b *strings.Builder, ms uint64) {
	var buf [windowTokenMaxLen]byte
	b.Write(strconv.AppendUint(append(buf[:0], windowPrefix...), ms>>windowShift, 16))
}

// isWindowToken reports whether tok is a window token as windowToken
// writes it: "=T" and 1 to 16 lower-case hex digits without a leading 0.
func isWindowToken(tok string) bool {
	h, ok := strings.CutPrefix(tok, windowPrefix)
	return ok && h != "" && len(h) <= 16 && (h == "0" || h[0] != '0') && isLowerHex(h)
}

// uuidV7Millis returns the Unix milliseconds a UUID version 7 in its
// canonical text form (36 characters, either case) carries, or false for
// anything else. It runs for every direct message the bus sends, twice,
// and allocates nothing.
func uuidV7Millis(id string) (uint64, bool) {
	if len(id) != 36 || id[14] != '7' {
		return 0, false
	}
	switch id[19] { // the variant: 10xx
	case '8', '9', 'a', 'b', 'A', 'B':
	default:
		return 0, false
	}
	var ms uint64
	digits := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return 0, false
			}
			continue
		}
		var v byte
		switch {
		case '0' <= c && c <= '9':
			v = c - '0'
		case 'a' <= c && c <= 'f':
			v = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, false
		}
		if digits < 12 { // the first 48 bits: the milliseconds
			ms = ms<<4 | uint64(v)
		}
		digits++
	}
	return ms, true
}
