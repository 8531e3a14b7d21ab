package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// TestRequestProgress: a handler reports progress on the request it holds;
// the requester gets every update, in order, then the one reply: progress
// never completes the request. While the handler works, the request's
// record reads working with the count; at the end, replied.
func TestRequestProgress(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	orch := newBus(t, s, "orchestrator")
	const updates = 50
	release := make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for i := 1; i <= updates; i++ {
			pct := i * 100 / updates
			if err := d.Progress(ctx, bus.Progress{Message: fmt.Sprintf("step %d", i), Percent: &pct}); err != nil {
				return err
			}
		}
		<-release
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	var got []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		d, err := orch.Request(testContext(t), bus.Message{ID: "long-1", To: "worker", Type: "REVIEW"}, bus.OnProgress(func(u *bus.Delivery) {
			p, n, ok := u.ProgressUpdate()
			if !ok || u.Type != bus.TypeProgress || u.CausationID != "long-1" || p.Message != fmt.Sprintf("step %d", n) {
				t.Errorf("update %+v %+v", u.Message, p)
			}
			got = append(got, n)
			if n == updates {
				// The worker writes its record after each update, a moment
				// after the update itself.
				waitFor(t, "the record of every update", func() (bool, string) {
					sts, err := orch.Status(testContext(t), "long-1")
					if err != nil {
						return false, err.Error()
					}
					st := sts[0]
					return st.State == bus.StateWorking && st.Progress == updates && !st.LastProgress.IsZero(), fmt.Sprintf("%+v", st)
				})
				close(release)
			}
		}))
		if err != nil || d.Type != "DONE" {
			t.Errorf("Request = %+v, %v; want the DONE reply", d, err)
		}
	}()
	<-done
	if len(got) != updates {
		t.Fatalf("got %d updates, want %d", len(got), updates)
	}
	for i, n := range got {
		if n != i+1 {
			t.Fatalf("updates out of order: %v", got)
		}
	}
	if st := waitState(t, orch, "long-1", bus.StateReplied); st.Progress != updates {
		t.Errorf("final record %+v, want replied after %d updates", st, updates)
	}
}

// TestProgressWithoutFollower: a Request that does not follow progress is
// completed by the reply only; the updates reach the requester's handler,
// marked as progress.
func TestProgressWithoutFollower(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	orch := newBus(t, s, "orchestrator")
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if err := d.Progress(ctx, bus.Progress{Message: "half way"}); err != nil {
			return err
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	r := newRecorder()
	subscribe(t, orch, r.handle)
	d, err := orch.Request(testContext(t), bus.Message{To: "worker", Type: "REVIEW"})
	if err != nil || d.Type != "DONE" {
		t.Fatalf("Request = %+v, %v; want the DONE reply, not the progress", d, err)
	}
	u := r.waitCount(t, 1)[0]
	if p, n, ok := u.ProgressUpdate(); !ok || n != 1 || p.Message != "half way" || !u.IsProgress() {
		t.Errorf("handler got %+v, want the progress update", u.Message)
	}
}

func TestProgressOutsideHandler(t *testing.T) {
	d := &bus.Delivery{Message: bus.Message{ID: "x", From: "a"}}
	if err := d.Progress(context.Background(), bus.Progress{}); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("Progress on a Delivery the bus did not make: %v, want ErrInvalidMessage", err)
	}
}

// TestAttachAfterRequesterRestart: a requester that went away mid-task
// attaches to its request by ID from a new process, gets the updates it
// missed from the stream, then the ones still to come and the one reply;
// attaching after the reply hands over everything at once.
func TestAttachAfterRequesterRestart(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	first := make(chan struct{})
	release := make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for i := 1; i <= 5; i++ {
			if i == 4 {
				close(first)
				<-release
			}
			if err := d.Progress(ctx, bus.Progress{Message: fmt.Sprintf("step %d", i)}); err != nil {
				return err
			}
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})

	// The first requester sends, sees some updates, and is gone.
	gone := newBus(t, s, "orchestrator")
	ctx, cancel := context.WithCancel(testContext(t))
	returned := make(chan error, 1)
	go func() {
		_, err := gone.Request(ctx, bus.Message{ID: "task-1", To: "worker", Type: "REVIEW"})
		returned <- err
	}()
	<-first
	cancel()
	<-returned
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}

	back := newBus(t, s, "orchestrator")
	var got []string
	follow := bus.OnProgress(func(u *bus.Delivery) {
		p, _, ok := u.ProgressUpdate()
		if !ok {
			t.Errorf("not an update: %+v", u.Message)
		}
		got = append(got, p.Message)
		if len(got) == 3 {
			close(release) // the rest comes while attached
		}
	})
	d, err := back.Attach(testContext(t), "task-1", follow)
	if err != nil || d.Type != "DONE" || d.CausationID != "task-1" {
		t.Fatalf("Attach = %+v, %v; want the DONE reply", d, err)
	}
	want := []string{"step 1", "step 2", "step 3", "step 4", "step 5"}
	if !slices.Equal(got, want) {
		t.Errorf("updates %q, want %q", got, want)
	}

	// Once more, after the reply: all of it from the stream.
	got = nil
	d, err = back.Attach(testContext(t), "task-1", bus.OnProgress(func(u *bus.Delivery) {
		p, _, _ := u.ProgressUpdate()
		got = append(got, p.Message)
	}))
	if err != nil || d.Type != "DONE" || !slices.Equal(got, want) {
		t.Errorf("second Attach = %+v, %v with %q", d, err, got)
	}
	if _, err := back.Attach(testContext(t), "no-such-request"); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Attach to an unknown request: %v, want ErrNoStatus", err)
	}
}

// TestProgressInProtocol: progress on a message of a protocol with status
// updates of its own travels as that protocol's message (basemessage
// STATUS_UPDATE, coordination status_update), valid by its rules, and
// reads back as the update.
func TestProgressInProtocol(t *testing.T) {
	for _, tt := range []struct{ profile, file, wantType string }{
		{"basemessage", "task_assignment.json", "STATUS_UPDATE"},
		{"coordination", "task_assignment.json", "status_update"},
	} {
		t.Run(tt.profile, func(t *testing.T) {
			s := newServer(t)
			p := profile(t, tt.profile)
			task, err := profiles.Prepare(p, readFile(t, "../codec/profiles/testdata/"+tt.profile+"/"+tt.file), profiles.Addressing{})
			if err != nil {
				t.Fatal(err)
			}
			subscribe(t, newBus(t, s, task.To), func(ctx context.Context, d *bus.Delivery) error {
				pct := 40
				if err := d.Progress(ctx, bus.Progress{Message: "schema drafted", Percent: &pct}); err != nil {
					return err
				}
				_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
				return err
			})
			var got []*bus.Delivery
			if _, err := newBus(t, s, task.From).Request(testContext(t), *task, bus.OnProgress(func(u *bus.Delivery) { got = append(got, u) })); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("%d updates", len(got))
			}
			u := got[0]
			pr, n, ok := u.ProgressUpdate()
			if !ok || n != 1 || pr.Message != "schema drafted" || pr.Percent == nil || *pr.Percent != 40 || u.Type != tt.wantType || u.DataSchema != p.DataSchema() {
				t.Errorf("update %s %s: %+v %d %v", u.Type, u.Data, pr, n, ok)
			}
			if err := p.Validate(u.Data); err != nil {
				t.Errorf("the update breaks the protocol: %v", err)
			}
		})
	}
}

// TestProgressCountedInFinalState: the final state a lookup reads right
// after the reply, or after a handler that sent progress and returned,
// counts every update. The updates' records are written asynchronously,
// to another stream than the reply and the acknowledgement; a lookup that
// found the reply (or the consumer past the request) before the last
// update's record was stored derived replied (completed) with one update
// too few, and the late record then read working again.
func TestProgressCountedInFinalState(t *testing.T) {
	s := newServer(t)
	orch := newBus(t, s, "orchestrator")
	subscribe(t, newBus(t, s, "worker"), func(ctx context.Context, d *bus.Delivery) error {
		if err := d.Progress(ctx, bus.Progress{Message: "one"}); err != nil {
			return err
		}
		if d.Type == "ASK" {
			_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
			return err
		}
		return nil
	})
	const rounds = 100
	for i := range rounds {
		typ := "ASK"
		if i%2 == 1 {
			typ = "DO" // answered by no reply: completed
		}
		id := fmt.Sprintf("%s-%d", typ, i)
		if typ == "ASK" {
			if _, err := orch.Request(testContext(t), bus.Message{ID: id, To: "worker", Type: typ}, bus.OnProgress(func(*bus.Delivery) {})); err != nil {
				t.Fatal(err)
			}
		} else {
			publish(t, orch, bus.Message{ID: id, To: "worker", Type: typ})
		}
		waitFor(t, "final state of "+id, func() (bool, string) {
			sts, err := orch.Status(testContext(t), id)
			if err != nil || len(sts) != 1 {
				return false, fmt.Sprintf("%+v %v", sts, err)
			}
			st := sts[0]
			if st.State.Final() && st.Progress != 1 {
				t.Fatalf("round %d: %s reads %s after %d updates, want 1", i, id, st.State, st.Progress)
			}
			return st.State.Final(), string(st.State)
		})
	}
}

// TestNoWorkAfterTheReply: once a handler replied, a progress update or a
// question on the request is refused with ErrFinal, and the request's
// record stays replied. They were sent, and their records (working,
// input_required) overwrote replied: for good when the reply had an ID of
// its own, or the bus no index, so that a lookup could not find the reply;
// past the reply-by the request then read expired, and a Cancel of it
// succeeded.
func TestNoWorkAfterTheReply(t *testing.T) {
	for _, c := range []struct {
		name  string
		ownID bool
		opts  []bus.Option
	}{
		{name: "reply with an ID of its own", ownID: true},
		{name: "bus without index", opts: []bus.Option{bus.WithoutIndex()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t)
			ctx := testContext(t)
			worker, req := newBus(t, s, "worker", c.opts...), newBus(t, s, "req", c.opts...)
			type after struct{ progress, question error }
			done := make(chan after, 1)
			subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
				r := bus.Message{Type: "DONE"}
				if c.ownID {
					r.ID = "own-" + d.ID
				}
				if _, err := d.Reply(ctx, r); err != nil {
					return err
				}
				var a after
				a.progress = d.Progress(ctx, bus.Progress{Message: "after the reply"})
				qctx, cancel := context.WithTimeout(ctx, 2*time.Second) // nobody answers
				_, a.question = d.AskInput(qctx, bus.Message{Data: []byte("anything else?")})
				cancel()
				done <- a
				return nil
			})
			m := bus.Message{ID: "work-after-reply", To: "worker", Type: "JOB"}
			if _, err := req.Request(ctx, m); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if !errors.Is(a.progress, bus.ErrFinal) || !errors.Is(a.question, bus.ErrFinal) {
				t.Errorf("after the reply: Progress = %v, AskInput = %v; want both ErrFinal", a.progress, a.question)
			}
			if err := worker.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			sts, err := req.Status(ctx, m.ID)
			if err != nil || len(sts) != 1 || sts[0].State != bus.StateReplied {
				t.Fatalf("Status = %+v, %v; want replied", sts, err)
			}
			if st, err := req.Cancel(ctx, m.ID); !errors.Is(err, bus.ErrFinal) {
				t.Errorf("Cancel of the replied request = %s, %v; want ErrFinal", st.State, err)
			}
		})
	}
}

// TestProgressCountedInTheHandlersRecords: the records a handling writes
// itself as it ends (failed for a retry, completed for a message with a
// TTL, canceled) count the updates it sent, and a retry numbers on from
// them. They counted none: the retry numbered from 1 again, and the final
// records read 0 updates.
func TestProgressCountedInTheHandlersRecords(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	worker, req := newBus(t, s, "worker"), newBus(t, s, "req")
	started := make(chan struct{}, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for range 2 {
			if err := d.Progress(ctx, bus.Progress{Message: "step"}); err != nil {
				return err
			}
		}
		switch {
		case d.Type == "RETRIED" && d.Deliveries == 1:
			return errors.New("transient")
		case d.Type == "RETRIED":
			_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
			return err
		case d.Type == "LONG":
			started <- struct{}{}
			<-ctx.Done()
			return context.Cause(ctx)
		}
		return nil
	}, bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))

	var mu sync.Mutex
	var numbers []int
	retried := bus.Message{ID: "retried", To: "worker", Type: "RETRIED"}
	if _, err := req.Request(ctx, retried, bus.OnProgress(func(u *bus.Delivery) {
		_, n, _ := u.ProgressUpdate()
		mu.Lock()
		numbers = append(numbers, n)
		mu.Unlock()
	})); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if got := fmt.Sprint(numbers); got != "[1 2 3 4]" {
		t.Errorf("updates numbered %s across a retry, want [1 2 3 4]", got)
	}
	mu.Unlock()

	ttl := publish(t, req, bus.Message{ID: "ttl-job", To: "worker", Type: "JOB", TTL: time.Minute})
	long := publish(t, req, bus.Message{ID: "long-job", To: "worker", Type: "LONG"})
	<-started
	if _, err := req.Cancel(ctx, long.ID); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]struct {
		state    bus.State
		progress int
	}{retried.ID: {bus.StateReplied, 4}, ttl.ID: {bus.StateCompleted, 2}, long.ID: {bus.StateCanceled, 2}} {
		st := waitState(t, req, id, want.state)
		if st.Progress != want.progress {
			t.Errorf("%s reads %s with %d updates, want %d", id, st.State, st.Progress, want.progress)
		}
	}
}

// followed collects the numbers of the progress updates a Request hands
// to OnProgress.
type followed struct {
	mu      sync.Mutex
	numbers []int
}

func (f *followed) option() bus.RequestOption {
	return bus.OnProgress(func(u *bus.Delivery) {
		_, n, _ := u.ProgressUpdate()
		f.mu.Lock()
		f.numbers = append(f.numbers, n)
		f.mu.Unlock()
	})
}

// inOrder reports whether the updates numbered 1 to n came, in order.
func (f *followed) inOrder(n int) (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := len(f.numbers) == n
	for i, got := range f.numbers {
		ok = ok && got == i+1
	}
	return ok, fmt.Sprint(f.numbers)
}

// request sends worker a TASK request from lead, following its progress,
// and returns what Request returns, when it does.
func (f *followed) request(t *testing.T, lead *bus.Bus) <-chan error {
	returned := make(chan error, 1)
	go func() {
		_, err := lead.Request(testContext(t), bus.Message{To: "worker", Type: "TASK"}, f.option())
		returned <- err
	}()
	return returned
}

func (f *followed) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.numbers)
}

// TestProgressInOrderAcrossACut: the requester's connection is down while
// updates keep coming; OnProgress gets every one once, in order. The
// updates the listener heard after the reconnect went to OnProgress before
// those read from the stream that came while it was down.
func TestProgressInOrderAcrossACut(t *testing.T) {
	s := newServer(t)
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	lead, worker := dialBus(t, p.URL(), "lead"), newBus(t, s, "worker")
	const updates = 300
	var sent atomic.Int64
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		for range updates {
			if err := d.Progress(ctx, bus.Progress{Message: "step"}); err != nil {
				return err
			}
			sent.Add(1)
			time.Sleep(2 * time.Millisecond) // a steady pace, on both sides of the cut
		}
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	var f followed
	returned := f.request(t, lead)
	waitFor(t, "updates before the cut", func() (bool, string) { return f.count() >= 10, "" })
	p.hold()
	from := sent.Load()
	waitFor(t, "updates while the connection is down", func() (bool, string) { return sent.Load() >= from+10, "" })
	p.release()
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	if ok, got := f.inOrder(updates); !ok {
		t.Errorf("updates %s; want 1 to %d, in order", got, updates)
	}
}

// TestProgressMissedBeforeTheReply: updates sent while the requester's
// connection was down, and the reply as soon as it is back: OnProgress
// gets the updates before Request returns the reply. The reply, heard at
// once, ended the Request before the read of what it missed.
func TestProgressMissedBeforeTheReply(t *testing.T) {
	s := newServer(t)
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	lead, worker := dialBus(t, p.URL(), "lead"), newBus(t, s, "worker")
	const updates = 20
	started, sendUpdates, sent, sendReply := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		close(started)
		<-sendUpdates
		for range updates {
			if err := d.Progress(ctx, bus.Progress{Message: "step"}); err != nil {
				return err
			}
		}
		close(sent)
		<-sendReply
		_, err := d.Reply(ctx, bus.Message{Type: "DONE"})
		return err
	})
	var f followed
	returned := f.request(t, lead)
	<-started
	p.hold()
	waitFor(t, "the lead disconnected", func() (bool, string) { return !lead.Conn().IsConnected(), lead.Conn().Status().String() })
	close(sendUpdates)
	<-sent
	p.release()
	waitFor(t, "the lead reconnected", func() (bool, string) { return lead.Conn().IsConnected(), lead.Conn().Status().String() })
	close(sendReply)
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	if ok, got := f.inOrder(updates); !ok {
		t.Errorf("updates handed before the reply %s; want 1 to %d", got, updates)
	}
}

// TestProgressRacingTheReply: a handler whose goroutine sends progress
// while the handler replies leaves the request replied. An update that
// passed its check before the reply and wrote its record after it made the
// request read working again, for good when a lookup cannot find the
// reply (a reply with an ID of its own).
func TestProgressRacingTheReply(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	worker, req := newBus(t, s, "worker"), newBus(t, s, "req")
	var returned atomic.Int32
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		defer returned.Add(1)
		var wg sync.WaitGroup
		sent := make(chan struct{})
		wg.Go(func() { // updates until the reply ends them
			for i := 0; ; i++ {
				err := d.Progress(ctx, bus.Progress{Message: "step"})
				if i == 0 {
					close(sent)
				}
				if err != nil {
					return
				}
			}
		})
		<-sent
		_, err := d.Reply(ctx, bus.Message{ID: "own-" + d.ID, Type: "DONE"})
		wg.Wait()
		return err
	}, bus.WithConcurrency(4))
	const n = 20
	for i := range n {
		if _, err := req.Request(ctx, bus.Message{ID: fmt.Sprintf("race-%d", i), To: "worker", Type: "JOB"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the handlers returned", func() (bool, string) { return returned.Load() == n, fmt.Sprint(returned.Load()) })
	if err := worker.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var working []string
	for i := range n {
		id := fmt.Sprintf("race-%d", i)
		sts, err := req.Status(ctx, id)
		if err != nil || len(sts) != 1 {
			t.Fatalf("Status(%s) = %+v, %v", id, sts, err)
		}
		if sts[0].State != bus.StateReplied {
			working = append(working, id+" "+string(sts[0].State))
		}
	}
	if len(working) > 0 {
		t.Errorf("%d of %d requests replied to while their progress raced the reply read otherwise: %v", len(working), n, working)
	}
}
