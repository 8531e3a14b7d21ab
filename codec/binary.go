package codec

import (
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/subjects"
)

// transportHeaders is the room Encode leaves in a header map for the
// headers a publisher adds: Nats-Msg-Id, Nats-TTL, traceparent, tracestate.
const transportHeaders = 4

// Binary is the binary content mode of the CloudEvents NATS binding, the
// default codec: every attribute travels in its own ce- header, percent-
// encoded, and Data is the payload as is.
type Binary struct{}

// Encode validates m and returns one ce- header per attribute and m.Data as
// the payload (not copied). Errors wrap ErrInvalidMessage.
func (Binary) Encode(m *Message) (nats.Header, []byte, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, err
	}
	n := 6 + len(m.Extensions) // specversion id source type priority to
	if !m.Time.IsZero() {
		n++
	}
	if m.TTL > 0 {
		n++
	}
	if m.ContentType != "" {
		n++
	}
	if m.DataSchema != "" {
		n++
	}
	if m.CorrelationID != "" {
		n++
	}
	if m.CausationID != "" {
		n++
	}
	// The map has room for the transport headers a publisher adds, so that
	// adding them does not make it grow.
	w := headerWriter{h: make(nats.Header, n+transportHeaders), vals: make([]string, n)}
	w.set(headerSpecVersion, SpecVersion)
	w.set(headerID, escapeHeader(m.ID))
	w.set(headerSource, sourceHeader(m.From))
	w.set(headerType, escapeHeader(m.Type))
	w.set(headerPriority, priorityString(m.Priority))
	w.set(headerTo, escapeHeader(m.To))
	if !m.Time.IsZero() {
		// Both timestamps share one allocation; RFC 3339 needs no escaping.
		var buf [2 * len(time.RFC3339Nano)]byte
		b := m.Time.UTC().AppendFormat(buf[:0], time.RFC3339Nano)
		k := len(b)
		if m.TTL > 0 {
			b = m.Time.Add(m.TTL).UTC().AppendFormat(b, time.RFC3339Nano)
		}
		s := string(b)
		w.set(headerTime, s[:k])
		if m.TTL > 0 {
			w.set(headerExpiryTime, s[k:])
		}
	}
	if m.ContentType != "" {
		w.set(headerDataContentType, escapeHeader(m.ContentType))
	}
	if m.DataSchema != "" {
		w.set(headerDataSchema, escapeHeader(m.DataSchema))
	}
	if m.CorrelationID != "" {
		w.set(headerCorrelationID, escapeHeader(m.CorrelationID))
	}
	if m.CausationID != "" {
		w.set(headerCausationID, escapeHeader(m.CausationID))
	}
	for name, v := range m.Extensions {
		w.set(headerPrefix+name, escapeHeader(v))
	}
	return w.h, m.Data, nil
}

// lastSource is the ce-source value sourceHeader made last.
var lastSource atomic.Pointer[sourceValue]

type sourceValue struct{ from, value string }

// sourceHeader returns the ce-source value of a message from agent from.
// The last one made is kept: nearly every message a process encodes comes
// from its one agent, whose source would otherwise be built, and
// allocated, for each.
func sourceHeader(from string) string {
	if s := lastSource.Load(); s != nil && s.from == from {
		return s.value
	}
	s := &sourceValue{from: from, value: escapeHeader(SourcePrefix + subjects.EncodeToken(from))}
	lastSource.Store(s)
	return s.value
}

// Decode reads a message in either content mode; it is the package
// function [Decode].
func (Binary) Decode(h nats.Header, data []byte) (*Message, error) { return Decode(h, data) }

// headerWriter fills a header map whose value slices share one backing array.
type headerWriter struct {
	h    nats.Header
	vals []string
	i    int
}

func (w *headerWriter) set(key, v string) {
	if w.i == len(w.vals) { // never, as Encode counts; stay correct anyway
		w.h[key] = []string{v}
		return
	}
	w.vals[w.i] = v
	w.h[key] = w.vals[w.i : w.i+1 : w.i+1]
	w.i++
}

// decodeBinary reads the ce- headers of h. mode is modeStructured when a
// Content-Type header announces structured mode, and modeBare when h has no
// ce- and no Content-Type header (the message is then ErrNotCloudEvent).
func decodeBinary(h nats.Header, data []byte, tn *traceNotes) (_ *Message, mode int, _ error) {
	return decodeBinaryInto(new(Message), h, data, tn)
}

// decodeBinaryInto is decodeBinary into dst.
func decodeBinaryInto(dst *Message, h nats.Header, data []byte, tn *traceNotes) (_ *Message, mode int, _ error) {
	r := reader{m: dst}
	var (
		firstErr    error
		sawCE       bool
		sawSpec     bool
		contentType string
		nCT         int
	)
	for k, vs := range h {
		if !isCEHeader(k) {
			if tn != nil {
				tn.note(k, vs)
			}
			if len(k) == len(headerContentType) && strings.EqualFold(k, headerContentType) {
				for _, v := range vs {
					if ok, rule := structuredContentType(v); ok {
						if rule != nil {
							return nil, modeStructured, malformed("content-type", v, rule)
						}
						return nil, modeStructured, nil
					}
					contentType = v
					nCT++
				}
			}
			continue
		}
		if len(vs) == 0 {
			continue
		}
		sawCE = true
		if len(k) == len(headerSpecVersion) && strings.EqualFold(k, headerSpecVersion) {
			sawSpec = true
		}
		if firstErr != nil {
			continue
		}
		name, ok := attrName(k[len(headerPrefix):])
		if !ok {
			firstErr = malformed(k[len(headerPrefix):], "", errAttrName)
			continue
		}
		if len(vs) > 1 {
			firstErr = malformed(name, vs[0], errDuplicate)
			continue
		}
		v, err := unescapeHeader(vs[0])
		if err != nil {
			firstErr = malformed(name, vs[0], err)
			continue
		}
		if name == attrData {
			firstErr = malformed(name, "", errReserved)
			continue
		}
		if err := r.set(name, v); err != nil {
			firstErr = err
		}
	}
	if !sawSpec {
		if !sawCE && nCT == 0 {
			return nil, modeBare, ErrNotCloudEvent
		}
		return nil, modeBinary, ErrNotCloudEvent
	}
	if firstErr != nil {
		return nil, modeBinary, firstErr
	}
	if r.seen&seenDataContentType == 0 && nCT > 0 {
		// sdk-go writes datacontenttype as a plain content-type header.
		if nCT > 1 {
			return nil, modeBinary, malformed("content-type", contentType, errDuplicate)
		}
		if err := r.set(attrDataContentType, contentType); err != nil {
			return nil, modeBinary, err
		}
	}
	r.m.Data = data
	m, err := r.finish()
	return m, modeBinary, err
}

// isCEHeader reports whether k starts with "ce-" in any case.
func isCEHeader(k string) bool {
	return len(k) >= 3 && k[0]|0x20 == 'c' && k[1]|0x20 == 'e' && k[2] == '-'
}

// attrName returns the attribute name of a header name after "ce-", lower-
// cased; ok is false unless it has only ASCII letters and digits.
func attrName(s string) (string, bool) {
	if s == "" {
		return "", false
	}
	upper := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case 'A' <= c && c <= 'Z':
			upper = true
		default:
			return "", false
		}
	}
	if !upper {
		return s, true
	}
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b), true
}

const upperhex = "0123456789ABCDEF"

// headerSafe reports whether byte c may stand for itself in a header value:
// printable ASCII U+0021..U+007E except '"' and '%'.
func headerSafe(c byte) bool { return c > ' ' && c < 0x7f && c != '"' && c != '%' }

// escapeHeader percent-encodes s for a header value: space, '"', '%' and
// every byte outside U+0021..U+007E become %XY with upper-case hex. It
// returns s itself when nothing needs encoding.
func escapeHeader(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !headerSafe(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if headerSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperhex[c>>4])
		b.WriteByte(upperhex[c&15])
	}
	return b.String()
}

// unescapeHeader reverses escapeHeader leniently: a value in RFC 7230
// double quotes is unquoted first; hex digits may be lower case; bytes that
// needed no encoding may be encoded, and raw UTF-8 may be left unencoded.
// The result must be valid UTF-8.
func unescapeHeader(v string) (string, error) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var err error
		if v, err = unquoteHeader(v[1 : len(v)-1]); err != nil {
			return "", err
		}
	}
	i := strings.IndexByte(v, '%')
	if i < 0 {
		if !utf8.ValidString(v) {
			return "", errUTF8
		}
		return v, nil
	}
	b := make([]byte, 0, len(v))
	b = append(b, v[:i]...)
	for ; i < len(v); i++ {
		c := v[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(v) {
			return "", errPercent
		}
		hi, lo := unhex(v[i+1]), unhex(v[i+2])
		if hi < 0 || lo < 0 {
			return "", errPercent
		}
		b = append(b, byte(hi<<4|lo))
		i += 2
	}
	if !utf8.Valid(b) {
		return "", errUTF8
	}
	return string(b), nil
}

// unquoteHeader undoes the backslash escapes of an RFC 7230 quoted-string
// whose quotes are already removed. An unescaped '"' or a trailing '\' is
// an error.
func unquoteHeader(s string) (string, error) {
	if strings.IndexByte(s, '\\') < 0 {
		if strings.IndexByte(s, '"') >= 0 {
			return "", errQuoted
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\\':
			i++
			if i == len(s) {
				return "", errQuoted
			}
			b = append(b, s[i])
		case '"':
			return "", errQuoted
		default:
			b = append(b, c)
		}
	}
	return string(b), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
