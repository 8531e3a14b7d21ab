package profiles

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentbus/agentbus/codec"
)

// Update is one progress update on a task, in the terms the protocols'
// status messages share: what is happening and, if known, how much of it
// is done (0 to 100).
type Update struct {
	Message string
	Percent *int
}

// Progresser is a profile whose protocol has a status message of its own
// for progress on a task: basemessage (STATUS_UPDATE, status PROGRESS) and
// coordination (status_update, status in_progress). The bus sends a
// handler's progress on a message of such a profile as that message.
type Progresser interface {
	Profile
	// StatusUpdate returns the native status update u on task, a message
	// of the profile, from agent from to task's sender, at now.
	StatusUpdate(task *codec.Message, u Update, from string, now time.Time) ([]byte, error)
	// ReadUpdate reads a status update StatusUpdate made back; ok is
	// false when native is not one.
	ReadUpdate(native []byte) (u Update, ok bool)
}

var (
	_ Progresser = BaseMessage{}
	_ Progresser = Coordination{}
)

// taskOf returns the task ID of a native message: its payload's (or
// content's) taskId, else its message ID.
func taskOf(task *codec.Message, body string) string {
	var o object
	if json.Unmarshal(task.Data, &o) == nil {
		if id := o.obj(body).str("taskId"); id != "" {
			return id
		}
	}
	return task.ID
}

// StatusUpdate returns a STATUS_UPDATE with status PROGRESS on task:
// payload.taskId is the task's (or its messageId), progress the percentage,
// details the message; replyTo and correlationId tie it to the task.
func (p BaseMessage) StatusUpdate(task *codec.Message, u Update, from string, now time.Time) ([]byte, error) {
	if from == "" || task.From == "" {
		return nil, fmt.Errorf("%w: a status update needs a sender and a recipient", ErrInvalid)
	}
	type payload struct {
		TaskID   string `json:"taskId"`
		Status   string `json:"status"`
		Progress *int   `json:"progress,omitempty"`
		Details  string `json:"details,omitempty"`
	}
	correlation := task.CorrelationID
	if correlation == "" {
		correlation = task.ID
	}
	return json.Marshal(struct {
		MessageID     string  `json:"messageId"`
		CorrelationID string  `json:"correlationId"`
		ReplyTo       string  `json:"replyTo"`
		Timestamp     string  `json:"timestamp"`
		From          string  `json:"from"`
		To            string  `json:"to"`
		Type          string  `json:"type"`
		Version       string  `json:"version"`
		Payload       payload `json:"payload"`
	}{
		MessageID: codec.NewID(), CorrelationID: correlation, ReplyTo: task.ID,
		Timestamp: now.UTC().Format(time.RFC3339Nano), From: from, To: task.From,
		Type: "STATUS_UPDATE", Version: p.Version(),
		Payload: payload{TaskID: taskOf(task, "payload"), Status: "PROGRESS", Progress: u.Percent, Details: u.Message},
	})
}

// ReadUpdate reads a STATUS_UPDATE: details and progress.
func (BaseMessage) ReadUpdate(native []byte) (Update, bool) {
	var o object
	if json.Unmarshal(native, &o) != nil || o.str("type") != "STATUS_UPDATE" {
		return Update{}, false
	}
	pl := o.obj("payload")
	u := Update{Message: pl.str("details")}
	if n, ok := pl.integer("progress"); ok {
		u.Percent = &n
	}
	return u, true
}

// maxProgressLen is coordination.md's limit on content.progress, in
// characters.
const maxProgressLen = 200

// StatusUpdate returns a status_update with status in_progress on task:
// content.taskId is the task's (or its message ID); content.progress, the
// document's free text, is the message, after the percentage when there
// is one ("40% tests pass"), cut short with "…" to the document's 200
// characters.
func (Coordination) StatusUpdate(task *codec.Message, u Update, from string, now time.Time) ([]byte, error) {
	if from == "" || task.From == "" {
		return nil, fmt.Errorf("%w: a status update needs a sender and a recipient", ErrInvalid)
	}
	text := u.Message
	if u.Percent != nil {
		text = strings.TrimSpace(strconv.Itoa(*u.Percent) + "% " + text)
	}
	text = cutRunes(text, maxProgressLen)
	type content struct {
		TaskID    string  `json:"taskId"`
		Status    string  `json:"status"`
		Progress  string  `json:"progress"`
		BlockedBy *string `json:"blockedBy"`
	}
	return json.Marshal(struct {
		Type      string  `json:"type"`
		From      string  `json:"from"`
		To        string  `json:"to"`
		Timestamp string  `json:"timestamp"`
		Content   content `json:"content"`
	}{
		Type: "status_update", From: from, To: task.From, Timestamp: now.UTC().Format(time.RFC3339),
		Content: content{TaskID: taskOf(task, "content"), Status: "in_progress", Progress: text},
	})
}

// ReadUpdate reads a status_update: content.progress, with a leading
// percentage taken apart.
func (Coordination) ReadUpdate(native []byte) (Update, bool) {
	var o object
	if json.Unmarshal(native, &o) != nil || o.str("type") != "status_update" {
		return Update{}, false
	}
	text := o.obj("content").str("progress")
	if pct, rest, ok := strings.Cut(text, "% "); ok {
		if n, err := strconv.Atoi(pct); err == nil && n >= 0 && n <= 100 {
			return Update{Message: rest, Percent: &n}, true
		}
	}
	return Update{Message: text}, true
}
