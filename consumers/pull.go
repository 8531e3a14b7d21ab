package consumers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrPull is wrapped by the errors a lane's pull requests end with: the
// server refused or ended a request (JetStream status 409 and others), or
// stopped answering.
var ErrPull = errors.New("consumers: pull request failed")

// lane is one consumer, the subscription its messages arrive on, and the
// messages pulled from it, in one queue per level it serves. Fields marked
// "mu" are guarded by Dispatcher.mu.
type lane struct {
	queues  []*queue // one, or one per level for an AnyLevel lane
	levelOf func(subject string) int
	create  func(context.Context) error // Lane.Create; nil when the consumer exists
	name    string
	subject string // the consumer's "next messages" API subject
	inbox   string // requests reply to inbox.<seq>
	sub     *nats.Subscription
	closed  chan struct{} // closed when sub is gone

	buffered int // mu; messages in its queues
	// expecting means Lane.Stored was set and no message has arrived yet:
	// Strict waits for the lane even while it is drained, until
	// expectTimer (StoredWait) or a lasting failure ends it. mu.
	expecting   bool
	expectTimer *time.Timer
	// drained means a pull request is waiting at the server with room to
	// spare, so the server holds no message for this lane that it has not
	// sent us. mu.
	drained bool
	room    chan struct{} // signalled when buffered shrinks

	reqSeq   atomic.Uint64 // the current pull request
	reqBatch int           // mu; messages it asked for
	reqGot   int           // mu; messages received since it was sent
	ended    chan ending   // how the current request ended
	// activity is when the current request last heard from the server,
	// as Dispatcher.now: a status, or a message while the request waits
	// at the server (waiting). A request answered at once (no_wait) does
	// not watch it, so its messages, the many, read no clock.
	activity atomic.Int64
	waiting  atomic.Bool
}

// endKind is how a pull request ended.
type endKind int

const (
	endFilled      endKind = iota // every message asked for arrived
	endEmpty                      // 404 or 408: the server had no more to send
	endFailed                     // refused, unanswered, or not sent
	endUnavailable                // 503: no consumer took the request
	endReconnect                  // the connection was re-established
	endStopped                    // the dispatcher is stopping
)

type ending struct {
	kind endKind
	seq  uint64 // the request it ends; 0 for whatever request is current
	err  error
}

// queue holds the buffered messages of one lane at one level.
type queue struct {
	lane  *lane
	level int
	buf   []*held // mu; FIFO, so in stream order but for redeliveries
}

// newLane subscribes to the inbox that the pull requests of the lane spec
// names reply to.
func (d *Dispatcher) newLane(spec Lane) (*lane, error) {
	consumer := spec.Consumer
	l := &lane{
		create:  spec.Create,
		name:    consumer,
		subject: d.opts.APIPrefix + "CONSUMER.MSG.NEXT." + d.stream + "." + consumer,
		inbox:   d.nc.NewInbox(),
		closed:  make(chan struct{}),
		room:    make(chan struct{}, 1),
		ended:   make(chan ending, 1),
	}
	if spec.Level == AnyLevel {
		l.levelOf = d.opts.LevelOf
		for i := range d.levels {
			l.queues = append(l.queues, &queue{lane: l, level: i})
		}
	} else {
		l.queues = []*queue{{lane: l, level: spec.Level}}
	}
	sub, err := d.nc.Subscribe(l.inbox+".*", func(m *nats.Msg) { d.onMessage(l, m) })
	if err != nil {
		return nil, err
	}
	if spec.Stored {
		l.expecting = true
		l.expectTimer = time.AfterFunc(storedWait, func() { d.stopExpecting(l) })
	}
	sub.SetClosedHandler(func(string) { close(l.closed) })
	l.sub = sub
	return l, nil
}

// end reports how a request ended, to the puller waiting for it. Reports
// for an older request are dropped.
func (l *lane) end(kind endKind, seq uint64, err error) {
	if seq != 0 && seq != l.reqSeq.Load() {
		return
	}
	select {
	case l.ended <- ending{kind, seq, err}:
	default: // the puller has a report already
	}
}

// onMessage handles what arrives on a lane's inbox: a message, a heartbeat,
// or the status that ends a pull request. A message's metadata is parsed
// here, once: its stream sequence orders the lanes of a level.
func (d *Dispatcher) onMessage(l *lane, m *nats.Msg) {
	if len(m.Data) == 0 && len(m.Header) > 0 {
		if status := m.Header.Get("Status"); status != "" {
			l.activity.Store(int64(d.now()))
			seq, _ := strconv.ParseUint(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], 10, 64)
			switch status {
			case "100": // idle heartbeat
			case "404", "408": // no messages (no_wait), or the request expired
				l.end(endEmpty, seq, nil)
			case "503": // no responders
				l.end(endUnavailable, seq, fmt.Errorf("%w: consumer %s: status 503, no consumer took the request", ErrPull, l.name))
			case "409":
				desc := m.Header.Get("Description")
				if desc == "Leadership Change" || desc == "Server Shutdown" {
					// The consumer's leader moved (a node stopping, as in
					// a rolling upgrade): its new leader takes the next
					// pull, as after a 503. Before 2026-11-28 each was
					// reported as a failed pull.
					l.end(endUnavailable, seq, fmt.Errorf("%w: consumer %s: status 409 %s", ErrPull, l.name, desc))
					break
				}
				l.end(endFailed, seq, fmt.Errorf("%w: consumer %s: status 409 %s", ErrPull, l.name, desc))
			default:
				l.end(endFailed, seq, fmt.Errorf("%w: consumer %s: status %s %s", ErrPull, l.name, status, m.Header.Get("Description")))
			}
			return
		}
	}
	if l.waiting.Load() {
		l.activity.Store(int64(d.now()))
	}
	md, err := ParseMetadata(m.Reply)
	if err != nil {
		// Not a delivery of the consumer: nothing to settle or give back.
		d.opts.OnError(fmt.Errorf("message on %s: %w", m.Subject, err))
		return
	}
	d.mu.Lock()
	if d.stopping {
		d.mu.Unlock()
		d.giveBack(m.Subject, m.Reply)
		return
	}
	q := l.queues[0]
	if l.levelOf != nil {
		if i := l.levelOf(m.Subject); i >= 0 && i < len(l.queues) {
			q = l.queues[i]
		} else {
			q = l.queues[len(l.queues)-1]
		}
	}
	q.buf = append(q.buf, &held{
		m:       Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Metadata: md, reply: m.Reply, d: d},
		touched: d.lastTick(),
	})
	l.buffered++
	l.expecting = false
	l.reqGot++
	filled := l.reqGot == l.reqBatch
	if filled {
		// The request is used up: until the next one is answered the
		// server may hold messages for this lane again. Clearing drained
		// here, not when the puller hears of it, keeps the picker from
		// passing over this lane in the meantime.
		l.drained = false
	}
	d.mu.Unlock()
	d.ready.Signal()
	if filled {
		l.end(endFilled, 0, nil)
	}
}

// pull keeps one lane supplied. While the lane may hold messages at the
// server it asks for them without waiting (no_wait). Once the server returns
// fewer than asked, the lane is drained and pull parks a waiting request
// there, so a new message is pushed to us at once and an idle lane costs one
// request per PullExpiry.
func (d *Dispatcher) pull(l *lane) {
	defer d.pulling.Done()
	if l.create != nil && !d.create(l) {
		return
	}
	retry := time.Duration(0)
	var unavailableSince time.Time // of the 503s in a row, zero without
	for {
		room, drained, ok := d.waitRoom(l)
		if !ok {
			return
		}
		e := d.request(l, room, !drained)
		switch e.kind {
		case endStopped:
			return
		case endFilled: // onMessage cleared drained
			retry, unavailableSince = 0, time.Time{}
			continue
		case endEmpty:
			d.setDrained(l, true)
			retry, unavailableSince = 0, time.Time{}
			continue
		case endReconnect:
			d.setDrained(l, false)
			continue
		}
		first := 100 * time.Millisecond
		if e.kind == endUnavailable {
			// A consumer just created, as by another process of the same
			// agent, can take a few milliseconds to take requests (tens
			// on a cluster, where its replicas elect a leader first), and
			// a cluster can be electing its leader: ask again soon, then
			// less often, and report it only if it lasts. A 100ms wait
			// here let the other process take a whole backlog.
			first = 10 * time.Millisecond
			if unavailableSince.IsZero() {
				unavailableSince = time.Now()
			}
		}
		lasts := e.kind != endUnavailable || time.Since(unavailableSince) >= unavailableGrace
		if lasts {
			d.opts.OnError(fmt.Errorf("pull from consumer %s: %w", l.name, e.err))
		}
		// Until then Strict waits for the lane. A lane whose failure lasts
		// cannot tell what the server holds for it: it counts as empty
		// until a pull succeeds, so that Strict goes on with the levels
		// below rather than wait for it (as between attempts to create
		// its consumer). A consumer deleted under the lane (by an
		// operator, say) is not made again, even by a lane with Create: a
		// new durable consumer would start at the stream's first message
		// and deliver again what the old one had acknowledged.
		d.setDrained(l, lasts)
		if lasts {
			d.stopExpecting(l)
		}
		if !d.backOff(&retry, first) {
			return
		}
	}
}

// unavailableGrace is how long a lane's pulls may find no consumer (503),
// or find its leader moving (409 Leadership Change, Server Shutdown),
// before the dispatcher reports it: a consumer a cluster has just created
// took up to about 50 ms to take requests here, and reports of every
// agent's first message at a priority would teach operators to ignore
// them.
const unavailableGrace = time.Second

// backOff waits before the next attempt after a failure, twice as long as
// the last time (retry), from first up to 5s, and reports false if the
// dispatcher stopped meanwhile.
func (d *Dispatcher) backOff(retry *time.Duration, first time.Duration) bool {
	*retry = min(max(2**retry, first), 5*time.Second)
	select {
	case <-time.After(*retry):
		return true
	case <-d.pullCtx.Done():
		return false
	}
}

// create makes l's consumer exist (Lane.Create), trying again with a
// growing delay until it succeeds, and reports false if the dispatcher
// stopped first. Between a failed attempt and the next the lane counts as
// drained, so that Strict does not wait on it.
func (d *Dispatcher) create(l *lane) bool {
	retry := time.Duration(0)
	for {
		d.setDrained(l, false) // Strict waits while it is tried
		err := l.create(d.pullCtx)
		if err == nil {
			return true
		}
		if d.pullCtx.Err() != nil {
			return false
		}
		d.opts.OnError(fmt.Errorf("create consumer %s: %w", l.name, err))
		d.setDrained(l, true)
		d.stopExpecting(l)
		if !d.backOff(&retry, 100*time.Millisecond) {
			return false
		}
	}
}

// request sends one pull request for n messages and waits until it ends.
func (d *Dispatcher) request(l *lane, n int, noWait bool) ending {
	seq := l.reqSeq.Add(1)
	d.mu.Lock()
	l.reqBatch, l.reqGot = n, 0
	d.mu.Unlock()
	select {
	case <-l.ended: // a late report for an older request
	default:
	}
	body := make([]byte, 0, 80)
	body = append(body, `{"batch":`...)
	body = strconv.AppendInt(body, int64(n), 10)
	// Without a heartbeat the request is answered at once (no_wait) or
	// within its expiry; allow for a slow server on top.
	wait := 5 * time.Second
	heartbeat := time.Duration(0)
	if noWait {
		body = append(body, `,"no_wait":true}`...)
	} else {
		heartbeat = min(5*time.Second, d.opts.PullExpiry/4)
		body = append(body, `,"expires":`...)
		body = strconv.AppendInt(body, d.opts.PullExpiry.Nanoseconds(), 10)
		body = append(body, `,"idle_heartbeat":`...)
		body = strconv.AppendInt(body, heartbeat.Nanoseconds(), 10)
		body = append(body, '}')
		wait = 2*heartbeat + time.Second
	}
	l.activity.Store(int64(d.now()))
	l.waiting.Store(!noWait)
	if err := d.nc.PublishRequest(l.subject, l.inbox+"."+strconv.FormatUint(seq, 10), body); err != nil {
		return ending{kind: endFailed, err: err}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case e := <-l.ended:
			return e
		case <-d.pullCtx.Done():
			return ending{kind: endStopped}
		case <-t.C:
			if noWait {
				return ending{kind: endFailed, err: fmt.Errorf("%w: consumer %s: no answer in %v", ErrPull, l.name, wait)}
			}
			// A waiting request hears a message or a heartbeat at least
			// every heartbeat interval while the server holds it.
			quiet := d.now() - time.Duration(l.activity.Load())
			if quiet >= 2*heartbeat {
				return ending{kind: endFailed, err: fmt.Errorf("%w: consumer %s: no heartbeat for %v", ErrPull, l.name, quiet.Round(time.Millisecond))}
			}
			t.Reset(2*heartbeat - quiet + 100*time.Millisecond)
		}
	}
}

// waitRoom blocks until the lane should pull: there is room for half its
// prefetch, or any room while drained (a drained lane must keep a request
// waiting at the server).
func (d *Dispatcher) waitRoom(l *lane) (room int, drained, ok bool) {
	for {
		prefetch := d.prefetch()
		d.mu.Lock()
		room, drained = prefetch-l.buffered, l.drained
		pull := l.shouldPullLocked(prefetch)
		d.mu.Unlock()
		if pull {
			return room, drained, true
		}
		select {
		case <-l.room:
		case <-d.pullCtx.Done():
			return 0, false, false
		}
	}
}

// shouldPullLocked reports whether l, holding up to prefetch messages,
// should ask for more: it has room for half of them, or, drained, room for
// any (a drained lane keeps a request waiting at the server).
func (l *lane) shouldPullLocked(prefetch int) bool {
	room := prefetch - l.buffered
	return room >= max(1, prefetch/2) || (l.drained && room > 0)
}

// stopExpecting ends l's wait for its first message (lane.expecting).
func (d *Dispatcher) stopExpecting(l *lane) {
	d.mu.Lock()
	changed := l.expecting
	l.expecting = false
	d.mu.Unlock()
	if changed {
		d.ready.Broadcast()
	}
}

func (d *Dispatcher) setDrained(l *lane, drained bool) {
	d.mu.Lock()
	changed := l.drained != drained
	l.drained = drained
	d.mu.Unlock()
	if changed {
		d.ready.Broadcast()
	}
}

// closeLanes drains every lane's subscription: the server is told to stop
// sending, and whatever it sent before that is given back, so a message in
// flight at stop is redelivered at once rather than after AckWait.
//
// Without a connection the server cannot be told and nothing more can
// arrive, so the subscriptions are simply removed.
func (d *Dispatcher) closeLanes() {
	connected := d.nc.IsConnected()
	lanes := d.lanesNow() // no lane is added while stopping
	for _, l := range lanes {
		if l.expectTimer != nil {
			l.expectTimer.Stop()
		}
		if !connected || l.sub.Drain() != nil {
			l.sub.Unsubscribe()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range lanes {
		select {
		case <-l.closed:
		case <-ctx.Done():
			l.sub.Unsubscribe()
			d.opts.Logger.Debug("subscription drain timed out", "consumer", l.name)
		}
	}
}
