package bus_test

import (
	"errors"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNotProvisioned(t *testing.T) {
	s := embeddedtest.RunServer(t)
	b := newBus(t, s, "agent")
	if _, err := b.Publish(testContext(t), bus.Message{To: "x", Type: "T"}); !errors.Is(err, bus.ErrNotProvisioned) {
		t.Errorf("Publish error = %v, want ErrNotProvisioned", err)
	}
	if _, err := b.Subscribe(testContext(t), newRecorder().handle); !errors.Is(err, bus.ErrNotProvisioned) {
		t.Errorf("Subscribe error = %v, want ErrNotProvisioned", err)
	}
}

func TestProvisionIsIdempotentAndUpdates(t *testing.T) {
	s := embeddedtest.RunServer(t)
	nc := embeddedtest.Connect(t, s)
	admin := newAdmin(t, nc)
	ctx := testContext(t)
	info, err := admin.Provision(ctx, bus.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.Name != "AGENTBUS" || c.MaxAge != 30*24*time.Hour || c.Duplicates != time.Hour || !c.AllowMsgTTL ||
		c.MaxConsumers != bus.DefaultMaxConsumers || c.Storage != jetstream.FileStorage || c.Replicas != 1 {
		t.Errorf("provisioned config %+v", c)
	}
	if _, err := admin.Provision(ctx, bus.StreamConfig{}); err != nil {
		t.Fatalf("second provision: %v", err)
	}
	info, err = admin.Provision(ctx, bus.StreamConfig{MaxAge: 48 * time.Hour, DuplicateWindow: 2 * time.Minute})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if info.Config.MaxAge != 48*time.Hour || info.Config.Duplicates != 2*time.Minute {
		t.Errorf("updated config max age %v dedup %v", info.Config.MaxAge, info.Config.Duplicates)
	}
	if _, err := admin.Provision(ctx, bus.StreamConfig{DuplicateWindow: 2 * time.Hour, MaxAge: time.Hour}); !errors.Is(err, bus.ErrInvalidOption) {
		t.Errorf("dedup window over max age: %v, want ErrInvalidOption", err)
	}
}
