package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/agentbus/agentbus/bus"
)

// Event is one line of the demo's timeline.
type Event struct {
	// Elapsed is the time since the demo started.
	Elapsed time.Duration
	// Scene is the scene the event belongs to (see Scenes), or "setup" and
	// "teardown" around them.
	Scene string
	// From, To, Type, Priority and ID describe the message the event is
	// about, as the bus addressed it; they are empty for events about an
	// agent or the demo. From alone names the agent process of such an
	// event ("worker#1").
	From, To string
	Type     string
	Priority int
	ID       string
	// Event says what happened; see the Event* constants.
	Event string
	// Detail says it in words.
	Detail string
}

// The kinds of event.
const (
	EventStart        = "start"         // setup: the server, the stream, the agents
	EventScene        = "scene"         // a scene begins; Detail is its title
	EventOnline       = "online"        // an agent process subscribed to its inbox
	EventQueued       = "queued"        // published while its recipient does not take it yet
	EventPublished    = "published"     // published, stored by the server
	EventDuplicate    = "duplicate"     // published again with the same ID and dropped by the server
	EventHandled      = "handled"       // a handler succeeded
	EventTaken        = "taken"         // a handler started and never finished
	EventCrashed      = "crashed"       // an agent process lost its connection without settling
	EventRedelivered  = "redelivered"   // handled on a later delivery after a crash
	EventFailed       = "failed"        // a handler failed; the message is retried after a backoff
	EventExpired      = "expired"       // the message's TTL passed before anyone handled it
	EventRequest      = "request"       // a request is sent; its sender waits for the reply
	EventReplied      = "replied"       // the receiver of a request answered it
	EventReply        = "reply"         // the requester got its reply
	EventDeadLettered = "dead_lettered" // the message is on the dead-letter stream
	EventTrace        = "trace"         // the conversation's trace ID
	EventRecord       = "record"        // one message of the conversation and its lifecycle state
	EventWarning      = "warning"       // a bus reported an error in the background
	EventOK           = "ok"            // a scene showed what it was meant to
	EventFail         = "fail"          // a scene did not; Detail says why
	EventOffline      = "offline"       // the registry found an agent gone, or its process stopped
	EventEscalated    = "escalated"     // an outage reached the human inbox
	EventRecovered    = "recovered"     // the agent is back; the human inbox is told
	EventProgress     = "progress"      // a progress update on a request reached the requester
	EventCancel       = "cancel"        // a message is canceled (Bus.Cancel)
	EventCanceled     = "canceled"      // what a cancel ended: the Request, the handler, the record
	EventDeadline     = "deadline"      // a deadline of a request passed while its requester waited
	EventGathered     = "gathered"      // a requester of many proceeds with the replies it wanted; Detail says who did what
	EventStop         = "stop"          // teardown
)

// messageEvent returns the event about m.
func messageEvent(m *bus.Message, event, detail string) Event {
	return Event{From: m.From, To: m.To, Type: m.Type, Priority: m.Priority, ID: m.ID, Event: event, Detail: detail}
}

// jsonEvent is an Event as a JSON line.
type jsonEvent struct {
	ElapsedMS int64  `json:"elapsed_ms"`
	Scene     string `json:"scene"`
	From      string `json:"from"`
	To        string `json:"to"`
	Type      string `json:"type"`
	Priority  int    `json:"priority"`
	ID        string `json:"id"`
	Event     string `json:"event"`
	Detail    string `json:"detail"`
}

// MarshalJSON writes the event as one JSON object with the members
// elapsed_ms, scene, from, to, type, priority, id, event and detail, all of
// them always present.
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(jsonEvent{
		ElapsedMS: e.Elapsed.Milliseconds(), Scene: e.Scene, From: e.From, To: e.To,
		Type: e.Type, Priority: e.Priority, ID: e.ID, Event: e.Event, Detail: e.Detail,
	})
}

// Column widths of the timeline.
const (
	partyWidth = len("orchestrator -> reviewer")
	typeWidth  = len("VALIDATION_RESPONSE")
	idWidth    = len("val-1-reply")
)

// String returns the event as a line of the human timeline, with the
// message's addressing, priority, type and ID in columns:
//
//	+0.061s  orchestrator -> worker   p1 ESCALATION_REQUEST  esc-1       escalation queued last
//
// An event about no message is the time and the detail. A scene's first
// event is a heading, and its result is indented under its lines.
func (e Event) String() string {
	switch {
	case e.Event == EventScene:
		return fmt.Sprintf("\n[%s] %s", e.Scene, e.Detail)
	case e.Event == EventOK:
		return "         ok: " + e.Detail
	case e.Event == EventFail:
		return "         FAILED: " + e.Detail
	case e.Type == "" && e.ID == "":
		return fmt.Sprintf("+%.3fs  %s", e.Elapsed.Seconds(), e.Detail)
	}
	party := e.From
	if e.To != "" {
		party += " -> " + e.To
	}
	prio := "  "
	if e.Priority > 0 {
		prio = "p" + strconv.Itoa(e.Priority)
	}
	line := fmt.Sprintf("+%.3fs  %-*s %s %-*s %-*s %s", e.Elapsed.Seconds(),
		partyWidth, party, prio, typeWidth, e.Type, idWidth, e.ID, e.Detail)
	return strings.TrimRight(line, " ")
}

// Report is how the demo went.
type Report struct {
	// OK reports that every scene showed what it was meant to.
	OK bool
	// Elapsed is how long the demo ran.
	Elapsed time.Duration
	// Conversation is the correlation ID every scene's messages share, and
	// TraceID its OpenTelemetry trace ID (bus.ConversationTraceID).
	Conversation, TraceID string
	// Scenes are the scenes that ran, in order; after a failure the later
	// ones are missing.
	Scenes []SceneResult
	// Error is why the demo failed, "" if it did not.
	Error string
}

// SceneResult is the outcome of one scene.
type SceneResult struct {
	Scene string `json:"scene"`
	OK    bool   `json:"ok"`
	// Detail says what the scene showed, or why it failed.
	Detail string `json:"detail"`
}

// MarshalJSON writes the report as the final JSON line: event "summary",
// ok, elapsed_ms, conversation, trace_id, scenes and, on failure, error.
func (r Report) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Event        string        `json:"event"`
		OK           bool          `json:"ok"`
		ElapsedMS    int64         `json:"elapsed_ms"`
		Conversation string        `json:"conversation"`
		TraceID      string        `json:"trace_id"`
		Scenes       []SceneResult `json:"scenes"`
		Error        string        `json:"error,omitempty"`
	}{"summary", r.OK, r.Elapsed.Milliseconds(), r.Conversation, r.TraceID, r.Scenes, r.Error})
}

// String returns the report's closing line for a person.
func (r Report) String() string {
	passed := 0
	for _, s := range r.Scenes {
		if s.OK {
			passed++
		}
	}
	if r.OK {
		return fmt.Sprintf("\nagentbus demo: all %d scenes ok in %.1fs; conversation %s is trace %s",
			passed, r.Elapsed.Seconds(), r.Conversation, r.TraceID)
	}
	return fmt.Sprintf("\nagentbus demo: FAILED after %.1fs, %d of %d scenes ok: %s",
		r.Elapsed.Seconds(), passed, len(scenes), r.Error)
}

// Printer writes the timeline and the report, as text for a person or as
// JSON Lines. Its methods are not safe for concurrent use; Run calls
// Options.Events from one goroutine at a time.
type Printer struct {
	w       io.Writer
	jsonl   bool
	started bool
	err     error
}

// textHeading is the first line of the text timeline.
const textHeading = "agentbus demo: time since start, sender -> recipient, priority, type, message ID, what happened"

// NewPrinter returns a printer writing to w, JSON Lines if jsonLines.
func NewPrinter(w io.Writer, jsonLines bool) *Printer {
	return &Printer{w: w, jsonl: jsonLines}
}

// Event writes e.
func (p *Printer) Event(e Event) { p.write(e) }

// Report writes r, the last line.
func (p *Printer) Report(r Report) { p.write(r) }

// Err returns the first write error.
func (p *Printer) Err() error { return p.err }

func (p *Printer) write(v interface {
	json.Marshaler
	fmt.Stringer
}) {
	if p.err != nil {
		return
	}
	var line []byte
	if !p.jsonl && !p.started {
		line = append([]byte(textHeading), '\n')
	}
	p.started = true
	if p.jsonl {
		if line, p.err = v.MarshalJSON(); p.err != nil {
			return
		}
	} else {
		line = append(line, v.String()...)
	}
	_, p.err = p.w.Write(append(line, '\n'))
}
