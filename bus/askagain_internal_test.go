package bus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// TestAskAgain: a request whose answer does not come is made again, up to
// apiAttempts in all, never past the caller's context; any other error
// ends it at once.
func TestAskAgain(t *testing.T) {
	defer func(d time.Duration) { apiAttemptTimeout = d }(apiAttemptTimeout)
	apiAttemptTimeout = 50 * time.Millisecond
	lost := func(n int, calls *int) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			if *calls++; *calls <= n { // no answer: wait until the attempt ends
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 42, nil
		}
	}
	ctx := t.Context()
	var calls int
	if v, err := askAgain(ctx, nil, lost(apiAttempts-1, &calls)); err != nil || v != 42 || calls != apiAttempts {
		t.Errorf("%d answers lost: %d, %v after %d calls; want 42 after %d", apiAttempts-1, v, err, calls, apiAttempts)
	}
	calls = 0
	if _, err := askAgain(ctx, nil, lost(apiAttempts, &calls)); !errors.Is(err, context.DeadlineExceeded) || calls != apiAttempts {
		t.Errorf("%d answers lost: %v after %d calls; want the deadline after %d", apiAttempts, err, calls, apiAttempts)
	}
	calls = 0
	short, cancel := context.WithTimeout(ctx, apiAttemptTimeout/2)
	defer cancel()
	if _, err := askAgain(short, nil, lost(apiAttempts, &calls)); !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Errorf("the caller's deadline first: %v after %d calls; want it after 1", err, calls)
	}
	calls = 0
	refused := errors.New("refused")
	if _, err := askAgain(ctx, nil, func(context.Context) (int, error) { calls++; return 0, refused }); !errors.Is(err, refused) || calls != 1 {
		t.Errorf("another error: %v after %d calls; want it after 1", err, calls)
	}
}

// TestAskAgainAtReconnect: an attempt under way when its connection
// reconnects is made again at once, not when it times out: the server's
// answer to it, if sent while the connection was down, never comes.
func TestAskAgainAtReconnect(t *testing.T) {
	defer func(d time.Duration) { apiAttemptTimeout = d }(apiAttemptTimeout)
	apiAttemptTimeout = time.Hour
	s := embeddedtest.RunServer(t)
	nc, err := nats.Connect(s.ClientURL(), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := watchReconnects(nc)
	defer r.stop()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	calls := 0
	v, err := askAgain(ctx, r, func(ctx context.Context) (int, error) {
		if calls++; calls == 1 { // its answer lost with the connection
			if err := nc.ForceReconnect(); err != nil {
				return 0, err
			}
			<-ctx.Done()
			return 0, ctx.Err()
		}
		return 42, nil
	})
	if err != nil || v != 42 || calls != 2 {
		t.Errorf("an answer lost at a reconnect: %d, %v after %d calls; want 42 after 2", v, err, calls)
	}
}

// lossyJS is a real JetStream context whose next lose consumer lookups get
// no answer, and whose next loseCreates consumer creates (of the consumer
// named loseCreatesOf, if set) are made but get no answer, as requests
// whose answers a cluster lost: each waits until its context ends.
type lossyJS struct {
	jetstream.JetStream
	lose, loseCreates atomic.Int32
	loseCreatesOf     string
}

func (j *lossyJS) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.CreateConsumer(ctx, stream, cfg)
	if (j.loseCreatesOf == "" || cfg.Name == j.loseCreatesOf) && j.loseCreates.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c, err
}

func (j *lossyJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if j.lose.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return j.JetStream.Consumer(ctx, stream, name)
}

// TestEnsureSpecsAsksAgain: making an agent's consumers on a real server
// outlasts lost answers, up to apiAttempts, and fails with the deadline
// past them.
func TestEnsureSpecsAsksAgain(t *testing.T) {
	// The short attempts are for the lost answers only: provisioning under
	// them failed on a loaded machine (creating a stream can take longer).
	b := benchBus(t, provisionedServer(t), "worker")
	defer func(d time.Duration) { apiAttemptTimeout = d }(apiAttemptTimeout)
	apiAttemptTimeout = 100 * time.Millisecond
	lossy := &lossyJS{JetStream: b.js}
	b.js = lossy
	cs, err := b.opts.scheme.Consumers("worker")
	if err != nil {
		t.Fatal(err)
	}
	specs := []consumers.Spec{{Name: cs[0].Name, FilterSubject: cs[0].Filter}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	lossy.lose.Store(apiAttempts - 1)
	if _, err := b.ensureSpecs(ctx, specs, consumers.Settings{}); err != nil {
		t.Fatalf("after %d lost answers: %v", apiAttempts-1, err)
	}
	if _, err := lossy.JetStream.Consumer(ctx, b.opts.scheme.Stream(), cs[0].Name); err != nil {
		t.Errorf("the consumer was not made: %v", err)
	}
	lossy.lose.Store(apiAttempts)
	if _, err := b.ensureSpecs(ctx, specs, consumers.Settings{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after %d lost answers: %v, want context.DeadlineExceeded", apiAttempts, err)
	}
}

// TestNewReaderAsksAgain: a read whose consumer create lost its answer
// asks again, gets the consumer the first create made, reads it and
// deletes it: no second consumer, none left.
func TestNewReaderAsksAgain(t *testing.T) {
	b, lossy, ctx := lossyBus(t, "reader")
	if err := b.Register(ctx, AgentCard{Description: "reads"}); err != nil {
		t.Fatal(err)
	}
	lossy.loseCreates.Store(apiAttempts - 1)
	agents, err := b.Agents(ctx)
	if err != nil || len(agents) != 1 || agents[0].Card.Description != "reads" {
		t.Fatalf("Agents after %d lost answers = %+v, %v", apiAttempts-1, agents, err)
	}
	for _, stream := range []string{b.registry.stream, b.presence.stream} {
		s, err := lossy.JetStream.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Consumers != 0 {
			t.Errorf("after the read: %s has %d consumers, %v; want none", stream, info.State.Consumers, err)
		}
	}
}

// TestHistoryReadAsksAgain: an agent's lookup whose history consumer's
// create lost its answer asks again and finds the message.
func TestHistoryReadAsksAgain(t *testing.T) {
	b, lossy, ctx := lossyBus(t, "reader")
	// Two messages of one window, the looked-up one first: the window's
	// last message is the other, so the lookup reads the window.
	var ack PubAck
	for _, id := range []string{"019ab1c2-d3e4-7abc-8def-000000000001", "019ab1c2-d3e4-7abc-8def-000000000002"} {
		a, err := b.Publish(ctx, Message{ID: id, To: "other", Type: "T"})
		if err != nil {
			t.Fatal(err)
		}
		if ack.ID == "" {
			ack = a
		}
	}
	sent, _, err := b.opts.scheme.SentHistoryConsumer(b.agent)
	if err != nil {
		t.Fatal(err)
	}
	lossy.loseCreatesOf = sent
	lossy.loseCreates.Store(apiAttempts - 1)
	st, err := b.Status(ctx, ack.ID)
	if err != nil || len(st) == 0 || st[0].State != StatePending {
		t.Fatalf("Status after %d lost answers = %+v, %v; want pending", apiAttempts-1, st, err)
	}
	if n := lossy.loseCreates.Load(); n >= 0 {
		t.Errorf("%d lost answers left: the read did not use %s", n+1, sent)
	}
}

// lossyBus returns a bus of agent on a server of its own whose JetStream
// context is a lossyJS, with API attempts of 100 ms for the test, and a
// context for its calls.
func lossyBus(t *testing.T, agent string) (*Bus, *lossyJS, context.Context) {
	t.Helper()
	was := apiAttemptTimeout
	apiAttemptTimeout = 100 * time.Millisecond
	t.Cleanup(func() { apiAttemptTimeout = was })
	b := benchBus(t, provisionedServer(t), agent)
	lossy := &lossyJS{JetStream: b.js}
	b.js = lossy
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return b, lossy, ctx
}

// racedJS is a JetStream on which another process creates each bucket,
// and turns its rollups off, between this one's look for the bucket and
// its create: its first CreateOrUpdateKeyValue of a bucket does the other
// process's part on the real server, then sends the create this process
// would send next and returns the server's answer to it.
type racedJS struct {
	jetstream.JetStream
	raced map[string]bool
}

func (j *racedJS) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if j.raced[cfg.Bucket] {
		return j.JetStream.CreateOrUpdateKeyValue(ctx, cfg)
	}
	j.raced[cfg.Bucket] = true
	if _, err := j.JetStream.CreateOrUpdateKeyValue(ctx, cfg); err != nil { // the other process
		return nil, err
	}
	s, err := j.JetStream.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		return nil, err
	}
	if err := denyRollups(ctx, j.JetStream, "KV_"+cfg.Bucket); err != nil {
		return nil, err
	}
	_, err = j.JetStream.CreateStream(ctx, s.CachedInfo().Config) // this one's create, rollups allowed
	return nil, err
}

// TestProvisionRacingAnotherProcess: a provision whose buckets another
// process creates, and denies rollups on, between its look and its create
// succeeds, and leaves rollups denied on the status and registry buckets.
// Its create asked for rollups allowed, which the server refused as
// "stream name already in use" (six processes provisioning at once failed
// so in 3 rounds of 5). The presence bucket keeps rollups on whatever
// provision asks (docs/security.md).
func TestProvisionRacingAnotherProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nc, js := unprovisioned(t)
	raced := &racedJS{JetStream: js, raced: map[string]bool{}}
	if _, err := provision(ctx, nc, raced, StreamConfig{}, false, func(err error) { t.Error(err) }); err != nil {
		t.Fatalf("provision racing another process: %v", err)
	}
	scheme := subjects.Default()
	for _, bucket := range []string{scheme.StatusBucket(), scheme.RegistryBucket()} {
		st, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if st.CachedInfo().Config.AllowRollup {
			t.Errorf("%s allows rollups", bucket)
		}
	}
	if len(raced.raced) != 3 {
		t.Errorf("raced buckets %v, want the status, registry and presence buckets", raced.raced)
	}
}

// TestReaderGivenUpIsDeleted: a read whose caller gives up while the
// server makes its consumer (the answer lost) deletes that consumer.
// Before 2026-11-28 it stayed until the server removed it, a minute
// after, and a loop of History calls with short deadlines kept one for
// each that timed out so (found by a hunt for what a long-running agent
// leaves behind).
func TestReaderGivenUpIsDeleted(t *testing.T) {
	b := benchBus(t, provisionedServer(t), "reader")
	stream := b.opts.scheme.Stream()
	consumersOf := func() int {
		t.Helper()
		s, err := b.js.Stream(t.Context(), stream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Consumers
	}
	before := consumersOf()
	lossy := &lossyJS{JetStream: b.js}
	lossy.loseCreates.Store(1 << 20)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := newReader(ctx, lossy, stream, jetstream.ConsumerConfig{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("newReader with its answers lost: %v, want its deadline", err)
	}
	if n := consumersOf(); n != before {
		t.Errorf("%d consumers after the read was given up, %d before", n, before)
	}
}
