package bus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentbus/agentbus/bus"
)

// inputWorker asks its requester which branch to merge, and replies with
// what it did; a declined question is replied to as well.
func inputWorker(t *testing.T, worker *bus.Bus) {
	t.Helper()
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if err := d.Progress(ctx, bus.Progress{Message: "diff reviewed"}); err != nil {
			return err
		}
		answer, err := d.AskInput(ctx, bus.Message{ContentType: "text/plain", Data: []byte("which branch?")})
		text := ""
		switch {
		case errors.Is(err, bus.ErrInputDeclined):
			text = "not merged: " + string(answer.Data)
		case err != nil:
			return err
		default:
			text = "merged into " + string(answer.Data)
		}
		_, err = d.Reply(ctx, bus.Message{Type: "DONE", Data: []byte(text)})
		return err
	})
}

// TestAskInput: a handler pauses to ask its requester for input; the
// request's record reads input_required meanwhile; the Request answers
// with OnInput, and the work goes on to its one reply. A declined
// question reaches the handler as ErrInputDeclined.
func TestAskInput(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	inputWorker(t, newBus(t, s, "worker"))

	for _, tt := range []struct {
		id, want string
		answer   func() (bus.Message, error)
	}{
		{"merge-1", "merged into main", func() (bus.Message, error) { return bus.Message{Type: "ANSWER", Data: []byte("main")}, nil }},
		{"merge-2", "not merged: no branch is ready", func() (bus.Message, error) { return bus.Message{}, errors.New("no branch is ready") }},
	} {
		t.Run(tt.id, func(t *testing.T) {
			asked := 0
			d, err := orch.Request(testContext(t), bus.Message{ID: tt.id, To: "worker", Type: "MERGE"},
				bus.OnInput(func(ctx context.Context, q *bus.Delivery) (bus.Message, error) {
					asked++
					if id, ok := q.IsInputRequest(); !ok || id != tt.id || q.Type != bus.TypeInputRequired || string(q.Data) != "which branch?" {
						t.Errorf("question %+v", q.Message)
					}
					waitState(t, orch, tt.id, bus.StateInputRequired)
					return tt.answer()
				}))
			if err != nil || string(d.Data) != tt.want {
				t.Fatalf("Request = %+v, %v; want %q", d, err, tt.want)
			}
			if asked != 1 {
				t.Errorf("asked %d times", asked)
			}
			waitState(t, orch, tt.id, bus.StateReplied)
		})
	}
}

// TestAskInputWithoutOnInput: without OnInput the question reaches the
// requesting agent's handler, whose Reply answers it; a Request that
// follows progress sees the question too.
func TestAskInputWithoutOnInput(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	inputWorker(t, newBus(t, s, "worker"))
	subscribe(t, orch, func(ctx context.Context, d *bus.Delivery) error {
		if _, ok := d.IsInputRequest(); !ok {
			return nil
		}
		_, err := d.Reply(ctx, bus.Message{Type: "ANSWER", Data: []byte("release")})
		return err
	})
	var seen []string
	d, err := orch.Request(testContext(t), bus.Message{To: "worker", Type: "MERGE"}, bus.OnProgress(func(u *bus.Delivery) {
		if _, ok := u.IsInputRequest(); ok {
			seen = append(seen, "question")
		} else {
			seen = append(seen, "progress")
		}
	}))
	if err != nil || string(d.Data) != "merged into release" {
		t.Fatalf("Request = %+v, %v", d, err)
	}
	if fmt.Sprint(seen) != "[progress question]" {
		t.Errorf("followed %v, want the update, then the question", seen)
	}
}
