package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentbus/agentbus/bus/internal/asyncpub"
	"github.com/agentbus/agentbus/subjects"
)

// client is what a Bus and an Admin share: the connection, its JetStream
// context, its asynchronous publisher, the options, the telemetry, the
// lifecycle tracker, and, on a connection the handle dialled itself, the
// server's refusals.
type client struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	pub      *asyncpub.Publisher
	opts     options
	tel      *telemetry
	status   *tracker   // nil when lifecycle tracking is off
	registry kvSubjects // cards, groups, outages
	presence kvSubjects
	// reconnects ends the attempts of the handle's requests to the server
	// (askAgain) when the connection reconnects; stopped in closeConn.
	reconnects *reconnects
	directs    directSubjects // the plain direct subjects it sent on
	// consumer is a consumer of the message stream this handle may look
	// up (an agent's own, at the default priority), which tells whether
	// the stream exists where its permissions allow no stream info
	// (streamMissing); "" for an operator's handle.
	consumer string

	// refusals are the server's refusals of this connection's requests;
	// nil on a connection the caller made (New, NewAdmin), whose errors
	// the handle does not see.
	refusals *refusals

	// shards is the installation this handle is one shard's bus of
	// (NewShards), nil for a handle on one root: its sends, lookups,
	// cancels and registry reads then reach every message's or agent's
	// shard (bus/shards.go).
	shards *Shards

	// reads makes the handle's reads through consumers of their own; its
	// live context ends in closeConn (endLive).
	reads   streamReads
	endLive context.CancelFunc

	mu     sync.Mutex
	closed bool
	// closing is closed with closed set: it ends the calls that run until
	// their context ends (whileOpen).
	closing chan struct{}
}

// applyOptions returns the default options with opts applied, once.
func applyOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			continue // an option left unset: none
		}
		if err := opt(&o); err != nil {
			return options{}, err
		}
	}
	return o, nil
}

// dial connects to url as the client named name, taking replies on inbox
// (nats.go's random inbox when empty), and returns the connection with the
// refusals its error handler reports. The connection reconnects without
// limit; o's NATS options add to or override these.
func dial(url, name, inbox string, o *options) (*nats.Conn, *refusals, error) {
	r := &refusals{}
	onError := o.onError
	natsOpts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		// nats.go prints asynchronous errors to stderr unless told otherwise;
		// the library never prints.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			r.refused(err)
			onError(fmt.Errorf("connection: %w", err))
		}),
	}
	if inbox != "" {
		natsOpts = append(natsOpts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(url, append(natsOpts, o.natsOptions...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", RedactURLs(url), err)
	}
	r.inbox, r.nc = cmp.Or(nc.Opts.InboxPrefix, nats.InboxPrefix), nc
	o.ownsConn = true
	return nc, r, nil
}

// newClient checks the server and sets up what a handle of agent ("" for
// an Admin) needs on nc.
func newClient(nc *nats.Conn, agent string, o options, r *refusals) (*client, error) {
	if err := checkServer(nc); err != nil {
		return nil, err
	}
	live, endLive := context.WithCancel(context.Background())
	rc := watchReconnects(nc)
	if r != nil {
		rc.refusals = r
		r.tellInboxRefused(rc.endAttempts)
	}
	failed := func(err error) (*client, error) {
		endLive()
		rc.stop()
		return nil, err
	}
	var status *tracker // nil when lifecycle tracking is off
	if o.lifecycle {
		var err error
		if status, err = newTracker(nc, &o, live, rc); err != nil {
			return failed(fmt.Errorf("new bus: %w", err))
		}
	}
	plain, err := jetstream.New(nc)
	if err != nil {
		return failed(fmt.Errorf("new bus: %w", err))
	}
	js := askingJS{plain, rc}
	tel, err := newTelemetry(&o, agent)
	if err != nil {
		return failed(fmt.Errorf("%w: %w", ErrInvalidOption, err))
	}
	po := asyncpub.Options{
		MaxPending: o.maxAsyncPending,
		Timeout:    o.asyncTimeout,
		OnError: func(m *nats.Msg, err error) {
			status.unsent(m, err)
			o.onError(fmt.Errorf("async publish %s: %w", m.Subject, err))
		},
	}
	if status != nil {
		// An acknowledged asynchronous publish writes its pending record,
		// which needs the stream sequence the ack carries.
		po.OnAck = status.acked
	}
	po.Refused = rc.refusal
	pub := asyncpub.New(nc, po)
	if r != nil {
		r.tellInboxRefused(pub.Fail)
		if status != nil {
			r.tellInboxRefused(status.pub.Fail)
		}
	}
	var consumer string
	if agent != "" {
		if cs, err := o.scheme.Consumers(agent); err == nil {
			consumer = cs[subjects.DefaultPriority-1].Name
		}
	}
	return &client{nc: nc, js: js, pub: pub, opts: o, tel: tel, status: status, registry: registrySubjects(o.scheme), presence: presenceSubjects(o.scheme), reconnects: rc, refusals: r,
		consumer: consumer, reads: streamReads{js: js, onError: o.onError, live: live}, endLive: endLive, closing: make(chan struct{})}, nil
}

// Subjects returns the subject scheme of the bus.
func (c *client) Subjects() subjects.Scheme { return c.opts.scheme }

// Conn returns the underlying connection.
func (c *client) Conn() *nats.Conn { return c.nc }

func (c *client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// whileOpen returns ctx, cancelled also when the handle closes, for a call
// that runs until its context ends (the watches): Close ends the call as
// it stops the subscriptions, whether or not the handle owns its
// connection, and the call returns watchEnded's answer then. stop releases
// the context.
func (c *client) whileOpen(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// watchEnded is what a call that runs until its context ends returns when
// it ends: ErrClosed if the handle closed, nil if its caller's context
// ended.
func (c *client) watchEnded() error {
	if c.isClosed() {
		return ErrClosed
	}
	return nil
}

// watchFailed is what a watch of the registry returns when err ends it
// while it runs: watchEnded's answer if its context (from whileOpen)
// ended or the handle closed, which err is then the doing of, else err.
func (c *client) watchFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
		return c.watchEnded()
	}
	return c.closedOr(err)
}

// watchNotStarted is what a watch returns when err keeps it from
// starting: watchEnded's answer if its caller canceled its context (the
// watch was asked to end) or the handle closed, else err (closedOr). A
// deadline that passed before the watch started is err: the watch could
// not be made, as any call while the server is down.
func (c *client) watchNotStarted(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return c.watchEnded()
	}
	return c.closedOr(err)
}

// closedOr returns ErrClosed if the handle closed, which err is then the
// doing of, else err: what a watch returns when it cannot start.
func (c *client) closedOr(err error) error {
	if c.isClosed() {
		return ErrClosed
	}
	return err
}

// closedBy returns err, a call's failure, wrapped in ErrClosed when the
// handle was closed meanwhile: the connection Close closed under the call
// is what failed it (before 2026-11-28 such calls returned nats.go's
// ErrConnectionClosed).
func (c *client) closedBy(err error) error {
	if err != nil && c.isClosed() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// closeFlushed gives the asynchronous publishes and lifecycle records
// still in flight until ctx ends (closeFlushTimeout) to be stored, then
// closes: a process that publishes and exits leaves the record that
// 'agentbus status' then reads, and a lookup's write-back of a state it
// derived is kept.
func (c *client) closeFlushed(ctx context.Context) {
	if !c.nc.IsClosed() {
		if err := c.flushHere(ctx); err != nil {
			c.opts.onError(fmt.Errorf("close: writes still in flight: %w", err))
		}
	}
	c.closeConn()
}

// closeFlushTimeout bounds how long Close waits for the writes in flight
// and the offline report.
const closeFlushTimeout = 5 * time.Second

// closeConn ends the reads under way (ErrClosed), stops the asynchronous
// publishers, the bus's and the lifecycle tracker's, failing what they
// still have in flight, and closes the connection if the handle dialled
// it.
func (c *client) closeConn() {
	c.endLive()
	c.reconnects.stop()
	c.pub.Close()
	c.status.close()
	if c.opts.ownsConn {
		c.nc.Close()
	}
}

// watchRefusals returns ctx cancelled with a cause wrapping
// ErrPermissionDenied as soon as the server refuses a request of this
// connection on a subject that starts with prefix, and the function that
// stops watching. The server reports such a refusal on the connection, not
// to the request, which would otherwise wait out its timeout; a handle sees
// the connection's errors only when it dialled it, and otherwise returns
// ctx as it is.
func (c *client) watchRefusals(ctx context.Context, prefix string) (context.Context, func()) {
	if c.refusals == nil {
		return ctx, func() {}
	}
	return c.refusals.watchPrefix(ctx, prefix)
}

// refusable runs f, the set-up of a watch, with ctx ended as soon as the
// server refuses one of its JetStream API requests, or the subscription to
// the connection's inbox (then no answer can come), and its error saying
// so. Only the set-up: a refusal of another call's request would end a
// watch that ran on.
func refusable[T any](ctx context.Context, c *client, f func(context.Context) (T, error)) (T, error) {
	wctx, stop := c.watchRefusals(ctx, "$JS.API.")
	defer stop()
	v, err := f(wctx)
	return v, refusedCall(wctx, err)
}

// asReader returns cfg, what a read selects (its filter, deliver policy and
// start, HeadersOnly), as a consumer for that one read: no acks, in memory,
// one replica, removed by the server a minute after its last use should
// its reader's process die before deleting it (deleteReader).
func asReader(cfg jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	cfg.AckPolicy = jetstream.AckNonePolicy
	cfg.MemoryStorage, cfg.Replicas = true, 1
	cfg.InactiveThreshold = time.Minute
	return cfg
}

// newReader creates a consumer of stream for one read of what cfg selects
// (asReader), under a random name and described as "agentbus read" for an
// operator who lists the stream's consumers. Read it with readPending and
// delete it with deleteReader. A create whose answer does not come is made
// again (askAgain): with the same name and configuration, the server hands
// back the consumer if the first made it.
//
// Not nats.go's ordered consumer, which these reads used before: its every
// Fetch replaces the consumer with a new one, a create and a delete more
// for each read (and a read that deleted the consumer it was given left
// the replacement for five minutes); and when the replacement cannot be
// created, as when the server has gone, the Fetch retries for ever,
// whatever its caller's context says.
func newReader(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	cfg = asReader(cfg)
	cfg.Name, cfg.Description = nuid.Next(), "agentbus read"
	c, err := askAgain(ctx, reconnectsOf(js), func(ctx context.Context) (jetstream.Consumer, error) {
		return js.CreateConsumer(ctx, stream, cfg)
	})
	if cause := context.Cause(ctx); err != nil && (errors.Is(cause, context.DeadlineExceeded) || errors.Is(cause, context.Canceled)) {
		// The caller gave up while the server may have made it: deleted
		// by its name, which is this read's alone, rather than left for
		// the server to remove a minute later. Before 2026-11-28 a loop
		// of reads with short deadlines kept a consumer for each read
		// that timed out so, for that minute. Not after a refusal
		// (watchRefusals' cause): the server made nothing, and the
		// delete, refused too, would be taken for the next call's.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readerDeleteTimeout)
		_ = js.DeleteConsumer(dctx, stream, cfg.Name) // at worst the server removes it later
		cancel()
	}
	return c, err
}

// readerDeleteTimeout bounds the delete of a reader whose create its
// caller gave up on.
const readerDeleteTimeout = 2 * time.Second

// streamReads makes the reads of a handle, or of its lifecycle tracker,
// through consumers of their own (newReader): js creates and deletes them,
// onError hears of a delete that failed, and live ends when the handle
// closes its connection (closeConn). That ends a read under way with
// ErrClosed: its batch would otherwise wait out batchWait, and one more
// second, for messages that can no longer come.
type streamReads struct {
	js      jetstream.JetStream
	onError func(error)
	live    context.Context
}

// deleteReader deletes c, a reader of stream (asReader), once its
// read is done, even if ctx has ended, and reports a failure to onError,
// unless the handle has closed its connection: the server removes the
// reader a minute after its last use then. At once, not left to expire:
// every consumer costs the server memory and goroutines while it lasts,
// and a tool polling a status once a second would otherwise keep sixty of
// them.
func (r streamReads) deleteReader(ctx context.Context, stream string, c jetstream.Consumer) {
	name := c.CachedInfo().Name
	err := r.js.DeleteConsumer(context.WithoutCancel(ctx), stream, name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && r.live.Err() == nil {
		r.onError(fmt.Errorf("delete reader %s of %s: %w", name, stream, err))
	}
}

// readStream reads what cfg selects of stream once, with a consumer of its
// own (newReader) that it deletes once read (deleteReader), passing each
// message to each as readPending does. Its error is the create's or the
// read's.
func (r streamReads) readStream(ctx context.Context, stream string, cfg jetstream.ConsumerConfig,
	each func(jetstream.Msg, *jetstream.MsgMetadata) (stop bool, err error)) error {
	return r.readAfresh(ctx, stream, func(ctx context.Context) (jetstream.Consumer, error) { return newReader(ctx, r.js, stream, cfg) }, each)
}

// readAfresh reads with a consumer of stream that open makes, as
// readPending does, and deletes it (deleteReader). A read whose first
// messages a dropped connection lost (errReadGap before any reached each:
// nothing of the caller's is half done) is made again with a new consumer,
// up to apiAttempts reads in all. A read under way when the handle closes
// its connection ends with ErrClosed.
func (r streamReads) readAfresh(ctx context.Context, stream string, open func(context.Context) (jetstream.Consumer, error),
	each func(jetstream.Msg, *jetstream.MsgMetadata) (stop bool, err error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.live, cancel)()
	for attempt := 1; ; attempt++ {
		c, err := open(ctx)
		if err != nil {
			return r.closedOr(err)
		}
		passed := false
		err = readPending(ctx, c, reconnectsOf(r.js), func(m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
			passed = true
			return each(m, md)
		})
		r.deleteReader(ctx, stream, c)
		if err == nil || passed || attempt == apiAttempts || !errors.Is(err, errReadGap) || ctx.Err() != nil {
			return r.closedOr(err)
		}
	}
}

// closedOr returns ErrClosed for a read that failed once the handle closed
// its connection, which the failure is then the doing of, else err.
func (r streamReads) closedOr(err error) error {
	if err != nil && r.live.Err() != nil {
		return ErrClosed
	}
	return err
}

// errReadGap is wrapped by readPending's error when the consumer delivered
// a message that never arrived: the read would otherwise miss it.
var errReadGap = errors.New("a message of the read did not arrive")

// readPending reads what consumer c, which acks nothing, has pending when it
// was created, in batches, calling each with every message and its
// metadata until each says stop or nothing is left. A batch waits at most
// batchWait, and never past ctx's deadline; ctx's end ends it at once. A
// batch that brings nothing is checked against the consumer's state
// (readOn): messages counted as pending when the consumer was created can
// be gone since (a presence record that expired, a record deleted), and
// then the read ends with what it got; but the pull can also have been
// lost with a dropped connection, and then it is made again. A message the
// consumer delivered that did not arrive (a batch that ended before its
// last messages came, say) ends the read with an error wrapping
// errReadGap, never a short answer. A batch under way when the connection
// reconnects (rc, nil for none watched) is over then, as one whose wait ran
// out: its pull or its messages may have been lost with the connection.
func readPending(ctx context.Context, c jetstream.Consumer, rc *reconnects, each func(jetstream.Msg, *jetstream.MsgMetadata) (stop bool, err error)) error {
	var delivered uint64 // the consumer's sequence of the last message read
	empty := 0           // batches in a row that brought nothing
	for pending := c.CachedInfo().NumPending; pending > 0; {
		wait := batchWait
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d))
		}
		if wait <= 0 {
			return fmt.Errorf("%d pending: %w", pending, context.DeadlineExceeded)
		}
		n, done, err := fetch(ctx, c, rc, int(min(pending, 256)), wait, func(m jetstream.Msg) (bool, error) {
			md, err := m.Metadata()
			if err != nil {
				return true, err
			}
			if md.Sequence.Consumer != delivered+1 {
				return true, fmt.Errorf("%w: delivery %d came after %d", errReadGap, md.Sequence.Consumer, delivered)
			}
			delivered = md.Sequence.Consumer
			pending = md.NumPending
			return each(m, md)
		})
		switch {
		case done:
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("%d pending: %w", pending, context.Cause(ctx))
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		// A batch whose end never came (its wait ran out) is over, as one
		// the server ended.
		if n > 0 {
			empty = 0
			continue
		}
		if empty++; empty == apiAttempts {
			return fmt.Errorf("%w: %d pending, and %d pulls in a row brought none", errReadGap, pending, empty)
		}
		if pending, err = readOn(ctx, c, rc, delivered); err != nil {
			return err
		}
	}
	return nil
}

// fetch pulls a batch of up to size messages from c, waiting for them at
// most wait, until ctx ends, and until the connection reconnects (rc), and
// passes each that comes to each until it says stop or fails: done then,
// with each's error. n is how many came; err is the batch's error
// otherwise, context.DeadlineExceeded when its wait ran out, or the
// connection reconnected, before the server ended it.
func fetch(ctx context.Context, c jetstream.Consumer, rc *reconnects, size int, wait time.Duration, each func(jetstream.Msg) (stop bool, err error)) (n int, done bool, err error) {
	bctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	watched := rc.watch(cancel)
	defer watched.end() // on the early return; again after the check below, a no-op
	batch, err := c.Fetch(size, jetstream.FetchContext(bctx))
	if d, _ := bctx.Deadline(); errors.Is(err, jetstream.ErrInvalidOption) && !time.Now().Before(d) {
		err = context.DeadlineExceeded // the wait ran out as the pull was made
	}
	if err == nil {
		for m := range batch.Messages() {
			n++
			if stop, err := each(m); err != nil || stop {
				return n, true, err
			}
		}
		err = batch.Error()
	}
	if err != nil && ctx.Err() == nil && watched.end() {
		err = context.DeadlineExceeded // the connection reconnected under the batch
	}
	return n, false, err
}

// readOn tells readPending, after a batch of reader c brought nothing,
// how many messages are left to read: none if those it counted are gone
// from the stream, the same number if its pull was lost (the connection
// dropped with it in flight, and the server never had it), and an error
// wrapping errReadGap if the consumer delivered more than the delivered
// that came (they were lost with the connection).
func readOn(ctx context.Context, c jetstream.Consumer, rc *reconnects, delivered uint64) (uint64, error) {
	info, err := askAgain(ctx, rc, c.Info)
	if err != nil {
		return 0, err
	}
	if info.Delivered.Consumer != delivered {
		return 0, fmt.Errorf("%w: %d delivered, %d came", errReadGap, info.Delivered.Consumer, delivered)
	}
	return info.NumPending, nil
}

// batchWait bounds how long readPending waits for one batch.
var batchWait = 5 * time.Second // a variable for the tests

// concurrently calls f(i) for each i in [0, n), at most limit calls at a
// time, and returns when all have returned.
func concurrently(n, limit int, f func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(limit, n) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
