package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// The agents of the demo speak three of the protocols of docs/protocols.md,
// with messages shaped after the examples in the protocols' documents:
//
//   - Pipeline Broker messages (pipeline.md) for the work items: the
//     orchestrator's "develop" and "review_pr" messages carry their own
//     priority, 1..5, which becomes the bus priority.
//   - basemessage (base-message.md) for the escalation, the review request
//     and its reply: the message type decides the priority
//     (ESCALATION_REQUEST is 1), and correlationId names the conversation.
//   - swarm (swarm.md) for the review round: the Lead forwards an
//     implementer's ComponentHandoff to the reviewers, who answer with a
//     ReviewResult. The messages carry no addressing (it comes from the
//     transport), and component_id names the conversation.

// pipelineMessage is a Pipeline Broker message.
type pipelineMessage struct {
	ID        string         `json:"id"`
	From      string         `json:"from"`
	To        string         `json:"to"`
	Subject   string         `json:"subject"`
	Body      map[string]any `json:"body"`
	Priority  int            `json:"priority,omitempty"`
	Timestamp string         `json:"timestamp"`
	ReplyTo   *string        `json:"replyTo"`
	Status    string         `json:"status"`
}

// develop is the pipeline's work item: issue number index of total in a
// phase, for agent to at the given priority.
func develop(id, to, issue string, priority, index, total int) pipelineMessage {
	return pipelineMessage{
		ID: id, From: orchestrator, To: to, Subject: "develop", Priority: priority,
		Body:      map[string]any{"issue": issue, "phase": 2, "totalIssues": total, "currentIndex": index},
		Timestamp: now(), Status: "pending",
	}
}

// baseMessage is a basemessage message.
type baseMessage struct {
	MessageID     string `json:"messageId"`
	CorrelationID string `json:"correlationId"`
	Timestamp     string `json:"timestamp"`
	From          string `json:"from"`
	To            string `json:"to"`
	Type          string `json:"type"`
	Version       string `json:"version"`
	ReplyTo       string `json:"replyTo,omitempty"`
	Payload       any    `json:"payload"`
}

// escalationRequest is the payload of an ESCALATION_REQUEST.
type escalationRequest struct {
	TaskID         string           `json:"taskId"`
	EscalationType string           `json:"escalationType"`
	Reason         string           `json:"reason"`
	FailureHistory []failureAttempt `json:"failureHistory"`
	Context        map[string]any   `json:"context"`
}

type failureAttempt struct {
	Agent     string `json:"agent"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"lastError"`
}

// validationRequest is the payload of a VALIDATION_REQUEST.
type validationRequest struct {
	TaskID         string         `json:"taskId"`
	ValidationType string         `json:"validationType"`
	Subject        string         `json:"subject"`
	Details        map[string]any `json:"details"`
}

// validationResponse is the payload of a VALIDATION_RESPONSE.
type validationResponse struct {
	TaskID   string   `json:"taskId"`
	Decision string   `json:"decision"`
	Reasons  []string `json:"reasons"`
}

// componentHandoff is a swarm ComponentHandoff: an implementer's
// finished component, which the Lead forwards for review.
type componentHandoff struct {
	Schema        string   `json:"schema"`
	ComponentID   string   `json:"component_id"`
	Status        string   `json:"status"`
	FilesCreated  []string `json:"files_created"`
	FilesModified []string `json:"files_modified"`
	Summary       string   `json:"summary"`
	Notes         *string  `json:"notes"`
	Attempt       int      `json:"attempt"`
	TurnCount     int      `json:"turn_count"`
}

// reviewResult is a swarm ReviewResult: a reviewer's verdict on a
// component.
type reviewResult struct {
	Schema      string        `json:"schema"`
	ComponentID string        `json:"component_id"`
	Verdict     string        `json:"verdict"`
	Issues      []reviewIssue `json:"issues"`
	Notes       *string       `json:"notes"`
	TurnCount   int           `json:"turn_count"`
}

type reviewIssue struct {
	Severity     string `json:"severity"`
	File         string `json:"file"`
	Line         *int   `json:"line"`
	Description  string `json:"description"`
	SuggestedFix string `json:"suggested_fix"`
}

// now is a native timestamp: RFC 3339 in UTC, to the millisecond as the
// documents' examples write it.
func now() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// send publishes a native message of a protocol that names the
// conversation itself (basemessage's correlationId) as it is, with
// PublishNative: the profile reads the sender, recipient, type, priority,
// ID and correlation from the native fields and validates the message
// before it goes out. It returns the message as the bus sees it, for the
// timeline.
func (a *agent) send(ctx context.Context, p profiles.Profile, native any) (bus.PubAck, *bus.Message, error) {
	data, err := json.Marshal(native)
	if err != nil {
		return bus.PubAck{}, nil, err
	}
	ack, err := a.bus.PublishNative(ctx, p, data, profiles.Addressing{})
	if err != nil {
		return bus.PubAck{}, nil, err
	}
	m, err := p.Decode(data, profiles.Addressing{})
	if err != nil {
		return bus.PubAck{}, nil, err
	}
	return ack, m, nil
}

// prepare decodes and validates a native message the way PublishNative
// does, and puts it into the demo's conversation if its protocol has no
// correlation field (the Pipeline Broker format has none). The caller may
// set more of the Message, such as a TTL, before it publishes it.
func prepare(p profiles.Profile, native any) (*bus.Message, error) {
	data, err := json.Marshal(native)
	if err != nil {
		return nil, err
	}
	m, err := profiles.Prepare(p, data, profiles.Addressing{})
	if err != nil {
		return nil, fmt.Errorf("%s message: %w", p.Name(), err)
	}
	if m.CorrelationID == "" {
		m.CorrelationID = Conversation
	}
	return m, nil
}

// prepareSwarm decodes and validates a swarm message from agent from to
// agent (or group) to: the format carries no addressing, so it comes from
// the transport, as profiles.Addressing.
func prepareSwarm(native any, from, to string) (*bus.Message, error) {
	data, err := json.Marshal(native)
	if err != nil {
		return nil, err
	}
	m, err := profiles.Prepare(profiles.Swarm{}, data, profiles.Addressing{From: from, To: to})
	if err != nil {
		return nil, fmt.Errorf("swarm message: %w", err)
	}
	return m, nil
}

// sendInConversation publishes a pipeline message (see prepare) with an
// optional TTL.
func (a *agent) sendInConversation(ctx context.Context, p profiles.Profile, native any, ttl time.Duration) (bus.PubAck, *bus.Message, error) {
	m, err := prepare(p, native)
	if err != nil {
		return bus.PubAck{}, nil, err
	}
	m.TTL = ttl
	ack, err := a.bus.Publish(ctx, *m)
	return ack, m, err
}
