package bus_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestStatusByIndexedSubject: a message whose sender wrote no record (here
// a foreign publisher that indexes its subjects) is found by its subject.
// An operator and its recipient read it pending at its sequence, then
// completed once handled, which nobody wrote: the lookup reads it off the
// recipient's consumer. A subject that names an ID its event does not carry
// finds nothing by that ID, and does not hide the message that has it from
// an operator, who reads every subject that names the ID. (It does from an
// agent's lookup, which its permissions limit to the last message of each
// of two filters: docs/security.md.)
func TestStatusByIndexedSubject(t *testing.T) {
	s := newServer(t)
	worker := newBus(t, s, "worker")
	admin := adminOf(t, s)
	ctx := testContext(t)
	js, err := jetstream.New(embeddedtest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	send := func(from, id, subjectID string) *jetstream.PubAck {
		t.Helper()
		m := &codec.Message{ID: id, From: from, To: "worker", Type: "T", Priority: 2, CorrelationID: "conv-ix"}
		m.SetDefaults(time.Now())
		h, data, err := codec.Binary{}.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		h[jetstream.MsgIDHeader] = []string{id}
		subject := indexedSubject(t, "worker", from, "T", 2, subjectID, "conv-ix")
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	ack := send("foreign", "ix-1", "ix-1")
	send("foreign", "ix-2", "ix-3") // names ix-3, carries ix-2

	check := func(who string, sts []bus.Status, err error, want bus.State) string {
		if err != nil || len(sts) != 1 {
			return fmt.Sprintf("%s: %+v, %v", who, sts, err)
		}
		st := sts[0]
		if st.ID != "ix-1" || st.From != "foreign" || st.To != "worker" || st.Type != "T" || st.Priority != 2 ||
			st.CorrelationID != "conv-ix" || st.Stream != "AGENTBUS" || st.Sequence != ack.Sequence || st.State != want {
			return fmt.Sprintf("%s: %+v, want ix-1 %s at sequence %d", who, st, want, ack.Sequence)
		}
		return ""
	}
	sts, err := admin.Status(ctx, "ix-1")
	if msg := check("Admin.Status", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}
	sts, err = worker.Status(ctx, "ix-1")
	if msg := check("the recipient's Status", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}
	send("mallory", "ix-9", "ix-1") // names ix-1 too, later
	for _, id := range []string{"ix-2", "ix-3"} {
		if sts, err := admin.Status(ctx, id); !errors.Is(err, bus.ErrNoStatus) {
			t.Errorf("Admin.Status(%s) = %+v, %v, want ErrNoStatus", id, sts, err)
		}
	}
	sts, err = admin.Status(ctx, "ix-1")
	if msg := check("Admin.Status after a later subject naming ix-1", sts, err, bus.StatePending); msg != "" {
		t.Error(msg)
	}

	r := newRecorder()
	subscribe(t, worker, r.handle)
	r.waitCount(t, 3)
	waitFor(t, "ix-1 read completed", func() (bool, string) {
		sts, err := admin.Status(ctx, "ix-1")
		msg := check("Admin.Status", sts, err, bus.StateCompleted)
		return msg == "", msg
	})
}
