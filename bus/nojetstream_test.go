package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestErrorsSayTheFix: a publish to a server without JetStream says so and
// how to enable it; one to a bus nobody provisioned names the stream and
// the command to run, once, however many consumers a subscription asked
// for.
func TestErrorsSayTheFix(t *testing.T) {
	t.Run("JetStream off", func(t *testing.T) {
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		t.Cleanup(srv.Shutdown)
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		b, err := bus.New(nc, "a", bus.WithoutLifecycle(), bus.WithPublishAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = b.Publish(ctx, bus.Message{To: "b", Type: "T"})
		if !errors.Is(err, bus.ErrUnsupportedServer) || !strings.Contains(err.Error(), "JetStream is not enabled") || !strings.Contains(err.Error(), "-js") {
			t.Errorf("Publish without JetStream: %v, want ErrUnsupportedServer saying JetStream is off and how to turn it on", err)
		}
		// The registry is read through a consumer of its bucket: the fix
		// is the same, not to provision a bucket.
		_, err = b.Agents(ctx)
		if !errors.Is(err, bus.ErrUnsupportedServer) || errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), "-js") {
			t.Errorf("Agents without JetStream: %v, want ErrUnsupportedServer saying how to turn JetStream on", err)
		}
	})
	t.Run("not provisioned", func(t *testing.T) {
		s := newServer(t)
		b := newBus(t, s, "w", bus.WithRoot("fresh"), bus.WithoutLifecycle())
		_, err := b.Subscribe(testContext(t), func(context.Context, *bus.Delivery) error { return nil })
		if !errors.Is(err, bus.ErrNotProvisioned) {
			t.Fatalf("Subscribe: %v, want ErrNotProvisioned", err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "stream FRESH does not exist") || !strings.Contains(msg, "agentbus provision") || len(msg) > 200 {
			t.Errorf("Subscribe error %q (%d bytes), want one short line naming FRESH and agentbus provision", msg, len(msg))
		}
		_, err = b.Agents(testContext(t))
		if !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), "FRESH_AGENTS") || !strings.Contains(err.Error(), "agentbus provision") {
			t.Errorf("Agents: %v, want ErrNotProvisioned naming the bucket FRESH_AGENTS and agentbus provision", err)
		}
	})
	t.Run("presence bucket missing", func(t *testing.T) {
		// As a version before the presence bucket left it provisioned.
		s := newServer(t)
		js, err := jetstream.New(embeddedtest.Connect(t, s))
		if err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteStream(testContext(t), "KV_AGENTBUS_PRESENCE"); err != nil {
			t.Fatal(err)
		}
		b := newBus(t, s, "w")
		for name, call := range map[string]func(ctx context.Context) error{
			"Register":    func(ctx context.Context) error { return b.Register(ctx, bus.AgentCard{}) },
			"Agents":      func(ctx context.Context) error { _, err := b.Agents(ctx); return err },
			"LookupAgent": func(ctx context.Context) error { _, err := b.LookupAgent(ctx, "w"); return err },
		} {
			if err := call(testContext(t)); !errors.Is(err, bus.ErrNotProvisioned) || !strings.Contains(err.Error(), "AGENTBUS_PRESENCE") {
				t.Errorf("%s: %v, want ErrNotProvisioned naming the bucket AGENTBUS_PRESENCE", name, err)
			}
		}
	})
}
