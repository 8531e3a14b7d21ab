package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

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
		// Without a type, the answer is TypeInputAnswer; before, Reply
		// refused it, and the handler waited for its deadline.
		{"merge-3", "merged into dev", func() (bus.Message, error) { return bus.Message{Data: []byte("dev")}, nil }},
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

// TestAttachToAQuestion: a process that attaches to a request whose
// handler asked a question (AskInput) answers it with OnInput, unless the
// process that sent the request answered it already, and returns the reply
// that follows. Attach returned the question as the reply.
func TestAttachToAQuestion(t *testing.T) {
	for _, answeredBefore := range []bool{false, true} {
		t.Run(fmt.Sprintf("answered before: %v", answeredBefore), func(t *testing.T) {
			s := newServer(t)
			worker := newBus(t, s, "worker")
			asked := make(chan string, 1)
			goOn := make(chan struct{}) // closed by the attached process
			subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
				asked <- d.ID
				answer, err := d.AskInput(ctx, bus.Message{ContentType: "text/plain", Data: []byte("which branch?")})
				if err != nil {
					return err
				}
				for waiting := true; waiting; {
					if err := d.Progress(ctx, bus.Progress{Message: "merging"}); err != nil {
						return err
					}
					select {
					case <-goOn:
						waiting = false
					case <-time.After(20 * time.Millisecond):
					}
				}
				_, err = d.Reply(ctx, bus.Message{Type: "MERGED", ContentType: "text/plain", Data: answer.Data})
				return err
			})
			answer := func(asks *int, branch string) bus.RequestOption {
				return bus.OnInput(func(context.Context, *bus.Delivery) (bus.Message, error) {
					*asks++
					return bus.Message{Type: "ANSWER", ContentType: "text/plain", Data: []byte(branch)}, nil
				})
			}

			// The first process sends the request and is gone once asked,
			// or once it has answered.
			gone := newBus(t, s, "lead")
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			var opts []bus.RequestOption
			goneAsks := 0
			if answeredBefore {
				opts = append(opts, answer(&goneAsks, "main"))
			}
			returned := make(chan struct{})
			go func() {
				defer close(returned)
				gone.Request(ctx, bus.Message{To: "worker", Type: "MERGE"}, opts...) //nolint:errcheck
			}()
			id := <-asked
			want, state := "dev", bus.StateInputRequired
			if answeredBefore {
				want, state = "main", bus.StateWorking
			}
			waitState(t, worker, id, state)
			cancel()
			<-returned
			if err := gone.Close(); err != nil {
				t.Fatal(err)
			}

			// The process that attaches lets the handler reply once it has
			// a progress update: after the question, answered or not.
			back := newBus(t, s, "lead")
			asks := 0
			var once sync.Once
			d, err := back.Attach(testContext(t), id, answer(&asks, "dev"),
				bus.OnProgress(func(*bus.Delivery) { once.Do(func() { close(goOn) }) }))
			if err != nil || d.Type != "MERGED" || string(d.Data) != want {
				t.Fatalf("Attach = %+v, %v; want the reply MERGED %s", d, err, want)
			}
			if wantAsks := map[bool]int{false: 1, true: 0}[answeredBefore]; asks != wantAsks {
				t.Errorf("OnInput asked %d times, want %d", asks, wantAsks)
			}
		})
	}
}

// TestAskInputEndedByACancel: a cancel of the request ends its handler's
// AskInput with an error that says so (ErrCanceled), not only that its
// context ended (context.Canceled) before an answer came.
func TestAskInputEndedByACancel(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	lead, worker := newBus(t, s, "lead"), newBus(t, s, "worker")
	asked := make(chan error, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.AskInput(ctx, bus.Message{Data: []byte("which branch?")})
		asked <- err
		return err
	})
	questions := newRecorder()
	subscribe(t, lead, questions.handle) // shown the question; answers nothing
	m := publish(t, lead, bus.Message{To: "worker", Type: "JOB"})
	questions.waitCount(t, 1)
	waitState(t, lead, m.ID, bus.StateInputRequired)
	if _, err := lead.Cancel(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-asked; !errors.Is(err, bus.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Errorf("AskInput ended by a cancel of its request: %v; want ErrCanceled and context.Canceled", err)
	}
	waitState(t, lead, m.ID, bus.StateCanceled)
}
