package codec

import (
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentbus/agentbus/subjects"
)

// Message is the one canonical agentbus message. On the wire it is a
// CloudEvent; docs/cloudevents.md maps every field to its attribute.
//
// Call SetDefaults before encoding to fill the ID, Time, Priority and
// CorrelationID a sender usually leaves out; the codecs never change the
// Message they are given.
type Message struct {
	// ID identifies the message (CloudEvents id). "" makes SetDefaults
	// assign a new one (NewID).
	ID string
	// From is the sender's agent ID (CloudEvents source "/agents/<token>").
	// It must pass subjects.ValidateID.
	From string
	// To is the recipient's agent ID, or subjects.Broadcast ("*") for every
	// agent (extension to). It is required to encode; a decoded event
	// without a to extension leaves it "".
	To string
	// Type is the message type, e.g. "TASK_ASSIGNMENT" (CloudEvents type).
	// It must pass subjects.ValidateType.
	Type string
	// Priority runs from 1, the most urgent, to 5 (extension priority).
	// 0 makes SetDefaults use subjects.DefaultPriority (3).
	Priority int
	// CorrelationID names the conversation the message belongs to
	// (extension correlationid). "" makes SetDefaults use the message ID.
	CorrelationID string
	// CausationID is the ID of the message this one answers (extension
	// causationid). "" means the message answers nothing.
	CausationID string
	// Time is when the message was created (CloudEvents time). The zero
	// Time makes SetDefaults use its now; a zero Time is never encoded.
	Time time.Time
	// TTL is how long after Time the message stays deliverable (extension
	// expirytime = Time + TTL). 0 means it never expires.
	TTL time.Duration
	// ContentType is the media type of Data (CloudEvents datacontenttype).
	// "" means none is declared.
	ContentType string
	// DataSchema is an absolute URI naming the schema of Data (CloudEvents
	// dataschema). "" means none.
	DataSchema string
	// Data is the opaque payload. Decoders may return a slice that aliases
	// the payload they were given.
	Data []byte
	// Extensions are further CloudEvents extension attributes, carried as
	// strings. Names are lower-case a-z and 0-9 and none of the attributes
	// above. The optional core attribute subject has no field and travels
	// here as Extensions["subject"]. nil and empty are the same.
	Extensions map[string]string
}

// SetDefaults fills the fields a sender usually leaves out: a zero ID becomes
// a new one (as NewID's, made at now), a zero Time becomes now in UTC,
// Priority 0 becomes subjects.DefaultPriority and an empty CorrelationID
// becomes the ID. Fields already set are kept. now is the current time: an
// ID is never made earlier than the process's last one, so a time in the
// past gives an ID just after it.
func (m *Message) SetDefaults(now time.Time) {
	if m.ID == "" {
		m.ID = ids.next(now)
	}
	if m.Time.IsZero() {
		m.Time = now.UTC()
	}
	if m.Priority == 0 {
		m.Priority = subjects.DefaultPriority
	}
	if m.CorrelationID == "" {
		m.CorrelationID = m.ID
	}
}

// ExpiresAt returns Time + TTL, or the zero Time when the message never
// expires (TTL 0) or has no Time.
func (m *Message) ExpiresAt() time.Time {
	if m.TTL <= 0 || m.Time.IsZero() {
		return time.Time{}
	}
	return m.Time.Add(m.TTL)
}

// Expired reports whether the message has a TTL and now is at or after
// ExpiresAt.
func (m *Message) Expired(now time.Time) bool {
	exp := m.ExpiresAt()
	return !exp.IsZero() && !now.Before(exp)
}

// Broadcast reports whether the message is addressed to every agent.
func (m *Message) Broadcast() bool { return m.To == subjects.Broadcast }

// Limits on the attributes an agent controls, in bytes. Every remembered
// message ID costs each server about 300 bytes plus its length for the
// duplicate window, and every ID and conversation is part of a status key
// and of the records that name it, so none of them may grow without bound.
const (
	MaxIDLen          = 256  // ID, CorrelationID and CausationID (causationid)
	MaxContentTypeLen = 256  // ContentType
	MaxDataSchemaLen  = 2048 // DataSchema
	MaxExtensionLen   = 4096 // each extension value
	MaxExtensions     = 32   // extension attributes on one message
	// MaxExtensionsSize bounds the names and values of a message's
	// extensions together: nats-server refuses a message whose headers
	// pass 64 KiB, and a dead letter adds headers of its own to the
	// message's.
	MaxExtensionsSize = 32 << 10
)

// Validate reports whether m can be encoded. The rules:
//
//   - ID is non-empty, valid UTF-8 without control characters and not only
//     white space, and at most MaxIDLen bytes, like CorrelationID and
//     CausationID; ContentType, DataSchema, each extension value, the number
//     of extensions and their size together have their limits too (the Max
//     constants).
//   - From passes subjects.ValidateID; To passes it too or is
//     subjects.Broadcast; Type passes subjects.ValidateType and is not only
//     white space.
//   - Priority is 1..5 (subjects.ValidatePriority).
//   - CorrelationID, CausationID, ContentType, DataSchema and every extension
//     value are valid UTF-8 without control characters (so no CR or LF).
//   - ContentType, if set, is an RFC 2046 media type; DataSchema, if set, is
//     an absolute URI in the form net/url prints it.
//   - Time, if set, and Time + TTL fall in the years 0000..9999, which RFC
//     3339 can write.
//   - TTL is not negative, and a positive TTL needs a Time.
//   - Extension names are lower-case a-z and 0-9 and not reserved: not a
//     core attribute (subject aside) nor one of correlationid, causationid,
//     priority, to, expirytime; Extensions["subject"] is not only white space.
//
// A failure is a *FieldError naming the Message field ("Extensions" with the
// name as Value for a bad name, "Extensions[name]" for a bad value); it
// wraps ErrInvalidMessage and, where one applies, the subjects sentinel.
func (m *Message) Validate() error { return m.validate(&fieldNames) }

// names says how validate reports a failure: for Validate, by Message field
// and ErrInvalidMessage; for the decoders, by CloudEvents attribute and
// ErrMalformed.
type names struct {
	id, from, to, typ, priority, correlationID, replyTo string
	time, ttl, contentType, dataSchema                  string
	decoding                                            bool // names extensions by attribute; allows To == ""
}

var fieldNames = names{
	id: "ID", from: "From", to: "To", typ: "Type", priority: "Priority",
	correlationID: "CorrelationID", replyTo: "CausationID", time: "Time", ttl: "TTL",
	contentType: "ContentType", dataSchema: "DataSchema",
}

var attrNames = names{
	id: attrID, from: attrSource, to: attrTo, typ: attrType, priority: attrPriority,
	correlationID: attrCorrelationID, replyTo: attrCausationID, time: attrTime, ttl: attrExpiryTime,
	contentType: attrDataContentType, dataSchema: attrDataSchema, decoding: true,
}

func (n *names) fail(field, value string, rule error) error {
	if n.decoding {
		return malformed(field, value, rule)
	}
	return invalid(field, value, rule)
}

func (m *Message) validate(n *names) error {
	if err := idRule(m.ID); err != nil {
		return n.fail(n.id, m.ID, err)
	}
	for _, f := range [...]struct {
		name, value string
		max         int
	}{
		{n.correlationID, m.CorrelationID, MaxIDLen}, {n.replyTo, m.CausationID, MaxIDLen},
		{n.contentType, m.ContentType, MaxContentTypeLen}, {n.dataSchema, m.DataSchema, MaxDataSchemaLen},
	} {
		if len(f.value) > f.max {
			return n.fail(f.name, f.value, tooLong(len(f.value), f.max))
		}
	}
	if len(m.Extensions) > MaxExtensions {
		return n.fail("Extensions", "", fmt.Errorf("%w: %d extensions, at most %d", ErrTooLong, len(m.Extensions), MaxExtensions))
	}
	size := 0
	for name, v := range m.Extensions {
		size += len(name) + len(v)
	}
	if size > MaxExtensionsSize {
		return n.fail("Extensions", "", fmt.Errorf("%w: %d bytes of extensions, at most %d", ErrTooLong, size, MaxExtensionsSize))
	}
	if err := subjects.ValidateID(m.From); err != nil {
		return n.fail(n.from, m.From, err)
	}
	if m.To != subjects.Broadcast && (m.To != "" || !n.decoding) {
		if err := subjects.ValidateID(m.To); err != nil {
			return n.fail(n.to, m.To, err)
		}
	}
	if err := subjects.ValidateType(m.Type); err != nil {
		return n.fail(n.typ, m.Type, err)
	}
	if isBlank(m.Type) {
		return n.fail(n.typ, m.Type, errBlank)
	}
	if err := subjects.ValidatePriority(m.Priority); err != nil {
		return n.fail(n.priority, priorityString(m.Priority), err)
	}
	if err := checkText(m.CorrelationID); err != nil {
		return n.fail(n.correlationID, m.CorrelationID, err)
	}
	if err := checkText(m.CausationID); err != nil {
		return n.fail(n.replyTo, m.CausationID, err)
	}
	if !m.Time.IsZero() && !writableYear(m.Time) {
		return n.fail(n.time, m.Time.String(), errYear)
	}
	switch {
	case m.TTL < 0:
		return n.fail(n.ttl, m.TTL.String(), errTTLNegative)
	case m.TTL > 0 && m.Time.IsZero():
		return n.fail(n.ttl, m.TTL.String(), errTTLNoTime)
	case m.TTL > 0 && !writableYear(m.Time.Add(m.TTL)):
		return n.fail(n.ttl, m.TTL.String(), errYear)
	}
	if m.ContentType != "" {
		if err := checkText(m.ContentType); err != nil {
			return n.fail(n.contentType, m.ContentType, err)
		}
		if !validMediaType(m.ContentType) {
			return n.fail(n.contentType, m.ContentType, errMediaType)
		}
	}
	if m.DataSchema != "" {
		if err := checkText(m.DataSchema); err != nil {
			return n.fail(n.dataSchema, m.DataSchema, err)
		}
		if !validURI(m.DataSchema) {
			return n.fail(n.dataSchema, m.DataSchema, errURI)
		}
	}
	for name, v := range m.Extensions {
		if err := checkExtensionName(name); err != nil {
			if n.decoding {
				return malformed(name, "", err)
			}
			return invalid("Extensions", name, err)
		}
		err := checkText(v)
		if err == nil && name == attrSubject && isBlank(v) {
			err = errBlank
		}
		if err == nil && len(v) > MaxExtensionLen {
			err = tooLong(len(v), MaxExtensionLen)
		}
		if err != nil {
			if n.decoding {
				return malformed(name, v, err)
			}
			return invalid("Extensions["+name+"]", v, err)
		}
	}
	return nil
}

// ValidateID reports whether id can be a message's ID, as Validate checks
// Message.ID: not empty, at most MaxIDLen bytes, valid UTF-8 without
// control characters, not only white space. Its error is a *FieldError
// naming field, wrapping ErrInvalidMessage. A lookup by a message's or a
// conversation's ID checks it first, so that one no message can have is
// refused rather than looked for.
func ValidateID(field, id string) error {
	if err := idRule(id); err != nil {
		return invalid(field, id, err)
	}
	return nil
}

// idRule returns the rule of ValidateID that id breaks, if any.
func idRule(id string) error {
	switch {
	case id == "":
		return errEmpty
	case len(id) > MaxIDLen:
		return tooLong(len(id), MaxIDLen)
	}
	if err := checkText(id); err != nil {
		return err
	}
	if isBlank(id) {
		return errBlank
	}
	return nil
}

// tooLong is the rule an attribute of n bytes broke, whose limit is max.
func tooLong(n, max int) error {
	return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLong, n, max)
}

// checkText rejects invalid UTF-8 and control characters (C0, DEL, C1).
func checkText(s string) error {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return errControl
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return errUTF8
		}
		if unicode.IsControl(r) {
			return errControl
		}
		i += size
	}
	return nil
}

// isBlank reports whether s has only white space, which sdk-go trims away.
func isBlank(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// writableYear reports whether RFC 3339 can write t: years 0000..9999 in UTC.
func writableYear(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

// checkExtensionName accepts a CloudEvents attribute name that Message does
// not map to a field of its own.
func checkExtensionName(name string) error {
	if !validAttrName(name) {
		return errAttrName
	}
	if reserved(name) {
		return errReserved
	}
	return nil
}

func validAttrName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// reserved reports whether name is a core attribute other than subject, the
// data member, or an extension that Message maps to a field.
func reserved(name string) bool {
	switch name {
	case attrSpecVersion, attrID, attrSource, attrType, attrTime, attrDataContentType, attrDataSchema,
		attrData, attrCorrelationID, attrCausationID, attrPriority, attrTo, attrExpiryTime:
		return true
	}
	return false
}

var priorityStrings = [...]string{"0", "1", "2", "3", "4", "5"}

// priorityString formats p without allocating for 0..5.
func priorityString(p int) string {
	if p >= 0 && p < len(priorityStrings) {
		return priorityStrings[p]
	}
	return strconv.Itoa(p)
}
