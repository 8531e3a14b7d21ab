package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

// drainTimeout bounds how long subscribe waits for running handlers when it
// stops; past it their contexts are cancelled.
const drainTimeout = 30 * time.Second

// subscribeFlags are the flags of the subscribe command.
type subscribeFlags struct {
	agent       string
	count       int
	timeout     time.Duration
	concurrency int
	json        bool
	profile     string
	ackWait     time.Duration
	maxDeliver  int
	exec        string
	card        string // --card: the agent card to register, a JSON file
}

func (a *app) subscribeCommand() *cobra.Command {
	var f subscribeFlags
	cmd := &cobra.Command{
		Use:   "subscribe --agent AGENT [flags]",
		Short: "Consume an agent's inbox in priority order",
		Long: `Subscribe consumes the inbox of --agent: the messages sent to it and the
broadcasts, highest priority first and in publish order within a priority.
The inbox is durable: a message is removed from it only once it has been
handled, and several subscribers of one agent share the work.

Output, one line per message on stdout:

  default  a human-readable line:
           <time> p<priority> <from> -> <to> <type> id=<id> [delivery=<n>] data=<preview>
  --json   the message as one line of CloudEvents JSON (extensions at the
           top level) and nothing else on stdout; the data is a JSON value
           for a JSON content type or none, a string for text/*, and
           "data_base64" otherwise
  --exec   nothing of its own: CMD's output goes to stdout and stderr

Warnings, such as a failed --exec, go to stderr as lines starting with
"agentbus: warning: ".

--exec CMD runs "sh -c CMD" for each message, with the data on stdin and the
attributes in the environment:

  AGENTBUS_ID AGENTBUS_FROM AGENTBUS_TO AGENTBUS_TYPE AGENTBUS_PRIORITY
  AGENTBUS_CORRELATION_ID AGENTBUS_CAUSATION_ID AGENTBUS_CONTENT_TYPE
  AGENTBUS_TIME (RFC 3339, nanoseconds)
  AGENTBUS_SUBJECT (the NATS subject it was published on)
  AGENTBUS_SEQUENCE (its stream sequence)
  AGENTBUS_DELIVERY (1 on the first delivery, 2 on the first retry, ...)
  AGENTBUS_PROGRESS_FD (3: the file descriptor for progress updates)
  AGENTBUS_AGENT (--agent: the agent it handles the message as)

and what an agentbus command it runs needs to reach the same bus: NATS_URL,
AGENTBUS_ROOT and AGENTBUS_SHARDS, and the credentials and TLS files of the
flags (NATS_CREDS, NATS_NKEY, NATS_USER, NATS_PASSWORD, NATS_CA, NATS_CERT,
NATS_KEY, and AGENTBUS_TLSFIRST with --tlsfirst), so that 'agentbus reply' in
CMD answers on it.

Each line CMD writes to file descriptor 3 is a progress update sent to the
message's sender (see 'agentbus request --follow'): text, optionally
starting with a percentage ("echo '40% tests pass' >&3"), or a JSON object
{"message": "...", "percent": 40, "data": {...}}.

Exit status 0 acknowledges the message. Any other makes the bus redeliver it
after a backoff (1s, 2s, 4s, ... up to 1m) until --max-deliver deliveries,
when it is moved to the dead-letter stream ('agentbus dlq list'). CMD runs
in a process group of its own, which is terminated when subscribe is
interrupted. --exec and --json cannot be combined.

Subscribe stops, waits for running handlers and exits 0 after --count
messages were handled successfully (a failed --exec does not count), after
--timeout without a message, or on SIGINT or SIGTERM; with --count, a stop
at --timeout before --count messages were handled exits 3 and says how
many were. Messages received beyond --count are not handled but given back
for redelivery.`,
		Example: `  agentbus subscribe --agent bob
  agentbus subscribe --agent bob --json --count 1 --timeout 10s
  agentbus subscribe --agent bob --concurrency 4 --exec 'jq .task >> tasks.log'`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			// "" is more likely an unset variable than a wish: --exec ""
			// consumed the inbox with no handler run, --card "" registered
			// nothing.
			if err := checkNotEmpty(cmd, "exec", "card", "profile"); err != nil {
				return err
			}
			return a.subscribe(cmd.Context(), f)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.agent, "agent", "", "agent whose inbox to consume (required)")
	fl.IntVar(&f.count, "count", 0, "stop after this many messages were handled successfully (0: no limit)")
	fl.DurationVar(&f.timeout, "timeout", 0, "stop after this long without a message, e.g. 500ms or 5m (0: wait forever)")
	fl.IntVar(&f.concurrency, "concurrency", 1, "messages handled at once")
	fl.BoolVar(&f.json, "json", false, "print each message as one line of CloudEvents JSON")
	fl.StringVar(&f.profile, "profile", "", "print the native messages of this protocol ("+strings.Join(profiles.Names(), ", ")+"): JSON ones one per line, front-matter documents each followed by a line "+frontMatterSeparator)
	fl.DurationVar(&f.ackWait, "ack-wait", bus.DefaultAckWait, "how long the server waits for a crashed subscriber before it redelivers (>= 100ms)")
	fl.IntVar(&f.maxDeliver, "max-deliver", bus.DefaultMaxDeliver, "deliveries of a failing message before it is dead-lettered")
	fl.StringVar(&f.exec, "exec", "", "run `CMD` with sh -c for each message; exit 0 acknowledges")
	fl.StringVar(&f.card, "card", "", "register the agent with the card in this JSON `FILE` (bus.AgentCard) and report it online while subscribed (docs/presence.md)")
	_ = cmd.MarkFlagRequired("agent") // the flag exists
	return cmd
}

func (a *app) subscribe(ctx context.Context, f subscribeFlags) error {
	var err error
	switch {
	case f.json && f.exec != "":
		return usagef("--json and --exec cannot be used together")
	case f.profile != "" && (f.json || f.exec != ""):
		return usagef("--profile cannot be used with --json or --exec")
	}
	if f.profile != "" {
		if _, err := lookupProfile(f.profile); err != nil {
			return err
		}
	}
	switch {
	case f.count < 0:
		return usagef("--count %d: must be >= 0", f.count)
	case f.timeout < 0:
		return usagef("--timeout %v: must be >= 0", f.timeout)
	case f.concurrency < 1:
		return usagef("--concurrency %d: must be >= 1", f.concurrency)
	case f.concurrency > bus.MaxConcurrency(0):
		return usagef("--concurrency %d: at most %d, the messages the agent's consumers hand out at once", f.concurrency, bus.MaxConcurrency(0))
	case f.maxDeliver < 1:
		return usagef("--max-deliver %d: must be >= 1", f.maxDeliver)
	}
	var card *bus.AgentCard
	if f.card != "" {
		if card, err = readCard(f.card); err != nil {
			return err
		}
	}
	b, err := a.connectAs("agent", f.agent, a.warnErrors())
	if err != nil {
		return err
	}
	defer b.Close()
	if card != nil {
		if err := b.Register(ctx, *card); err != nil {
			if errors.Is(err, bus.ErrInvalidCard) {
				return usageError{fmt.Errorf("--card %s: %w", f.card, err)}
			}
			return err
		}
	}

	concurrency := f.concurrency
	if f.count > 0 {
		// More handlers than messages wanted would only claim surplus
		// messages to give back.
		concurrency = min(concurrency, f.count)
	}
	s := newSession(ctx, a, f)
	sub, err := b.Subscribe(ctx, s.handle,
		bus.WithConcurrency(concurrency),
		bus.WithAckWait(f.ackWait),
		bus.WithMaxDeliver(f.maxDeliver),
	)
	if err != nil {
		switch {
		case errors.Is(err, bus.ErrInvalidOption):
			return usageError{err}
		case ctx.Err() != nil:
			return nil // SIGINT or SIGTERM while it started: a clean stop too
		}
		return err
	}
	err = s.wait(ctx, sub)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainTimeout)
	defer cancel()
	if derr := sub.Drain(dctx); derr != nil && (err == nil || errors.Is(err, errTimedOut)) {
		err = fmt.Errorf("drain subscription: %w", derr)
	}
	if errors.Is(err, errTimedOut) {
		s.mu.Lock()
		handled := s.handled
		s.mu.Unlock()
		if f.count > 0 && handled < f.count {
			return shortError{handled: handled, want: f.count, timeout: f.timeout}
		}
		return nil
	}
	return err
}

// errTimedOut is how wait reports that --timeout passed without a message.
var errTimedOut = errors.New("timed out")

// shortError is a subscribe with --count that stopped at --timeout with
// fewer messages handled; it exits with exitShort.
type shortError struct {
	handled, want int
	timeout       time.Duration
}

func (e shortError) Error() string {
	return fmt.Sprintf("subscribe: %d of --count %d messages handled before --timeout %s passed without a message", e.handled, e.want, e.timeout)
}

// session is one run of subscribe: it handles messages, counts them and
// tells wait when to stop.
type session struct {
	a       *app
	f       subscribeFlags
	mainCtx context.Context // cancelled on SIGINT/SIGTERM

	mu       sync.Mutex
	inflight int       // handlers that claimed a slot and are running
	handled  int       // messages handled successfully
	last     time.Time // when a handler last started or finished
	err      error     // the failure that stopped the session, if any

	activity chan struct{} // a handler started or finished; capacity 1
	finished chan struct{} // closed once handled reaches --count or on a failure
	finish   sync.Once
}

func newSession(ctx context.Context, a *app, f subscribeFlags) *session {
	return &session{
		a:        a,
		f:        f,
		mainCtx:  ctx,
		last:     time.Now(),
		activity: make(chan struct{}, 1),
		finished: make(chan struct{}),
	}
}

// handle is the bus handler.
func (s *session) handle(ctx context.Context, d *bus.Delivery) error {
	if !s.claim() {
		// Beyond --count: not a failure, so no step towards --max-deliver.
		return bus.GiveBack(0)
	}
	err := s.process(ctx, d)
	s.release(err == nil)
	return err
}

// claim reserves one of the --count slots for a message about to be
// handled, or reports that every slot is taken or the session is over.
func (s *session) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.finished:
		return false
	default:
	}
	if s.f.count > 0 && s.handled+s.inflight >= s.f.count {
		return false
	}
	s.inflight++
	s.last = time.Now()
	s.signal()
	return true
}

// release returns a slot; a message handled successfully keeps it.
func (s *session) release(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.last = time.Now()
	if ok {
		s.handled++
		if s.f.count > 0 && s.handled >= s.f.count {
			s.finish.Do(func() { close(s.finished) })
		}
	}
	s.signal()
}

// signal tells wait that the handlers changed; s.mu is held.
func (s *session) signal() {
	select {
	case s.activity <- struct{}{}:
	default:
	}
}

// fail stops the session with err, such as a failed write to stdout.
func (s *session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.finish.Do(func() { close(s.finished) })
}

// idle reports how long no handler has been running, and whether one is.
func (s *session) idle() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.last), s.inflight > 0
}

// failure returns the failure that stopped the session, if any.
func (s *session) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// wait returns when the session should stop: --count reached, --timeout
// passed without a message, ctx cancelled, or a failure (returned).
func (s *session) wait(ctx context.Context, sub *bus.Subscription) error {
	var (
		timer   *time.Timer
		expired <-chan time.Time
	)
	if s.f.timeout > 0 {
		timer = time.NewTimer(s.f.timeout)
		defer timer.Stop()
		expired = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.finished:
			return s.failure()
		case <-sub.Done():
			return errors.New("subscription stopped")
		case <-s.activity:
			if timer == nil {
				continue
			}
			// While a handler runs the timer is off; its end restarts it.
			timer.Stop()
			if idle, running := s.idle(); !running {
				timer.Reset(max(s.f.timeout-idle, 0))
			}
		case <-expired:
			idle, running := s.idle()
			switch {
			case running:
				// Its end restarts the timer.
			case idle >= s.f.timeout:
				return errTimedOut
			default:
				timer.Reset(s.f.timeout - idle)
			}
		}
	}
}

// process handles one message the way the flags say.
func (s *session) process(ctx context.Context, d *bus.Delivery) error {
	if s.f.exec != "" {
		return s.exec(ctx, d)
	}
	line, err := deliveryOutput(d, s.f.profile, s.f.json)
	if err != nil {
		// A message not of --profile's protocol, or one the codec read but
		// cannot write (such as one from another producer without a "to"
		// attribute): retrying will not help, so it goes to the
		// dead-letter stream.
		s.a.warnf("message %s dead-lettered: %v", d.ID, err)
		return bus.Permanent(err)
	}
	if _, err := s.a.stdout.Write(line); err != nil {
		err = fmt.Errorf("write stdout: %w", err)
		s.fail(err)
		return err
	}
	return nil
}

// frontMatterSeparator ends each front-matter document subscribe prints.
const frontMatterSeparator = "%%%"

// nativeOutput renders the native message of d for subscribe --profile:
// JSON formats compacted to one line, front-matter documents as they are,
// followed by a separator line. A message of another protocol is an error.
func nativeOutput(profile string, d *bus.Delivery) ([]byte, error) {
	p, ok := profiles.ForDataSchema(d.DataSchema)
	if !ok || p.Name() != profile {
		return nil, fmt.Errorf("not a %s message (dataschema %q)", profile, d.DataSchema)
	}
	if p.Name() == "frontmatter" {
		out := append([]byte(nil), d.Data...)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		return append(out, frontMatterSeparator+"\n"...), nil
	}
	return append(compactJSON(d.Data), '\n'), nil
}

// compactJSON removes insignificant white space, so that an event is
// always one line.
func compactJSON(j []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, j); err != nil {
		return j
	}
	return buf.Bytes()
}

// previewLen bounds the data shown in a human-readable line, in runes.
const previewLen = 64

// humanLine renders d for a person: time, priority, from -> to, type, ID,
// delivery count past the first, and a preview of the data.
func humanLine(d *bus.Delivery) string {
	line := fmt.Sprintf("%s p%d %s -> %s %s id=%s",
		d.Time.UTC().Format(timeMillis), d.Priority, d.From, d.To, d.Type, d.ID)
	if d.Deliveries > 1 {
		line += " delivery=" + strconv.Itoa(d.Deliveries)
	}
	return line + " data=" + preview(d.Data)
}

// preview quotes the start of data, or describes it if it is not text.
func preview(data []byte) string {
	if !utf8.Valid(data) {
		return fmt.Sprintf("<%d bytes>", len(data))
	}
	if utf8.RuneCount(data) <= previewLen {
		return strconv.Quote(string(data))
	}
	cut, n := 0, 0
	for cut < len(data) && n < previewLen {
		_, size := utf8.DecodeRune(data[cut:])
		cut += size
		n++
	}
	return fmt.Sprintf("%s...(%d bytes)", strconv.Quote(string(data[:cut])), len(data))
}
