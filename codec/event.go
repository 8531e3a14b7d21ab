package codec

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/agentbus/agentbus/subjects"
)

// ToEvent validates m and returns it as an sdk-go event that passes
// event.Validate: the attributes of docs/cloudevents.md, priority as an
// int32 (CloudEvents Integer) extension, expirytime as a types.Timestamp,
// other extensions as strings and Extensions["subject"] as the subject.
// DataEncoded aliases m.Data; DataBase64 is set when sdk-go would otherwise
// not write Data back byte for byte in JSON. Errors wrap ErrInvalidMessage.
func ToEvent(m *Message) (event.Event, error) {
	if err := m.Validate(); err != nil {
		return event.Event{}, err
	}
	src, err := url.Parse(SourcePrefix + subjects.EncodeToken(m.From))
	if err != nil { // cannot happen: a token is a valid path segment
		return event.Event{}, invalid("From", m.From, err)
	}
	ec := &event.EventContextV1{
		ID:     m.ID,
		Source: types.URIRef{URL: *src},
		Type:   m.Type,
	}
	if !m.Time.IsZero() {
		ec.Time = &types.Timestamp{Time: m.Time.UTC()}
	}
	if m.ContentType != "" {
		ct := m.ContentType
		ec.DataContentType = &ct
	}
	if m.DataSchema != "" {
		ec.DataSchema = types.ParseURI(m.DataSchema)
	}
	ext := make(map[string]any, 5+len(m.Extensions))
	ext[attrPriority] = int32(m.Priority)
	ext[attrTo] = m.To
	if m.CorrelationID != "" {
		ext[attrCorrelationID] = m.CorrelationID
	}
	if m.CausationID != "" {
		ext[attrCausationID] = m.CausationID
	}
	if m.TTL > 0 {
		ext[attrExpiryTime] = types.Timestamp{Time: m.ExpiresAt().UTC()}
	}
	for name, v := range m.Extensions {
		if name == attrSubject {
			s := v
			ec.Subject = &s
			continue
		}
		ext[name] = v
	}
	ec.Extensions = ext

	e := event.Event{Context: ec}
	if len(m.Data) > 0 {
		e.DataEncoded = m.Data
		switch dataMode(m.ContentType, m.Data) {
		case dataJSON:
			e.DataBase64 = !isSDKJSON(m.ContentType)
		case dataBase64:
			e.DataBase64 = true
		}
	}
	if err := e.Validate(); err != nil {
		return event.Event{}, fmt.Errorf("%w: sdk-go rejects the event: %w", ErrInvalidMessage, err)
	}
	return e, nil
}

// FromEvent reads an sdk-go event with the rules of [Decode]: specversion
// must be "1.0", priority an int32 or a string, expirytime a timestamp or
// an RFC 3339 string; other extensions are formatted as CloudEvents
// canonical strings and the subject goes to Extensions["subject"]. Data
// aliases the event's DataEncoded. Errors wrap ErrMalformed; an event
// without a context is ErrNotCloudEvent.
func FromEvent(e event.Event) (*Message, error) {
	if e.Context == nil || e.SpecVersion() == "" {
		return nil, ErrNotCloudEvent
	}
	r := newReader()
	if err := r.set(attrSpecVersion, e.SpecVersion()); err != nil {
		return nil, err
	}
	for _, a := range [...]struct{ name, v string }{
		{attrID, e.ID()},
		{attrSource, e.Source()},
		{attrType, e.Type()},
		{attrDataContentType, e.DataContentType()},
		{attrDataSchema, e.DataSchema()},
		{attrSubject, e.Subject()},
	} {
		if a.v == "" {
			continue
		}
		if err := r.set(a.name, a.v); err != nil {
			return nil, err
		}
	}
	if t := e.Time(); !t.IsZero() {
		r.seen |= seenTime
		r.m.Time = t.UTC()
	}
	for name, v := range e.Extensions() {
		if err := setEventExtension(&r, name, v); err != nil {
			return nil, err
		}
	}
	r.m.Data = e.Data()
	return r.finish()
}

// setEventExtension applies one extension of an sdk-go event, whose value
// is one of the CloudEvents Go types.
func setEventExtension(r *reader, name string, v any) error {
	switch name {
	case attrPriority:
		switch p := v.(type) {
		case int32:
			if p < subjects.HighestPriority || p > subjects.LowestPriority {
				return malformed(name, strconv.Itoa(int(p)), errPriority)
			}
			return r.set(name, priorityString(int(p)))
		case string:
			return r.set(name, p)
		}
		s, _ := types.Format(v)
		return malformed(name, s, errPriority)
	case attrExpiryTime:
		if s, ok := v.(string); ok {
			return r.set(name, s)
		}
		t, err := types.ToTime(v)
		if err != nil {
			return malformed(name, "", errTimestamp)
		}
		if err := r.mark(seenExpiryTime, name, ""); err != nil {
			return err
		}
		r.expiry = t.UTC()
		return nil
	}
	s, err := types.Format(v)
	if err != nil {
		return malformed(name, "", errValueType)
	}
	return r.set(name, s)
}
