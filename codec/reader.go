package codec

import (
	"strings"
	"time"

	"github.com/agentbus/agentbus/codec/internal/rfc3339"
	"github.com/agentbus/agentbus/subjects"
)

// Bits of reader.seen, one per attribute that maps to a Message field.
const (
	seenSpecVersion uint16 = 1 << iota
	seenID
	seenSource
	seenType
	seenTime
	seenDataContentType
	seenDataSchema
	seenCorrelationID
	seenCausationID
	seenPriority
	seenTo
	seenExpiryTime
)

// reader builds a Message from attributes as the decoders find them: name
// lower-case, value the attribute's canonical string, already unescaped.
// It is shared by the binary and structured decoders and by FromEvent, so
// that all three accept and reject the same things.
type reader struct {
	m      *Message
	seen   uint16
	expiry time.Time
}

func newReader() reader { return reader{m: new(Message)} }

// mark records that the attribute of bit was given, once.
func (r *reader) mark(bit uint16, name, v string) error {
	if r.seen&bit != 0 {
		return malformed(name, v, errDuplicate)
	}
	r.seen |= bit
	return nil
}

// set applies attribute name with value v.
func (r *reader) set(name, v string) error {
	var bit uint16
	switch name {
	case attrSpecVersion:
		bit = seenSpecVersion
	case attrID:
		bit = seenID
	case attrSource:
		bit = seenSource
	case attrType:
		bit = seenType
	case attrTime:
		bit = seenTime
	case attrDataContentType:
		bit = seenDataContentType
	case attrDataSchema:
		bit = seenDataSchema
	case attrCorrelationID:
		bit = seenCorrelationID
	case attrCausationID:
		bit = seenCausationID
	case attrPriority:
		bit = seenPriority
	case attrTo:
		bit = seenTo
	case attrExpiryTime:
		bit = seenExpiryTime
	default:
		return r.setExtension(name, v)
	}
	if err := r.mark(bit, name, v); err != nil {
		return err
	}
	m := r.m
	switch bit {
	case seenSpecVersion:
		if v != SpecVersion {
			return malformed(name, v, errSpecVersion)
		}
	case seenID:
		m.ID = v
	case seenSource:
		from, err := parseSource(v)
		if err != nil {
			return malformed(name, v, err)
		}
		m.From = from
	case seenType:
		m.Type = v
	case seenTime:
		t, ok := parseTime(v)
		if !ok {
			return malformed(name, v, errTimestamp)
		}
		m.Time = t
	case seenDataContentType:
		m.ContentType = v
	case seenDataSchema:
		m.DataSchema = v
	case seenCorrelationID:
		m.CorrelationID = v
	case seenCausationID:
		m.CausationID = v
	case seenPriority:
		p, ok := parsePriority(v)
		if !ok {
			return malformed(name, v, errPriority)
		}
		m.Priority = p
	case seenTo:
		if v == "" { // "" means absent only when the attribute is
			return malformed(name, v, subjects.ValidateID(v))
		}
		m.To = v
	case seenExpiryTime:
		t, ok := parseTime(v)
		if !ok {
			return malformed(name, v, errTimestamp)
		}
		r.expiry = t
	}
	return nil
}

func (r *reader) setExtension(name, v string) error {
	if err := checkExtensionName(name); err != nil {
		return malformed(name, "", err)
	}
	if _, dup := r.m.Extensions[name]; dup {
		return malformed(name, v, errDuplicate)
	}
	if r.m.Extensions == nil {
		r.m.Extensions = make(map[string]string, 2)
	}
	r.m.Extensions[name] = v
	return nil
}

// finish checks what needs every attribute: required ones, the TTL, and
// then the whole Message as Validate would, by attribute name.
func (r *reader) finish() (*Message, error) {
	if r.seen&seenSpecVersion == 0 {
		return nil, malformed(attrSpecVersion, "", errMissing)
	}
	if r.seen&seenID == 0 {
		return nil, malformed(attrID, "", errMissing)
	}
	if r.seen&seenSource == 0 {
		return nil, malformed(attrSource, "", errMissing)
	}
	if r.seen&seenType == 0 {
		return nil, malformed(attrType, "", errMissing)
	}
	m := r.m
	if r.seen&seenPriority == 0 {
		m.Priority = subjects.DefaultPriority
	}
	if r.seen&seenExpiryTime != 0 {
		exp := r.expiry
		var rule error
		switch {
		case m.Time.IsZero():
			rule = errTTLNoTime
		case !exp.After(m.Time):
			rule = errExpiryOrder
		default:
			m.TTL = exp.Sub(m.Time)
			if !m.Time.Add(m.TTL).Equal(exp) { // Sub saturated
				rule = errExpiryRange
			}
		}
		if rule != nil {
			return nil, malformed(attrExpiryTime, exp.Format(time.RFC3339Nano), rule)
		}
	}
	if err := m.validate(&attrNames); err != nil {
		return nil, err
	}
	return m, nil
}

// parseSource maps a CloudEvents source to From: SourcePrefix and a token
// give the decoded token; any other source, from a foreign producer, is
// taken verbatim.
func parseSource(v string) (string, error) {
	if v == "" {
		return "", errEmpty
	}
	if tok, ok := strings.CutPrefix(v, SourcePrefix); ok {
		return subjects.DecodeToken(tok)
	}
	return v, nil
}

// parseTime parses an RFC 3339 timestamp, "t" and "z" in either case and
// no more than the RFC allows (rfc3339.Parse), and returns it in UTC.
func parseTime(v string) (time.Time, bool) {
	t, ok := rfc3339.Parse(v)
	if !ok {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// parsePriority parses a CloudEvents Integer in 1..5: decimal digits only.
func parsePriority(v string) (int, bool) {
	if v == "" || len(v) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n < subjects.HighestPriority || n > subjects.LowestPriority {
		return 0, false
	}
	return n, true
}
