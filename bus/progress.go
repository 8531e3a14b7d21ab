package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/agentbus/agentbus/codec/profiles"
)

// ExtProgress is the CloudEvents extension that marks a progress update on
// a request (Delivery.Progress): its number, 1 for the first update on that
// request from the handling process. Its causationid is the request's ID.
const ExtProgress = "progress"

// TypeProgress is the type of the progress updates Delivery.Progress sends,
// except on a message of a protocol with status updates of its own
// (profiles.Progresser: basemessage STATUS_UPDATE, coordination
// status_update), where the update is that native message.
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
// marked with ExtProgress (TypeProgress, or the protocol's own status
// update when d is a message of one that has them), which a Request that follows progress
// (OnProgress) hands to its caller and which never completes it. d's
// lifecycle record becomes working, with the number of updates. Call it
// from d's handler, with the handler's ctx. Once d is replied to, its work
// is over: a later update is refused with an error wrapping ErrFinal, and
// d's record stays replied.
func (d *Delivery) Progress(ctx context.Context, p Progress) error {
	if d.bus == nil {
		return fmt.Errorf("%w: progress on a delivery the bus did not make", ErrInvalidMessage)
	}
	b := d.bus
	h := handlingOf(ctx)
	if h == nil || h.d.ID != d.ID {
		return fmt.Errorf("%w: progress on %s outside its handler (pass the handler's ctx)", ErrInvalidMessage, d.ID)
	}
	if h.replied.Load() {
		return fmt.Errorf("%w: progress on %s after its reply", ErrFinal, d.ID)
	}
	if p.Percent != nil && (*p.Percent < 0 || *p.Percent > 100) {
		return fmt.Errorf("%w: progress percent %d is not 0..100", ErrInvalidMessage, *p.Percent)
	}
	m, err := b.progressMessage(d, p)
	if err != nil {
		return err
	}
	b.seedProgress(ctx, h) // done when the handling began (run), but for one ContextWithDelivery made
	n := h.progress.Add(1)
	setExtension(&m, ExtProgress, strconv.FormatInt(n, 10))
	if by, ok := d.Extensions[ExtReplyBy]; ok {
		setExtension(&m, ExtReplyBy, by)
	}
	if _, err := b.Publish(ctx, m); err != nil {
		return err
	}
	h.lastAt.Store(time.Now().UnixNano())
	b.recordWork(h, StateWorking)
	return nil
}

// seedProgress counts, once, the progress updates the deliveries of h's
// message before this one sent, as its record says: a redelivery numbers
// on from them, and its records count them.
func (b *Bus) seedProgress(ctx context.Context, h *handling) {
	if h.d.Deliveries <= 1 || b.status == nil {
		return
	}
	h.seedProgress.Do(func() {
		if st, err := b.status.get(ctx, &h.d.Message, b.agent); err == nil && st.Progress > 0 {
			h.progress.Add(int64(st.Progress))
			h.lastAt.CompareAndSwap(0, st.LastProgress.UnixNano())
		}
	})
}

// progressMessage returns update p on d as a message to d's sender: the
// protocol's own status update when d is a message of a protocol that has
// one (profiles.Progresser), else TypeProgress with p as JSON.
func (b *Bus) progressMessage(d *Delivery, p Progress) (Message, error) {
	m := Message{To: d.From, Priority: d.Priority, CorrelationID: conversationOf(&d.Message), CausationID: d.ID}
	if pr, ok := progresserOf(&d.Message); ok {
		native, err := pr.StatusUpdate(&d.Message, profiles.Update{Message: p.Message, Percent: p.Percent}, b.agent, time.Now())
		if err != nil {
			return Message{}, fmt.Errorf("%w: progress: %w", ErrInvalidMessage, err)
		}
		nm, err := profiles.Prepare(pr, native, profiles.Addressing{From: b.agent, To: d.From})
		if err != nil {
			return Message{}, fmt.Errorf("%w: progress: %w", ErrInvalidMessage, err)
		}
		nm.CorrelationID, nm.CausationID = m.CorrelationID, m.CausationID
		return *nm, nil
	}
	data, err := json.Marshal(p)
	if err != nil {
		return Message{}, fmt.Errorf("%w: progress: %w", ErrInvalidMessage, err)
	}
	m.Type, m.ContentType, m.Data = TypeProgress, "application/json", data
	return m, nil
}

// progresserOf returns the protocol of m if it has status updates of its
// own.
func progresserOf(m *Message) (profiles.Progresser, bool) {
	p, ok := profiles.ForDataSchema(m.DataSchema)
	if !ok {
		return nil, false
	}
	pr, ok := p.(profiles.Progresser)
	return pr, ok
}

// IsProgress reports whether d is a progress update on a request
// (ExtProgress).
func (d *Delivery) IsProgress() bool {
	return d.Extensions[ExtProgress] != ""
}

// ProgressUpdate returns the update d carries and its number, if d is a
// progress update that Delivery.Progress sent (a native status update
// gives its message and percentage, no Data).
func (d *Delivery) ProgressUpdate() (Progress, int, bool) {
	n, err := strconv.Atoi(d.Extensions[ExtProgress])
	if err != nil || n < 1 {
		return Progress{}, 0, false
	}
	if pr, ok := progresserOf(&d.Message); ok {
		u, ok := pr.ReadUpdate(d.Data)
		return Progress{Message: u.Message, Percent: u.Percent}, n, ok
	}
	var p Progress
	if err := json.Unmarshal(d.Data, &p); err != nil {
		return Progress{}, 0, false
	}
	return p, n, true
}
