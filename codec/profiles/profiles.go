package profiles

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Profile maps one native agent protocol onto [codec.Message]. The five
// profiles are stateless values, safe for concurrent use.
type Profile interface {
	// Name is the profile's name: "frontmatter", "basemessage", "swarm",
	// "coordination" or "pipeline".
	Name() string
	// Version is the version of the profile's rules, "1.0".
	Version() string
	// DataSchema is the URI every decoded Message carries in DataSchema:
	// "urn:agentbus:profile:<name>:<version>", also the $id of the
	// profile's JSON Schema.
	DataSchema() string
	// Decode turns a native message into a Message: ID, From, To, Type,
	// Priority, CorrelationID, CausationID and Time from the native fields where
	// the format has them, addr where it does not; Data is native itself,
	// not copied and never re-encoded. Decode does not apply the
	// document's rules (see Validate): it fails, with a *ValidationError,
	// only when native cannot be parsed or lacks what a Message needs
	// (a type, a sender, a recipient). The Message it returns passes
	// codec.Message.Validate once SetDefaults has filled in the ID and time.
	Decode(native []byte, addr Addressing) (*codec.Message, error)
	// Validate checks native by the document's rules. A failure is a
	// *ValidationError listing every finding; it wraps ErrInvalid.
	Validate(native []byte) error
	// Strict reports whether the document wants invalid messages rejected
	// (true) or delivered with the findings attached (false: coordination).
	Strict() bool
	// Defaults are the delivery settings the document asks for.
	Defaults() Defaults
}

// Rejecter is a profile whose protocol answers a message that breaks its
// rules with a message of its own (basemessage's MESSAGE_ERROR). The bus
// sends the answer to the sender of an invalid message it dead-letters.
type Rejecter interface {
	Profile
	// Rejection returns the native answer, from agent from at time now, to
	// invalid, which failed Validate with verr.
	Rejection(invalid *codec.Message, verr error, from string, now time.Time) ([]byte, error)
}

// Addressing is what the publishing side knows beyond the native message.
type Addressing struct {
	// From is the publishing agent. It is the sender for formats that carry
	// none (frontmatter, swarm) and for a native message whose sender is
	// missing or empty; a native sender wins. "" means none.
	From string
	// To is the recipient, subjects.Broadcast ("*") for every agent. It is
	// used the same way as From. "" means none.
	To string
	// Priority, 1..5, overrides the profile's default priority. 0 means
	// none: the native priority (pipeline) or the profile's mapping applies.
	Priority int
}

// Defaults are the delivery settings a protocol document specifies. A zero
// field means the document sets none and the bus default applies.
type Defaults struct {
	// RequestTimeout is how long a request waits for its reply.
	RequestTimeout time.Duration
	// CorrelationTimeout is how long a conversation (one correlation ID)
	// stays open.
	CorrelationTimeout time.Duration
	// PublishAttempts is how many times a publish is tried, with
	// exponential backoff between tries.
	PublishAttempts int
	// DedupWindow is how long a message ID is remembered to drop duplicates.
	DedupWindow time.Duration
	// Retention is how long messages are kept.
	Retention time.Duration
}

// Content types of the native data.
const (
	ContentTypeJSON     = "application/json"
	ContentTypeMarkdown = "text/markdown"
)

// ExtFindings is the Message extension in which [Prepare] attaches the
// findings of an invalid message of a lenient profile: a JSON array of
// Finding objects, at most [MaxAttachedFindings] of them and at most
// codec.MaxExtensionLen bytes in all. Each message is cut short to a few
// hundred bytes, ending in "…", and when findings had to be left out the
// last object says how many: rule "truncated", message
// "N more findings not attached".
const ExtFindings = "profilefindings"

// MaxAttachedFindings bounds how many findings Prepare attaches, so that a
// badly broken message cannot grow the event's headers without limit.
const MaxAttachedFindings = 16

// maxAttachedMessageLen bounds, in bytes, the message of each finding
// Prepare attaches: a message quoting a long bad value would otherwise
// fill the extension on its own.
const maxAttachedMessageLen = 256

// ruleTruncated is the rule of the last finding Prepare attaches when it
// left some out.
const ruleTruncated = "truncated"

// ErrInvalid is wrapped by every *ValidationError: a native message breaks
// its document's rules or cannot be decoded.
var ErrInvalid = errors.New("profiles: invalid native message")

// Finding is one broken rule.
type Finding struct {
	// Field locates the value at fault: a JSON pointer into the native JSON
	// or into the front-matter envelope ("/content/objective"; "" for the
	// whole message), or "Addressing.From" / "Addressing.To" when the
	// sender or recipient is missing from both native and Addressing.
	Field string `json:"field"`
	// Rule names the rule: a JSON Schema keyword ("required", "enum",
	// "maxLength", "type", "format", ...), a hard rule of the document
	// ("critical_count>0 requires signal=fail"), "syntax" for input that
	// does not parse, "frontmatter" for a missing envelope, or "message"
	// for a value a Message cannot carry (see codec.Message.Validate).
	// Among attached findings (see ExtFindings), "truncated" marks the
	// last one, which counts the findings left out.
	Rule string `json:"rule"`
	// Message says what is wrong, in English.
	Message string `json:"message"`
}

// String returns "field: rule: message".
func (f Finding) String() string {
	field := f.Field
	if field == "" {
		field = "(message)"
	}
	return field + ": " + f.Rule + ": " + f.Message
}

// ValidationError lists the findings against one native message.
type ValidationError struct {
	// Profile is the name of the profile that checked the message.
	Profile string
	// Findings are in the order the checks found them; never empty.
	Findings []Finding
}

// Error returns the profile and every finding on one line.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString(ErrInvalid.Error())
	b.WriteString(" (")
	b.WriteString(e.Profile)
	b.WriteString("): ")
	for i, f := range e.Findings {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.String())
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Has reports whether some finding is at field and names rule.
func (e *ValidationError) Has(field, rule string) bool {
	return slices.ContainsFunc(e.Findings, func(f Finding) bool { return f.Field == field && f.Rule == rule })
}

func invalid(profile string, findings ...Finding) error {
	return &ValidationError{Profile: profile, Findings: findings}
}

var registry = []Profile{Frontmatter{}, BaseMessage{}, Swarm{}, Coordination{}, Pipeline{}}

// Lookup returns the profile called name.
func Lookup(name string) (Profile, bool) {
	for _, p := range registry {
		if p.Name() == name {
			return p, true
		}
	}
	return nil, false
}

// ForDataSchema returns the profile whose DataSchema is uri, the way a
// receiver finds the profile of a Message it got.
func ForDataSchema(uri string) (Profile, bool) {
	p, ok := bySchema[uri]
	return p, ok
}

// bySchema indexes the registry by DataSchema. ForDataSchema runs for every
// message a subscriber receives, so it must not build the URIs each time.
var bySchema = func() map[string]Profile {
	m := make(map[string]Profile, len(registry))
	for _, p := range registry {
		m[p.DataSchema()] = p
	}
	return m
}()

// Names returns the profile names in a fixed order.
func Names() []string {
	names := make([]string, len(registry))
	for i, p := range registry {
		names[i] = p.Name()
	}
	return names
}

// Prepare is what a publisher does with a native message: Decode it, then
// Validate it. An invalid message of a strict profile is refused with the
// *ValidationError; one of a lenient profile (coordination) is returned
// with its findings attached in Extensions[ExtFindings], as many as fit
// there (read them back with [AttachedFindings]), so it is delivered and
// the receiver can log them. An error from Decode is returned as it is.
func Prepare(p Profile, native []byte, addr Addressing) (*codec.Message, error) {
	m, err := p.Decode(native, addr)
	if err != nil {
		return nil, err
	}
	verr := p.Validate(native)
	if verr == nil {
		return m, nil
	}
	if p.Strict() {
		return nil, verr
	}
	var ve *ValidationError
	if !errors.As(verr, &ve) {
		return nil, verr
	}
	v, err := attachFindings(ve.Findings)
	if err != nil {
		return nil, fmt.Errorf("attach findings: %w", err)
	}
	if m.Extensions == nil {
		m.Extensions = make(map[string]string, 1)
	}
	m.Extensions[ExtFindings] = v
	return m, nil
}

// attachFindings returns the value of ExtFindings for fs: the first of fs,
// each message cut to maxAttachedMessageLen bytes, as many as fit in
// MaxAttachedFindings objects and codec.MaxExtensionLen bytes, the last
// object saying how many were left out if any were.
func attachFindings(fs []Finding) (string, error) {
	n := min(len(fs), MaxAttachedFindings)
	objs := make([][]byte, n, n+1)
	for i, f := range fs[:n] {
		f.Message = cutBytes(f.Message, maxAttachedMessageLen)
		b, err := json.Marshal(f)
		if err != nil {
			return "", err
		}
		objs[i] = b
	}
	for k := n; ; k-- {
		list := objs[:k]
		if left := len(fs) - k; left > 0 {
			if k == MaxAttachedFindings { // no room for the count
				continue
			}
			what := "findings"
			if left == 1 {
				what = "finding"
			}
			b, err := json.Marshal(Finding{Rule: ruleTruncated, Message: fmt.Sprintf("%d more %s not attached", left, what)})
			if err != nil {
				return "", err
			}
			list = append(list, b)
		}
		size := len("[]") + len(list) - 1
		for _, b := range list {
			size += len(b)
		}
		if size <= codec.MaxExtensionLen || k == 0 { // k == 0: the count alone, a few dozen bytes
			return "[" + string(bytes.Join(list, []byte(","))) + "]", nil
		}
	}
}

// cutBytes returns s if it is at most n bytes long, else as much of it as
// fits in n bytes with "…" after it, cut where a rune starts.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len(ellipsis)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + ellipsis
}

// cutRunes returns s if it has at most n runes, else its first n-1 runes
// and "…".
func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	runes := 0
	for i := range s {
		if runes == n-1 {
			return s[:i] + ellipsis
		}
		runes++
	}
	return s // not reached: s has more than n runes
}

// ellipsis ends a text cut short.
const ellipsis = "…"

// AttachedFindings returns the findings Prepare attached to m, or nil when
// there are none. A value that is not a JSON array of findings is an error.
func AttachedFindings(m *codec.Message) ([]Finding, error) {
	v, ok := m.Extensions[ExtFindings]
	if !ok {
		return nil, nil
	}
	var fs []Finding
	if err := json.Unmarshal([]byte(v), &fs); err != nil {
		return nil, fmt.Errorf("extension %s: %w", ExtFindings, err)
	}
	return fs, nil
}

// CountFindings returns how many findings fs, read by [AttachedFindings],
// stands for: the ones attached, and for a last one of rule "truncated"
// the findings it says were left out instead of itself.
func CountFindings(fs []Finding) int {
	n := len(fs)
	if n == 0 || fs[n-1].Rule != ruleTruncated {
		return n
	}
	var left int
	if _, err := fmt.Sscanf(fs[n-1].Message, "%d more", &left); err != nil || left < 1 {
		return n // not a count this package wrote: a finding like the others
	}
	return n - 1 + left
}

// dataSchema builds the DataSchema URI of a profile.
func dataSchema(name, version string) string {
	return "urn:agentbus:profile:" + name + ":" + version
}

// fieldNames maps the codec.Message fields a profile fills from the native
// message to the native field they came from, to name it in a Finding.
type fieldNames map[string]string

// finish applies the caller's addressing and priority to m and checks that
// the result is a Message the codecs can carry. It is the last step of
// every Decode.
func finish(profile string, m *codec.Message, addr Addressing, defaultPriority int, names fieldNames) (*codec.Message, error) {
	if m.From == "" {
		m.From = addr.From
		names["From"] = "Addressing.From"
	}
	if m.To == "" {
		m.To = addr.To
		names["To"] = "Addressing.To"
	}
	switch {
	case addr.Priority != 0:
		if err := subjects.ValidatePriority(addr.Priority); err != nil {
			return nil, invalid(profile, Finding{Field: "Addressing.Priority", Rule: "priority", Message: err.Error()})
		}
		m.Priority = addr.Priority
	case m.Priority == 0:
		m.Priority = defaultPriority
	}
	var missing []Finding
	if m.From == "" {
		missing = append(missing, Finding{Field: names["From"], Rule: "required", Message: "no sender in the message or the addressing"})
	}
	if m.To == "" {
		missing = append(missing, Finding{Field: names["To"], Rule: "required", Message: "no recipient in the message or the addressing"})
	}
	if len(missing) > 0 {
		return nil, invalid(profile, missing...)
	}
	// Check a copy with the defaults filled in, so that a Message without
	// an ID or time (the bus assigns them) is judged on what it has.
	c := *m
	c.SetDefaults(time.Unix(0, 0))
	if err := c.Validate(); err != nil {
		field := ""
		if fe, ok := errors.AsType[*codec.FieldError](err); ok {
			field = names[fe.Field]
		}
		return nil, invalid(profile, Finding{Field: field, Rule: "message", Message: err.Error()})
	}
	return m, nil
}
