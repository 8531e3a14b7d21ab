package consumers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Handler processes one message and settles it: [Msg.Ack], [Msg.Nak] or
// [Msg.Term]. A message the handler returns without settling, or whose
// handler panics, is given back for redelivery at once (and the panic is
// reported to Options.OnError as an error wrapping [ErrHandlerPanic]).
// ctx is cancelled when the dispatcher stops.
//
// msg is the handler's until it returns: settle it before then, and do not
// keep it. The dispatcher reads its state once the handler returns, so a
// settlement from another goroutine afterwards races with it. What the
// message carries (Subject, Header, Data, Metadata) is never changed by
// the dispatcher and may be kept.
type Handler func(ctx context.Context, msg *Msg)

// Policy decides which level's message starts next. Within a level the
// message with the lowest stream sequence among the heads of its lanes
// starts first, whatever the policy.
type Policy int

const (
	// Strict always starts the highest-priority message available, in
	// stream order within a level. Lower levels wait while a higher one has
	// a backlog, or may have one: while its lane has not told. A lane
	// whose pulls keep failing (reported to Options.OnError) counts as
	// empty until one succeeds, so that it cannot hold the levels below it
	// forever.
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

// Adaptive prefetch (Options.Prefetch zero).
const (
	// MaxPrefetch bounds what a lane holds in memory.
	MaxPrefetch = 512
	// PrefetchWindow is how much work, in handler time, a lane holds.
	PrefetchWindow = 100 * time.Millisecond
)

// DefaultPullExpiry is how long one waiting pull request lasts when the
// queues are empty. An idle dispatcher sends one request per lane per
// DefaultPullExpiry and nothing else.
const DefaultPullExpiry = 30 * time.Second

// Options configure a dispatcher.
type Options struct {
	// Concurrency is how many handlers may run at once. Zero means 1.
	Concurrency int
	// Prefetch is how many messages each lane may hold in memory waiting
	// for a handler. Zero means adaptive: about as many as the handlers
	// start in PrefetchWindow, judged from how long they have taken so far
	// (every handling of 20 µs or more is timed, one in eight of faster
	// ones), at least Concurrency and at most MaxPrefetch. Fast handlers then
	// never wait for a pull round trip, and slow ones hold no more than
	// they are about to start, which leaves the rest of a backlog to the
	// agent's other processes. Held messages are kept alive with
	// in-progress acks, so waiting here never causes a redelivery.
	Prefetch int
	// Policy chooses between levels. The zero value is Strict.
	Policy Policy
	// Weights are the Weighted policy's shares, one per level, highest
	// level first. Nil means 2^(n-1-i): 16, 8, 4, 2, 1 for five levels.
	Weights []int
	// LevelOf places each message of a lane whose Level is AnyLevel: it
	// returns the index of the message's level from its subject. An index
	// outside the levels places it in the lowest level. It is called once
	// per message, on the goroutine that receives it, and must not block.
	// Required when a lane has AnyLevel.
	LevelOf func(subject string) int
	// AckWait must equal the consumers' AckWait; in-progress acks are sent
	// for held and running messages at least every AckWait/2. Zero means
	// DefaultAckWait.
	AckWait time.Duration
	// PullExpiry is the lifetime of a waiting pull request. Zero means
	// DefaultPullExpiry. It must be at least 1s.
	PullExpiry time.Duration
	// APIPrefix is the JetStream API subject prefix. Empty means
	// "$JS.API."; a JetStream domain D uses "$JS.D.API.".
	APIPrefix string
	// OnError receives errors that happen in the background: failed pulls,
	// handler panics and messages given back unsettled. Nil drops them.
	OnError func(error)
	// Logger receives debug records. Nil discards them.
	Logger *slog.Logger
}

// Lane is one durable consumer a dispatcher reads, and the priority level
// its messages belong to.
type Lane struct {
	// Consumer is the durable consumer's name.
	Consumer string
	// Level is the index of the lane's level, 0 for the highest, or
	// AnyLevel for a lane that carries several, such as an agent's
	// broadcasts of every priority: Options.LevelOf then places each of its
	// messages.
	Level int
	// Create, if not nil, makes the consumer exist: the lane's puller calls
	// it before its first pull, and again after a failure (reported to
	// Options.OnError) with a growing delay, until it succeeds or the
	// dispatcher stops. Meanwhile Strict waits for the lane, as for any
	// lane that has not told whether it holds messages, except between a
	// failed attempt and the next, when the lane counts as empty. Its
	// context ends when the dispatcher stops.
	Create func(ctx context.Context) error
	// Stored says the caller found a message on the consumer's subjects
	// when it made the lane, as the bus does before it creates an agent's
	// consumer of a priority. Strict then waits for the lane until it
	// delivers its first message, for up to StoredWait after the lane
	// starts, even if the consumer answers at first that it holds none: on
	// a cluster, a consumer just created can be led from a replica that
	// has not stored the message yet, and a lower level would start first.
	Stored bool
}

// StoredWait is how long Strict waits for the first message of a lane
// whose Lane.Stored is set, when its consumer says it holds none: long
// enough for the replicas of a cluster to store what was acknowledged,
// short enough that a message another process took meanwhile holds the
// lower levels back only briefly.
const StoredWait = 2 * time.Second

// storedWait is StoredWait, unless a test changed it (export_test.go).
var storedWait = StoredWait

// AnyLevel is the Level of a lane whose messages belong to several levels.
const AnyLevel = -1

// checkLanes reports whether lanes can be given to Start with levels
// levels: every level has a lane of its own or is served by an AnyLevel
// lane, and no consumer is given twice.
func checkLanes(levels int, lanes []Lane, levelOf func(string) int) error {
	if len(lanes) == 0 {
		return fmt.Errorf("%w: no consumers", ErrInvalidOption)
	}
	if levels <= 0 {
		return fmt.Errorf("%w: %d levels", ErrInvalidOption, levels)
	}
	served := make([]bool, levels)
	seen := make(map[string]bool)
	for _, l := range lanes {
		if err := checkLane(l, levels, levelOf); err != nil {
			return err
		}
		if seen[l.Consumer] {
			return fmt.Errorf("%w: consumer %q given twice", ErrInvalidOption, l.Consumer)
		}
		seen[l.Consumer] = true
		if l.Level == AnyLevel {
			for i := range served {
				served[i] = true
			}
		} else {
			served[l.Level] = true
		}
	}
	for i, ok := range served {
		if !ok {
			return fmt.Errorf("%w: level %d has no consumers", ErrInvalidOption, i)
		}
	}
	return nil
}

// checkLane reports whether l names a consumer and a level of levels, or
// AnyLevel with levelOf to place its messages.
func checkLane(l Lane, levels int, levelOf func(string) int) error {
	switch {
	case l.Consumer == "":
		return fmt.Errorf("%w: lane with no consumer", ErrInvalidOption)
	case l.Level == AnyLevel:
		if levelOf == nil {
			return fmt.Errorf("%w: consumer %q has AnyLevel and Options.LevelOf is nil", ErrInvalidOption, l.Consumer)
		}
	case l.Level < 0 || l.Level >= levels:
		return fmt.Errorf("%w: consumer %q has level %d of %d", ErrInvalidOption, l.Consumer, l.Level, levels)
	}
	return nil
}

func (o *Options) setDefaults(levels int) error {
	if o.Concurrency < 0 {
		return fmt.Errorf("%w: concurrency %d is negative", ErrInvalidOption, o.Concurrency)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.Prefetch < 0 {
		return fmt.Errorf("%w: prefetch %d is negative", ErrInvalidOption, o.Prefetch)
	}

	if o.Policy != Strict && o.Policy != Weighted {
		return fmt.Errorf("%w: unknown policy %v", ErrInvalidOption, o.Policy)
	}
	if o.Weights == nil {
		o.Weights = make([]int, levels)
		for i := range o.Weights {
			o.Weights[i] = 1 << (levels - 1 - i)
		}
	}
	if len(o.Weights) != levels {
		return fmt.Errorf("%w: %d weights for %d levels", ErrInvalidOption, len(o.Weights), levels)
	}
	for _, w := range o.Weights {
		if w <= 0 {
			return fmt.Errorf("%w: weight %d is not positive", ErrInvalidOption, w)
		}
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.PullExpiry == 0 {
		o.PullExpiry = DefaultPullExpiry
	}
	if o.PullExpiry < time.Second {
		return fmt.Errorf("%w: pull expiry %v is under 1s", ErrInvalidOption, o.PullExpiry)
	}
	if o.APIPrefix == "" {
		o.APIPrefix = "$JS.API."
	}
	if !strings.HasSuffix(o.APIPrefix, ".") {
		o.APIPrefix += "."
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
	m       Msg           // what the handler gets; its Metadata parsed from the ack subject when it arrived
	touched time.Duration // last delivery or in-progress ack, as Dispatcher.now
	slot    int           // its index in Dispatcher.inflight while its handler runs
}

// Dispatcher pulls from an agent's priority levels and runs a handler on
// each message in the order its Policy decides. Start one with [Start].
type Dispatcher struct {
	opts    Options
	nc      *nats.Conn
	handler Handler
	stream  string
	levels  [][]*queue // mu; the queues of each level, highest level first
	lanes   []*lane    // mu; every lane, in the order given to Start, then added
	weights []int      // smooth weighted round robin state, per level

	mu       sync.Mutex
	ready    *sync.Cond // on mu: a message arrived, a lane's state changed, or stopping
	stopping bool       // guarded by mu: no more messages are picked or kept
	// inflight holds the messages whose handlers run, each at its index
	// (held.slot): a slice, not a set, because every message is added and
	// removed and only keepAlive reads them all. mu.
	inflight []*held
	epoch    time.Time    // Dispatcher.now counts from it
	tick     atomic.Int64 // Dispatcher.now at keepAlive's last tick (lastTick)
	// While stopping, until the lanes' subscriptions are gone
	// (lanesClosed), messages given back wait in givenBack (both guarded
	// by mu): see deferGiveBack.
	lanesClosed bool
	givenBack   []giveBackMsg

	pullCtx    context.Context // cancelled to stop pulling and picking
	stopPull   context.CancelFunc
	handlerCtx context.Context // cancelled to cancel running handlers
	stopAll    context.CancelFunc

	// handling is the moving average of how long a handler takes, in
	// nanoseconds; 0 until one returned. It sizes an adaptive prefetch.
	handling atomic.Int64

	pulling sync.WaitGroup // pullers and the connection watcher
	workers sync.WaitGroup
	done    chan struct{}
}

// Start begins dispatching the messages of the durable consumers lanes
// names, of stream, in levels priority levels, 0 the highest. Each lane
// belongs to one level, or with AnyLevel to all of them, its messages placed
// by Options.LevelOf. The policy chooses between levels; within a level the
// buffered message with the lowest stream sequence starts first, so the
// lanes of a level together keep publish order. Every level needs a lane
// and no consumer may appear twice. The consumers must exist (see Ensure).
// Start returns at once; stop the dispatcher with Stop or Drain.
func Start(nc *nats.Conn, stream string, levels int, lanes []Lane, h Handler, opts Options) (*Dispatcher, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	if err := checkLanes(levels, lanes, opts.LevelOf); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil handler", ErrInvalidOption)
	}
	if err := opts.setDefaults(levels); err != nil {
		return nil, err
	}
	d := newDispatcher(nc, stream, levels, h, opts)
	for _, spec := range lanes {
		l, err := d.newLane(spec)
		if err != nil {
			for _, l := range d.lanes {
				l.sub.Unsubscribe()
				if l.expectTimer != nil {
					l.expectTimer.Stop()
				}
			}
			return nil, fmt.Errorf("subscribe for consumer %s: %w", spec.Consumer, err)
		}
		d.addLaneLocked(l)
	}
	reconnected := nc.StatusChanged(nats.CONNECTED)
	d.pulling.Add(len(d.lanes) + 1)
	for _, l := range d.lanes {
		go d.pull(l)
	}
	go d.watch(reconnected)
	d.workers.Add(opts.Concurrency)
	for range opts.Concurrency {
		go d.runWorker()
	}
	keeperStop := make(chan struct{})
	keeperDone := make(chan struct{})
	go d.keepAlive(keeperStop, keeperDone)
	go func() {
		d.pulling.Wait()
		d.closeLanes()
		d.sendGivenBack()
		d.releaseBuffered()
		d.workers.Wait()
		close(keeperStop)
		<-keeperDone
		d.stopAll()
		close(d.done)
	}()
	return d, nil
}

// newDispatcher returns a dispatcher of stream's levels with opts, which
// have their defaults, before it has lanes or goroutines.
func newDispatcher(nc *nats.Conn, stream string, levels int, h Handler, opts Options) *Dispatcher {
	d := &Dispatcher{
		opts:    opts,
		nc:      nc,
		handler: h,
		stream:  stream,
		levels:  make([][]*queue, levels),
		weights: make([]int, levels),
		done:    make(chan struct{}),
		epoch:   time.Now(),
	}
	d.ready = sync.NewCond(&d.mu)
	d.pullCtx, d.stopPull = context.WithCancel(context.Background())
	d.handlerCtx, d.stopAll = context.WithCancel(context.Background())
	return d
}

// addLaneLocked adds l to the lanes read and its queues to their levels,
// with mu held or before the dispatcher starts.
func (d *Dispatcher) addLaneLocked(l *lane) {
	d.lanes = append(d.lanes, l)
	for _, q := range l.queues {
		d.levels[q.level] = append(d.levels[q.level], q)
	}
}

// AddLane starts reading one more durable consumer, as if it had been
// among the lanes given to Start: an agent's priority whose consumer is
// created when its first message arrives. The consumer must exist, or
// spec.Create make it exist. Its level must be one of the dispatcher's;
// from now on Strict waits for the lane to tell whether it holds messages
// (and, with Create, for its consumer to be created) before a lower level
// starts. It returns an error wrapping ErrInvalidOption for a bad lane or
// a consumer the dispatcher reads already, and ErrStopped once the
// dispatcher is stopping.
func (d *Dispatcher) AddLane(spec Lane) error {
	if err := checkLane(spec, len(d.levels), d.opts.LevelOf); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return ErrStopped
	}
	for _, l := range d.lanes {
		if l.name == spec.Consumer {
			return fmt.Errorf("%w: consumer %q given twice", ErrInvalidOption, spec.Consumer)
		}
	}
	l, err := d.newLane(spec)
	if err != nil {
		return fmt.Errorf("subscribe for consumer %s: %w", spec.Consumer, err)
	}
	d.addLaneLocked(l)
	// Not stopping, so the connection watcher still counts in pulling: the
	// stop sequence cannot be waiting on it yet.
	d.pulling.Add(1)
	go d.pull(l)
	return nil
}

// ErrStopped is returned by [Dispatcher.AddLane] once the dispatcher is
// stopping.
var ErrStopped = errors.New("consumers: dispatcher stopped")

// lanesNow returns the lanes read now.
func (d *Dispatcher) lanesNow() []*lane {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lanes[:len(d.lanes):len(d.lanes)]
}

// watch tells every lane to issue a new pull request after a reconnect:
// the server that held the old one may be gone.
func (d *Dispatcher) watch(reconnected chan nats.Status) {
	defer d.pulling.Done()
	defer d.nc.RemoveStatusListener(reconnected)
	for {
		select {
		case <-d.pullCtx.Done():
			return
		case _, ok := <-reconnected:
			if !ok {
				<-d.pullCtx.Done()
				continue
			}
			for _, l := range d.lanesNow() {
				l.end(endReconnect, 0, nil)
			}
		}
	}
}

// Stop stops pulling, gives back the messages held in memory for immediate
// redelivery, and cancels the context of running handlers. It does not wait:
// Done is closed once every handler has returned and its message is settled.
// Stop is idempotent.
func (d *Dispatcher) Stop() {
	d.stopPicking()
	d.stopAll()
}

// stopPicking stops pulling and makes the workers pick no more messages.
func (d *Dispatcher) stopPicking() {
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	d.ready.Broadcast()
	d.stopPull()
}

// Drain stops pulling, gives back the messages held in memory, and waits
// until the running handlers finish and their messages are settled. If ctx
// ends first, Drain calls Stop and returns ctx's error.
func (d *Dispatcher) Drain(ctx context.Context) error {
	d.stopPicking()
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		d.Stop()
		return ctx.Err()
	}
}

// Buffered returns how many messages each level, summed over its lanes,
// holds in memory waiting for a handler, highest level first.
func (d *Dispatcher) Buffered() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]int, len(d.levels))
	for i, qs := range d.levels {
		for _, q := range qs {
			out[i] += len(q.buf)
		}
	}
	return out
}

// Done is closed when the dispatcher has stopped and every message it
// received is settled or given back.
func (d *Dispatcher) Done() <-chan struct{} { return d.done }

// signal wakes a goroutine waiting on ch, if any, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// runWorker is one handler slot: it picks the message the policy chooses,
// runs the handler and settles the message, until the dispatcher stops.
// Picking only when a worker is free means a message that arrives while
// every handler is busy still competes on priority for the next start.
func (d *Dispatcher) runWorker() {
	defer d.workers.Done()
	var running *held // set while its handler runs
	defer func() {
		if running != nil {
			d.handlerExited(running)
		}
	}()
	d.mu.Lock()
	for n := 0; ; {
		if d.stopping {
			d.mu.Unlock()
			return
		}
		h := d.pickLocked()
		if h == nil {
			d.ready.Wait()
			continue
		}
		d.mu.Unlock()
		running = h
		d.handle(h, n)
		running = nil
		n++
		d.mu.Lock()
		d.finishedLocked(h)
	}
}

// errGoexit reports a handler that called runtime.Goexit (as t.FailNow
// does), which ends the goroutine it runs on.
var errGoexit = errors.New("consumers: handler called runtime.Goexit; message given back")

// handlerExited cleans up after h's handler called runtime.Goexit, which
// is neither a return nor a panic: the worker's goroutine ends with it.
// The message is given back unless settled, and another worker takes the
// place of this one, which would otherwise leave the subscription a
// handler short for good (none at all with a concurrency of 1).
func (d *Dispatcher) handlerExited(h *held) {
	d.opts.OnError(fmt.Errorf("message %s: %w", h.m.Subject, errGoexit))
	if !h.m.settled {
		if err := h.m.Nak(0); err != nil {
			d.opts.OnError(fmt.Errorf("give back message %s: %w", h.m.Subject, err))
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.finishedLocked(h)
	if !d.stopping {
		d.workers.Add(1) // before this worker's Done
		go d.runWorker()
	}
}

// finishedLocked removes h, whose handler returned, from inflight: the last
// message there takes its slot.
func (d *Dispatcher) finishedLocked(h *held) {
	last := len(d.inflight) - 1
	moved := d.inflight[last]
	d.inflight[h.slot], moved.slot = moved, h.slot
	d.inflight[last] = nil
	d.inflight = d.inflight[:last]
}

// now returns the time since the dispatcher started, from the monotonic
// clock alone.
func (d *Dispatcher) now() time.Duration { return time.Since(d.epoch) }

// lastTick returns the time of keepAlive's last tick, as now: when a
// message arrives, to within AckWait/6, read without a clock. A message
// looks older than it is by at most that, so keepAlive's in-progress ack
// for it comes at most one tick sooner than its arrival time would make
// it, never later.
func (d *Dispatcher) lastTick() time.Duration { return time.Duration(d.tick.Load()) }

// pickLocked removes and returns the next message to handle, or nil when
// there is none to start. Strict waits while a lane of the candidate level
// or of a level above it has not yet told whether it holds messages, so that
// neither a lower level nor a later message of the level starts first;
// Weighted shares starts between the levels that have messages here, without
// waiting for the other lanes.
func (d *Dispatcher) pickLocked() *held {
	var q *queue // the queue to take the message from
	total := 0
	for i, qs := range d.levels {
		head, unknown := headLocked(qs, d.prefetch())
		if d.opts.Policy == Strict {
			if unknown {
				return nil
			}
			if head == nil {
				continue
			}
			q = head
			break
		}
		if head == nil {
			continue
		}
		d.weights[i] += d.opts.Weights[i]
		total += d.opts.Weights[i]
		if q == nil || d.weights[i] > d.weights[q.level] {
			q = head
		}
	}
	if q == nil {
		return nil
	}
	d.weights[q.level] -= total
	h := q.buf[0]
	q.buf[0] = nil
	q.buf = q.buf[1:]
	q.lane.buffered--
	h.slot = len(d.inflight)
	d.inflight = append(d.inflight, h)
	if q.lane.shouldPullLocked(d.prefetch()) {
		// Only then: waking the puller for every message taken would
		// cost a goroutine switch per message for nothing.
		signal(q.lane.room)
	}
	return h
}

// headLocked returns the queue among qs whose first buffered message has
// the lowest stream sequence, nil if none holds a message, and whether one of
// them is empty while its lane is still asking the server for messages that
// may belong there: it has not told that the server holds nothing more for
// it (it is not drained) and it will pull (shouldPullLocked). A lane that
// serves every level and will not pull, full or with less room than it
// pulls for, cannot learn more until one of its messages starts, so its
// empty queues do not hold up the others: what it has not fetched yet is
// later in the stream than everything it holds. (Until 2026-11-28 a lane
// with some room but not enough to pull held them up, and Strict waited
// for news it never asked for: a backlog or burst of broadcasts stopped
// the subscription.)
func headLocked(qs []*queue, prefetch int) (head *queue, unknown bool) {
	for _, q := range qs {
		switch {
		case len(q.buf) == 0:
			unknown = unknown || ((!q.lane.drained || q.lane.expecting) && q.lane.shouldPullLocked(prefetch))
		case head == nil || q.buf[0].m.Metadata.StreamSeq < head.buf[0].m.Metadata.StreamSeq:
			head = q
		}
	}
	return head, unknown
}

// timeEvery is how often the handling of a fast handler is timed for an
// adaptive prefetch: one in timeEvery. Two clock reads cost about a
// tenth of a microsecond, and a fast handler's prefetch is MaxPrefetch
// whatever its exact time; a handler that takes at least timeAllOver is
// timed every time.
const (
	timeEvery   = 8
	timeAllOver = 20 * time.Microsecond
)

// handle runs the handler on h's message, the n-th its worker handled. The
// handler settles it; one it returns without settling, or whose handler
// panicked, is given back.
func (d *Dispatcher) handle(h *held, n int) {
	m := &h.m
	timed := d.opts.Prefetch == 0 && (n%timeEvery == 0 || d.handling.Load() >= int64(timeAllOver))
	var start time.Time
	if timed {
		start = time.Now()
	}
	panicked := d.call(m)
	if timed {
		before := d.prefetch()
		d.observe(time.Since(start))
		if d.prefetch() > before {
			// A lane that was full may pull again: wake its puller, or
			// Strict would wait on a lane that now has room but does not
			// ask.
			for _, l := range d.lanesNow() {
				signal(l.room)
			}
		}
	}
	if !m.settled {
		if !panicked {
			d.opts.OnError(fmt.Errorf("message %s: %w", m.Subject, errUnsettled))
		}
		if err := m.Nak(0); err != nil {
			d.opts.OnError(fmt.Errorf("give back message %s: %w", m.Subject, err))
		}
	}
}

// errUnsettled reports a handler that returned without settling.
var errUnsettled = errors.New("consumers: handler returned without settling the message; given back")

// call runs the handler on m and reports whether it panicked.
func (d *Dispatcher) call(m *Msg) (panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			panicked = true
			d.opts.OnError(fmt.Errorf("message %s: %w", m.Subject, panicError(r)))
		}
	}()
	d.handler(d.handlerCtx, m)
	return false
}

// observe adds a handler's duration to the moving average (weight 1/8).
func (d *Dispatcher) observe(took time.Duration) {
	for {
		old := d.handling.Load()
		next := int64(took)
		if old != 0 {
			next = old + (int64(took)-old)/8
		}
		if d.handling.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// prefetch returns how many messages a lane may hold now: Options.Prefetch,
// or, when that is zero, as many as the handlers start in PrefetchWindow
// at their average speed so far, between Concurrency and MaxPrefetch.
func (d *Dispatcher) prefetch() int {
	if d.opts.Prefetch > 0 {
		return d.opts.Prefetch
	}
	avg := d.handling.Load()
	if avg == 0 {
		return d.opts.Concurrency
	}
	n := int64(d.opts.Concurrency) * int64(PrefetchWindow) / avg
	return int(min(max(n, int64(d.opts.Concurrency)), MaxPrefetch))
}

// giveBack naks the message on subject, whose ack subject is reply, so the
// server redelivers it at once, to this agent's other processes or later
// to this one.
func (d *Dispatcher) giveBack(subject, reply string) {
	if d.deferGiveBack(subject, reply, nakBody) {
		return
	}
	if err := d.nc.Publish(reply, nakBody); err != nil {
		d.opts.Logger.Debug("give back message", "subject", subject, "error", err)
	}
}

// giveBackMsg is a nak held back until the lanes are closed.
type giveBackMsg struct {
	subject, reply string
	body           []byte
}

// deferGiveBack holds back a nak (body) of the message with ack subject
// reply while the dispatcher stops and its lanes' subscriptions may still
// exist, and reports whether it did; sendGivenBack sends it once they are
// gone. Sent at once, the nak could make the server redeliver the message
// straight to a pull request of this process still waiting at the server,
// whose inbox is being unsubscribed: the message would then reach nobody
// and wait out AckWait, where it should go to the agent's next process at
// once.
func (d *Dispatcher) deferGiveBack(subject, reply string, body []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.stopping || d.lanesClosed {
		return false
	}
	d.givenBack = append(d.givenBack, giveBackMsg{subject: subject, reply: reply, body: body})
	return true
}

// sendGivenBack marks the lanes closed and sends the naks held back until
// then.
func (d *Dispatcher) sendGivenBack() {
	d.mu.Lock()
	d.lanesClosed = true
	msgs := d.givenBack
	d.givenBack = nil
	d.mu.Unlock()
	for _, m := range msgs {
		if err := d.nc.Publish(m.reply, m.body); err != nil {
			d.opts.Logger.Debug("give back message", "subject", m.subject, "error", err)
		}
	}
}

// releaseBuffered gives back every message still waiting in memory.
func (d *Dispatcher) releaseBuffered() {
	d.mu.Lock()
	var msgs []*Msg
	for _, l := range d.lanes {
		for _, q := range l.queues {
			for _, h := range q.buf {
				msgs = append(msgs, &h.m)
			}
			q.buf = nil
		}
		l.buffered = 0
		l.drained = false
	}
	d.mu.Unlock()
	for _, m := range msgs {
		d.giveBack(m.Subject, m.reply)
	}
}

// keepAlive sends an in-progress ack for every held or running message that
// has not been touched for AckWait/3 (checked every AckWait/6, so no message
// goes more than AckWait/2 without one), so neither waiting in the buffer nor a
// long handler lets the server redeliver it.
func (d *Dispatcher) keepAlive(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(d.opts.AckWait / 6)
	defer t.Stop()
	var due []*Msg // only their Subject and reply are read
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			due = due[:0]
			now := d.now()
			d.tick.Store(int64(now))
			limit := now - d.opts.AckWait/3
			touch := func(h *held) {
				if h.touched < limit {
					h.touched = now
					due = append(due, &h.m)
				}
			}
			d.mu.Lock()
			for _, l := range d.lanes {
				for _, q := range l.queues {
					for _, h := range q.buf {
						touch(h)
					}
				}
			}
			for _, h := range d.inflight {
				touch(h)
			}
			d.mu.Unlock()
			for _, m := range due {
				if err := d.nc.Publish(m.reply, progressBody); err != nil {
					d.opts.Logger.Debug("in-progress ack", "subject", m.Subject, "error", err)
				}
			}
		}
	}
}
