package profiles

import (
	"github.com/agentbus/agentbus/codec"
)

// Swarm is the swarm profile: the JSON messages of swarm.md, identified by
// their schema member. The format carries no addressing: the sender and
// recipient come from [Addressing]. It is strict: the document has the Lead
// flag and send back messages that deviate from the schema.
type Swarm struct{}

var _ Profile = Swarm{}

// Name returns "swarm".
func (Swarm) Name() string { return "swarm" }

// Version returns "1.0", the first agentbus mapping of the document.
func (Swarm) Version() string { return "1.0" }

// DataSchema returns "urn:agentbus:profile:swarm:1.0".
func (p Swarm) DataSchema() string { return dataSchema(p.Name(), p.Version()) }

// Strict returns true.
func (Swarm) Strict() bool { return true }

// Defaults returns the zero Defaults: the document sets none for delivery.
func (Swarm) Defaults() Defaults { return Defaults{} }

// Swarm message types without a schema member of their own, and the type
// of "$schema": "component-assignment".
const (
	SwarmComponentAssignment = "ComponentAssignment"
	SwarmContextBundle       = "ContextBundle"
	SwarmArchitectPlan       = "ArchitectPlan"
)

// SwarmType returns the type of a swarm message: its schema member
// ("ComponentHandoff", ...); ComponentAssignment for the document's
// "$schema": "component-assignment"; and, for an object with neither,
// ArchitectPlan when it has a goal and ContextBundle when it has a run_dir.
// It returns "" when native is not a JSON object or none of these applies.
func SwarmType(native []byte) string {
	o, err := parseObject("swarm", native)
	if err != nil {
		return ""
	}
	return swarmType(o)
}

func swarmType(o object) string {
	switch {
	case o.has("schema"):
		return o.str("schema")
	case o.has("$schema"):
		if o.str("$schema") == "component-assignment" {
			return SwarmComponentAssignment
		}
		return ""
	case o.has("goal"):
		return SwarmArchitectPlan
	case o.has("run_dir"):
		return SwarmContextBundle
	}
	return ""
}

// Decode takes the type from [SwarmType], From and To from addr,
// component_id as CorrelationID (it threads a component through assignment,
// review and test), and timestamp, which only ReviewFindings has, as Time.
// The priority: HandoffRequest and HandoffSummary 2 (an agent is running
// out of context), everything else 3.
func (p Swarm) Decode(native []byte, addr Addressing) (*codec.Message, error) {
	o, err := parseObject(p.Name(), native)
	if err != nil {
		return nil, err
	}
	typ := swarmType(o)
	if typ == "" {
		return nil, invalid(p.Name(), Finding{Field: "/schema", Rule: "required", Message: "not a swarm message: no schema member and not a context bundle or architect plan"})
	}
	m := &codec.Message{
		Type:          typ,
		CorrelationID: o.str("component_id"),
		Time:          o.timestamp("timestamp"),
		ContentType:   ContentTypeJSON,
		DataSchema:    p.DataSchema(),
		Data:          native,
	}
	prio := 3
	if typ == "HandoffRequest" || typ == "HandoffSummary" {
		prio = 2
	}
	return finish(p.Name(), m, addr, prio, fieldNames{
		"Type": "/schema", "CorrelationID": "/component_id", "Time": "/timestamp",
	})
}

// Validate checks native against schemas/swarm.schema.json.
func (p Swarm) Validate(native []byte) error { return validateJSON(p.Name(), native) }
