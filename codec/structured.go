package codec

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/subjects"
)

// Structured is the structured content mode of the CloudEvents NATS
// binding: the payload is the event in the CloudEvents JSON format and the
// only header is Content-Type: application/cloudevents+json.
type Structured struct{}

// Encode validates m and returns the Content-Type header and the JSON event
// of [MarshalJSON]. Errors wrap ErrInvalidMessage.
func (Structured) Encode(m *Message) (nats.Header, []byte, error) {
	b, err := MarshalJSON(m)
	if err != nil {
		return nil, nil, err
	}
	return nats.Header{headerContentType: []string{ContentTypeStructured}}, b, nil
}

// Decode reads a message in either content mode; it is the package
// function [Decode]. To read a JSON event that came without headers, use
// [UnmarshalJSON].
func (Structured) Decode(h nats.Header, data []byte) (*Message, error) { return Decode(h, data) }

// MarshalJSON validates m and returns it in the CloudEvents JSON event
// format, the payload of a structured-mode message: attributes and
// extensions as members (extensions sorted by name), then the data. Data is
// written as
//
//   - "data" holding the JSON value itself, byte for byte, when ContentType
//     declares JSON (or is "") and Data is a JSON value in UTF-8 without
//     surrounding white space;
//   - "data" holding a JSON string when ContentType is text/* in UTF-8 and
//     Data is valid UTF-8;
//   - "data_base64" otherwise;
//
// and left out when Data is empty. Errors wrap ErrInvalidMessage.
func MarshalJSON(m *Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return appendEvent(make([]byte, 0, jsonSizeHint(m)), m), nil
}

// UnmarshalJSON reads an event in the CloudEvents JSON format, as
// MarshalJSON writes it and as sdk-go's json.Marshal of an event.Event
// does. It accepts "data" or "data_base64", null for an absent attribute,
// and integer extensions as JSON numbers or strings; members must be
// CloudEvents attribute names and given once. Errors wrap ErrMalformed; see
// [Decode] for the rest.
func UnmarshalJSON(data []byte) (*Message, error) { return decodeJSON(data) }

// The ways appendEvent writes Data.
const (
	dataNone = iota
	dataJSON
	dataText
	dataBase64
)

func dataMode(ct string, data []byte) int {
	switch {
	case len(data) == 0:
		return dataNone
	case isJSONContent(ct):
		if embeddableJSON(data) {
			return dataJSON
		}
		return dataBase64
	case isUTF8Text(ct) && utf8.Valid(data):
		return dataText
	}
	return dataBase64
}

// embeddableJSON reports whether data is a JSON value that a reader gets
// back byte for byte from the "data" member: valid, in UTF-8 (json.Valid
// does not check the bytes inside strings, and JSON text between systems
// must be UTF-8, RFC 8259 section 8.1), and without white space around it,
// which a JSON parser does not keep.
func embeddableJSON(data []byte) bool {
	return !isJSONSpace(data[0]) && !isJSONSpace(data[len(data)-1]) && json.Valid(data) && utf8.Valid(data)
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func jsonSizeHint(m *Message) int {
	n := 320 + len(m.ID) + 3*len(m.From) + len(m.To) + len(m.Type) + len(m.CorrelationID) +
		len(m.CausationID) + len(m.ContentType) + len(m.DataSchema) + (len(m.Data)+2)/3*4
	for k, v := range m.Extensions {
		n += len(k) + len(v) + 6
	}
	return n
}

// appendEvent appends the JSON event of a valid m to b.
func appendEvent(b []byte, m *Message) []byte {
	b = append(b, `{"specversion":"`+SpecVersion+`","id":`...)
	b = appendJSONString(b, m.ID)
	b = append(b, `,"source":"`+SourcePrefix...)
	b = append(b, subjects.EncodeToken(m.From)...) // [A-Za-z0-9_%-] only
	b = append(b, `","type":`...)
	b = appendJSONString(b, m.Type)
	if !m.Time.IsZero() {
		b = append(b, `,"time":"`...)
		b = m.Time.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if m.ContentType != "" {
		b = append(b, `,"datacontenttype":`...)
		b = appendJSONString(b, m.ContentType)
	}
	if m.DataSchema != "" {
		b = append(b, `,"dataschema":`...)
		b = appendJSONString(b, m.DataSchema)
	}
	if m.CorrelationID != "" {
		b = append(b, `,"correlationid":`...)
		b = appendJSONString(b, m.CorrelationID)
	}
	if m.CausationID != "" {
		b = append(b, `,"causationid":`...)
		b = appendJSONString(b, m.CausationID)
	}
	b = append(b, `,"priority":`...)
	b = append(b, priorityString(m.Priority)...)
	b = append(b, `,"to":`...)
	b = appendJSONString(b, m.To)
	if m.TTL > 0 {
		b = append(b, `,"expirytime":"`...)
		b = m.Time.Add(m.TTL).UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if len(m.Extensions) > 0 {
		names := make([]string, 0, len(m.Extensions))
		for name := range m.Extensions {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			b = append(b, ',', '"')
			b = append(b, name...) // [a-z0-9] only
			b = append(b, '"', ':')
			b = appendJSONString(b, m.Extensions[name])
		}
	}
	switch dataMode(m.ContentType, m.Data) {
	case dataJSON:
		b = append(b, `,"data":`...)
		b = append(b, m.Data...)
	case dataText:
		b = append(b, `,"data":`...)
		b = appendJSONString(b, m.Data)
	case dataBase64:
		b = append(b, `,"data_base64":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.Data)
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendJSONString appends s, valid UTF-8, as a JSON string. Only '"', '\'
// and control characters below U+0020 are escaped.
func appendJSONString[S string | []byte](b []byte, s S) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', upperhex[c>>4], upperhex[c&15])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeJSON reads a JSON event. The payload is checked with json.Valid
// first, so the scanner below only has to find where members begin and end.
func decodeJSON(p []byte) (*Message, error) {
	if !json.Valid(p) {
		return nil, errPayloadNotJSON
	}
	i := skipJSONSpace(p, 0)
	if i >= len(p) || p[i] != '{' {
		return nil, errPayloadNotObject
	}
	r := newReader()
	var dataRaw, base64Raw []byte
	i = skipJSONSpace(p, i+1)
	for i < len(p) && p[i] == '"' {
		end := jsonStringEnd(p, i)
		if end < 0 {
			return nil, errPayloadNotJSON
		}
		key := p[i:end]
		i = skipJSONSpace(p, end)
		if i >= len(p) || p[i] != ':' {
			return nil, errPayloadNotJSON
		}
		i = skipJSONSpace(p, i+1)
		end = jsonValueEnd(p, i)
		if end < 0 {
			return nil, errPayloadNotJSON
		}
		val := p[i:end]
		i = skipJSONSpace(p, end)
		if i < len(p) && p[i] == ',' {
			i = skipJSONSpace(p, i+1)
		}

		nameb, err := unquoteJSON(key)
		if err != nil {
			return nil, malformed("member name", string(key), err)
		}
		name := string(nameb)
		switch name {
		case attrData, attrDataBase64:
			if name == attrDataBase64 && val[0] == 'n' { // null: absent
				continue
			}
			if name == attrData {
				if dataRaw != nil {
					return nil, malformed(name, "", errDuplicate)
				}
				dataRaw = val
			} else {
				if base64Raw != nil {
					return nil, malformed(name, "", errDuplicate)
				}
				base64Raw = val
			}
			continue
		}
		v, null, err := attrValue(name, val)
		if err != nil {
			return nil, err
		}
		if null {
			continue
		}
		if err := r.set(name, v); err != nil {
			return nil, err
		}
	}

	switch {
	case dataRaw != nil && base64Raw != nil:
		return nil, malformed(attrDataBase64, "", errDataTwice)
	case base64Raw != nil:
		if base64Raw[0] != '"' {
			return nil, malformed(attrDataBase64, string(base64Raw), errValueType)
		}
		s, err := unquoteJSON(base64Raw)
		if err != nil {
			return nil, malformed(attrDataBase64, "", err)
		}
		if r.m.Data, err = decodeBase64(s); err != nil {
			return nil, malformed(attrDataBase64, "", errBase64)
		}
	case dataRaw != nil:
		if isJSONContent(r.m.ContentType) {
			r.m.Data = dataRaw // the JSON value itself, null included
			break
		}
		if dataRaw[0] == 'n' { // no payload
			break
		}
		if dataRaw[0] != '"' { // not the string it should be; take it as is
			r.m.Data = dataRaw
			break
		}
		s, err := unquoteJSON(dataRaw)
		if err != nil {
			return nil, malformed(attrData, "", err)
		}
		r.m.Data = s
	}
	return r.finish()
}

var (
	errPayloadNotJSON   = malformedPayload("structured payload is not JSON")
	errPayloadNotObject = malformedPayload("structured payload is not a JSON object")
)

// attrValue converts the JSON value of attribute name to its canonical
// string; null reports a JSON null, which means absent.
func attrValue(name string, val []byte) (v string, null bool, err error) {
	switch c := val[0]; {
	case c == '"':
		s, err := unquoteJSON(val)
		if err != nil {
			return "", false, malformed(name, "", err)
		}
		return string(s), false, nil
	case c == 'n':
		return "", true, nil
	case c == 't' || c == 'f' || c == '-' || '0' <= c && c <= '9':
		if stringAttr(name) {
			return "", false, malformed(name, string(val), errValueType)
		}
		if c != 't' && c != 'f' && !isJSONInteger(val) {
			return "", false, malformed(name, string(val), errJSONInteger)
		}
		return string(val), false, nil
	}
	return "", false, malformed(name, "", errValueType)
}

// stringAttr reports whether attribute name must be a JSON string.
func stringAttr(name string) bool {
	switch name {
	case attrSpecVersion, attrID, attrSource, attrType, attrTime, attrDataContentType, attrDataSchema,
		attrSubject, attrCorrelationID, attrCausationID, attrTo, attrExpiryTime:
		return true
	}
	return false
}

// isJSONInteger reports whether a JSON number has only an integer part.
func isJSONInteger(num []byte) bool {
	if num[0] == '-' {
		num = num[1:]
	}
	if len(num) == 0 {
		return false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// decodeBase64 decodes standard base64, padded or, leniently, not.
func decodeBase64(s []byte) ([]byte, error) {
	enc := base64.StdEncoding
	if len(s)%4 != 0 && bytes.IndexByte(s, '=') < 0 {
		enc = base64.RawStdEncoding
	}
	out := make([]byte, enc.DecodedLen(len(s)))
	n, err := enc.Decode(out, s)
	return out[:n], err
}

func skipJSONSpace(p []byte, i int) int {
	for i < len(p) && isJSONSpace(p[i]) {
		i++
	}
	return i
}

// jsonStringEnd returns the index after the string that starts at p[i], or
// -1.
func jsonStringEnd(p []byte, i int) int {
	for j := i + 1; j < len(p); j++ {
		switch p[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// jsonValueEnd returns the index after the value that starts at p[i], or -1.
func jsonValueEnd(p []byte, i int) int {
	if i >= len(p) {
		return -1
	}
	switch p[i] {
	case '"':
		return jsonStringEnd(p, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(p); j++ {
			switch p[j] {
			case '"':
				end := jsonStringEnd(p, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(p) && p[j] != ',' && p[j] != '}' && p[j] != ']' && !isJSONSpace(p[j]) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// unquoteJSON returns the contents of the JSON string raw (quotes
// included). Without escapes it aliases raw. Invalid UTF-8 and escaped lone
// surrogates are errors, where encoding/json would put U+FFFD.
func unquoteJSON(raw []byte) ([]byte, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, errQuoted
	}
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		if !utf8.Valid(s) {
			return nil, errUTF8
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			// A run up to the next escape holds whole UTF-8 sequences, as
			// '\' never occurs inside one.
			j := bytes.IndexByte(s[i:], '\\')
			if j < 0 {
				j = len(s) - i
			}
			run := s[i : i+j]
			if !utf8.Valid(run) {
				return nil, errUTF8
			}
			b = append(b, run...)
			i += j
			continue
		}
		if i+1 >= len(s) {
			return nil, errQuoted
		}
		c := s[i+1]
		i += 2
		switch c {
		case '"', '\\', '/':
			b = append(b, c)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r1, ok := hex4(s, i)
			if !ok {
				return nil, errQuoted
			}
			i += 4
			if utf16.IsSurrogate(r1) {
				if r1 >= 0xdc00 || i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
					return nil, errUTF8
				}
				r2, ok := hex4(s, i+2)
				if !ok || r2 < 0xdc00 || r2 > 0xdfff {
					return nil, errUTF8
				}
				r1 = utf16.DecodeRune(r1, r2)
				i += 6
			}
			b = utf8.AppendRune(b, r1)
		default:
			return nil, errQuoted
		}
	}
	return b, nil
}

func hex4(s []byte, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range s[i : i+4] {
		h := unhex(c)
		if h < 0 {
			return 0, false
		}
		r = r<<4 | rune(h)
	}
	return r, true
}
