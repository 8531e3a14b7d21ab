package profiles

import "github.com/agentbus/agentbus/codec"

// Coordination is the coordination profile: the JSON task_assignment,
// status_update, question and result messages of coordination.md, with
// from, to, timestamp and content. It is lenient: the document says
// invalid messages are logged but must not block, so [Prepare] delivers
// them with their findings attached.
type Coordination struct{}

var _ Profile = Coordination{}

// Name returns "coordination".
func (Coordination) Name() string { return "coordination" }

// Version returns "1.0", the first agentbus mapping of the document.
func (Coordination) Version() string { return "1.0" }

// DataSchema returns "urn:agentbus:profile:coordination:1.0".
func (p Coordination) DataSchema() string { return dataSchema(p.Name(), p.Version()) }

// Strict returns false.
func (Coordination) Strict() bool { return false }

// Defaults returns the zero Defaults: the document sets none.
func (Coordination) Defaults() Defaults { return Defaults{} }

// Decode maps from, to, type and timestamp, and content.taskId to
// CorrelationID (result messages carry none). The format has no message ID
// and no reply reference. The priority: question 2; status_update and
// result whose content.status is blocked or failed 2; other results and
// task_assignment 3; other status updates 4.
func (p Coordination) Decode(native []byte, addr Addressing) (*codec.Message, error) {
	o, err := parseObject(p.Name(), native)
	if err != nil {
		return nil, err
	}
	typ := o.str("type")
	if typ == "" {
		return nil, invalid(p.Name(), Finding{Field: "/type", Rule: "required", Message: "a message type is needed to route the message"})
	}
	content := o.obj("content")
	m := &codec.Message{
		From:          o.str("from"),
		To:            o.str("to"),
		Type:          typ,
		CorrelationID: content.str("taskId"),
		Time:          o.timestamp("timestamp"),
		ContentType:   ContentTypeJSON,
		DataSchema:    p.DataSchema(),
		Data:          native,
	}
	return finish(p.Name(), m, addr, coordinationPriority(typ, content.str("status")), fieldNames{
		"From": "/from", "To": "/to", "Type": "/type", "CorrelationID": "/content/taskId", "Time": "/timestamp",
	})
}

func coordinationPriority(typ, status string) int {
	stuck := status == "blocked" || status == "failed"
	switch {
	case typ == "question", stuck && (typ == "status_update" || typ == "result"):
		return 2
	case typ == "status_update":
		return 4
	default:
		return 3
	}
}

// Validate checks native against schemas/coordination.schema.json.
func (p Coordination) Validate(native []byte) error { return validateJSON(p.Name(), native) }
