package bus_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

func profile(t *testing.T, name string) profiles.Profile {
	t.Helper()
	p, ok := profiles.Lookup(name)
	if !ok {
		t.Fatalf("no profile %q", name)
	}
	return p
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPublishNativePipeline: a pipeline message crosses the bus byte for
// byte, addressed and prioritised by its own fields.
func TestPublishNativePipeline(t *testing.T) {
	s := newServer(t)
	native := readFile(t, "../codec/profiles/testdata/pipeline/message.json")
	pm := newBus(t, s, "pm")
	ack, err := pm.PublishNative(testContext(t), profile(t, "pipeline"), native, profiles.Addressing{})
	if err != nil {
		t.Fatalf("PublishNative: %v", err)
	}
	r := newRecorder()
	subscribe(t, newBus(t, s, "dev"), r.handle)
	d := r.waitCount(t, 1)[0]
	if !bytes.Equal(d.Data, native) {
		t.Errorf("data changed on the way:\n%s\nwant\n%s", d.Data, native)
	}
	if d.ID != ack.ID || d.ID != "msg-uuid-v4" || d.From != "pm" || d.To != "dev" || d.Priority != 4 ||
		d.DataSchema != profile(t, "pipeline").DataSchema() || d.ContentType != "application/json" {
		t.Errorf("delivered %+v", d.Message)
	}
}

func TestPublishNativeStrictAndLenient(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)

	// basemessage is strict: the document's own CTO review example lacks a
	// required field, so it is refused and nothing is published.
	orch := newBus(t, s, "build orchestrator")
	review := readFile(t, "../codec/profiles/testdata/basemessage/cto_review.json")
	_, err := newBus(t, s, senderOf(t, review)).PublishNative(ctx, profile(t, "basemessage"), review, profiles.Addressing{})
	var ve *profiles.ValidationError
	if !errors.Is(err, bus.ErrInvalidMessage) || !errors.As(err, &ve) || len(ve.Findings) == 0 {
		t.Fatalf("invalid basemessage: %v, want ErrInvalidMessage with findings", err)
	}

	// A native sender other than the bus's agent is refused.
	task := readFile(t, "../codec/profiles/testdata/basemessage/task_assignment.json")
	if _, err := newBus(t, s, "impostor").PublishNative(ctx, profile(t, "basemessage"), task, profiles.Addressing{}); !errors.Is(err, bus.ErrInvalidMessage) {
		t.Errorf("foreign sender: %v, want ErrInvalidMessage", err)
	}
	if _, err := orch.PublishNative(ctx, profile(t, "basemessage"), task, profiles.Addressing{}); err != nil {
		t.Fatalf("valid basemessage: %v", err)
	}

	// coordination is lenient: an over-long question is delivered with the
	// finding attached.
	q := strings.Replace(string(readFile(t, "../codec/profiles/testdata/coordination/question.json")),
		"Should password hash use bcrypt or argon2?", strings.Repeat("why? ", 70), 1)
	worker := newBus(t, s, "database-build-agent")
	if _, err := worker.PublishNative(ctx, profile(t, "coordination"), []byte(q), profiles.Addressing{}); err != nil {
		t.Fatalf("lenient coordination: %v", err)
	}
	r := newRecorder()
	subscribe(t, newBus(t, s, "orchestrator"), r.handle)
	d := r.waitCount(t, 1)[0]
	findings, err := profiles.AttachedFindings(&d.Message)
	if err != nil || len(findings) == 0 || string(d.Data) != q {
		t.Errorf("delivered findings %v (%v), data intact %v", findings, err, string(d.Data) == q)
	}
}

// senderOf returns the native "from" of a JSON message.
func senderOf(t *testing.T, native []byte) string {
	t.Helper()
	p := profile(t, "basemessage")
	m, err := p.Decode(native, profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	return m.From
}

// TestInvalidNativeFromRawPublisher: a basemessage that breaks the
// protocol, published without PublishNative, is dead-lettered by the
// receiver, and its sender gets the MESSAGE_ERROR the protocol prescribes.
func TestInvalidNativeFromRawPublisher(t *testing.T) {
	s := newServer(t)
	review := readFile(t, "../codec/profiles/testdata/basemessage/cto_review.json")
	p := profile(t, "basemessage")
	m, err := p.Decode(review, profiles.Addressing{})
	if err != nil {
		t.Fatal(err)
	}
	// Publish skips the protocol's validation: this is what a publisher
	// that does not use PublishNative sends.
	if _, err := newBus(t, s, "@agent-cto").Publish(testContext(t), *m); err != nil {
		t.Fatal(err)
	}
	receiver := newBus(t, s, "build orchestrator")
	r := newRecorder()
	subscribe(t, receiver, r.handle)
	dl := waitDeadLetters(t, receiver, 1)[0]
	if reason := dl.Header.Get(bus.HeaderDeadLetterReason); reason != string(bus.ReasonInvalidNative) {
		t.Errorf("dead-letter reason %q, want %q", reason, bus.ReasonInvalidNative)
	}

	replies := newRecorder()
	subscribe(t, newBus(t, s, "@agent-cto"), replies.handle)
	d := replies.waitCount(t, 1)[0]
	if d.Type != profiles.TypeMessageError || d.CorrelationID != "project-review" || d.CausationID != "msg-456" ||
		!strings.Contains(string(d.Data), `"originalMessageId"`) || !strings.Contains(string(d.Data), "msg-456") {
		t.Errorf("MESSAGE_ERROR %+v data %s", d.Message, d.Data)
	}
	if got := r.deliveries(); len(got) != 0 {
		t.Errorf("the invalid message reached the handler: %v", r.types())
	}
}

// TestMessageErrorGoesToTheSender: the MESSAGE_ERROR for an invalid
// basemessage goes to its sender, whom the subject vouches for, whatever
// its native from says. It went to the agent the native from named: an
// agent that sent nothing got it, or with "*" every agent did, and the
// sender got nothing addressed to it.
func TestMessageErrorGoesToTheSender(t *testing.T) {
	for _, claimed := range []string{"alice", "*"} {
		t.Run(claimed, func(t *testing.T) {
			s := newServer(t)
			native := []byte(`{"messageId":"msg-9","correlationId":"c-9","timestamp":"2024-01-01T12:00:00Z",` +
				`"from":"` + claimed + `","to":"worker","type":"STATUS_UPDATE","payload":{}}`) // no version: invalid
			m := bus.Message{ID: "msg-9", To: "worker", Type: "STATUS_UPDATE", CorrelationID: "c-9",
				ContentType: "application/json", DataSchema: profiles.BaseMessage{}.DataSchema(), Data: native}
			toSender := newRecorder()
			mallory := newBus(t, s, "mallory")
			subscribe(t, mallory, toSender.handle)
			if _, err := mallory.Publish(testContext(t), m); err != nil {
				t.Fatal(err)
			}
			subscribe(t, newBus(t, s, "worker"), newRecorder().handle)
			d := toSender.waitCount(t, 1)[0]
			var reply struct{ To string }
			if d.Type != profiles.TypeMessageError || d.To != "mallory" || json.Unmarshal(d.Data, &reply) != nil || reply.To != "mallory" {
				t.Errorf("the sender got %s to %q (native to %q), want a MESSAGE_ERROR to mallory", d.Type, d.To, reply.To)
			}
		})
	}
}
