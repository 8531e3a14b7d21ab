package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestDuplicateIDStoredOnce(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	agent := newBus(t, s, "agent")

	m := bus.Message{ID: "fixed-id-1", To: "agent", Type: "T", Data: []byte("once")}
	first := publish(t, sender, m)
	second := publish(t, sender, m)
	if first.Duplicate || !second.Duplicate || second.Sequence != first.Sequence {
		t.Fatalf("acks %+v then %+v, want the second a duplicate of the first", first, second)
	}
	publish(t, sender, bus.Message{To: "agent", Type: "after"})

	r := newRecorder()
	subscribe(t, agent, r.handle)
	r.waitCount(t, 2)
	if got := r.types(); !slices.Equal(got, []string{"T", "after"}) {
		t.Errorf("handled %v, want [T after]", got)
	}
}

func TestPublishErrors(t *testing.T) {
	s := newServer(t, func(o *embedded.Options) { o.MaxPayload = 64 * 1024 })
	b := newBus(t, s, "sender")
	ctx := testContext(t)
	tests := []struct {
		name    string
		msg     bus.Message
		wantErr error
	}{
		{"empty to", bus.Message{Type: "T"}, bus.ErrInvalidMessage},
		{"empty type", bus.Message{To: "x"}, bus.ErrInvalidMessage},
		{"bad priority", bus.Message{To: "x", Type: "T", Priority: 9}, bus.ErrInvalidMessage},
		{"invalid UTF-8 agent", bus.Message{To: "\xff", Type: "T"}, bus.ErrInvalidAgentID},
		{"control character in type", bus.Message{To: "x", Type: "a\r\nb"}, bus.ErrInvalidMessage},
		{"over-long agent", bus.Message{To: strings.Repeat("é", 100), Type: "T"}, bus.ErrInvalidAgentID},
		{"impersonation", bus.Message{From: "someone-else", To: "x", Type: "T"}, bus.ErrInvalidMessage},
		{"oversize payload", bus.Message{To: "x", Type: "T", Data: make([]byte, 70*1024)}, bus.ErrPayloadTooLarge},
		{"negative TTL", bus.Message{To: "x", Type: "T", TTL: -time.Second}, bus.ErrInvalidMessage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Publish(ctx, tt.msg)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Publish error = %v, want %v", err, tt.wantErr)
			}
			if _, err := b.PublishAsync(context.Background(), tt.msg); !errors.Is(err, tt.wantErr) {
				t.Fatalf("PublishAsync error = %v, want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := b.Publish(ctx, bus.Message{To: "x", Type: "T", Data: make([]byte, 70*1024)}); err == nil ||
		!strings.Contains(err.Error(), "max_payload of 65536") || !strings.Contains(err.Error(), "data 71680") {
		t.Errorf("oversize payload error %v, want the size and the server's limit", err)
	}
	var fe *codec.FieldError
	if _, err := b.Publish(ctx, bus.Message{To: "x", Type: "T", Priority: 9}); !errors.As(err, &fe) || fe.Field == "" {
		t.Errorf("bad priority error %v, want a *codec.FieldError naming the field", err)
	}
}

func TestAsyncPublish(t *testing.T) {
	s := newServer(t)
	sender := newBus(t, s, "sender")
	var futures []*bus.PublishFuture
	for i := range 100 {
		f, err := sender.PublishAsync(context.Background(), bus.Message{To: "agent", Type: "bulk", Data: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	select {
	case <-sender.PublishAsyncComplete():
	case <-time.After(testTimeout):
		t.Fatal("async publishes not complete")
	}
	for i, f := range futures {
		ack, err := f.Wait(testContext(t))
		if err != nil || ack.Sequence != uint64(i+1) || ack.ID != f.ID() {
			t.Fatalf("future %d: ack %+v err %v", i, ack, err)
		}
	}
	r := newRecorder()
	subscribe(t, newBus(t, s, "agent"), r.handle, bus.WithPrefetch(32), bus.WithConcurrency(4))
	r.waitCount(t, 100)
}

// TestPublishIDWithASpaceAtAnEnd: an ID with a space at either end is
// refused. The server trims the Nats-Msg-Id header's value, so " job-1"
// was stored as a duplicate of "job-1": Publish reported Duplicate, and the
// message was lost.
func TestPublishIDWithASpaceAtAnEnd(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "sender")
	ctx := testContext(t)
	for _, id := range []string{"job-1", "job-2\u00a0", "\u3000job-3", "job 4"} {
		if ack, err := b.Publish(ctx, bus.Message{ID: id, To: "worker", Type: "T"}); err != nil || ack.Duplicate {
			t.Errorf("Publish(%q) = %+v, %v; want it stored", id, ack, err)
		}
	}
	for _, id := range []string{" job-1", "job-1 "} {
		ack, err := b.Publish(ctx, bus.Message{ID: id, To: "worker", Type: "T"})
		var fe *codec.FieldError
		if !errors.Is(err, bus.ErrInvalidMessage) || !errors.As(err, &fe) || fe.Field != "ID" {
			t.Errorf("Publish(%q) = %+v, %v; want a FieldError on ID wrapping ErrInvalidMessage", id, ack, err)
		}
	}
}

// TestPublishOverTheStreamsMaxMsgSize: a message over the stream's
// MaxMsgSize, under the server's max_payload, fails with
// ErrPayloadTooLarge, as one over max_payload does. It failed with the
// server's JetStream error (10054), which wrapped nothing of the bus's.
func TestPublishOverTheStreamsMaxMsgSize(t *testing.T) {
	s := embeddedtest.RunServer(t)
	if _, err := adminOf(t, s).Provision(testContext(t), bus.StreamConfig{MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	b := newBus(t, s, "sender")
	if _, err := b.Publish(testContext(t), bus.Message{To: "worker", Type: "T", Data: make([]byte, 4096)}); !errors.Is(err, bus.ErrPayloadTooLarge) {
		t.Errorf("Publish of 4 KiB under a MaxMsgSize of 1 KiB = %v, want ErrPayloadTooLarge", err)
	}
}

// TestRefusedResendOfAStoredMessage: a second publish of a stored
// message's ID that the server refuses (here over max_payload) leaves the
// stored message reading as it stands, pending: the sender's failed
// record, of a publish that never went out, does not describe what the
// stream holds. Before, the stored message read failed until it was
// handled (found by hunt h12).
func TestRefusedResendOfAStoredMessage(t *testing.T) {
	s := newServer(t, func(o *embedded.Options) { o.MaxPayload = 64 << 10 })
	b := newBus(t, s, "sender")
	ack := publish(t, b, bus.Message{ID: "job-1", To: "alice", Type: "T", Data: []byte("small")})
	if _, err := b.Publish(testContext(t), bus.Message{ID: "job-1", To: "alice", Type: "T", Data: make([]byte, 128<<10)}); !errors.Is(err, bus.ErrPayloadTooLarge) {
		t.Fatalf("oversize resend: %v, want ErrPayloadTooLarge", err)
	}
	if err := b.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	sts, err := b.Status(testContext(t), "job-1")
	if err != nil || len(sts) != 1 || sts[0].State != bus.StatePending || sts[0].Sequence != ack.Sequence {
		t.Errorf("Status(job-1) = %+v, %v; want pending at sequence %d", sts, err, ack.Sequence)
	}
	// A publish that failed and stored nothing still reads failed.
	if _, err := b.Publish(testContext(t), bus.Message{ID: "job-2", To: "alice", Type: "T", Data: make([]byte, 128<<10)}); !errors.Is(err, bus.ErrPayloadTooLarge) {
		t.Fatal(err)
	}
	if err := b.Flush(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if sts, err := b.Status(testContext(t), "job-2"); err != nil || len(sts) != 1 || sts[0].State != bus.StateFailed {
		t.Errorf("Status(job-2) = %+v, %v; want failed", sts, err)
	}
}
