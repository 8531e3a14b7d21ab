package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/bus/auth"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// scheduling starts a server with agents alice and bob, bob's deliveries
// recorded, and an operator's handle.
func scheduling(t *testing.T) (s *embedded.Server, alice *bus.Bus, rec *recorder, admin *bus.Admin) {
	t.Helper()
	s = newServer(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	rec = newRecorder()
	subscribe(t, bob, rec.handle)
	return s, alice, rec, adminOf(t, s)
}

// statusOf returns the one record of id, read as an operator.
func statusOf(t *testing.T, admin *bus.Admin, id string) bus.Status {
	t.Helper()
	sts, err := admin.Status(testContext(t), id)
	if err != nil || len(sts) != 1 {
		t.Fatalf("Status(%s) = %+v, %v", id, sts, err)
	}
	return sts[0]
}

// TestScheduleAt: a message scheduled a second ahead waits on the server,
// scheduled, and reaches its recipient when it is due, with its Time the
// firing time; the recipient's handling ends its record completed.
func TestScheduleAt(t *testing.T) {
	_, alice, rec, admin := scheduling(t)
	ctx := testContext(t)

	when := bus.In(time.Second)
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder", Data: []byte("stand-up")}, when)
	if err != nil {
		t.Fatalf("Schedule: %v", err)
	}
	if ack.Stream != subjects.Default().ScheduleStream() {
		t.Errorf("stored in %s, want the schedule stream", ack.Stream)
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := statusOf(t, admin, ack.ID)
	firesAt := st.FiresAt
	if st.State != bus.StateScheduled || firesAt.IsZero() || st.Schedule != when.String() {
		t.Errorf("record before it fired = %+v, want scheduled with its time", st)
	}

	d := rec.waitCount(t, 1)[0]
	if got := time.Now(); got.Before(firesAt) {
		t.Errorf("delivered at %v, before it was due at %v", got, firesAt)
	}
	if d.ID != ack.ID || d.From != "alice" || string(d.Data) != "stand-up" || !d.Time.Equal(firesAt) {
		t.Errorf("delivered %+v, want the scheduled message with Time %v", d.Message, firesAt)
	}
	waitFor(t, "the record completed", func() (bool, string) {
		st := statusOf(t, admin, ack.ID)
		return st.State == bus.StateCompleted && st.By == "bob", fmt.Sprint(st)
	})
}

// TestScheduleReachesRunningSubscriber: a message scheduled to a running
// subscriber, at a priority it has no consumer for, reaches it when it
// fires: by the schedule stream's firing notice, with no look at the
// stream meanwhile; and, when the notice is lost, by the subscriber's next
// look. Here the schedule stream sends no notices at all; in a cluster one
// can go unsent while the stream's leader changes, or be dropped on a slow
// connection.
func TestScheduleReachesRunningSubscriber(t *testing.T) {
	for _, tc := range []struct {
		name    string
		notices bool
		looks   bus.SubscribeOption
	}{
		{"notice", true, bus.WithLooks(time.Hour, time.Hour)},
		// The first look is over long before the message fires.
		{"notice lost", false, bus.WithLooks(50*time.Millisecond, 300*time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t)
			ctx := testContext(t)
			if !tc.notices {
				editStream(t, s, subjects.Default().ScheduleStream(), func(cfg *jetstream.StreamConfig) { cfg.RePublish = nil })
			}
			rec := newRecorder()
			subscribe(t, newBus(t, s, "bob"), rec.handle, tc.looks)
			ack, err := newBus(t, s, "alice").Schedule(ctx, bus.Message{To: "bob", Type: "reminder", Priority: 2}, bus.In(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if d := rec.waitCount(t, 1)[0]; d.ID != ack.ID {
				t.Errorf("delivered %s, want %s", d.ID, ack.ID)
			}
		})
	}
}

// TestScheduleCancel: a schedule its sender cancels never fires, and its
// record reads canceled; a message scheduled after it, for the same time
// or later, comes first (had the canceled one fired, it would have come
// before: the server fires a second's schedules in stream order).
// A cancel after it fired is ErrFinal.
func TestScheduleCancel(t *testing.T) {
	_, alice, rec, admin := scheduling(t)
	ctx := testContext(t)

	canceled, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder", Data: []byte("never")}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	st, err := alice.Cancel(ctx, canceled.ID)
	if err != nil || st.State != bus.StateCanceled {
		t.Fatalf("Cancel = %+v, %v", st, err)
	}
	later, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder", Data: []byte("later")}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := rec.waitCount(t, 1)
	if got[0].ID != later.ID {
		t.Errorf("first delivery %s (%q), want the later message; the canceled one fired", got[0].ID, got[0].Data)
	}
	waitFor(t, "the later message's record completed", func() (bool, string) {
		st := statusOf(t, admin, later.ID)
		return st.State == bus.StateCompleted, fmt.Sprint(st)
	})
	if _, err := alice.Cancel(ctx, later.ID); !errors.Is(err, bus.ErrFinal) {
		t.Errorf("Cancel after it was handled = %v, want ErrFinal", err)
	}
	if n := len(rec.deliveries()); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// TestScheduleRecipientCancel: the recipient cannot remove a schedule, so
// the message fires; the recipient drops it by its canceled record.
func TestScheduleRecipientCancel(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	admin := adminOf(t, s)
	canceled, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder"}, bus.In(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := bob.Cancel(ctx, canceled.ID); err != nil || st.State != bus.StateCanceled {
		t.Fatalf("the recipient's Cancel = %+v, %v", st, err)
	}
	rec := newRecorder()
	subscribe(t, bob, rec.handle)
	sentinel, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder"}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.waitCount(t, 1); got[0].ID != sentinel.ID {
		t.Errorf("handled %s, want only the sentinel %s", got[0].ID, sentinel.ID)
	}
	if st := statusOf(t, admin, canceled.ID); st.State != bus.StateCanceled {
		t.Errorf("canceled message's record %+v", st)
	}
}

// TestScheduleSurvivesRestart: the sender exits and the server restarts on
// its store before the message is due; the message comes all the same.
func TestScheduleSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, func(o *embedded.Options) { o.StoreDir = dir })
	ctx := testContext(t)
	alice := newBus(t, s, "alice")
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder", Data: []byte("after the restart")}, bus.In(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	opts := s.Options()
	s.Shutdown()
	s2 := startAgain(t, opts)

	bob := newBus(t, s2, "bob")
	rec := newRecorder()
	subscribe(t, bob, rec.handle)
	if d := rec.waitCount(t, 1)[0]; d.ID != ack.ID || string(d.Data) != "after the restart" {
		t.Errorf("delivered %+v", d.Message)
	}
}

// TestScheduleEvery: a recurring schedule fires again and again, each
// firing a message with an ID of its own and the schedule's ID as
// ExtScheduleID, each with its own record; canceled, the schedule is
// removed from the server and its record reads canceled.
func TestScheduleEvery(t *testing.T) {
	s, alice, rec, admin := scheduling(t)
	ctx := testContext(t)

	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "tick"}, bus.Every(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := rec.waitCount(t, 2)[:2]
	if got[0].ID == got[1].ID || got[0].ID == ack.ID {
		t.Errorf("firing IDs %s, %s (schedule %s), want two of their own", got[0].ID, got[1].ID, ack.ID)
	}
	if !got[1].Time.After(got[0].Time) {
		t.Errorf("firing times %v, %v: want each firing's own", got[0].Time, got[1].Time)
	}
	for _, d := range got {
		if d.Extensions[bus.ExtScheduleID] != ack.ID || d.CorrelationID != ack.ID {
			t.Errorf("firing %+v, want scheduleid and conversation %s", d.Message, ack.ID)
		}
	}
	waitFor(t, "the first firing's record completed", func() (bool, string) {
		st := statusOf(t, admin, got[0].ID)
		return st.State == bus.StateCompleted, fmt.Sprint(st)
	})
	if st := statusOf(t, admin, ack.ID); st.State != bus.StateScheduled || st.Schedule != "@every 1s" {
		t.Errorf("schedule's record %+v, want scheduled @every 1s", st)
	}

	if st, err := alice.Cancel(ctx, ack.ID); err != nil || st.State != bus.StateCanceled {
		t.Fatalf("Cancel = %+v, %v", st, err)
	}
	scheduleRemoved(t, s, "alice", ack.ID)
}

// scheduleRemoved checks that the schedule of message id from agent from
// is gone from the server: the last message on its subject is a cancel's,
// which schedules nothing.
func scheduleRemoved(t *testing.T, s *embedded.Server, from, id string) {
	t.Helper()
	ctx := testContext(t)
	js, _ := jetstream.New(embeddedtest.Connect(t, s))
	stream, err := js.Stream(ctx, subjects.Default().ScheduleStream())
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := subjects.Default().Schedule(from, id)
	last, err := stream.GetLastMsgForSubject(ctx, subj)
	if err != nil || last.Header.Get(jetstream.ScheduleHeader) != "" {
		t.Errorf("last message on %s: %+v, %v; want one without a schedule", subj, last, err)
	}
}

// TestScheduleEveryCanceledByRecipient: a recurring schedule its recipient
// canceled goes on firing (and is dropped) until its sender cancels it
// too, which removes it and succeeds.
func TestScheduleEveryCanceledByRecipient(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob := newBus(t, s, "alice"), newBus(t, s, "bob")
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "tick"}, bus.Every(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.Cancel(ctx, ack.ID); err != nil {
		t.Fatalf("the recipient's Cancel: %v", err)
	}
	if st, err := alice.Cancel(ctx, ack.ID); err != nil || st.State != bus.StateCanceled {
		t.Fatalf("the sender's Cancel after the recipient's = %+v, %v; want it to remove the schedule", st, err)
	}
	scheduleRemoved(t, s, "alice", ack.ID)
}

// TestScheduleBroadcast: a scheduled broadcast reaches every agent when
// due; canceled by its sender before, it reaches nobody.
func TestScheduleBroadcast(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice, bob, carol := newBus(t, s, "alice"), newBus(t, s, "bob"), newBus(t, s, "carol")
	rb, rc := newRecorder(), newRecorder()
	subscribe(t, bob, rb.handle)
	subscribe(t, carol, rc.handle)
	dropped, err := alice.Schedule(ctx, bus.Message{To: bus.Broadcast, Type: "all-hands", Data: []byte("canceled")}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := alice.Cancel(ctx, dropped.ID); err != nil || st.State != bus.StateCanceled {
		t.Fatalf("Cancel of a scheduled broadcast = %+v, %v", st, err)
	}
	ack, err := alice.Schedule(ctx, bus.Message{To: bus.Broadcast, Type: "all-hands"}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{rb, rc} {
		if d := r.waitCount(t, 1)[0]; d.ID != ack.ID || !d.Broadcast() {
			t.Errorf("delivered %+v, want the broadcast %s", d.Message, ack.ID)
		}
	}
}

// TestScheduleForgedSender: the server does not check a schedule's target
// against the scheduler's permissions, so an agent may schedule a message
// onto a subject naming another sender. The receiver checks the server's
// Nats-Scheduler header and dead-letters it as a sender mismatch.
func TestScheduleForgedSender(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	admin := adminOf(t, s)
	var errs embeddedtest.SyncBuffer
	bob := newBus(t, s, "bob", bus.WithErrorHandler(func(err error) { fmt.Fprintln(&errs, err) }))
	rec := newRecorder()
	subscribe(t, bob, rec.handle)

	// mallory schedules a message claiming to be from carol.
	m := codec.Message{ID: "forged-1", From: "carol", To: "bob", Type: "order", Priority: 3, Time: time.Now()}
	h, data, err := codec.Binary{}.Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	sc := subjects.Default()
	direct, _ := sc.Direct("bob", "carol", "order", 3)
	target, _ := sc.Fired(m.ID, direct)
	schedule, _ := sc.Schedule("mallory", m.ID)
	h[jetstream.ScheduleHeader] = []string{"@at " + time.Now().UTC().Format(time.RFC3339)}
	h[jetstream.ScheduleTargetHeader] = []string{target}
	nc := embeddedtest.Connect(t, s)
	js, _ := jetstream.New(nc)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: schedule, Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged message dead-lettered", func() (bool, string) {
		dls, err := admin.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "bob"})
		return err == nil && len(dls) == 1 && dls[0].Reason == bus.ReasonSenderMismatch, fmt.Sprint(dls, err)
	})
	if len(rec.deliveries()) != 0 {
		t.Errorf("the forged message was handled")
	}
	if !strings.Contains(errs.String(), "scheduled by another agent") {
		t.Errorf("error handler got %q", errs.String())
	}
}

// TestScheduleInvalid: an invalid When, or a TTL on a recurring schedule,
// is refused before anything is stored.
func TestScheduleInvalid(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	alice := newBus(t, s, "alice")
	for _, tt := range []struct {
		name string
		m    bus.Message
		w    bus.When
		want error
	}{
		{"zero When", bus.Message{To: "bob", Type: "t"}, bus.When{}, bus.ErrInvalidOption},
		{"under a second", bus.Message{To: "bob", Type: "t"}, bus.Every(500 * time.Millisecond), bus.ErrInvalidOption},
		{"fractional seconds", bus.Message{To: "bob", Type: "t"}, bus.Every(1500 * time.Millisecond), bus.ErrInvalidOption},
		{"recurring with a TTL", bus.Message{To: "bob", Type: "t", TTL: time.Minute}, bus.Every(time.Minute), bus.ErrInvalidMessage},
		{"invalid recipient", bus.Message{To: strings.Repeat("x", 300), Type: "t"}, bus.In(time.Hour), bus.ErrInvalidMessage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := alice.Schedule(ctx, tt.m, tt.w); !errors.Is(err, tt.want) {
				t.Errorf("Schedule = %v, want %v", err, tt.want)
			}
		})
	}
	// The server parses a cron expression; one it refuses is an invalid
	// option, as the ones checked here are.
	if _, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "t"}, bus.Cron("not cron", nil)); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("Schedule with an invalid cron expression = %v, want ErrInvalidOption", err)
	}
	nc := embeddedtest.Connect(t, s)
	js, _ := jetstream.New(nc)
	stream, _ := js.Stream(ctx, subjects.Default().ScheduleStream())
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != 0 {
		t.Errorf("schedule stream holds %v messages (%v), want none", info.State.Msgs, err)
	}
}

// TestSchedulePermissions: under generated permissions only the agents
// made schedulers may schedule (and cancel their schedules); the others'
// Schedule is refused by the server. The recipient needs nothing more.
func TestSchedulePermissions(t *testing.T) {
	srv := newAuthServerConfig(t, auth.Config{Agents: []string{"alice", "bob", "mallory"}, Schedulers: []string{"alice"}})
	var errs errorTally
	alice := srv.agentBus(t, "alice", errs.add)
	bob := srv.agentBus(t, "bob", errs.add)
	mallory := srv.agentBus(t, "mallory", errs.add)
	ctx := testContext(t)
	rec := newRecorder()
	subscribe(t, bob, rec.handle)

	dropped, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder"}, bus.In(2*time.Second))
	if err != nil {
		t.Fatalf("a scheduler's Schedule: %v", err)
	}
	if _, err := alice.Cancel(ctx, dropped.ID); err != nil {
		t.Fatalf("a scheduler's Cancel of its schedule: %v", err)
	}
	ack, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "reminder"}, bus.In(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if d := rec.waitCount(t, 1)[0]; d.ID != ack.ID {
		t.Errorf("bob got %s, want %s", d.ID, ack.ID)
	}
	if _, err := mallory.Schedule(ctx, bus.Message{To: "bob", Type: "reminder"}, bus.In(time.Hour)); !errors.Is(err, bus.ErrPermissionDenied) {
		t.Errorf("Schedule by an agent that is no scheduler = %v, want ErrPermissionDenied", err)
	}
}

// TestScheduleNotProvisioned: without the schedule stream, Schedule says
// which stream to provision.
func TestScheduleNotProvisioned(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	js, _ := jetstream.New(embeddedtest.Connect(t, s))
	if err := js.DeleteStream(ctx, subjects.Default().ScheduleStream()); err != nil {
		t.Fatal(err)
	}
	_, err := newBus(t, s, "alice").Schedule(ctx, bus.Message{To: "bob", Type: "t"}, bus.In(time.Hour))
	if !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), subjects.Default().ScheduleStream()) {
		t.Errorf("Schedule without the schedule stream = %v, want ErrNotProvisioned naming it", err)
	}
}

// scheduleStored reports whether a schedule of sender's message id is on
// the server, read from the schedule stream.
func scheduleStored(t *testing.T, s *embedded.Server, sender, id string) bool {
	t.Helper()
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(testContext(t), subjects.Default().ScheduleStream())
	if err != nil {
		t.Fatal(err)
	}
	subj, err := subjects.Default().Schedule(sender, id)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(testContext(t), subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return last.Header.Get(jetstream.ScheduleHeader) != ""
}

// TestScheduleWhoseAckWasLost: a Schedule whose ack is lost with the
// connection fails, but its schedule is stored and fires; its record
// keeps the schedule, so that its sender's Cancel removes it. The record
// read failed without it, a lookup then read it completed from a firing,
// and Cancel returned ErrFinal: the schedule fired for good.
func TestScheduleWhoseAckWasLost(t *testing.T) {
	s, _, rec, admin := scheduling(t)
	ctx := testContext(t)
	p := newCutProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	alice := dialBus(t, p.URL(), "alice", bus.WithPublishAttempts(1))
	bus.SetPublishAttemptTimeout(t, 500*time.Millisecond)
	cut := p.cutOnDelivery(`"stream":"AGENTBUS_SCHED"`)
	m := bus.Message{ID: "ack-lost", To: "bob", Type: "tick"}
	if _, err := alice.Schedule(ctx, m, bus.Every(time.Second)); err == nil || !wasCut(cut) {
		t.Fatalf("Schedule with its ack cut = %v (cut: %v); want an error", err, wasCut(cut))
	}
	waitFor(t, "the record, failed with its schedule", func() (bool, string) { // written once the connection is back
		sts, err := admin.Status(ctx, m.ID)
		return err == nil && len(sts) == 1 && sts[0].State == bus.StateFailed && sts[0].Schedule != "", fmt.Sprint(sts, err)
	})
	rec.waitCount(t, 1) // stored all the same: it fires
	if st, err := alice.Cancel(ctx, m.ID); err != nil {
		t.Fatalf("its sender's Cancel = %+v, %v", st, err)
	}
	if scheduleStored(t, s, "alice", m.ID) {
		t.Error("the schedule is on the server after its sender's Cancel: it fires on")
	}
}

// TestScheduleInAZoneTheServerCannotLoad: a cron schedule in time.Local or
// a time.FixedZone is refused at once (ErrInvalidOption) and leaves no
// record, so that the same ID scheduled again in a named zone reads
// scheduled. The server refused the fixed zone with an error that wrapped
// no error of the bus, and a failed record stayed in the way.
func TestScheduleInAZoneTheServerCannotLoad(t *testing.T) {
	s, alice, _, admin := scheduling(t)
	ctx := testContext(t)
	m := bus.Message{ID: "in-a-zone", To: "bob", Type: "nightly"}
	for _, loc := range []*time.Location{time.FixedZone("UTC+1", 3600), time.Local} {
		if _, err := alice.Schedule(ctx, m, bus.Cron("0 0 2 * * *", loc)); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("Cron in %s: %v; want ErrInvalidOption", loc, err)
		}
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if sts, err := admin.Status(ctx, m.ID); !errors.Is(err, bus.ErrNoStatus) {
		t.Errorf("Status after the refusals = %+v, %v; want ErrNoStatus", sts, err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Schedule(ctx, m, bus.Cron("0 0 2 * * *", berlin)); err != nil {
		t.Fatal(err)
	}
	if err := alice.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := statusOf(t, admin, m.ID); st.State != bus.StateScheduled {
		t.Errorf("scheduled in a named zone: %s (%s); want scheduled", st.State, st.Reason)
	}
	if _, err := alice.Cancel(ctx, m.ID); err != nil || scheduleStored(t, s, "alice", m.ID) {
		t.Errorf("Cancel = %v; stored after it: %v", err, scheduleStored(t, s, "alice", m.ID))
	}
}

// TestCancelOfABroadcastSent: a broadcast sent cannot be canceled, also
// once a recipient's handling recorded a state of its own, and also when
// a schedule sent it. Cancel canceled the recipient's copy (its retries
// stopped), and a fired scheduled broadcast (reporting success while its
// recipients handled it).
func TestCancelOfABroadcastSent(t *testing.T) {
	s, alice, rec, admin := scheduling(t)
	ctx := testContext(t)
	fired, err := alice.Schedule(ctx, bus.Message{To: bus.Broadcast, Type: "all-hands"}, bus.In(0))
	if err != nil {
		t.Fatal(err)
	}
	rec.waitCount(t, 1)
	if _, err := alice.Cancel(ctx, fired.ID); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("Cancel of a scheduled broadcast that fired: %v; want ErrInvalidMessage", err)
	}

	failing := newBus(t, s, "carol")
	subscribe(t, failing, func(context.Context, *bus.Delivery) error { return errors.New("not yet") })
	sent := publish(t, alice, bus.Message{To: bus.Broadcast, Type: "all"})
	waitFor(t, "carol's failed record", func() (bool, string) {
		sts, err := admin.Status(ctx, sent.ID)
		return slices.ContainsFunc(sts, func(st bus.Status) bool { return st.To == "carol" && st.State == bus.StateFailed }), fmt.Sprint(sts, err)
	})
	if st, err := alice.Cancel(ctx, sent.ID); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("Cancel of a broadcast a recipient failed to handle = %+v, %v; want ErrInvalidMessage", st, err)
	}
}

// TestScheduleAtAPastTimeWithATTL: a time past fires at once, and the
// message's TTL counts from then. Its time was the time past, so that it
// expired on arrival, never handled.
func TestScheduleAtAPastTimeWithATTL(t *testing.T) {
	_, alice, rec, _ := scheduling(t)
	before := time.Now()
	ack, err := alice.Schedule(testContext(t), bus.Message{To: "bob", Type: "late", TTL: 10 * time.Minute}, bus.At(before.Add(-time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	d := rec.waitCount(t, 1)[0]
	if d.ID != ack.ID || d.Time.Before(before.Truncate(time.Second)) {
		t.Errorf("handled %s with time %v; want %s, its time the firing, after %v", d.ID, d.Time, ack.ID, before)
	}
}

// TestSchedulesOutliveMaxBytes: StreamConfig.MaxBytes bounds the message
// stream, not the schedule stream. The schedule stream had the same limit
// and removed its oldest messages first: the fired copies it keeps for
// the retention pushed out the schedules still waiting, which never fired
// while their records read scheduled.
func TestSchedulesOutliveMaxBytes(t *testing.T) {
	srv := embeddedtest.RunServer(t)
	ctx := testContext(t)
	if _, err := newAdmin(t, embeddedtest.Connect(t, srv)).Provision(ctx, bus.StreamConfig{MaxBytes: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	alice, bob := newBus(t, srv, "alice"), newBus(t, srv, "bob")
	rec := newRecorder()
	subscribe(t, bob, rec.handle)
	later, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "later"}, bus.In(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 16<<10)
	for i := range 24 { // 384 KiB fired
		if _, err := alice.Schedule(ctx, bus.Message{To: "bob", Type: "now", Data: big}, bus.At(time.Now())); err != nil {
			t.Fatal(err)
		}
		rec.waitCount(t, i+1)
	}
	if !scheduleStored(t, srv, "alice", later.ID) {
		t.Error("the schedule due in an hour is gone from the schedule stream")
	}
}

// TestRecurringScheduleOutlivesItsConversationsDeadline: a recurring
// schedule made in the handler of a conversation with a deadline fires on
// in that conversation, its firings without the deadline, which they come
// after. They carried it: each firing came after the deadline it carried,
// and what its handler sent in the conversation expired at once.
func TestRecurringScheduleOutlivesItsConversationsDeadline(t *testing.T) {
	s := newServer(t)
	alice := newBus(t, s, "alice", bus.WithConversationTimeout(time.Minute))
	bob, carol := newBus(t, s, "bob"), newBus(t, s, "carol")
	scheduled := make(chan string, 1)
	subscribe(t, bob, func(ctx context.Context, d *bus.Delivery) error {
		ack, err := bob.Schedule(ctx, bus.Message{To: "carol", Type: "tick"}, bus.Every(time.Second))
		scheduled <- ack.ID
		return err
	})
	rec := newRecorder()
	subscribe(t, carol, rec.handle)
	start := publish(t, alice, bus.Message{To: "bob", Type: "start"})
	id := <-scheduled
	t.Cleanup(func() { bob.Cancel(testContext(t), id) })
	d := rec.waitCount(t, 1)[0]
	if _, ok := d.Extensions[bus.ExtConversationBy]; ok || d.CorrelationID != start.ID {
		t.Errorf("a firing in conversation %s with extensions %v; want conversation %s, no deadline", d.CorrelationID, d.Extensions, start.ID)
	}
}
