package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// ExtProgress is the CloudEvents extension that marks a progress update on
// a request (Delivery.Progress): its number, 1 for the first update on that
// request from the handling process. Its causationid is the request's ID.
const ExtProgress = "progress"

// TypeProgress is the type of the progress updates Delivery.Progress sends.
const TypeProgress = "agentbus.progress"

// Progress is one update on long work, as Delivery.Progress sends it and
// Delivery.ProgressUpdate reads it.
type Progress struct {
	// Message says what is happening, for people.
	Message string `json:"message,omitempty"`
	// Percent is how much is done, 0 to 100; nil when unknown.
	Percent *int `json:"percent,omitempty"`
	// Data is anything else, as JSON.
	Data json.RawMessage `json:"data,omitempty"`
}

// Progress sends p to the sender of d, the request being handled, as a
// progress update: a message in d's conversation whose causation is d,
// marked with ExtProgress, which a Request that follows progress
// (OnProgress) hands to its caller and which never completes it. d's
// lifecycle record becomes working, with the number of updates. Call it
// from d's handler, with the handler's ctx.
func (d *Delivery) Progress(ctx context.Context, p Progress) error {
	if d.bus == nil {
		return fmt.Errorf("%w: progress on a delivery the bus did not make", ErrInvalidMessage)
	}
	b := d.bus
	h := handlingOf(ctx)
	if h == nil || h.d.ID != d.ID {
		return fmt.Errorf("%w: progress on %s outside its handler (pass the handler's ctx)", ErrInvalidMessage, d.ID)
	}
	if p.Percent != nil && (*p.Percent < 0 || *p.Percent > 100) {
		return fmt.Errorf("%w: progress percent %d is not 0..100", ErrInvalidMessage, *p.Percent)
	}
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("%w: progress: %w", ErrInvalidMessage, err)
	}
	n := h.progress.Add(1)
	m := Message{
		To: d.From, Type: TypeProgress, Priority: d.Priority, CorrelationID: conversationOf(&d.Message), CausationID: d.ID,
		ContentType: "application/json", Data: data, Extensions: map[string]string{ExtProgress: strconv.FormatInt(n, 10)},
	}
	if by, ok := d.Extensions[ExtReplyBy]; ok {
		m.Extensions[ExtReplyBy] = by
	}
	if _, err := b.Publish(ctx, m); err != nil {
		return err
	}
	now := time.Now().UTC()
	h.lastAt.Store(now.UnixNano())
	s := statusOf(&d.Message, b.agent, StateWorking, b.agent).withDelivery(d)
	s.Progress, s.LastProgress = int(n), now
	b.status.record(s, false)
	return nil
}

// IsProgress reports whether d is a progress update on a request
// (ExtProgress).
func (d *Delivery) IsProgress() bool {
	return d.Extensions[ExtProgress] != ""
}

// ProgressUpdate returns the update d carries and its number, if d is a
// progress update that Delivery.Progress sent.
func (d *Delivery) ProgressUpdate() (Progress, int, bool) {
	n, err := strconv.Atoi(d.Extensions[ExtProgress])
	if err != nil || n < 1 {
		return Progress{}, 0, false
	}
	var p Progress
	if err := json.Unmarshal(d.Data, &p); err != nil {
		return Progress{}, 0, false
	}
	return p, n, true
}
