package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/benchmark"
	"github.com/agentbus/agentbus/embedded"
)

// benchFlags are the flags of the bench command.
type benchFlags struct {
	messages int
	size     int
	agents   int
	rate     string
	json     bool
	only     []string
	rounds   int
	tcp      bool
}

func (a *app) benchCommand() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Measure the bus side by side with raw nats.go on one server",
		Long: `Bench runs the bus and raw nats.go side by side on the same server in the
same run and prints each figure with its ratio, bus divided by raw:

  async              async publish throughput: bus PublishAsync against
                     jetstream PublishMsgAsync with the bare payload ("raw")
                     and with exactly the headers and subjects the bus
                     writes ("raw+headers"; a subject names its message),
                     and each side's process CPU per message (Unix)
  async-untracked    the same with the bus's lifecycle tracking off
                     (bus.WithoutLifecycle; subjects name no message)
  sync               sync publish latency p50 and p99: Publish against
                     PublishMsg of the bare payload and of the bus's headers
                     and subjects, the three taking turns
  consume            subscribe+ack throughput of a backlog: Subscribe
                     (prefetch 500) with a handler that returns nil, against
                     a raw durable consumer's Consume with explicit acks, of
                     bare messages ("raw") and of messages with the bus's
                     headers, each decoded ("raw+headers"), and each side's
                     process CPU per message (Unix)
  consume-defaults   the same with Subscribe given no options
  consume-untracked  the same with lifecycle records off, prefetch 500
  request            Request -> Reply round trip p50 and p99, both agents
                     subscribed, against raw nats.go doing the same hops:
                     request to the stream, read by the responder's durable
                     pull consumer, reply to the stream, read by the
                     requester's; --messages or 2000 round trips, if fewer
  e2e                publish-to-handler latency p50 and p99 at --rate, the
                     send time carried in the payload; --messages or 5 s
                     worth, if fewer
  priority           priority inversions draining a backlog of priorities
                     1..5 sent to an offline agent: handler starts that took
                     a message while a more urgent one waited; the bus
                     (Strict) against one raw consumer over the agent's
                     subjects in stream order
  setup              time to New and Subscribe --agents agents, against
                     creating the same durable consumers with raw nats.go
                     (server memory per agent: go test -bench SetupAgents
                     ./bus, which runs the server in a process of its own)

For throughput a ratio below 1 means the bus is slower; for latency, time
and inversions a ratio above 1 means the bus takes longer or inverts more.

Without --server, bench starts an embedded server with file storage in a
temporary directory and removes it afterwards ($NATS_URL is not used, so
bench never loads a server by accident). Both sides reach it in process,
as a program reaches the server it embeds (embedded.Server.Connect) and as
go test -bench does; with --tcp, over loopback TCP, which adds the
kernel's work on every hop to the process both sides share with the
server. With --server it uses that server and the global connection flags.
Either way every scenario uses streams of its own, named
agentbus-bench-<run>-<scenario>-bus and -raw (--root is not used), and
deletes them when it ends.

With --rounds N each scenario runs N times, one round after another; the
table gives each scenario's median round by its headline ratio (bus/raw+headers
where there is such a side, else bus/raw; for latency the p50) and, below it,
that ratio's least, median and greatest over the rounds. On a shared machine
one round cannot tell a ratio at a target from one just under it.

The output is a table on stdout, or with --json one JSON document with every
figure, units in the member names (msgs_per_s, us, ms). On a terminal, bench
reports each scenario on stderr as it starts.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error { return a.bench(cmd, f) }),
	}
	fl := cmd.Flags()
	fl.IntVar(&f.messages, "messages", benchmark.DefaultMessages, "messages per side in each scenario")
	fl.IntVar(&f.size, "size", benchmark.DefaultSize, "payload size in bytes (at least 8)")
	fl.IntVar(&f.agents, "agents", benchmark.DefaultAgents, "agents the setup scenario subscribes")
	fl.StringVar(&f.rate, "rate", strconv.FormatFloat(benchmark.DefaultRate, 'f', -1, 64)+"/s", "publish rate of the e2e scenario, N/s or N messages per second")
	fl.BoolVar(&f.json, "json", false, "print one JSON document instead of the table")
	fl.StringSliceVar(&f.only, "only", nil, "comma-separated scenarios to run ("+strings.Join(scenarioNames(), ",")+"); default all")
	fl.BoolVar(&f.tcp, "tcp", false, "reach the embedded server over loopback TCP, not in process")
	fl.IntVar(&f.rounds, "rounds", 1, fmt.Sprintf("times each scenario runs; the median round is reported, with the spread (at most %d)", benchmark.MaxRounds))
	return cmd
}

// bench runs the bench command.
func (a *app) bench(cmd *cobra.Command, f benchFlags) error {
	cfg, err := f.config()
	if err != nil {
		return usageError{err}
	}
	if f.tcp && cmd.Flags().Changed("server") {
		return usageError{errors.New("--tcp is for the embedded server; --server is reached as its URL says")}
	}
	stop, err := a.benchServer(cmd, &cfg, f.tcp)
	if err != nil {
		return err
	}
	defer stop()
	if w, ok := a.stderr.file(); ok && isTerminal(w) {
		cfg.Progress = func(s benchmark.Scenario) {
			fmt.Fprintf(a.stderr, "agentbus bench: running %s: %s\n", s.Name, s.Summary)
		}
	}
	rep, err := benchmark.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteTable(a.stdout)
}

// config returns the benchmark configuration the flags ask for, without
// its server (see benchServer); an error is a usage error.
func (f benchFlags) config() (benchmark.Config, error) {
	for _, v := range []struct {
		name string
		n    int
	}{{"--messages", f.messages}, {"--size", f.size}, {"--agents", f.agents}, {"--rounds", f.rounds}} {
		if v.n <= 0 {
			return benchmark.Config{}, fmt.Errorf("%s %d must be positive", v.name, v.n)
		}
	}
	rate, err := parseRate(f.rate)
	if err != nil {
		return benchmark.Config{}, err
	}
	var only []string
	for _, s := range f.only {
		if s = strings.TrimSpace(s); s != "" {
			only = append(only, s)
		}
	}
	if f.only != nil && len(only) == 0 { // given, naming nothing: not "all"
		return benchmark.Config{}, fmt.Errorf("--only %q names no scenario", strings.Join(f.only, ","))
	}
	cfg := benchmark.Config{Messages: f.messages, Size: f.size, Agents: f.agents, Rate: rate, Only: only, Rounds: f.rounds}
	return cfg, cfg.Validate()
}

// parseRate parses --rate: a positive number of messages per second,
// written N or N/s.
func parseRate(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
	if err != nil || !(v > 0) || math.IsInf(v, 1) { // !(v > 0) is also NaN
		return 0, fmt.Errorf("--rate %q: want a positive number of messages per second, such as 1000/s", s)
	}
	return v, nil
}

// benchServer points cfg at the server bench measures: --server when it
// was given on the command line, else an embedded server it starts, which
// stop shuts down, reached in process or, with tcp, over loopback TCP.
func (a *app) benchServer(cmd *cobra.Command, cfg *benchmark.Config, tcp bool) (stop func(), err error) {
	opts := []nats.Option{
		nats.Name("agentbus bench"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { a.warnf("connection: %v", err) }),
	}
	if cmd.Flags().Changed("server") {
		auth, err := a.natsOptions()
		if err != nil {
			return nil, err
		}
		url := a.server
		opts = append(opts, auth...)
		// One connection first, for the error every command gives when
		// the server cannot be reached.
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", url, err)
		}
		nc.Close()
		cfg.Dial = func() (*nats.Conn, error) { return nats.Connect(url, opts...) }
		cfg.Server = redactURLs(url, url)
		return func() {}, nil
	}
	// The server's warnings and errors go to stderr: a refused stream or
	// consumer is explained there (a full disk, say) and not only by the
	// API error's one line.
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := embedded.Start(embedded.Options{Logger: embedded.SlogLogger(logger)})
	if err != nil {
		return nil, err
	}
	if tcp {
		url := s.ClientURL()
		cfg.Dial = func() (*nats.Conn, error) { return nats.Connect(url, opts...) }
		cfg.Server = "embedded, file storage, loopback TCP"
	} else {
		cfg.Dial = func() (*nats.Conn, error) { return s.Connect(opts...) }
		cfg.Server = "embedded, file storage, in process"
	}
	// No memory figure: the server shares this process with both sides'
	// clients, whose garbage and retained state the heap cannot tell
	// apart (one run showed the bus's agents costing less than nothing).
	// go test -bench SetupAgents ./bus measures a server of its own.
	return s.Shutdown, nil
}

// scenarioNames returns the name of every bench scenario.
func scenarioNames() []string {
	var out []string
	for _, s := range benchmark.Scenarios() {
		out = append(out, s.Name)
	}
	return out
}
