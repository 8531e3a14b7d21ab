package profiles

import (
	"bytes"
	"fmt"
	"math"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/agentbus/agentbus/codec"
)

// Frontmatter is the frontmatter profile: a YAML front-matter envelope
// between two "---" lines (type, signal and typed fields), then a Markdown
// body, as frontmatter-envelope.md defines. The format carries no
// addressing: the sender and recipient come from [Addressing]. It is
// strict: the document's schema-compliance list must hold before output is
// returned.
type Frontmatter struct{}

var _ Profile = Frontmatter{}

// Name returns "frontmatter".
func (Frontmatter) Name() string { return "frontmatter" }

// Version returns "1.0", the first agentbus mapping of the document.
func (Frontmatter) Version() string { return "1.0" }

// DataSchema returns "urn:agentbus:profile:frontmatter:1.0".
func (p Frontmatter) DataSchema() string { return dataSchema(p.Name(), p.Version()) }

// Strict returns true.
func (Frontmatter) Strict() bool { return true }

// Defaults returns the zero Defaults: the document sets none for delivery.
func (Frontmatter) Defaults() Defaults { return Defaults{} }

// Decode takes Type from the envelope's type, From and To from addr. The
// format has no ID, correlation, reply reference or time. The priority
// comes from the signal: escalate 1 (a user decision is needed), blocked 2
// (work has stopped), a plan_result with has_blockers: true 2 (it triggers
// a user escalation), everything else 3.
func (p Frontmatter) Decode(native []byte, addr Addressing) (*codec.Message, error) {
	env, err := p.envelope(native)
	if err != nil {
		return nil, err
	}
	typ, _ := env["type"].(string)
	if typ == "" {
		return nil, invalid(p.Name(), Finding{Field: "/type", Rule: "required", Message: "a message type is needed to route the message"})
	}
	signal, _ := env["signal"].(string)
	blockers, _ := env["has_blockers"].(bool)
	prio := 3
	switch {
	case signal == "escalate":
		prio = 1
	case signal == "blocked", typ == "plan_result" && blockers:
		prio = 2
	}
	m := &codec.Message{
		Type:        typ,
		ContentType: ContentTypeMarkdown,
		DataSchema:  p.DataSchema(),
		Data:        native,
	}
	return finish(p.Name(), m, addr, prio, fieldNames{"Type": "/type"})
}

// Validate parses the envelope and checks it against
// schemas/frontmatter.schema.json: the type and signal enums, the signals
// each type may send, the required fields per type, the field enums and
// the hard rules. The Markdown body is not checked.
func (p Frontmatter) Validate(native []byte) error {
	env, err := p.envelope(native)
	if err != nil {
		return err
	}
	return validateValue(p.Name(), env)
}

// Envelope returns the front matter of native decoded as the JSON value the
// schema describes (maps, slices, strings, float64 or int numbers, bools,
// nil), and the Markdown body after it. A document that does not start
// with a "---" line, has no closing "---" line, or whose envelope is not a
// YAML mapping fails with a *ValidationError.
func (p Frontmatter) Envelope(native []byte) (envelope map[string]any, body []byte, err error) {
	head, body, ok := splitFrontmatter(native)
	if !ok {
		return nil, nil, invalid(p.Name(), Finding{Rule: "frontmatter", Message: `no YAML front matter: the document must start with a "---" line and close the envelope with another`})
	}
	var v any
	if err := yaml.Unmarshal(head, &v); err != nil {
		return nil, nil, invalid(p.Name(), syntaxFinding(err))
	}
	env, ok := jsonValue(v).(map[string]any)
	if !ok {
		return nil, nil, invalid(p.Name(), Finding{Rule: "type", Message: "the front matter is not a YAML mapping"})
	}
	return env, body, nil
}

func (p Frontmatter) envelope(native []byte) (map[string]any, error) {
	env, _, err := p.Envelope(native)
	return env, err
}

// splitFrontmatter splits "---\n<yaml>\n---\n<body>" into the YAML and the
// body. Lines may end in CRLF; the closing line may end the document.
func splitFrontmatter(doc []byte) (head, body []byte, ok bool) {
	rest, ok := cutLine(doc, "---")
	if !ok {
		return nil, nil, false
	}
	for off := 0; off <= len(rest); {
		line := rest[off:]
		if after, ok := cutLine(line, "---"); ok {
			return rest[:off], after, true
		}
		i := bytes.IndexByte(line, '\n')
		if i < 0 {
			break
		}
		off += i + 1
	}
	return nil, nil, false
}

// cutLine reports whether b starts with the line text, ended by LF, CRLF or
// the end of b, and returns what follows the line.
func cutLine(b []byte, text string) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(text))
	if !ok {
		return nil, false
	}
	switch {
	case len(rest) == 0:
		return rest, true
	case rest[0] == '\n':
		return rest[1:], true
	case len(rest) > 1 && rest[0] == '\r' && rest[1] == '\n':
		return rest[2:], true
	}
	return nil, false
}

// jsonValue turns what yaml.v3 decodes into a JSON value: maps with
// non-string keys get their keys printed, times become RFC 3339 strings,
// and NaN and infinities, which JSON cannot hold, become strings.
func jsonValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonValue(e)
		}
		return v
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = jsonValue(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = jsonValue(e)
		}
		return v
	case time.Time:
		return v.Format(time.RFC3339Nano)
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v)
		}
		return v
	case nil, bool, string, int, int64, uint64:
		return v
	default:
		return fmt.Sprint(v)
	}
}
