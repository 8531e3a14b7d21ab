package benchmark

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	DefaultMessages = 10_000
	DefaultSize     = 1024
	DefaultAgents   = 100
	DefaultRate     = 1000.0 // messages per second
)

// Limits of the scenarios.
const (
	// MinSize is the smallest payload: the e2e scenario carries the send
	// time in the first 8 bytes.
	MinSize = 8
	// MinMessages is the smallest message count: each side is measured in
	// two halves (mirrored), and throughput in each between the first and
	// the last message handled.
	MinMessages = 4
	// EndToEndDuration bounds each side of the e2e scenario: it sends
	// Messages, or as many as Rate sends in this time if that is fewer.
	EndToEndDuration = 5 * time.Second
	// ConsumePrefetch is the bus's prefetch in the consume and
	// consume-untracked scenarios, the size of the pull batch of a raw
	// Consume by default.
	ConsumePrefetch = 500
	// MaxRequests bounds the round trips of each side of the request
	// scenario: it makes Messages, or MaxRequests if that is fewer.
	MaxRequests = 2000
	// stallTimeout fails a scenario whose handlers received nothing for
	// this long.
	stallTimeout = 30 * time.Second
	// cleanupTimeout bounds the deletion of a scenario's streams.
	cleanupTimeout = 30 * time.Second
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("benchmark: invalid config")

// Config says what Run measures and where.
type Config struct {
	// Dial opens a new connection to the server under test. Run opens
	// several, one per side of each scenario, and closes each. Run fails
	// without it.
	Dial func() (*nats.Conn, error)
	// Server describes the server in the report, such as "embedded" or
	// its URL without secrets. Run does not use it; empty is reported so.
	Server string
	// Messages is how many messages each side sends in each scenario but
	// setup (and e2e, see EndToEndDuration). Zero means DefaultMessages;
	// otherwise at least MinMessages.
	Messages int
	// Size is the payload size in bytes. Zero means DefaultSize; otherwise
	// at least MinSize.
	Size int
	// Agents is how many agents the setup scenario subscribes. Zero means
	// DefaultAgents.
	Agents int
	// Rate is the publish rate of the e2e scenario in messages per second.
	// Zero means DefaultRate.
	Rate float64
	// Only names the scenarios to run (see Scenarios). Empty means all.
	Only []string
	// Rounds is how many times each scenario runs, one round after
	// another, each with streams of its own. The report gives each
	// scenario's median round by its headline ratio and the spread of that
	// ratio (Report.Spread). Zero means one round, and no spread; at most
	// MaxRounds.
	Rounds int
	// Progress, if not nil, is called with each scenario just before it
	// runs.
	Progress func(Scenario)
	// Memory, if not nil, returns the memory the server under test uses, in
	// bytes; the setup scenario reports its growth per agent on each side.
	// Nil leaves the memory figure out: a remote server is not measurable
	// from here.
	Memory func() (uint64, error)
	// MemoryName says in the report what Memory measures, such as "server
	// RSS" or "process heap: client + embedded server".
	MemoryName string
}

// Validate reports whether the figures and names in c are valid, whatever
// its Dial; the error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Messages != 0 && c.Messages < MinMessages:
		return fmt.Errorf("%w: messages %d must be at least %d", ErrInvalidConfig, c.Messages, MinMessages)
	case c.Size != 0 && c.Size < MinSize:
		return fmt.Errorf("%w: size %d must be at least %d bytes (the e2e scenario carries the send time in the payload)", ErrInvalidConfig, c.Size, MinSize)
	case c.Agents < 0:
		return fmt.Errorf("%w: agents %d is negative", ErrInvalidConfig, c.Agents)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("%w: rate %v must be a positive number of messages per second", ErrInvalidConfig, c.Rate)
	case c.Rounds < 0 || c.Rounds > MaxRounds:
		return fmt.Errorf("%w: rounds %d must be between 1 and %d", ErrInvalidConfig, c.Rounds, MaxRounds)
	}
	for _, name := range c.Only {
		if !slices.ContainsFunc(scenarios, func(s Scenario) bool { return s.Name == name }) {
			return fmt.Errorf("%w: unknown scenario %q; the scenarios are %s", ErrInvalidConfig, name, strings.Join(names(), ", "))
		}
	}
	return nil
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Messages == 0 {
		c.Messages = DefaultMessages
	}
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Agents == 0 {
		c.Agents = DefaultAgents
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	return c
}

// runs reports whether c selects the scenario called name.
func (c Config) runs(name string) bool {
	return len(c.Only) == 0 || slices.Contains(c.Only, name)
}

// requests is how many round trips each side of the request scenario
// makes.
func (c Config) requests() int { return min(c.Messages, MaxRequests) }

// endToEndMessages is how many messages each side of the e2e scenario
// sends.
func (c Config) endToEndMessages() int {
	return max(MinMessages, min(c.Messages, int(c.Rate*EndToEndDuration.Seconds())))
}

// Scenario is one comparison of the bus with raw nats.go.
type Scenario struct {
	// Name identifies the scenario in Config.Only, in the first column of
	// the table and as its member of the report's JSON.
	Name string
	// Summary says in one line what the scenario compares.
	Summary string

	run func(*runner, context.Context, *env) error
}

// scenarios are every scenario, in the order Run runs them.
var scenarios = []Scenario{
	{Name: "async", Summary: "async publish throughput: bus PublishAsync vs raw PublishMsgAsync, bare and with the bus's headers", run: (*runner).async},
	{Name: "async-untracked", Summary: "async publish throughput with lifecycle off: bus PublishAsync (WithoutLifecycle) vs raw PublishMsgAsync, bare and with the bus's headers", run: (*runner).asyncUntracked},
	{Name: "sync", Summary: "sync publish latency: bus Publish vs raw PublishMsg", run: (*runner).sync},
	{Name: "consume", Summary: "subscribe+ack throughput of a backlog: bus Subscribe (prefetch 500) vs raw Consume with explicit acks, bare and with the bus's headers decoded", run: (*runner).consume},
	{Name: "consume-defaults", Summary: "subscribe+ack throughput of a backlog: bus Subscribe without options vs raw Consume, bare and with the bus's headers decoded", run: (*runner).consumeDefaults},
	{Name: "consume-untracked", Summary: "subscribe+ack throughput of a backlog with lifecycle off: bus Subscribe (WithoutLifecycle, prefetch 500) vs raw Consume, bare and with the bus's headers decoded", run: (*runner).consumeUntracked},
	{Name: "request", Summary: "request-reply round trip latency: bus Request and Reply vs the same hops in raw JetStream", run: (*runner).request},
	{Name: "e2e", Summary: "publish-to-handler latency at a fixed publish rate", run: (*runner).e2e},
	{Name: "priority", Summary: "priority inversions draining a mixed-priority backlog: bus Strict vs one raw consumer in stream order", run: (*runner).priority},
	{Name: "setup", Summary: "time (and, where measurable, server memory) to set up the consumers of many agents: bus New+Subscribe vs raw CreateOrUpdateConsumer", run: (*runner).setup},
}

// Scenarios returns every scenario in the order Run runs them.
func Scenarios() []Scenario { return slices.Clone(scenarios) }

// names returns the names of every scenario.
func names() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.Name
	}
	return out
}

// Run runs the scenarios cfg selects, one after another, and returns their
// figures. Each scenario has streams of its own, a bus stream (with what
// bus.Admin.Provision creates beside it) under a root unique to the run and the
// scenario, and a raw stream under another, which it deletes when it ends,
// whether it succeeded or not. The first error stops the run. A scenario
// whose handlers receive nothing for 30 s fails; ctx ends a run early.
//
// Errors: ErrInvalidConfig for a config that fails Validate or has no Dial,
// else the first failure, naming its scenario.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Dial == nil {
		return nil, fmt.Errorf("%w: no Dial function", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	id, err := newRunID()
	if err != nil {
		return nil, err
	}
	r := &runner{
		cfg:     cfg,
		id:      id,
		payload: make([]byte, cfg.Size),
		epoch:   time.Now(),
		report: &Report{Settings: Settings{
			Server:         cfg.Server,
			GoVersion:      runtime.Version(),
			CPUs:           runtime.NumCPU(),
			Messages:       cfg.Messages,
			SizeBytes:      cfg.Size,
			Agents:         cfg.Agents,
			RateMsgsPerSec: cfg.Rate,
			Rounds:         cfg.Rounds,
			RunID:          id,
		}},
	}
	stopKeeping, err := keepAccountStore(ctx, cfg.Dial, id)
	if err != nil {
		return nil, err
	}
	defer stopKeeping()
	for _, s := range scenarios {
		if !cfg.runs(s.Name) {
			continue
		}
		if err := r.runRounds(ctx, s); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
	}
	return r.report, nil
}

// runRounds runs s cfg.Rounds times and keeps the figures of its median
// round, with their spread when there was more than one.
func (r *runner) runRounds(ctx context.Context, s Scenario) error {
	report := r.report
	defer func() { r.report = report }()
	rounds := make([]*Report, r.cfg.Rounds)
	for i := range rounds {
		if r.cfg.Progress != nil {
			r.cfg.Progress(s)
		}
		rounds[i] = &Report{}
		r.report = rounds[i]
		if err := r.runScenario(ctx, s); err != nil {
			if len(rounds) > 1 {
				return fmt.Errorf("round %d of %d: %w", i+1, len(rounds), err)
			}
			return err
		}
		if report.Settings.ServerVersion == "" {
			report.Settings.ServerVersion = rounds[i].Settings.ServerVersion
		}
	}
	median, spread := medianRound(s.Name, rounds)
	report.take(s.Name, median)
	if len(rounds) > 1 && spread != nil {
		if report.Spread == nil {
			report.Spread = make(map[string]*Spread)
		}
		report.Spread[s.Name] = spread
	}
	return nil
}

// keepAccountStore creates a small stream of the run that lives until the
// returned function deletes it. nats-server removes an account's store
// directory in the background when the account's last stream is deleted,
// and a stream created meanwhile fails ("could not create storage
// directory": nats-server 2.15 deletes the directories after a stream
// delete in a goroutine of its own, stream.go); one scenario deletes its
// streams right before the next creates its own, so the account must never
// be left without one.
func keepAccountStore(ctx context.Context, dial func() (*nats.Conn, error), id string) (func(), error) {
	nc, err := dial()
	if err != nil {
		return nil, fmt.Errorf("keep the account's store: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	name := "AGENTBUS-BENCH-" + strings.ToUpper(id) + "-KEEP"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"agentbus-bench-" + id + "-keep"},
		Storage: jetstream.FileStorage, MaxMsgs: 1}); err != nil { // file storage: a directory of its own
		nc.Close()
		return nil, fmt.Errorf("keep the account's store: %w", err)
	}
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = js.DeleteStream(dctx, name)
		nc.Close()
	}, nil
}

// newRunID returns 8 random hex digits that keep the names of one run
// apart from every other's on a shared server.
func newRunID() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("run ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// runner runs the scenarios of one Run and collects their figures.
type runner struct {
	cfg     Config
	id      string
	payload []byte    // the payload of every message but e2e's
	epoch   time.Time // e2e send times are monotonic offsets from it
	report  *Report
}

// runScenario runs s in an environment of its own and removes the
// environment afterwards.
func (r *runner) runScenario(ctx context.Context, s Scenario) (err error) {
	e, err := newEnv(ctx, r.cfg.Dial, "agentbus-bench-"+r.id+"-"+s.Name)
	defer func() { err = errors.Join(err, e.close()) }()
	if err != nil {
		return err
	}
	if r.report.Settings.ServerVersion == "" {
		r.report.Settings.ServerVersion = e.admin.ConnectedServerVersion()
	}
	return s.run(r, ctx, e)
}
