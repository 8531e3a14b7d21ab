package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrInvalidOptions is wrapped by every error [Start] returns for bad Options.
var ErrInvalidOptions = errors.New("consumers: invalid options")

// Handler processes one message. Returning nil acknowledges it. Returning an
// error naks it with a backoff delay, or terminates it when it was the last
// delivery allowed or the error is [Permanent]. A panic counts as an error
// wrapping [ErrHandlerPanic]. ctx is cancelled when the dispatcher stops.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Policy decides which level's message starts next.
type Policy int

const (
	// Strict always starts the highest-priority message available, and FIFO
	// within a level. Lower levels wait while a higher one has a backlog.
	Strict Policy = iota
	// Weighted shares handler starts between levels with a backlog in
	// proportion to Options.Weights (smooth weighted round robin), so that a
	// busy high level cannot starve the lower ones.
	Weighted
)

func (p Policy) String() string {
	switch p {
	case Strict:
		return "strict"
	case Weighted:
		return "weighted"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// DefaultPullExpiry is how long one waiting pull request lasts when the
// queues are empty. An idle dispatcher sends one request per level per
// DefaultPullExpiry and nothing else.
const DefaultPullExpiry = 30 * time.Second

// Options configure a dispatcher.
type Options struct {
	// Concurrency is how many handlers may run at once. Zero means 1.
	Concurrency int
	// Prefetch is how many messages each level may hold in memory waiting
	// for a handler. Zero means Concurrency. Held messages are kept alive
	// with in-progress acks, so waiting here never causes a redelivery.
	Prefetch int
	// Policy chooses between levels. The zero value is Strict.
	Policy Policy
	// Weights are the Weighted policy's shares, one per level in the order
	// given to Start. Nil means 2^(n-1-i): 16, 8, 4, 2, 1 for five levels.
	Weights []int
	// AckWait must equal the consumers' AckWait; in-progress acks are sent
	// for held and running messages every AckWait/2. Zero means
	// DefaultAckWait.
	AckWait time.Duration
	// MaxDeliver must equal the consumers' MaxDeliver; a failure on that
	// delivery terminates the message. Zero means DefaultMaxDeliver, -1
	// without limit.
	MaxDeliver int
	// Backoff gives the nak delay after a failure. Nil means DefaultBackoff.
	Backoff Backoff
	// PullExpiry is the lifetime of a waiting pull request. Zero means
	// DefaultPullExpiry. It must be at least 1s.
	PullExpiry time.Duration
	// OnError receives errors that happen in the background: failed pulls,
	// failed acks and handler panics. Nil drops them.
	OnError func(error)
	// Logger receives debug records. Nil discards them.
	Logger *slog.Logger
}

func (o *Options) setDefaults(levels int) error {
	if o.Concurrency < 0 {
		return fmt.Errorf("%w: concurrency %d is negative", ErrInvalidOptions, o.Concurrency)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.Prefetch < 0 {
		return fmt.Errorf("%w: prefetch %d is negative", ErrInvalidOptions, o.Prefetch)
	}
	if o.Prefetch == 0 {
		o.Prefetch = o.Concurrency
	}
	if o.Policy != Strict && o.Policy != Weighted {
		return fmt.Errorf("%w: unknown policy %v", ErrInvalidOptions, o.Policy)
	}
	if o.Weights == nil {
		o.Weights = make([]int, levels)
		for i := range o.Weights {
			o.Weights[i] = 1 << (levels - 1 - i)
		}
	}
	if len(o.Weights) != levels {
		return fmt.Errorf("%w: %d weights for %d levels", ErrInvalidOptions, len(o.Weights), levels)
	}
	for _, w := range o.Weights {
		if w <= 0 {
			return fmt.Errorf("%w: weight %d is not positive", ErrInvalidOptions, w)
		}
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = DefaultMaxDeliver
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.PullExpiry == 0 {
		o.PullExpiry = DefaultPullExpiry
	}
	if o.PullExpiry < time.Second {
		return fmt.Errorf("%w: pull expiry %v is under 1s", ErrInvalidOptions, o.PullExpiry)
	}
	if o.OnError == nil {
		o.OnError = func(error) {}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// held is a message delivered to this process and not yet settled.
type held struct {
	msg     jetstream.Msg
	touched time.Time // last delivery or in-progress ack
}

// level is one consumer and the messages pulled from it.
type level struct {
	index int
	cons  jetstream.Consumer
	buf   []*held // FIFO; guarded by Dispatcher.mu
	// drained means a pull request is waiting at the server with room to
	// spare, so the server holds no message for this level that it has not
	// sent us. Guarded by Dispatcher.mu.
	drained bool
	room    chan struct{} // signalled when buf shrinks
}

// Dispatcher pulls from an agent's priority levels and runs a handler on
// each message in the order its Policy decides. Start one with [Start].
type Dispatcher struct {
	opts    Options
	handler Handler
	levels  []*level
	weights []int // smooth weighted round robin state

	mu       sync.Mutex
	inflight map[*held]struct{}

	wake  chan struct{} // signalled when a level's state changes
	slots chan struct{} // one token per running handler

	pullCtx    context.Context // cancelled to stop pulling and dispatching
	stopPull   context.CancelFunc
	handlerCtx context.Context // cancelled to cancel running handlers
	stopAll    context.CancelFunc

	pulling  sync.WaitGroup // pullers and the dispatch loop
	handlers sync.WaitGroup
	done     chan struct{}
}

// Start begins dispatching messages of the given consumers, highest priority
// first: consumers[0] is the highest level. It returns at once; stop the
// dispatcher with Stop or Drain.
func Start(consumers []jetstream.Consumer, h Handler, opts Options) (*Dispatcher, error) {
	if len(consumers) == 0 {
		return nil, fmt.Errorf("%w: no consumers", ErrInvalidOptions)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrInvalidOptions)
	}
	if err := opts.setDefaults(len(consumers)); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		opts:     opts,
		handler:  h,
		weights:  make([]int, len(consumers)),
		inflight: make(map[*held]struct{}),
		wake:     make(chan struct{}, 1),
		slots:    make(chan struct{}, opts.Concurrency),
		done:     make(chan struct{}),
	}
	d.pullCtx, d.stopPull = context.WithCancel(context.Background())
	d.handlerCtx, d.stopAll = context.WithCancel(context.Background())
	for i, c := range consumers {
		d.levels = append(d.levels, &level{index: i, cons: c, room: make(chan struct{}, 1)})
	}
	d.pulling.Add(len(d.levels) + 1)
	for _, l := range d.levels {
		go d.pull(l)
	}
	go d.dispatch()
	keeperStop := make(chan struct{})
	keeperDone := make(chan struct{})
	go d.keepAlive(keeperStop, keeperDone)
	go func() {
		d.pulling.Wait()
		d.releaseBuffered()
		d.handlers.Wait()
		close(keeperStop)
		<-keeperDone
		d.stopAll()
		close(d.done)
	}()
	return d, nil
}

// Stop stops pulling, gives back the messages held in memory for immediate
// redelivery, and cancels the context of running handlers. It does not wait:
// Done is closed once every handler has returned and its message is settled.
// Stop is idempotent.
func (d *Dispatcher) Stop() {
	d.stopPull()
	d.stopAll()
}

// Drain stops pulling, gives back the messages held in memory, and waits
// until the running handlers finish and their messages are settled. If ctx
// ends first, Drain calls Stop and returns ctx's error.
func (d *Dispatcher) Drain(ctx context.Context) error {
	d.stopPull()
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		d.Stop()
		return ctx.Err()
	}
}

// Done is closed when the dispatcher has stopped and every message it
// received is settled or given back.
func (d *Dispatcher) Done() <-chan struct{} { return d.done }

func (d *Dispatcher) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// dispatch waits for a free handler slot, then for the message the policy
// picks, and starts the handler. Taking the slot first means a message that
// arrives while all handlers are busy still competes on priority.
func (d *Dispatcher) dispatch() {
	defer d.pulling.Done()
	for {
		select {
		case d.slots <- struct{}{}:
		case <-d.pullCtx.Done():
			return
		}
		var h *held
		for {
			d.mu.Lock()
			h = d.pickLocked()
			d.mu.Unlock()
			if h != nil {
				break
			}
			select {
			case <-d.wake:
			case <-d.pullCtx.Done():
				<-d.slots
				return
			}
		}
		d.handlers.Add(1)
		go d.run(h)
	}
}

// pickLocked removes and returns the next message to handle, or nil when
// there is none to start. Strict waits while a level above every candidate
// has not yet told whether it holds messages; Weighted shares starts between
// the levels that have messages here, without waiting for the others.
func (d *Dispatcher) pickLocked() *held {
	best := -1
	total := 0
	for _, l := range d.levels {
		if len(l.buf) == 0 {
			if !l.drained && d.opts.Policy == Strict {
				break
			}
			continue
		}
		if d.opts.Policy == Strict {
			best = l.index
			break
		}
		d.weights[l.index] += d.opts.Weights[l.index]
		total += d.opts.Weights[l.index]
		if best < 0 || d.weights[l.index] > d.weights[best] {
			best = l.index
		}
	}
	if best < 0 {
		return nil
	}
	d.weights[best] -= total
	l := d.levels[best]
	h := l.buf[0]
	l.buf[0] = nil
	l.buf = l.buf[1:]
	d.inflight[h] = struct{}{}
	d.signal(l.room)
	return h
}

func (d *Dispatcher) run(h *held) {
	defer func() {
		d.mu.Lock()
		delete(d.inflight, h)
		d.mu.Unlock()
		<-d.slots
		d.handlers.Done()
	}()
	d.settle(h.msg, d.call(h.msg))
}

func (d *Dispatcher) call(m jetstream.Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
			d.opts.OnError(fmt.Errorf("message %s: %w", m.Subject(), err))
		}
	}()
	return d.handler(d.handlerCtx, m)
}

// settle acks, naks with backoff, or terminates m after its handler returned
// herr.
func (d *Dispatcher) settle(m jetstream.Msg, herr error) {
	var err error
	switch {
	case herr == nil:
		err = m.Ack()
	case IsPermanent(herr):
		err = m.TermWithReason(termReason(herr))
	default:
		delivery := 1
		if md, merr := m.Metadata(); merr == nil {
			delivery = int(md.NumDelivered)
		}
		if d.opts.MaxDeliver > 0 && delivery >= d.opts.MaxDeliver {
			err = m.TermWithReason(termReason(fmt.Errorf("failed on delivery %d of %d: %w", delivery, d.opts.MaxDeliver, herr)))
		} else {
			err = m.NakWithDelay(d.opts.Backoff(delivery))
		}
	}
	if err != nil {
		d.opts.OnError(fmt.Errorf("settle message %s: %w", m.Subject(), err))
	}
}

// pull keeps one level supplied. While the level may hold messages at the
// server it asks for them without waiting (FetchNoWait). Once the server
// returns fewer than asked, the level is drained and pull parks a waiting
// request there, so a new message is pushed to us at once and an idle level
// costs one request per PullExpiry.
func (d *Dispatcher) pull(l *level) {
	defer d.pulling.Done()
	retry := time.Duration(0)
	for {
		room, drained, ok := d.waitRoom(l)
		if !ok {
			return
		}
		var n int
		var err error
		if drained {
			n, err = d.fetchWaiting(l, room)
			if err == nil && n == room {
				d.setDrained(l, false)
			}
		} else {
			n, err = d.fetchNoWait(l, room)
			if err == nil && n < room {
				d.setDrained(l, true)
			}
		}
		if err == nil {
			retry = 0
			continue
		}
		d.setDrained(l, false)
		if d.pullCtx.Err() != nil {
			return
		}
		d.opts.OnError(fmt.Errorf("pull from consumer %s: %w", consumerName(l.cons), err))
		retry = min(max(2*retry, 100*time.Millisecond), 5*time.Second)
		select {
		case <-time.After(retry):
		case <-d.pullCtx.Done():
			return
		}
	}
}

// waitRoom blocks until the level should pull: there is room for half its
// prefetch, or any room while drained (a drained level must keep a request
// waiting at the server).
func (d *Dispatcher) waitRoom(l *level) (room int, drained, ok bool) {
	threshold := max(1, d.opts.Prefetch/2)
	for {
		d.mu.Lock()
		room, drained = d.opts.Prefetch-len(l.buf), l.drained
		d.mu.Unlock()
		if room >= threshold || (drained && room > 0) {
			return room, drained, true
		}
		select {
		case <-l.room:
		case <-d.pullCtx.Done():
			return 0, false, false
		}
	}
}

func (d *Dispatcher) setDrained(l *level, drained bool) {
	d.mu.Lock()
	changed := l.drained != drained
	l.drained = drained
	d.mu.Unlock()
	if changed {
		d.signal(d.wake)
	}
}

func (d *Dispatcher) fetchNoWait(l *level, n int) (int, error) {
	batch, err := l.cons.FetchNoWait(n)
	if err != nil {
		return 0, err
	}
	return d.receive(l, batch)
}

func (d *Dispatcher) fetchWaiting(l *level, n int) (int, error) {
	ctx, cancel := context.WithTimeout(d.pullCtx, d.opts.PullExpiry)
	defer cancel()
	batch, err := l.cons.Fetch(n, jetstream.FetchContext(ctx))
	if err != nil {
		return 0, err
	}
	got, err := d.receive(l, batch)
	if errors.Is(err, context.DeadlineExceeded) && d.pullCtx.Err() == nil {
		err = nil // the request expired with nothing more to send
	}
	return got, err
}

// receive moves a batch's messages into the level's buffer as they arrive.
func (d *Dispatcher) receive(l *level, batch jetstream.MessageBatch) (int, error) {
	n := 0
	for m := range batch.Messages() {
		d.mu.Lock()
		l.buf = append(l.buf, &held{msg: m, touched: time.Now()})
		d.mu.Unlock()
		d.signal(d.wake)
		n++
	}
	return n, batch.Error()
}

// releaseBuffered naks every message still waiting in memory so the server
// redelivers it at once, to this agent's other processes or later to this one.
func (d *Dispatcher) releaseBuffered() {
	d.mu.Lock()
	var msgs []jetstream.Msg
	for _, l := range d.levels {
		for _, h := range l.buf {
			msgs = append(msgs, h.msg)
		}
		l.buf = nil
		l.drained = false
	}
	d.mu.Unlock()
	for _, m := range msgs {
		if err := m.Nak(); err != nil {
			d.opts.Logger.Debug("give back message", "subject", m.Subject(), "error", err)
		}
	}
}

// keepAlive sends an in-progress ack for every held or running message that
// has not been touched for AckWait/2, so neither waiting in the buffer nor a
// long handler lets the server redeliver it.
func (d *Dispatcher) keepAlive(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(d.opts.AckWait / 4)
	defer t.Stop()
	var due []jetstream.Msg
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			due = due[:0]
			limit := now.Add(-d.opts.AckWait / 2)
			touch := func(h *held) {
				if h.touched.Before(limit) {
					h.touched = now
					due = append(due, h.msg)
				}
			}
			d.mu.Lock()
			for _, l := range d.levels {
				for _, h := range l.buf {
					touch(h)
				}
			}
			for h := range d.inflight {
				touch(h)
			}
			d.mu.Unlock()
			for _, m := range due {
				if err := m.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
					d.opts.Logger.Debug("in-progress ack", "subject", m.Subject(), "error", err)
				}
			}
		}
	}
}

func consumerName(c jetstream.Consumer) string {
	if info := c.CachedInfo(); info != nil {
		return info.Name
	}
	return "?"
}
