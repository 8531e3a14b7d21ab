package profiles

import (
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Pipeline is the pipeline profile: the JSON Pipeline Broker messages of
// pipeline.md with id, from, to, subject, body, priority 1..5, timestamp,
// replyTo and status. It is strict.
type Pipeline struct{}

var _ Profile = Pipeline{}

// pipelinePriority is the document's per-subject table, the priority of a
// message that gives none.
var pipelinePriority = map[string]int{
	"develop":               4,
	"fix_review_changes":    4,
	"session_reset":         5,
	"issue_complete":        4,
	"issue_failed":          4,
	"ready":                 5,
	"alert":                 2,
	"needs_human":           2,
	"review_pr":             4,
	"review_approved":       3,
	"review_changes":        3,
	"auto_advance":          3,
	"auto_advance_complete": 3,
	"phase_ready":           4,
	"stop":                  1,
	"error":                 1,
	"info":                  5,
}

// Name returns "pipeline".
func (Pipeline) Name() string { return "pipeline" }

// Version returns "1.0", the first agentbus mapping of the document.
func (Pipeline) Version() string { return "1.0" }

// DataSchema returns "urn:agentbus:profile:pipeline:1.0".
func (p Pipeline) DataSchema() string { return dataSchema(p.Name(), p.Version()) }

// Strict returns true.
func (Pipeline) Strict() bool { return true }

// Defaults returns the zero Defaults: the document's delivery rules
// (priority order, FIFO within a priority, queueing while offline) are the
// bus's own behaviour, and it sets no timeouts or retention.
func (Pipeline) Defaults() Defaults { return Defaults{} }

// Decode maps id to ID, from, to ("*" is a broadcast), subject to Type,
// replyTo to CausationID and timestamp to Time. The priority is the message's
// own when it is an integer 1..5, else the document's table for the
// subject, else 3.
func (p Pipeline) Decode(native []byte, addr Addressing) (*codec.Message, error) {
	o, err := parseObject(p.Name(), native)
	if err != nil {
		return nil, err
	}
	subject := o.str("subject")
	if subject == "" {
		return nil, invalid(p.Name(), Finding{Field: "/subject", Rule: "required", Message: "a subject is needed to route the message"})
	}
	m := &codec.Message{
		ID:          o.str("id"),
		From:        o.str("from"),
		To:          o.str("to"),
		Type:        subject,
		CausationID: o.str("replyTo"),
		Time:        o.timestamp("timestamp"),
		ContentType: ContentTypeJSON,
		DataSchema:  p.DataSchema(),
		Data:        native,
	}
	if n, ok := o.integer("priority"); ok && subjects.ValidatePriority(n) == nil {
		m.Priority = n
	}
	prio, ok := pipelinePriority[subject]
	if !ok {
		prio = subjects.DefaultPriority
	}
	return finish(p.Name(), m, addr, prio, fieldNames{
		"ID": "/id", "From": "/from", "To": "/to", "Type": "/subject", "CausationID": "/replyTo", "Time": "/timestamp",
	})
}

// Validate checks native against schemas/pipeline.schema.json.
func (p Pipeline) Validate(native []byte) error { return validateJSON(p.Name(), native) }
