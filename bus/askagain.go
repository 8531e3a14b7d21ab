package bus

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The answer to a request the bus makes of the server can be lost: in a
// cluster (a leader change, a server too busy to answer in time), and
// whenever the connection drops with the request in flight, as it does when
// a server restarts or the client moves to another node: nats.go fails no
// request on a reconnect. The caller would wait until its context ended,
// and a handler's read, whose context has no deadline, for good. So every
// request the bus makes whose answer it waits for is made by askAgain, in
// one of three ways: a JetStream handle whose reads ask again (askingJS),
// a direct get (directGet), or a write that is the same when made twice
// (publishAgain). An attempt ends when its answer has not come in time,
// and at once when the connection reconnects (reconnects), whose drop may
// have lost it. The exceptions bound their wait otherwise: Publish, with
// its own attempts (publishAttemptTimeout), and reads through a consumer,
// with its pull's expiry (readPending pulls again when a pull was lost).

// Attempts of askAgain: each is bounded by apiAttemptTimeout when ctx
// allows longer, and ends when its connection reconnects.
const apiAttempts = 3

var apiAttemptTimeout = 5 * time.Second // a variable for the tests

// askAgain calls do, an idempotent request, with a context bounded by
// apiAttemptTimeout, and again when its answer did not come in time or its
// connection reconnected meanwhile (r, nil for none watched: an answer
// the server sent while the connection was down never comes), up to
// apiAttempts calls in all and never past ctx. Called within another's
// attempt (ensureSpecs over askingJS), it ends with that attempt, which
// then asks again itself.
func askAgain[T any](ctx context.Context, r *reconnects, do func(context.Context) (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		if refused := r.refusal(); refused != nil {
			var zero T
			return zero, refused
		}
		actx, cancel := context.WithTimeout(ctx, apiAttemptTimeout)
		watched := r.watch(cancel)
		v, err := do(actx)
		reconnected := watched.end()
		cancel()
		if err == nil || attempt == apiAttempts || ctx.Err() != nil || !reconnected && !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
	}
}

// reconnects ends the attempts under way on a connection when it
// reconnects (watch): the answers the server sent them while it was down
// never come. A nil *reconnects watches nothing.
type reconnects struct {
	nc     *nats.Conn
	events chan nats.Status // the connection's reconnects, until stop

	mu       sync.Mutex
	attempts map[uint64]context.CancelFunc // under way, by ticket
	last     uint64                        // the last ticket given
	back     chan struct{}                 // closed at the next reconnect
	// refusals are the connection's, whose refusal of its inbox makes
	// askAgain fail at once (nil for a connection the caller made).
	refusals *refusals
}

// watchReconnects watches nc's reconnects until stop, or until nc closes.
func watchReconnects(nc *nats.Conn) *reconnects {
	r := &reconnects{nc: nc, events: nc.StatusChanged(nats.CONNECTED, nats.CLOSED),
		attempts: make(map[uint64]context.CancelFunc), back: make(chan struct{})}
	go func() {
		for status := range r.events {
			if status == nats.CLOSED {
				r.stop() // ends the loop
				continue
			}
			r.reconnected()
		}
	}()
	return r
}

// reconnected ends the attempts under way and tells those waiting on
// connected.
func (r *reconnects) reconnected() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endAttemptsLocked()
	close(r.back)
	r.back = make(chan struct{})
}

// endAttempts ends the attempts under way: the server refused the
// connection's inbox (refusals.tellInboxRefused), and askAgain, which
// then asks no more (refusal), returns the refusal.
func (r *reconnects) endAttempts(error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endAttemptsLocked()
}

func (r *reconnects) endAttemptsLocked() {
	for t, cancel := range r.attempts {
		cancel()
		delete(r.attempts, t)
	}
}

// refusal is the connection's refusal of its inbox (refusals.inboxRefusal):
// no answer can come. Nil for a nil r.
func (r *reconnects) refusal() error {
	if r == nil {
		return nil
	}
	return r.refusals.inboxRefusal()
}

// watch makes the connection's next reconnect call cancel, until the
// ticket's end. It costs a lock and a map entry, not the allocations of a
// context.AfterFunc: a synchronous Publish makes one per attempt.
func (r *reconnects) watch(cancel context.CancelFunc) ticket {
	if r == nil {
		return ticket{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last++
	r.attempts[r.last] = cancel
	return ticket{r, r.last}
}

// connected returns a channel closed when the connection next reconnects;
// nil, which never is, for a nil r.
func (r *reconnects) connected() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.back
}

// stop ends the watch; again, it does nothing. A nil r has none.
func (r *reconnects) stop() {
	if r != nil {
		r.nc.RemoveStatusListener(r.events) // closes events
	}
}

// ticket is an attempt watched for a reconnect (reconnects.watch).
type ticket struct {
	r *reconnects
	n uint64
}

// end stops watching, and reports whether the connection reconnected
// meanwhile and ended the attempt.
func (t ticket) end() (reconnected bool) {
	if t.r == nil {
		return false
	}
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	_, watched := t.r.attempts[t.n]
	delete(t.r.attempts, t.n)
	return !watched
}

// reconnectsOf returns the reconnects js's requests watch: an askingJS's,
// nil for any other.
func reconnectsOf(js jetstream.JetStream) *reconnects {
	if a, ok := js.(askingJS); ok {
		return a.reconnects
	}
	return nil
}

// directGet asks a stream that allows direct gets for the last message on
// subject ($JS.API.DIRECT.GET.<stream>.<subject>): the bus's look-ups of
// records, presence and indexed messages. r is nc's reconnects.
func directGet(ctx context.Context, nc *nats.Conn, r *reconnects, subject string) (*nats.Msg, error) {
	return askAgain(ctx, r, func(ctx context.Context) (*nats.Msg, error) {
		return nc.RequestWithContext(ctx, subject, nil)
	})
}

// publishAgain stores msg, a write that is the same when made twice (a
// record put again, a message with its Nats-Msg-Id), with askAgain.
func publishAgain(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) (*jetstream.PubAck, error) {
	return askAgain(ctx, reconnectsOf(js), func(ctx context.Context) (*jetstream.PubAck, error) {
		return js.PublishMsg(ctx, msg)
	})
}

// askingJS is a JetStream handle whose look-ups of streams and consumers,
// the reads of the streams it returns, and its deletes of consumers (a
// consumer deleted already is ErrConsumerNotFound, which its callers take
// as done) ask again (askAgain), also when its connection reconnects
// (reconnects, nil for none watched). Its other writes are as nats.go
// makes them.
type askingJS struct {
	jetstream.JetStream
	reconnects *reconnects
}

func (j askingJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := askAgain(ctx, j.reconnects, func(ctx context.Context) (jetstream.Stream, error) { return j.JetStream.Stream(ctx, name) })
	if err != nil {
		return nil, err
	}
	return askingStream{s, j.reconnects}, nil
}

func (j askingJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	return askAgain(ctx, j.reconnects, func(ctx context.Context) (jetstream.Consumer, error) { return j.JetStream.Consumer(ctx, stream, name) })
}

func (j askingJS) DeleteConsumer(ctx context.Context, stream, name string) error {
	_, err := askAgain(ctx, j.reconnects, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, j.JetStream.DeleteConsumer(ctx, stream, name)
	})
	return err
}

// askingStream is a stream whose reads ask again. A purge does not: made
// twice, it would remove what came in between.
type askingStream struct {
	jetstream.Stream
	reconnects *reconnects
}

func (s askingStream) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return askAgain(ctx, s.reconnects, func(ctx context.Context) (*jetstream.StreamInfo, error) { return s.Stream.Info(ctx, opts...) })
}

func (s askingStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return askAgain(ctx, s.reconnects, func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return s.Stream.GetMsg(ctx, seq, opts...) })
}
