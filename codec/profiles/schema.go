package profiles

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// The JSON Schemas (draft 2020-12), one per profile, named
// schemas/<profile>.schema.json. docs/schemas in the repository holds the
// same files for agents that validate on their side.
//
//go:embed schemas/*.schema.json
var schemaFS embed.FS

// SchemaJSON returns the profile's JSON Schema (draft 2020-12) as published
// in docs/schemas/<name>.schema.json. For frontmatter it describes the
// envelope as the JSON value its YAML decodes to.
func SchemaJSON(name string) ([]byte, bool) {
	b, err := schemaFS.ReadFile("schemas/" + name + ".schema.json")
	return b, err == nil
}

// ruleKeyword is the annotation that names a hard rule of a document in the
// schemas: a finding inside a subschema carrying it takes its value as Rule.
const ruleKeyword = "x-rule"

// schema is one compiled profile schema and the raw document, which is
// searched for ruleKeyword annotations.
type schema struct {
	compiled *jsonschema.Schema
	raw      any
}

var (
	schemasOnce sync.Once
	schemas     map[string]*schema
	schemasErr  error
)

// loadSchemas compiles every embedded schema once. A failure is a bug in
// the embedded files, caught by the tests.
func loadSchemas() (map[string]*schema, error) {
	schemasOnce.Do(func() {
		entries, err := schemaFS.ReadDir("schemas")
		if err != nil {
			schemasErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		ids := make(map[string]string)
		raws := make(map[string]any)
		for _, e := range entries {
			name := strings.TrimSuffix(e.Name(), ".schema.json")
			b, err := schemaFS.ReadFile("schemas/" + e.Name())
			if err != nil {
				schemasErr = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				schemasErr = fmt.Errorf("schema %s: %w", name, err)
				return
			}
			id, _ := doc.(map[string]any)["$id"].(string)
			if err := c.AddResource(id, doc); err != nil {
				schemasErr = fmt.Errorf("schema %s: %w", name, err)
				return
			}
			ids[name], raws[name] = id, doc
		}
		schemas = make(map[string]*schema, len(ids))
		for name, id := range ids {
			sch, err := c.Compile(id)
			if err != nil {
				schemasErr = fmt.Errorf("schema %s: %w", name, err)
				return
			}
			schemas[name] = &schema{compiled: sch, raw: raws[name]}
		}
	})
	return schemas, schemasErr
}

// validateJSON parses native as one JSON value and checks it against the
// profile's schema.
func validateJSON(profile string, native []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(native))
	if err != nil {
		return invalid(profile, syntaxFinding(err))
	}
	return validateValue(profile, v)
}

// validateValue checks an already parsed value against the profile's schema.
func validateValue(profile string, v any) error {
	all, err := loadSchemas()
	if err != nil {
		return fmt.Errorf("load schemas: %w", err)
	}
	s, ok := all[profile]
	if !ok {
		return fmt.Errorf("no schema for profile %s", profile)
	}
	err = s.compiled.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return invalid(profile, Finding{Rule: "schema", Message: err.Error()})
	}
	var fs []Finding
	s.collect(ve, &fs)
	if len(fs) == 0 { // cannot happen: a failed validation has a leaf
		fs = append(fs, Finding{Rule: "schema", Message: ve.Error()})
	}
	// The validator walks maps, so sort for a stable order.
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(strings.Compare(a.Field, b.Field), strings.Compare(a.Rule, b.Rule), strings.Compare(a.Message, b.Message))
	})
	return invalid(profile, fs...)
}

var printer = message.NewPrinter(language.English)

// collect appends a Finding for every leaf of the validation error tree.
func (s *schema) collect(e *jsonschema.ValidationError, fs *[]Finding) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			s.collect(c, fs)
		}
		return
	}
	field := pointer(e.InstanceLocation)
	kw := e.ErrorKind.KeywordPath()
	rule := ""
	if len(kw) > 0 {
		rule = kw[0]
	}
	if r := s.hardRule(e.SchemaURL); r != "" {
		rule = r
	}
	if req, ok := e.ErrorKind.(*kind.Required); ok {
		for _, name := range req.Missing {
			*fs = append(*fs, Finding{
				Field:   pointer(append(e.InstanceLocation[:len(e.InstanceLocation):len(e.InstanceLocation)], name)),
				Rule:    rule,
				Message: "missing required field " + strconvQuote(name),
			})
		}
		return
	}
	if rule == "" {
		rule = "schema"
	}
	*fs = append(*fs, Finding{Field: field, Rule: rule, Message: e.ErrorKind.LocalizedString(printer)})
}

// hardRule returns the ruleKeyword annotation of the innermost subschema
// on the path to the schema at schemaURL ("<id>#/json/pointer"), or "".
func (s *schema) hardRule(schemaURL string) string {
	_, frag, ok := strings.Cut(schemaURL, "#")
	if !ok {
		return ""
	}
	var toks []string
	if frag != "" {
		for _, t := range strings.Split(strings.TrimPrefix(frag, "/"), "/") {
			t, err := url.PathUnescape(t)
			if err != nil {
				return ""
			}
			toks = append(toks, strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~"))
		}
	}
	rule := ""
	node := s.raw
	for i := 0; ; i++ {
		obj, isObj := node.(map[string]any)
		if isObj {
			if r, ok := obj[ruleKeyword].(string); ok {
				rule = r
			}
		}
		if i == len(toks) {
			return rule
		}
		switch n := node.(type) {
		case map[string]any:
			node = n[toks[i]]
		case []any:
			var idx int
			if _, err := fmt.Sscanf(toks[i], "%d", &idx); err != nil || idx < 0 || idx >= len(n) {
				return rule
			}
			node = n[idx]
		default:
			return rule
		}
	}
}

// pointer writes tokens as a JSON pointer (RFC 6901).
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

func syntaxFinding(err error) Finding {
	return Finding{Rule: "syntax", Message: err.Error()}
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
