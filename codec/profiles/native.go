package profiles

import (
	"encoding/json"
	"math"
	"time"

	"github.com/agentbus/agentbus/codec/internal/rfc3339"
)

// object is a native JSON object whose members are decoded on demand, so
// that a member of the wrong type spoils only itself.
type object map[string]json.RawMessage

// parseObject decodes native as one JSON object.
func parseObject(profile string, native []byte) (object, error) {
	var o object
	if err := json.Unmarshal(native, &o); err != nil {
		return nil, invalid(profile, syntaxFinding(err))
	}
	if o == nil { // the JSON was null
		return nil, invalid(profile, Finding{Rule: "type", Message: "not a JSON object"})
	}
	return o, nil
}

// str returns the member name if it is a JSON string, else "".
func (o object) str(name string) string {
	raw, ok := o[name]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// obj returns the member name if it is a JSON object, else nil.
func (o object) obj(name string) object {
	raw, ok := o[name]
	if !ok {
		return nil
	}
	var v object
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return v
}

// integer returns the member name if it is a JSON number with an integer
// value, as JSON Schema's "integer" has it (1, 1.0 and 1e0 alike), else
// 0, false.
func (o object) integer(name string) (int, bool) {
	raw, ok := o[name]
	if !ok {
		return 0, false
	}
	var n int
	if json.Unmarshal(raw, &n) == nil {
		return n, true
	}
	// Not in integer syntax: a whole number written with a fraction or an
	// exponent. Beyond 2^53 float64 may not hold it exactly, which no
	// member read here (a priority, a percentage) comes near.
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f < math.MinInt || f >= math.MaxInt {
		return 0, false
	}
	return int(f), true
}

// has reports whether the member name is present.
func (o object) has(name string) bool {
	_, ok := o[name]
	return ok
}

// timestamp returns the member name if it is an RFC 3339 time, "t" and
// "z" in either case as the schemas' date-time allows, else the zero
// Time. A time the document allows but RFC 3339 does not (no zone) is
// left for Validate to report.
func (o object) timestamp(name string) time.Time {
	t, ok := rfc3339.Parse(o.str(name))
	if !ok {
		return time.Time{}
	}
	return t
}
