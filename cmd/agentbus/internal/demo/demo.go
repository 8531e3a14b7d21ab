package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
)

// The agents. Each process of an agent has a connection and a bus of its
// own, as separate programs would.
const (
	orchestrator = "orchestrator"
	worker       = "worker" // two processes: worker#1 and worker#2
	reviewer     = "reviewer"
	// human is the inbox of the person the operator's escalation policy
	// calls when the worker stays offline.
	human = "human"
	// operator provisions the bus and watches for dead letters, as
	// `agentbus serve` does, and reads what an agent's permissions would
	// not let it: the dead-letter stream and whole conversations.
	operator = "operator"
)

// Conversation is the correlation ID that every message of the demo
// shares, and so its conversation and its trace; but the review round's,
// which the swarm protocol threads by the component under review.
const Conversation = "release-42"

// DefaultTimeout bounds a whole run when Options.Timeout is zero.
const DefaultTimeout = 50 * time.Second

// The workers' subscription settings, shorter than the defaults so that the
// demo shows in seconds what takes minutes in production.
const (
	// ackWait is how long the server waits for an ack before it gives the
	// message to another process: the time to notice a crashed worker
	// (default 30 s).
	ackWait = 2 * time.Second
	// maxDeliver is how many times a failing message is tried before it is
	// dead-lettered (default 5).
	maxDeliver = 3
	// retryDelay is the backoff between those tries (default 1 s, 2 s, 4 s ...).
	retryDelay = 200 * time.Millisecond
	// heartbeat is how often a registered worker reports its presence; the
	// registry finds it offline three heartbeats after its last (default
	// 10 s).
	heartbeat = time.Second
	// escalateAfter is how long the worker may stay offline before the
	// human is called (the pipeline protocol's 3 minutes).
	escalateAfter = time.Second
)

// waitTimeout bounds every wait for something to happen: a delivery, a
// reply, a lifecycle record. Generous for a loaded machine; a demo that
// works never waits that long.
const waitTimeout = 15 * time.Second

// Options configure Run.
type Options struct {
	// Events receives each line of the timeline as it happens, from one
	// goroutine at a time. Nil discards them.
	Events func(Event)
	// Timeout bounds the whole run; zero means DefaultTimeout.
	Timeout time.Duration
}

// scene is one part of the demo. play returns what the scene showed, or an
// error when it did not see what it was meant to.
type scene struct {
	name, title string
	play        func(*demo, context.Context) (string, error)
}

var scenes = []scene{
	{"priority", "an escalation overtakes queued work", (*demo).priority},
	{"crash", "a worker crashes mid-task; another worker gets the message", (*demo).crash},
	{"duplicate", "a message published twice is stored and handled once", (*demo).duplicate},
	{"ttl", "a message expires before its recipient comes online", (*demo).ttl},
	{"request", "a request and its reply", (*demo).request},
	{"poison", "a message that always fails is dead-lettered", (*demo).poison},
	{"presence", "a worker dies: found offline, requests fail fast, a human is called, the worker drains its queue", (*demo).presence},
	{"tasks", "long work: a review streams progress and is canceled; another's do-by passes while the reviewer is offline", (*demo).tasks},
	{"review", "a swarm review round: the lead asks 5 reviewers, one crashes, one is slow; it proceeds at 3 verdicts", (*demo).review},
	{"trace", "one conversation, one trace", (*demo).trace},
}

// Scenes returns the names of the scenes in the order they play.
func Scenes() []string {
	out := make([]string, len(scenes))
	for i, s := range scenes {
		out[i] = s.name
	}
	return out
}

// Run starts an embedded NATS server with JetStream and file storage in a
// temporary directory, provisions the bus on it, and plays every scene with
// the agents of the demo, each on a connection of its own. It reports each
// event to o.Events, checks that each scene showed what it is meant to
// show, and stops at the first that did not. It stops the agents and the
// server, and removes the store, before it returns.
//
// The error is nil exactly when Report.OK is true.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	d := &demo{
		start:    time.Now(),
		events:   o.Events,
		seen:     make(chan observation, 64),
		expected: make(map[string]expectation),
	}
	rep := Report{Conversation: Conversation, TraceID: bus.ConversationTraceID(Conversation).String()}
	runCtx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	err := d.run(runCtx, &rep)
	if err != nil && ctx.Err() == nil && errors.Is(runCtx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("the demo did not finish within %s: %w", o.Timeout, err)
	}
	rep.Elapsed = time.Since(d.start)
	rep.OK = err == nil
	if err != nil {
		rep.Error = err.Error()
	}
	return rep, err
}

// demo is one run.
type demo struct {
	start time.Time

	mu     sync.Mutex // serializes events; guards scene
	events func(Event)
	scene  string // the scene playing, for the events

	srv      *embedded.Server
	url      string
	operator *bus.Admin
	// stopWatching stops the operator's dead-letter watcher; watching
	// waits for it.
	stopWatching context.CancelFunc
	watching     sync.WaitGroup

	orch     *agent
	workers  []*agent // worker#1, then worker#2 ...
	reviewer *agent
	human    *agent
	panel    []*agent // the reviewers of the review round

	// seen receives what the agents' handlers did, in the order they did
	// it; the scenes wait on it.
	seen chan observation
	// expected is the final lifecycle state each scene expects of its
	// messages, which the trace scene checks.
	expected map[string]expectation
}

// expectation is the final lifecycle record a message should reach.
type expectation struct {
	state      bus.State
	deliveries int // 0: any
}

func (d *demo) expect(id string, s bus.State, deliveries int) {
	d.expected[id] = expectation{state: s, deliveries: deliveries}
}

func (d *demo) run(ctx context.Context, rep *Report) error {
	defer d.teardown()
	if err := d.setup(ctx); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for _, s := range scenes {
		d.setScene(s.name)
		d.emit(Event{Event: EventScene, Detail: s.title})
		shown, err := s.play(d, ctx)
		if err != nil {
			err = fmt.Errorf("scene %s: %w", s.name, err)
			d.emit(Event{Event: EventFail, Detail: err.Error()})
			rep.Scenes = append(rep.Scenes, SceneResult{Scene: s.name, Detail: err.Error()})
			return err
		}
		d.emit(Event{Event: EventOK, Detail: shown})
		rep.Scenes = append(rep.Scenes, SceneResult{Scene: s.name, OK: true, Detail: shown})
	}
	return nil
}

// emit stamps e with the time and the scene and reports it.
func (d *demo) emit(e Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e.Elapsed = time.Since(d.start)
	if e.Scene == "" {
		e.Scene = d.scene
	}
	if d.events != nil {
		d.events(e)
	}
}

func (d *demo) setScene(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.scene = name
}

// setup starts the server, provisions the bus and connects the operator and
// the orchestrator.
func (d *demo) setup(ctx context.Context) error {
	d.setScene("setup")
	// The zero Options: a random loopback port and a temporary store
	// directory with file storage, which Shutdown removes.
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		return err
	}
	d.srv, d.url = srv, srv.ClientURL()
	d.emit(Event{From: "server", Event: EventStart,
		Detail: fmt.Sprintf("embedded NATS server with JetStream at %s, file storage in %s (removed at the end)", d.url, srv.Options().StoreDir)})

	if d.operator, err = bus.ConnectAdmin(d.url, bus.WithErrorHandler(d.onError(operator, nil))); err != nil {
		return err
	}
	if _, err := d.operator.Provision(ctx, bus.StreamConfig{}); err != nil {
		return err
	}
	s := d.operator.Subjects()
	// Dead-letter the messages whose last delivery a crashed process never
	// settled, which the server only announces: `agentbus serve` does this.
	watchCtx, stopWatching := context.WithCancel(context.Background())
	d.stopWatching = stopWatching
	d.watching.Go(func() {
		if err := d.operator.WatchDeadLetters(watchCtx); err != nil {
			d.onError(operator, nil)(err)
		}
	})
	d.emit(Event{From: operator, Event: EventStart,
		Detail: fmt.Sprintf("operator provisions stream %s, dead-letter stream %s, status bucket %s and agent registry %s and %s, and watches for dead letters",
			s.Stream(), s.DeadLetterStream(), s.StatusBucket(), s.RegistryBucket(), s.PresenceBucket())})

	if d.orch, err = d.connect(orchestrator, orchestrator); err != nil {
		return err
	}
	d.emit(Event{From: orchestrator, Event: EventStart,
		Detail: fmt.Sprintf("orchestrator connects; every message of the demo but the swarm review round's belongs to conversation %s", Conversation)})
	return nil
}

// teardown closes every agent, the operator and the server, which removes
// its store.
func (d *demo) teardown() {
	d.setScene("teardown")
	agents := append(append([]*agent{d.reviewer, d.orch, d.human}, d.workers...), d.panel...)
	for _, a := range agents {
		if a != nil {
			a.bus.Close()
		}
	}
	if d.stopWatching != nil {
		d.stopWatching()
		d.watching.Wait()
	}
	if d.operator != nil {
		d.operator.Close()
	}
	if d.srv != nil {
		d.srv.Shutdown()
		d.emit(Event{From: "server", Event: EventStop, Detail: "agents disconnected, server stopped, store removed"})
	}
}

// onError returns the error handler of the bus of agent process a (nil
// for the operator): errors in the background, such as a failed pull or
// ack, have no caller to return to. The demo shows them as warnings,
// except those of a process it crashed on purpose, whose every pending
// write fails with its connection.
func (d *demo) onError(label string, a *agent) func(error) {
	return func(err error) {
		if a != nil && a.crashed.Load() {
			return
		}
		d.emit(Event{From: label, Event: EventWarning, Detail: fmt.Sprintf("%s: %v", label, err)})
	}
}

// agent is one process of an agent.
type agent struct {
	label string // "worker#1"
	bus   *bus.Bus
	sub   *bus.Subscription
	// stall makes the handler hang instead of working, so that the process
	// can crash in the middle of a message.
	stall   atomic.Bool
	crashed atomic.Bool
}

// connect connects a process of agent id, labelled label in the timeline.
func (d *demo) connect(id, label string, opts ...bus.Option) (*agent, error) {
	a := &agent{label: label}
	b, err := bus.Connect(d.url, id, append([]bus.Option{bus.WithErrorHandler(d.onError(label, a))}, opts...)...)
	if err != nil {
		return nil, err
	}
	a.bus = b
	return a, nil
}

// crash closes the process's connection without settling the message its
// handler holds, as a process that is killed does, then releases what is
// left of it.
func (a *agent) crash() {
	a.crashed.Store(true)
	a.bus.Conn().Close()
	if a.sub != nil {
		a.sub.Stop()
		<-a.sub.Done()
	}
	a.bus.Close()
}

// observation is what an agent's handler did with one delivery.
type observation struct {
	by  *agent
	d   *bus.Delivery
	err error // what the handler returned; errStalled if it hung
}

// errStalled stands for a handler that hangs.
var errStalled = errors.New("handler hangs")

// observe reports what a handler did to the scene waiting for it.
func (d *demo) observe(ctx context.Context, by *agent, dl *bus.Delivery, err error) {
	o := observation{by: by, d: dl, err: err}
	select {
	case d.seen <- o:
	case <-ctx.Done():
	}
}

// next waits for the next thing a handler did.
func (d *demo) next(ctx context.Context, what string) (observation, error) {
	t := time.NewTimer(waitTimeout)
	defer t.Stop()
	select {
	case o := <-d.seen:
		return o, nil
	case <-t.C:
		return observation{}, fmt.Errorf("no %s within %s", what, waitTimeout)
	case <-ctx.Done():
		return observation{}, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

// rereadEvery is how often reread reads again.
const rereadEvery = 20 * time.Millisecond

// reread calls read until it reports done, for at most waitTimeout. The
// bus writes lifecycle records and dead letters a moment after the event
// they describe (asynchronously, so that tracking never slows a message
// down) and has no call that waits for one, so a reader that has just seen
// the event reads again until the record has caught up. read returns what
// it found last, for the error.
func reread(ctx context.Context, what string, read func(context.Context) (done bool, last string, err error)) error {
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(rereadEvery)
	defer tick.Stop()
	for {
		done, last, err := read(ctx)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", what, err)
		case done:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%s: not within %s; last seen: %s", what, waitTimeout, last)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%s: %w; last seen: %s", what, ctx.Err(), last)
		}
	}
}

// awaitState waits until the lifecycle record of message id at recipient
// to, read by b, reaches the final state want, and returns it. A record
// that ends in another final state is an error at once.
func awaitState(ctx context.Context, b *bus.Bus, id, to string, want bus.State) (bus.Status, error) {
	var found bus.Status
	err := reread(ctx, fmt.Sprintf("lifecycle record of %s %s", id, want), func(ctx context.Context) (bool, string, error) {
		sts, err := b.Status(ctx, id)
		if errors.Is(err, bus.ErrNoStatus) {
			return false, "no record", nil
		}
		if err != nil {
			return false, "", err
		}
		for _, st := range sts {
			if st.To != to {
				continue
			}
			found = st
			if st.State == want {
				return true, "", nil
			}
			if st.State.Final() {
				return false, "", fmt.Errorf("state %s, want %s", st.State, want)
			}
			return false, string(st.State), nil
		}
		return false, "no record for " + to, nil
	})
	return found, err
}
