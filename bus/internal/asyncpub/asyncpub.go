package asyncpub

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults, the same as nats.go's jetstream.PublishMsgAsync.
const (
	// DefaultStallWait is how long Publish waits for room when MaxPending
	// publishes are in flight.
	DefaultStallWait = 200 * time.Millisecond
	// DefaultRetryWait is the pause before a publish that met no
	// responders (the stream has no leader yet) is sent again.
	DefaultRetryWait = 250 * time.Millisecond
	// DefaultRetryAttempts is how often such a publish is sent again.
	DefaultRetryAttempts = 2
)

// Options configure a Publisher.
type Options struct {
	// MaxPending bounds the publishes in flight: past it Publish waits up
	// to StallWait for room, then fails with jetstream.ErrTooManyStalledMsgs.
	// Zero means no bound.
	MaxPending int
	// StallWait is that wait. Zero means DefaultStallWait.
	StallWait time.Duration
	// Timeout is how long a publish waits for its ack before it fails with
	// jetstream.ErrAsyncPublishTimeout: at least Timeout, at most an eighth
	// more. Zero means no timeout.
	Timeout time.Duration
	// RetryWait and RetryAttempts govern a publish the server answers
	// with no responders. Zero means DefaultRetryWait and
	// DefaultRetryAttempts; a negative RetryAttempts, no retries.
	RetryWait     time.Duration
	RetryAttempts int
	// OnAck, if not nil, is called with every acknowledged message, after
	// its future resolved, on the goroutine that reads acks: it must not
	// block.
	OnAck func(m *nats.Msg, ack *jetstream.PubAck)
	// OnError, if not nil, is called with every message whose publish
	// failed after it went out (an error ack, a timeout, a disconnect),
	// after its future resolved.
	OnError func(m *nats.Msg, err error)
	// SendAgainOnReconnect keeps the publishes in flight when the
	// connection drops, and sends them again once it is back, where they
	// would otherwise fail with nats.ErrDisconnected: for messages that are
	// the same when stored twice (a record put again, one with a
	// Nats-Msg-Id or an expected last sequence). Their wait for an ack
	// (Timeout) starts again.
	SendAgainOnReconnect bool
	// Refused, if not nil, says why no ack can come now (the server
	// refused the subscription to the connection's inbox), or nil: Publish
	// then fails with it at once. Fail fails the publishes in flight.
	Refused func() error
}

// timeoutTicks is how many sweeps a publish's ack is waited for: the sweep
// runs every Timeout/timeoutTicks.
const timeoutTicks = 8

// Publisher sends messages to JetStream without waiting and matches each
// ack the server sends back to its Future. Create one with New; it is safe
// for concurrent use.
type Publisher struct {
	nc   *nats.Conn
	opts Options
	tick time.Duration // Timeout/timeoutTicks

	mu       sync.Mutex
	closed   bool
	sub      *nats.Subscription // acks arrive on prefix+token; made by the first Publish
	prefix   string
	status   chan nats.Status // a disconnect fails every publish in flight
	watching sync.WaitGroup
	next     uint64             // the token of the next publish
	pending  map[uint64]*Future // in flight, by token
	stall    chan struct{}      // closed when a Publish waiting for room may go on
	complete chan struct{}      // closed when nothing is in flight
	epoch    uint64             // sweeps so far
	sweeper  *time.Timer        // runs while a publish is in flight
	sweeping bool
}

// New returns a Publisher on nc. It subscribes to its acks with the first
// Publish; Close unsubscribes.
func New(nc *nats.Conn, o Options) *Publisher {
	if o.StallWait <= 0 {
		o.StallWait = DefaultStallWait
	}
	if o.RetryWait <= 0 {
		o.RetryWait = DefaultRetryWait
	}
	switch {
	case o.RetryAttempts == 0:
		o.RetryAttempts = DefaultRetryAttempts
	case o.RetryAttempts < 0:
		o.RetryAttempts = 0
	}
	p := &Publisher{nc: nc, opts: o, pending: make(map[uint64]*Future)}
	if o.Timeout > 0 {
		p.tick = max(o.Timeout/timeoutTicks, time.Millisecond)
	}
	return p
}

// Future is the pending result of one Publish.
type Future struct {
	p       *Publisher
	msg     *nats.Msg
	token   uint64
	epoch   uint64 // the sweep count when it was sent
	retries int
	// sent is set, with SendAgainOnReconnect, once Publish has sent msg,
	// which it no longer changes then: resendAll sends only such a message
	// again.
	sent atomic.Bool

	// Guarded by p.mu until resolved; read-only after.
	resolved bool
	ack      *jetstream.PubAck
	err      error
	done     chan struct{} // made by Done
}

// closedChan is the Done of a future resolved before anyone asked.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Done is closed when the publish is acknowledged or has failed.
func (f *Future) Done() <-chan struct{} {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	if f.resolved {
		return closedChan
	}
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f.done
}

// Result returns the server's ack or the error the publish failed with. Call
// it once Done is closed.
func (f *Future) Result() (*jetstream.PubAck, error) {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.ack, f.err
}

// ErrReplySet is returned by Publish for a message that has a reply
// subject: the Publisher sets it to receive the ack.
var ErrReplySet = errors.New("asyncpub: message has a reply subject")

// Publish sends m and returns at once; the Future resolves with the
// server's ack. m must not have a Reply, which Publish sets, and must not
// be changed afterwards. It fails when MaxPending publishes stay in flight
// for StallWait (jetstream.ErrTooManyStalledMsgs), after Close
// (nats.ErrConnectionClosed), and when the connection refuses m.
func (p *Publisher) Publish(m *nats.Msg) (*Future, error) {
	if m.Reply != "" {
		return nil, ErrReplySet
	}
	f := &Future{p: p, msg: m}
	if err := p.register(f); err != nil {
		return nil, err
	}
	m.Reply = replySubject(p.prefix, f.token)
	if err := p.nc.PublishMsg(m); err != nil {
		p.mu.Lock()
		p.removeLocked(f.token)
		p.mu.Unlock()
		m.Reply = ""
		return nil, err
	}
	if p.opts.SendAgainOnReconnect {
		f.sent.Store(true)
	}
	return f, nil
}

// register makes f pending under a new token, waiting for room first.
func (p *Publisher) register(f *Future) error {
	if p.opts.Refused != nil {
		if err := p.opts.Refused(); err != nil {
			return err
		}
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nats.ErrConnectionClosed
		}
		if p.opts.MaxPending <= 0 || len(p.pending) < p.opts.MaxPending {
			break
		}
		if p.stall == nil {
			p.stall = make(chan struct{})
		}
		stall := p.stall
		p.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(p.opts.StallWait)
		}
		select {
		case <-stall:
		case <-timer.C:
			return jetstream.ErrTooManyStalledMsgs
		}
		p.mu.Lock()
	}
	if p.sub == nil {
		if err := p.subscribeLocked(); err != nil {
			p.mu.Unlock()
			return err
		}
	}
	f.token = p.next
	p.next++
	f.epoch = p.epoch
	p.pending[f.token] = f
	if p.tick > 0 && !p.sweeping {
		p.sweeping = true
		if p.sweeper == nil {
			p.sweeper = time.AfterFunc(p.tick, p.sweep)
		} else {
			p.sweeper.Reset(p.tick)
		}
	}
	p.mu.Unlock()
	return nil
}

// subscribeLocked subscribes to the acks and starts watching the
// connection: a disconnect fails every publish in flight, whose ack may
// never come, as nats.go's own asynchronous publishes do.
func (p *Publisher) subscribeLocked() error {
	prefix := p.nc.NewInbox() + "."
	sub, err := p.nc.Subscribe(prefix+"*", p.handleAck)
	if err != nil {
		return err
	}
	p.sub, p.prefix = sub, prefix
	p.status = p.nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	p.watching.Add(1)
	go p.watch(p.status)
	return nil
}

// lastToken returns the part of subject after its last dot.
func lastToken(subject string) string {
	for i := len(subject) - 1; i >= 0; i-- {
		if subject[i] == '.' {
			return subject[i+1:]
		}
	}
	return subject
}

// watch fails every publish in flight when the connection drops, or with
// SendAgainOnReconnect sends them again once it is back, until the
// connection closes or Close closes status.
func (p *Publisher) watch(status chan nats.Status) {
	defer p.watching.Done()
	for s := range status {
		switch {
		case s == nats.CLOSED:
			p.failAll(nats.ErrConnectionClosed)
			return
		case s == nats.CONNECTED && p.opts.SendAgainOnReconnect:
			p.resendAll()
		case s == nats.RECONNECTING && !p.opts.SendAgainOnReconnect:
			p.failAll(nats.ErrDisconnected)
		}
	}
}

// resendAll sends every publish in flight again (resend): the connection
// is back, and what went out before it dropped may never have arrived. A
// publish still being sent by Publish is left to it.
func (p *Publisher) resendAll() {
	p.mu.Lock()
	inFlight := make([]*Future, 0, len(p.pending))
	for _, f := range p.pending {
		if f.sent.Load() {
			inFlight = append(inFlight, f)
		}
	}
	p.mu.Unlock()
	for _, f := range inFlight {
		p.resend(f)
	}
}

// Fail fails every publish in flight with err: no ack can come to them
// (the server refused the subscription to the connection's inbox).
func (p *Publisher) Fail(err error) { p.failAll(err) }

// failAll fails every publish in flight with err.
func (p *Publisher) failAll(err error) {
	p.mu.Lock()
	failed := make([]*Future, 0, len(p.pending))
	for token, f := range p.pending {
		delete(p.pending, token)
		p.resolveLocked(f, nil, err)
		failed = append(failed, f)
	}
	p.removedLocked()
	p.mu.Unlock()
	p.reportErrors(failed)
}

// sweep fails the publishes whose ack has not come for timeoutTicks sweeps,
// and runs again while any is in flight.
func (p *Publisher) sweep() {
	p.mu.Lock()
	p.epoch++
	var expired []*Future
	for token, f := range p.pending {
		// f went out during epoch f.epoch, which began with a sweep or
		// with the sweeper's start: the sweep that begins epoch
		// f.epoch+timeoutTicks+1 comes at least timeoutTicks ticks later.
		if p.epoch-f.epoch > timeoutTicks {
			delete(p.pending, token)
			p.resolveLocked(f, nil, jetstream.ErrAsyncPublishTimeout)
			expired = append(expired, f)
		}
	}
	if len(expired) > 0 {
		p.removedLocked()
	}
	if len(p.pending) > 0 && !p.closed {
		p.sweeper.Reset(p.tick)
	} else {
		p.sweeping = false
	}
	p.mu.Unlock()
	p.reportErrors(expired)
}

// handleAck resolves the future an ack is for.
func (p *Publisher) handleAck(m *nats.Msg) {
	token, ok := decodeToken(lastToken(m.Subject))
	if !ok {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		p.noResponders(token)
		return
	}
	ack, err := parseAck(m.Data)
	p.finish(token, ack, err)
}

// finish resolves the publish of token with ack or err, unless it is no
// longer in flight (it timed out or failed already), and passes it to
// OnAck or OnError.
func (p *Publisher) finish(token uint64, ack *jetstream.PubAck, err error) {
	p.mu.Lock()
	f := p.removeLocked(token)
	if f != nil {
		p.resolveLocked(f, ack, err)
	}
	p.mu.Unlock()
	switch {
	case f == nil:
	case err != nil:
		p.reportErrors([]*Future{f})
	case p.opts.OnAck != nil:
		p.opts.OnAck(f.msg, ack)
	}
}

// removeLocked takes the publish of token out of flight and returns its
// future, or nil if it is not in flight.
func (p *Publisher) removeLocked(token uint64) *Future {
	f := p.pending[token]
	if f != nil {
		delete(p.pending, token)
		p.removedLocked()
	}
	return f
}

// noResponders sends the publish of token again after RetryWait, or fails
// it with jetstream.ErrNoStreamResponse when its retries are used up.
func (p *Publisher) noResponders(token uint64) {
	p.mu.Lock()
	f := p.pending[token]
	if f == nil {
		p.mu.Unlock()
		return
	}
	retry := f.retries < p.opts.RetryAttempts
	if retry {
		f.retries++
	}
	p.mu.Unlock()
	if !retry {
		p.finish(token, nil, jetstream.ErrNoStreamResponse)
		return
	}
	time.AfterFunc(p.opts.RetryWait, func() { p.resend(f) })
}

// resend sends f's message again, under the same token, if it is still in
// flight.
func (p *Publisher) resend(f *Future) {
	p.mu.Lock()
	live := p.pending[f.token] != nil // tokens are never reused
	if live {
		f.epoch = p.epoch // its wait for an ack starts again
	}
	p.mu.Unlock()
	if !live {
		return
	}
	if err := p.nc.PublishMsg(f.msg); err != nil {
		p.finish(f.token, nil, err)
	}
}

// resolveLocked sets f's result and wakes whoever waits on it.
func (p *Publisher) resolveLocked(f *Future, ack *jetstream.PubAck, err error) {
	f.resolved, f.ack, f.err = true, ack, err
	if f.done != nil {
		close(f.done)
	}
}

// removedLocked wakes a Publish waiting for room and the waiters for
// completion, after publishes left pending.
func (p *Publisher) removedLocked() {
	if p.stall != nil && (p.opts.MaxPending <= 0 || len(p.pending) < p.opts.MaxPending) {
		close(p.stall)
		p.stall = nil
	}
	if p.complete != nil && len(p.pending) == 0 {
		close(p.complete)
		p.complete = nil
	}
}

// reportErrors passes each failed future's message and error to OnError.
func (p *Publisher) reportErrors(failed []*Future) {
	if p.opts.OnError == nil {
		return
	}
	for _, f := range failed {
		p.opts.OnError(f.msg, f.err)
	}
}

// Complete returns a channel closed once no publish is in flight: every
// one made so far is acknowledged or has failed.
func (p *Publisher) Complete() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return closedChan
	}
	if p.complete == nil {
		p.complete = make(chan struct{})
	}
	return p.complete
}

// Close fails the publishes still in flight with nats.ErrConnectionClosed,
// unsubscribes from acks and stops watching the connection; Publish fails
// from then on. It does not close the connection. Close is idempotent.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	sub, status := p.sub, p.status
	if p.sweeper != nil {
		p.sweeper.Stop()
		p.sweeping = false
	}
	p.mu.Unlock()
	p.failAll(nats.ErrConnectionClosed)
	if sub != nil {
		_ = sub.Unsubscribe() // fails only on a closed connection, which has dropped it
		p.nc.RemoveStatusListener(status)
		p.watching.Wait()
	}
}
