package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestClosedBus(t *testing.T) {
	s := newServer(t)
	b := newBus(t, s, "agent")
	sub := subscribe(t, b, newRecorder().handle)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Done():
	default:
		t.Error("subscription still running after Close")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if _, err := b.Publish(testContext(t), bus.Message{To: "x", Type: "T"}); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if _, err := b.Subscribe(testContext(t), newRecorder().handle); !errors.Is(err, bus.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want ErrClosed", err)
	}
}

func TestNewValidates(t *testing.T) {
	s := newServer(t)
	nc := embeddedtest.Connect(t, s)
	tests := []struct {
		name    string
		agent   string
		opts    []bus.Option
		wantErr error
	}{
		{"empty agent", "", nil, bus.ErrInvalidAgentID},
		{"broadcast agent", "*", nil, bus.ErrInvalidAgentID},
		{"bad root", "a", []bus.Option{bus.WithRoot("a b")}, bus.ErrInvalidOption},
		{"nil codec", "a", []bus.Option{bus.WithCodec(nil)}, bus.ErrInvalidOption},
		{"zero async pending", "a", []bus.Option{bus.WithMaxAsyncPending(0)}, bus.ErrInvalidOption},
		{"provision root mismatch", "a", []bus.Option{bus.WithRoot("one"), bus.WithProvision(bus.StreamConfig{Root: "two"})}, bus.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := bus.New(nc, tt.agent, tt.opts...); !errors.Is(err, tt.wantErr) {
				t.Errorf("New error = %v, want %v", err, tt.wantErr)
			}
		})
	}
	b := newBus(t, s, "a")
	for _, opt := range []bus.SubscribeOption{bus.WithConcurrency(0), bus.WithPrefetch(-1), bus.WithAckWait(time.Millisecond),
		bus.WithMaxDeliver(0), bus.WithPolicy(bus.Weighted, 1, 2), bus.WithBackoff(nil)} {
		if _, err := b.Subscribe(testContext(t), newRecorder().handle, opt); !errors.Is(err, bus.ErrInvalidOption) {
			t.Errorf("Subscribe with a bad option = %v, want ErrInvalidOption", err)
		}
	}
}
