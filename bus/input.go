package bus

import (
	"context"
	"errors"
	"fmt"
)

// ExtInputFor is the CloudEvents extension that marks a question a handler
// asks while it works (Delivery.AskInput): the ID of the request it
// handles. The question is itself a request; its answer is its reply.
const ExtInputFor = "inputfor"

// TypeInputRequired is the type of a question Delivery.AskInput sends when
// the question sets none.
const TypeInputRequired = "agentbus.input_required"

// TypeInputDeclined is the type of the answer a Request's OnInput function
// sends when it returns an error; its data is the error's text.
const TypeInputDeclined = "agentbus.input_declined"

// TypeInputAnswer is the type of the answer a Request's OnInput function
// returns without one.
const TypeInputAnswer = "agentbus.input_answer"

// ErrInputDeclined is wrapped by the error of an AskInput whose question
// was answered TypeInputDeclined.
var ErrInputDeclined = errors.New("bus: input declined")

// AskInput pauses the work on d, the request being handled, to ask for
// input, and returns the answer. q is the question: a request to d's
// sender unless q.To names someone else (a person's inbox agent, say), in
// d's conversation, caused by d and marked ExtInputFor, of type
// TypeInputRequired unless q sets one. While AskInput waits, d's record
// reads input_required; with the answer it reads working again.
//
// The requester sees the question with its Request: OnInput answers it
// there. Without OnInput the question reaches the asked agent's handler
// like any request (Delivery.IsInputRequest), and whoever handles it
// answers with Reply, or `agentbus reply`. AskInput waits as Request does:
// until ctx's deadline (the handler's, a do-by among them) or the request
// timeout; a cancel of d ends it with d's context. Call it from d's
// handler, with the handler's ctx. Once d is replied to, its work is
// over: a question after the reply is refused with an error wrapping
// ErrFinal, and d's record stays replied.
func (d *Delivery) AskInput(ctx context.Context, q Message, opts ...RequestOption) (*Delivery, error) {
	if d.bus == nil {
		return nil, fmt.Errorf("%w: input on a delivery the bus did not make", ErrInvalidMessage)
	}
	b := d.bus
	h := handlingOf(ctx)
	if h == nil || h.d.ID != d.ID {
		return nil, fmt.Errorf("%w: input asked on %s outside its handler (pass the handler's ctx)", ErrInvalidMessage, d.ID)
	}
	if h.replied.Load() {
		return nil, fmt.Errorf("%w: input asked on %s after its reply", ErrFinal, d.ID)
	}
	if q.To == "" {
		q.To = d.From
	}
	if q.Type == "" {
		q.Type = TypeInputRequired
	}
	if q.Priority == 0 {
		q.Priority = d.Priority
	}
	setExtension(&q, ExtInputFor, d.ID)
	b.recordWork(h, StateInputRequired)
	answer, err := b.Request(ctx, q, opts...)
	b.recordWork(h, StateWorking)
	if err != nil {
		return nil, err
	}
	if answer.Type == TypeInputDeclined {
		return answer, fmt.Errorf("%w: %s", ErrInputDeclined, answer.Data)
	}
	return answer, nil
}

// IsInputRequest reports whether d is a question a handler asked while it
// worked on a request (Delivery.AskInput), and returns that request's ID.
func (d *Delivery) IsInputRequest() (requestID string, ok bool) {
	id, ok := d.Extensions[ExtInputFor]
	return id, ok && id != ""
}

// OnInput answers the questions the handler of the request asks its
// sender while Request waits (Delivery.AskInput): f's message is sent as
// the reply to the question, of TypeInputAnswer unless it has a type; an
// error from f is sent as a TypeInputDeclined reply with its text. f runs
// on Request's goroutine, in order with the progress updates. Without
// OnInput the questions reach the agent's handler like any request.
func OnInput(f func(ctx context.Context, question *Delivery) (Message, error)) RequestOption {
	return func(o *requestOptions) { o.onInput = f }
}

// answerInput answers question q with ro's OnInput function.
func (b *Bus) answerInput(ctx context.Context, f func(context.Context, *Delivery) (Message, error), q *Delivery) {
	answer, err := f(ctx, q)
	switch {
	case err != nil:
		answer = Message{Type: TypeInputDeclined, ContentType: "text/plain", Data: []byte(err.Error())}
	case answer.Type == "":
		answer.Type = TypeInputAnswer
	}
	if _, err := b.Reply(ctx, &q.Message, answer); err != nil {
		b.opts.onError(fmt.Errorf("answer the question %s on request %s: %w", q.ID, q.CausationID, err))
	}
}

// recordWork writes the state of the request h handles (working,
// input-required), with its progress, unless the request is replied to: an
// update or a question racing the reply (a goroutine of the handler) leaves
// the record replied, which it overwrote before.
func (b *Bus) recordWork(h *handling, state State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.replied.Load() {
		return // the reply came first, and the record stays replied
	}
	s := statusOf(&h.d.Message, b.agent, state, b.agent).withDelivery(h.d)
	s.Progress, s.LastProgress = h.progressCount()
	if f := b.status.record(s, false); f != nil {
		h.progressRecord.Store(f)
	}
}
