package consumers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// lossyJS is a real JetStream context whose next lose consumer lookups get
// no answer, as a request whose answer a cluster lost: each waits until
// its context ends.
type lossyJS struct {
	jetstream.JetStream
	lose atomic.Int32
}

func (j *lossyJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if j.lose.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return j.JetStream.Consumer(ctx, stream, name)
}

// TestEnsureAsksAgain: an attempt whose answer does not come is made
// again, up to ensureAttempts in all, and never past the caller's context.
func TestEnsureAsksAgain(t *testing.T) {
	defer func(d time.Duration) { ensureAttemptTimeout = d }(ensureAttemptTimeout)
	ensureAttemptTimeout = 100 * time.Millisecond
	js, err := jetstream.New(embeddedtest.Connect(t, embeddedtest.RunServer(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	cfg := Settings{}.ConsumerConfig(Spec{Name: "c", FilterSubject: "s.c.>"})

	lossy := &lossyJS{JetStream: js}
	lossy.lose.Store(ensureAttempts - 1)
	if c, err := ensure(ctx, lossy, "S", cfg); err != nil || c.CachedInfo().Name != "c" {
		t.Fatalf("after %d lost answers: %v, %v; want the consumer", ensureAttempts-1, c, err)
	}

	lossy.lose.Store(ensureAttempts)
	if _, err := ensure(ctx, lossy, "S", cfg); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after %d lost answers: %v, want context.DeadlineExceeded", ensureAttempts, err)
	}

	lossy.lose.Store(ensureAttempts)
	short, cancelShort := context.WithTimeout(ctx, ensureAttemptTimeout/2)
	defer cancelShort()
	if _, err := ensure(short, lossy, "S", cfg); !errors.Is(err, context.DeadlineExceeded) || short.Err() == nil {
		t.Errorf("a caller's context ending first: %v, want its deadline", err)
	}
	if lossy.lose.Load() != ensureAttempts-1 {
		t.Errorf("%d attempts past the caller's deadline, want none", ensureAttempts-1-lossy.lose.Load())
	}
}
