package codec

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// SpecVersion is the CloudEvents version the codecs write and the only one
// they read.
const SpecVersion = "1.0"

// SourcePrefix starts the CloudEvents source of every message agentbus
// writes: source = SourcePrefix + subjects.EncodeToken(From).
const SourcePrefix = "/agents/"

// ContentTypeStructured is the Content-Type header of a structured-mode
// message: the payload is the CloudEvents JSON event format.
const ContentTypeStructured = "application/cloudevents+json"

// CloudEvents attribute names: the core ones, then the extensions that
// Message maps to fields.
const (
	attrSpecVersion     = "specversion"
	attrID              = "id"
	attrSource          = "source"
	attrType            = "type"
	attrTime            = "time"
	attrDataContentType = "datacontenttype"
	attrDataSchema      = "dataschema"
	attrSubject         = "subject"
	attrData            = "data"
	attrDataBase64      = "data_base64"
	attrCorrelationID   = "correlationid"
	attrCausationID     = "causationid"
	attrPriority        = "priority"
	attrTo              = "to"
	attrExpiryTime      = "expirytime"
)

// Binary-mode header names: "ce-" and the attribute name.
const (
	headerPrefix          = "ce-"
	headerSpecVersion     = headerPrefix + attrSpecVersion
	headerID              = headerPrefix + attrID
	headerSource          = headerPrefix + attrSource
	headerType            = headerPrefix + attrType
	headerTime            = headerPrefix + attrTime
	headerDataContentType = headerPrefix + attrDataContentType
	headerDataSchema      = headerPrefix + attrDataSchema
	headerCorrelationID   = headerPrefix + attrCorrelationID
	headerCausationID     = headerPrefix + attrCausationID
	headerPriority        = headerPrefix + attrPriority
	headerTo              = headerPrefix + attrTo
	headerExpiryTime      = headerPrefix + attrExpiryTime
	headerContentType     = "Content-Type"
)

// Codec turns a Message into a NATS message and back.
//
// Encode validates m (see [Message.Validate]; call SetDefaults first) and
// returns the headers and payload to publish; the payload may alias m.Data.
// Its errors wrap ErrInvalidMessage.
//
// Decode reads a NATS message in either content mode, whichever codec wrote
// it; see the package function [Decode]. Its errors wrap ErrMalformed.
type Codec interface {
	Encode(m *Message) (nats.Header, []byte, error)
	Decode(h nats.Header, data []byte) (*Message, error)
}

var (
	_ Codec = Binary{}
	_ Codec = Structured{}
)

// Decode reads a message in the content mode the CloudEvents NATS binding
// detects: structured when a Content-Type header (name in any case) starts
// with "application/cloudevents" (in any case), binary otherwise. For
// producers that follow the binding's earlier, structured-only version, as
// sdk-go's structured writers do, a message with no ce- and no Content-Type
// header whose payload is a JSON object with a "specversion" member is read
// in structured mode too.
//
// The returned Message passes Validate, except that To is "" when the event
// has no to extension. Its Data may alias data.
//
// Every error wraps ErrMalformed. It is ErrNotCloudEvent when the message is
// not a CloudEvent at all, and a *FieldError when an attribute is at fault
// (when several are, which one is named is unspecified).
func Decode(h nats.Header, data []byte) (*Message, error) {
	m, mode, err := decodeBinary(h, data, nil)
	return decodeMode(m, mode, err, data)
}

// decodeMode finishes Decode once decodeBinary told the content mode.
func decodeMode(m *Message, mode int, err error, data []byte) (*Message, error) {
	switch mode {
	case modeStructured:
		if err != nil {
			return nil, err
		}
		return decodeJSON(data)
	case modeBare:
		if looksStructured(data) {
			return decodeJSON(data)
		}
	}
	return m, err
}

// The content modes decodeBinary tells Decode about.
const (
	modeBinary     = iota // read as binary mode; the result stands
	modeStructured        // a Content-Type header announces structured mode
	modeBare              // no ce- and no Content-Type header
)

// looksStructured reports whether a headerless payload is a structured
// event: a JSON object with a "specversion" member at the top level.
func looksStructured(data []byte) bool {
	i := skipJSONSpace(data, 0)
	if i >= len(data) || data[i] != '{' || !bytes.Contains(data, []byte(`"specversion"`)) || !json.Valid(data) {
		return false
	}
	for i = skipJSONSpace(data, i+1); i < len(data) && data[i] == '"'; {
		end := jsonStringEnd(data, i)
		if end < 0 {
			return false
		}
		if string(data[i:end]) == `"specversion"` {
			return true
		}
		i = skipJSONSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipJSONSpace(data, i+1)
		if i = jsonValueEnd(data, i); i < 0 {
			return false
		}
		if i = skipJSONSpace(data, i); i < len(data) && data[i] == ',' {
			i = skipJSONSpace(data, i+1)
		}
	}
	return false
}

// structuredContentType tells apart the Content-Type values that announce
// structured mode. It returns ok == false when ct does not, and a non-nil
// rule when ct announces a mode or format this package cannot read.
func structuredContentType(ct string) (ok bool, rule error) {
	const prefix = "application/cloudevents"
	if len(ct) < len(prefix) || !strings.EqualFold(ct[:len(prefix)], prefix) {
		return false, nil
	}
	rest := ct[len(prefix):]
	if len(rest) >= 5 && strings.EqualFold(rest[:5], "+json") {
		rest = rest[5:]
	} else if len(rest) > 0 && rest[0] == '-' {
		return true, errBatch
	}
	rest = strings.TrimLeft(rest, " \t")
	if rest != "" && rest[0] != ';' {
		return true, errEventFormat
	}
	return true, nil
}

// mediaType returns the type/subtype of a content type, without parameters
// or surrounding white space, in the case it was written.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.TrimSpace(ct)
}

// isJSONContent reports whether ct declares JSON data per the CloudEvents
// JSON format: absent, a subtype "json" or a subtype ending in "+json".
func isJSONContent(ct string) bool {
	mt := mediaType(ct)
	if mt == "" {
		return true
	}
	i := strings.IndexByte(mt, '/')
	if i < 0 {
		return false
	}
	sub := mt[i+1:]
	return strings.EqualFold(sub, "json") || len(sub) >= 5 && strings.EqualFold(sub[len(sub)-5:], "+json")
}

// isSDKJSON reports whether sdk-go's JSON writer embeds data of type ct as
// a JSON value: only for these types (and none), not for every "+json".
func isSDKJSON(ct string) bool {
	mt := strings.ToLower(mediaType(ct))
	switch mt {
	case "", "application/json", "text/json", "application/cloudevents+json", "application/cloudevents-batch+json":
		return true
	}
	return false
}

// isUTF8Text reports whether ct is text/* in UTF-8 (no charset or charset
// utf-8 or us-ascii), which the structured codec writes as a JSON string.
func isUTF8Text(ct string) bool {
	mt := mediaType(ct)
	if len(mt) < 5 || !strings.EqualFold(mt[:5], "text/") {
		return false
	}
	_, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "us-ascii")
}

// validMediaType reports whether ct is "type/subtype" with optional
// parameters: mime.ParseMediaType accepts it (it also takes a lone "type",
// which RFC 2046 does not). A plain "type/subtype" is checked without it,
// which saves its allocations on the common case.
func validMediaType(ct string) bool {
	if i := strings.IndexByte(ct, '/'); i > 0 && i < len(ct)-1 && allTokenChars(ct[:i]) && allTokenChars(ct[i+1:]) {
		return true
	}
	if !strings.Contains(mediaType(ct), "/") {
		return false
	}
	_, _, err := mime.ParseMediaType(ct)
	return err == nil
}

// allTokenChars reports whether s has only RFC 2045 token characters.
func allTokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=':
			return false
		default:
			if c <= ' ' || c >= 0x7f {
				return false
			}
		}
	}
	return true
}

// validURI reports whether s is an absolute URI that net/url prints back
// unchanged, so that sdk-go, which keeps a dataschema as a *url.URL, carries
// it exactly.
func validURI(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.IsAbs() && u.String() == s
}
