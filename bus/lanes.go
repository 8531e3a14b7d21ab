package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/subjects"
)

// An agent's direct consumer of a priority is created with the first
// message sent to it at that priority, not before: every durable consumer
// costs the server about 31 KiB of memory and a directory of files whether
// it is read or not, and most agents are sent messages at one or two
// priorities. The broadcast consumer is created when the agent first
// subscribes (broadcasts wait for it only from then on).
//
// Nothing is lost in between. A direct consumer reads its priority from
// the first message the stream holds, so one created late still delivers
// everything sent before it, and a subscriber creates, when it starts, the
// consumer of every priority that has a message stored. For the others it
// watches their subjects with core NATS subscriptions, which carry no
// message it handles but tell it that a consumer is due: one per priority
// on its direct subject, taking one message, and one for the firing
// notices of the messages scheduled to it (the stream stores a fired
// message without publishing it; the schedule stream republishes its
// headers as a notice). It then adds the consumer's lane to its
// dispatcher, which creates the consumer before the lane's first pull and
// starts no message of a lower priority meanwhile, and drops the watch.
// Subscribe starts the watches before it looks at the stream, and looks
// again a few seconds later (lateLook), after every reconnect, and every
// half minute or so while a priority is watched (lookEvery), so that a
// message stored while the subscriber was starting or disconnected, or
// whose firing notice it never heard, is not left for its next start.

// lateLook is when a subscriber looks at the stream a second time for the
// priorities it watches: a message whose publication the server took just
// before the watch began may be stored after the first look.
const lateLook = 2 * time.Second

// lookEvery is how often, give or take a quarter, a subscriber looks at
// the stream after lateLook while it still watches a priority. A firing
// notice is a core NATS message that only the schedule stream's leader
// sends, once, as it stores the fired message: one can go unsent while
// the leader changes, or be dropped on a slow connection, and nothing
// else would tell a running subscriber that the message is due.
// The looks bound that wait. Each costs one direct get per watched
// priority (docs/performance.md gives the figure at 10,000 agents); the
// jitter keeps agents started together from looking together.
const lookEvery = 30 * time.Second

// storedAt reports, for each of the direct consumers specs, whether the
// stream holds a message it reads: the last message of its filter, with
// one direct get each, all at once. A priority the stream gives no answer
// about (an old provisioning without direct gets, no answer in time, an
// error status) counts as holding one when unanswered is set, so that its
// consumer is created as it was before direct gets were asked, and as
// holding none otherwise; noAnswer joins the reasons of those.
// The server's refusal of the direct gets ends it at once with an error
// wrapping ErrPermissionDenied, where each would wait out ctx.
func (b *client) storedAt(ctx context.Context, specs []consumers.Spec, unanswered bool) (stored []bool, noAnswer, err error) {
	prefix := b.opts.scheme.StreamDirectGetPrefix()
	ctx, stop := b.watchRefusals(ctx, strings.TrimSuffix(prefix, "."))
	defer stop()
	stored = make([]bool, len(specs))
	reasons := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			resp, err := directGet(ctx, b.nc, b.reconnects, prefix+spec.FilterSubject)
			if err == nil {
				switch status := resp.Header.Get("Status"); status {
				case "": // the message itself
					stored[i] = true
					return
				case "404":
					return
				default:
					err = fmt.Errorf("status %s %s", status, resp.Header.Get("Description"))
				}
			}
			stored[i], reasons[i] = unanswered, fmt.Errorf("direct get %s: %w", spec.FilterSubject, err)
		})
	}
	wg.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, ErrPermissionDenied) {
		return nil, nil, cause
	}
	return stored, errors.Join(reasons...), nil
}

// ensureConsumers makes sure the consumers of agent that are due exist with
// the settings o gives (creating the missing ones and updating those whose
// settings differ): its broadcast consumer, and each direct consumer whose
// priority has a message stored, or all of them with all. It returns the
// dispatcher lanes that read them, the broadcast consumer's last, and the
// state of the priority-1 consumer if it is among them (nil if not); without
// all, the lane of a direct consumer made for a message the look found,
// and that has delivered none, is consumers.Lane.Stored.
//
// The broadcast consumer is due whatever the look finds, so it is made
// while the look asks, and the direct consumers the look finds due while it
// is still being made: a new agent's Subscribe waits for the slower of the
// two, not for both in turn. A look the server refuses can so leave the
// broadcast consumer made, as a later Subscribe would make it.
func (b *client) ensureConsumers(ctx context.Context, agent string, o subscribeOptions, all bool) ([]consumers.Lane, *jetstream.ConsumerInfo, error) {
	specs, lanes, err := consumerSpecs(b.opts.scheme, agent)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if all {
		made, err := b.ensureSpecs(ctx, specs, o.settings)
		if err != nil {
			return nil, nil, err
		}
		return lanes, made[0].CachedInfo(), nil
	}
	direct, broadcast := specs[:subjects.LowestPriority], specs[subjects.LowestPriority:]
	var (
		made      sync.WaitGroup
		broadErr  error
		dueLanes  []consumers.Lane
		dueSpecs  []consumers.Spec
		dueDirect []jetstream.Consumer
	)
	made.Go(func() { _, broadErr = b.ensureSpecs(ctx, broadcast, o.settings) })
	due, _, err := b.storedAt(ctx, direct, true)
	if err == nil {
		for i := range direct {
			if due[i] {
				dueSpecs, dueLanes = append(dueSpecs, direct[i]), append(dueLanes, lanes[i])
			}
		}
		if len(dueSpecs) > 0 {
			dueDirect, err = b.ensureSpecs(ctx, dueSpecs, o.settings)
		}
	}
	made.Wait()
	if err == nil {
		err = broadErr
	}
	if err != nil {
		return nil, nil, err
	}
	var p1 *jetstream.ConsumerInfo
	for i, c := range dueDirect {
		if dueSpecs[i].Name == direct[0].Name {
			p1 = c.CachedInfo()
		}
		// The look found a message for a consumer that has delivered none,
		// so it holds one for the agent: Strict waits for it even if the
		// consumer says at first that it has none, as one just made on a
		// cluster does when it is led from a replica that has not stored
		// the message yet. A consumer that has delivered before may have
		// been acknowledged what the look found.
		dueLanes[i].Stored = c.CachedInfo().Delivered.Consumer == 0
	}
	return append(dueLanes, lanes[subjects.LowestPriority]), p1, nil
}

// serverSettings returns the consumer settings the server gets for a
// subscription's s: a delivery limit twice its own (WithMaxDeliver). The
// bus itself terminates a message whose handler failed on its last
// delivery allowed (decide), so the server's limit ends only a message no
// handler settles; its room keeps the deliveries that a stopping process
// gives back unhandled (Stop, Drain, Close), or that a crash loses, from
// ending a message before its handler failed. With the server's limit the
// subscription's, a message given back on its last delivery was never
// delivered again: with WithMaxDeliver(1), everything a stopping process
// held.
func serverSettings(s consumers.Settings) consumers.Settings {
	if n := orDefault(s.MaxDeliver, consumers.DefaultMaxDeliver); n > 0 {
		s.MaxDeliver = 2 * n
	}
	return s
}

// ensureSpecs makes the consumers specs describe exist with settings s,
// and returns them, in the order of specs.
func (b *client) ensureSpecs(ctx context.Context, specs []consumers.Spec, s consumers.Settings) ([]jetstream.Consumer, error) {
	ctx, stop := b.watchRefusals(ctx, "$JS.API.CONSUMER.")
	defer stop()
	// The lookups, creates and updates are idempotent: askAgain makes them
	// again when an answer does not come.
	cs, err := askAgain(ctx, b.reconnects, func(ctx context.Context) ([]jetstream.Consumer, error) {
		return consumers.Ensure(ctx, b.js, b.opts.scheme.Stream(), specs, serverSettings(s))
	})
	if err != nil {
		return nil, refusedCall(ctx, b.notProvisioned(err))
	}
	return cs, nil
}

// laneWatch watches the priorities of a subscription that have no
// consumer yet, and adds each one's lane to the dispatcher when a message
// comes for it, on a goroutine of its own that ends when the subscription
// stops.
type laneWatch struct {
	b        *Bus
	settings consumers.Settings
	specs    []consumers.Spec // the direct consumers, priority 1 first
	lanes    []consumers.Lane

	// arrivals takes the one message each direct watch takes.
	arrivals chan *nats.Msg
	// missing tells the priorities whose lanes are not read yet, and
	// watches holds their direct watches. Only the goroutine touches them
	// after start.
	missing []bool
	watches []*nats.Subscription
	// firing is the subscription to the firing notices of the messages
	// scheduled to the agent, nil once every priority has a lane; its
	// handler sets the bit of each notice's priority in fired (bit 0 for
	// priority 1) and signals firedNews.
	firing    *nats.Subscription
	fired     atomic.Uint32
	firedNews chan struct{}
	// firstLook and every are lateLook and lookEvery, unless a test set
	// them (WithLooks, export_test.go).
	firstLook, every time.Duration
	// ctx ends when the subscription stops (stop); done is closed when
	// the goroutine has ended and the dispatcher is done.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// watchPriorities starts watching every direct subject of the agent; ctx
// bounds the wait for the server to have the watches.
func (b *Bus) watchPriorities(ctx context.Context, o subscribeOptions) (*laneWatch, error) {
	specs, lanes, err := consumerSpecs(b.opts.scheme, b.agent)
	if err != nil {
		return nil, err
	}
	w := &laneWatch{
		b:         b,
		settings:  o.settings,
		specs:     specs[:subjects.LowestPriority],
		lanes:     lanes[:subjects.LowestPriority],
		arrivals:  make(chan *nats.Msg, subjects.LowestPriority),
		missing:   make([]bool, subjects.LowestPriority),
		watches:   make([]*nats.Subscription, subjects.LowestPriority),
		firedNews: make(chan struct{}, 1),
		firstLook: cmp.Or(o.firstLook, lateLook),
		every:     cmp.Or(o.lookEvery, lookEvery),
		done:      make(chan struct{}),
	}
	for i, spec := range w.specs {
		w.missing[i] = true
		// A direct watch takes one message: the server sends it no more
		// (however many follow before the consumer exists), and arrivals,
		// with room for one of each, never overflows.
		sub, err := b.nc.ChanSubscribe(spec.FilterSubject, w.arrivals)
		if err == nil {
			err = sub.AutoUnsubscribe(1)
		}
		if err != nil {
			w.unwatch()
			return nil, fmt.Errorf("watch %s: %w", spec.FilterSubject, err)
		}
		w.watches[i] = sub
	}
	// The firing notices of every priority share one subscription, which a
	// burst of them cannot overflow: each only sets its priority's bit.
	firing, err := b.opts.scheme.FiringFilter(b.agent)
	if err == nil {
		w.firing, err = b.nc.Subscribe(firing, func(m *nats.Msg) {
			if p := b.opts.scheme.FiringPriority(m.Subject); p > 0 {
				w.fired.Or(1 << (p - 1))
				select {
				case w.firedNews <- struct{}{}:
				default: // the goroutine has news to read already
				}
			}
		})
	}
	if err != nil {
		w.unwatch()
		return nil, fmt.Errorf("watch %s: %w", firing, err)
	}
	// The server has the watches before the stream is looked at.
	if err := b.nc.FlushWithContext(ctx); err != nil {
		w.unwatch()
		return nil, fmt.Errorf("watch the agent's subjects: %w", err)
	}
	return w, nil
}

// unwatch ends every watch.
func (w *laneWatch) unwatch() {
	for i := range w.watches {
		w.endWatch(i)
	}
	if w.firing != nil {
		_ = w.firing.Unsubscribe()
		w.firing = nil
	}
}

// endWatch ends the direct watch of priority i+1, which may have ended
// already with the one message it takes.
func (w *laneWatch) endWatch(i int) {
	if w.watches[i] != nil {
		_ = w.watches[i].Unsubscribe()
		w.watches[i] = nil
	}
}

// start ends the watches of the priorities the dispatcher reads already,
// those of lanes, and adds the others' lanes as their messages come, until
// d stops or stop is called.
func (w *laneWatch) start(d *consumers.Dispatcher, lanes []consumers.Lane) {
	for i, l := range w.lanes {
		if slices.ContainsFunc(lanes, func(have consumers.Lane) bool { return have.Consumer == l.Consumer }) {
			w.read(i)
		}
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	reconnected := w.b.nc.StatusChanged(nats.CONNECTED)
	go func() {
		defer close(w.done)
		w.run(d, reconnected)
		w.unwatch()
		w.b.nc.RemoveStatusListener(reconnected)
		<-d.Done() // done means the subscription's every message settled
	}()
}

// stop ends the watching, and a consumer creation under way, without
// waiting; done is closed once the dispatcher is done too.
func (w *laneWatch) stop() { w.cancel() }

// run adds lanes as their priorities come due, until d stops or the watch
// is stopped.
func (w *laneWatch) run(d *consumers.Dispatcher, reconnected chan nats.Status) {
	look, late := time.NewTimer(w.firstLook), true
	defer look.Stop()
	for {
		due := make([]bool, len(w.specs))
		select {
		case <-d.Done():
			return
		case <-w.ctx.Done():
			return
		case m := <-w.arrivals:
			if i := slices.Index(w.watches, m.Sub); i >= 0 {
				due[i] = true
			}
		case <-w.firedNews:
			fired := w.fired.Swap(0)
			for i := range due {
				due[i] = fired&(1<<i) != 0
			}
		case <-look.C:
			// The looks after lateLook count a priority nobody answered
			// for as holding nothing: it is asked about again at the next
			// look, where counting it as holding a message, as the looks
			// at the start do, would create every consumer of an agent
			// after any passing outage.
			due = w.stored(late)
			late = false
			look.Reset(w.every*3/4 + rand.N(w.every/2))
		case <-reconnected:
			due = w.stored(true)
		}
		if !w.add(d, due) || !slices.Contains(w.missing, true) {
			return
		}
	}
}

// stored reports which watched priorities have a message stored, one
// the stream gives no answer about counting as holding one when
// unanswered is set (storedAt). A look without an answer is reported.
func (w *laneWatch) stored(unanswered bool) []bool {
	var idx []int
	var specs []consumers.Spec
	for i, missing := range w.missing {
		if missing {
			idx, specs = append(idx, i), append(specs, w.specs[i])
		}
	}
	ctx, cancel := context.WithTimeout(w.ctx, defaultTimeout)
	defer cancel()
	due := make([]bool, len(w.specs))
	stored, noAnswer, err := w.b.storedAt(ctx, specs, unanswered)
	if err == nil {
		err = noAnswer
	}
	if err != nil && w.ctx.Err() == nil {
		w.b.opts.onError(fmt.Errorf("look for messages to %s: %w", w.b.agent, err))
	}
	for j, has := range stored {
		due[idx[j]] = has
	}
	return due
}

// add adds the lanes of the watched priorities due names to d, ending
// their watches; each lane's consumer is created by the dispatcher before
// the lane's first pull, which Strict waits for, so that no message of a
// lower priority starts meanwhile (consumers.Lane.Create, which retries a
// failed creation). It reports false once d is stopping.
func (w *laneWatch) add(d *consumers.Dispatcher, due []bool) bool {
	for i, ok := range due {
		if !ok || !w.missing[i] {
			continue
		}
		w.read(i)
		lane := w.lanes[i]
		lane.Create = func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, defaultTimeout)
			defer cancel()
			_, err := w.b.ensureSpecs(ctx, w.specs[i:i+1], w.settings)
			return err
		}
		if err := d.AddLane(lane); err != nil {
			if !errors.Is(err, consumers.ErrStopped) {
				w.b.opts.onError(fmt.Errorf("read consumer %s: %w", w.specs[i].Name, err))
			}
			return false
		}
	}
	return true
}

// read marks priority i+1's lane read and ends its watch.
func (w *laneWatch) read(i int) {
	w.missing[i] = false
	w.endWatch(i)
}
