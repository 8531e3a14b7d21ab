package bus

import (
	"context"
	"errors"
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
// (publishAgain). The exceptions bound their wait otherwise: Publish, with
// its own attempts (publishAttemptTimeout), and reads through a consumer,
// with its pull's expiry (readPending pulls again when a pull was lost).

// Attempts of askAgain: each is bounded by apiAttemptTimeout when ctx
// allows longer.
const apiAttempts = 3

var apiAttemptTimeout = 5 * time.Second // a variable for the tests

// askAgain calls do, an idempotent request, with a context bounded by
// apiAttemptTimeout, and again when its answer did not come in time, up to
// apiAttempts calls in all and never past ctx. Called within another's
// attempt (ensureSpecs over askingJS), it ends with that attempt, which
// then asks again itself.
func askAgain[T any](ctx context.Context, do func(context.Context) (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, apiAttemptTimeout)
		v, err := do(actx)
		cancel()
		if err == nil || attempt == apiAttempts || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return v, err
		}
	}
}

// directGet asks a stream that allows direct gets for the last message on
// subject ($JS.API.DIRECT.GET.<stream>.<subject>): the bus's look-ups of
// records, presence and indexed messages.
func directGet(ctx context.Context, nc *nats.Conn, subject string) (*nats.Msg, error) {
	return askAgain(ctx, func(ctx context.Context) (*nats.Msg, error) {
		return nc.RequestWithContext(ctx, subject, nil)
	})
}

// publishAgain stores msg, a write that is the same when made twice (a
// record put again, a message with its Nats-Msg-Id), with askAgain.
func publishAgain(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) (*jetstream.PubAck, error) {
	return askAgain(ctx, func(ctx context.Context) (*jetstream.PubAck, error) {
		return js.PublishMsg(ctx, msg)
	})
}

// askingJS is a JetStream handle whose look-ups of streams and consumers,
// the reads of the streams it returns, and its deletes of consumers (a
// consumer deleted already is ErrConsumerNotFound, which its callers take
// as done) ask again (askAgain). Its other writes are as nats.go makes
// them.
type askingJS struct{ jetstream.JetStream }

func (j askingJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := askAgain(ctx, func(ctx context.Context) (jetstream.Stream, error) { return j.JetStream.Stream(ctx, name) })
	if err != nil {
		return nil, err
	}
	return askingStream{s}, nil
}

func (j askingJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	return askAgain(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return j.JetStream.Consumer(ctx, stream, name) })
}

func (j askingJS) DeleteConsumer(ctx context.Context, stream, name string) error {
	_, err := askAgain(ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, j.JetStream.DeleteConsumer(ctx, stream, name)
	})
	return err
}

// askingStream is a stream whose reads ask again. A purge does not: made
// twice, it would remove what came in between.
type askingStream struct{ jetstream.Stream }

func (s askingStream) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	return askAgain(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return s.Stream.Info(ctx, opts...) })
}

func (s askingStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return askAgain(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return s.Stream.GetMsg(ctx, seq, opts...) })
}
