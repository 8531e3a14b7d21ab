package cli

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) provisionCommand() *cobra.Command {
	var cfg bus.StreamConfig
	var agents []string
	var shard int
	budget := byteSize(bus.DefaultDedupMemoryBudget)
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create or update the bus's JetStream stream",
		Long: `Provision creates the JetStream stream that carries the bus's messages on
--server, with its dead-letter stream, the stream that keeps unsettled
deliveries for the dead-letter watcher, the lifecycle status bucket and the
agent registry, or updates them in place to match the flags. It is
idempotent and safe to run from several processes; flags left out take the
defaults shown.

On success it prints one line describing the stream, for example:

  stream AGENTBUS subjects=agentbus.agent.*.p1.*.*,agentbus.agent.*.p2.*.*,agentbus.agent.*.p3.*.*,agentbus.agent.*.p4.*.*,agentbus.agent.*.p5.*.*,agentbus.agent.*.p1.*.*.*.*,agentbus.agent.*.p2.*.*.*.*,agentbus.agent.*.p3.*.*.*.*,agentbus.agent.*.p4.*.*.*.*,agentbus.agent.*.p5.*.*.*.*,agentbus.all.p1.*.*,agentbus.all.p2.*.*,agentbus.all.p3.*.*,agentbus.all.p4.*.*,agentbus.all.p5.*.* storage=file replicas=1 max-age=720h dedup-window=1h max-consumers=120000 messages=0

With --agent it also creates the durable consumers of each agent named, as its
first subscribe would, and prints a line per agent. Messages sent to an agent
wait for it in any case; broadcasts only from the moment its consumers exist,
so an agent set up this way before it first runs gets the broadcasts sent in
between.

Every server holding the stream keeps each message ID of the dedup window in
memory, about 300 B per ID (docs/operations.md, "Duplicate window and
memory"). With --peak-rate, provision refuses a window whose IDs at that rate
need more than --dedup-budget, and names the longest window that fits; raise
--dedup-budget to accept it. Without --peak-rate it provisions, then warns on
stderr that the memory is not bounded.

With --shards N it provisions an installation split into N shards, each a
root of its own (<root>.s0 to <root>.s<N-1>) with its own streams, records N
in each shard's registry, where every process given another --shards is
refused, and prints a line per shard; --shard K provisions shard K only, so that each can be
given its own --tag. Each agent given with --agent gets its consumers on its
own shard, named on its line. Agents reach a sharded installation through
bus.Shards (docs/operations.md, "Past one stream"), and so do the agent
commands (publish, request, reply, subscribe, cancel ...) given the same
--shards. So do the operator's: status, trace, cancel, agents, group and
dlq watch reach every shard, or the shard of the agent they name, and serve
provisions and watches every shard. The commands that work on one shard's
streams (dlq list, show, replay and purge, agents escalate, and history and
redeliver as an operator) refuse --shards: give them a shard's root with
--root.

--tag places the streams and buckets on the servers of a cluster that have
every tag given (server_tags in their configuration).`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if !cmd.Flags().Changed("dedup-window") {
				// A short --max-age alone shortens the dedup window with it.
				cfg.DuplicateWindow = min(cfg.DuplicateWindow, cfg.MaxAge)
			}
			cfg.DedupMemoryBudget = int64(budget)
			if cfg.Replicas == 0 { // the library's default, which --replicas 0 would not be asking for
				return usagef("--replicas 0: 1 to 5")
			}
			// Zero is the library's default too: --max-age 0, "no limit"
			// in NATS, shrank a longer retention to the default's.
			for _, name := range []string{"max-age", "dedup-window", "max-consumers", "dedup-budget"} {
				if f := cmd.Flags().Lookup(name); f != nil && f.Changed && (f.Value.String() == "0" || f.Value.String() == "0s") {
					return usagef("--%s 0: must be more than zero (leave it out for the default)", name)
				}
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			for _, agent := range agents {
				if err := subjects.ValidateID(agent); err != nil {
					return usageError{fmt.Errorf("--agent: %w", err)}
				}
			}
			roots, err := shardRoots(a.root, a.shards, shard)
			if err != nil {
				return usageError{err}
			}
			if err := cfg.CheckDedupMemory(); err != nil {
				var be *bus.DedupBudgetError
				if errors.As(err, &be) {
					raise := fmt.Sprintf("--dedup-budget %dMiB or more", (be.Estimate+1<<20-1)>>20)
					if be.MaxWindow == 0 {
						return usagef("%w: use %s", err, raise)
					}
					return usagef("%w: use --dedup-window %s or less, or %s", err, formatDuration(be.MaxWindow), raise)
				}
				return usageError{err}
			}
			nc, ctx, stop, err := a.dial(cmd.Context(), "provision")
			if err != nil {
				return err
			}
			defer stop()
			defer nc.Close()
			admins := map[string]*bus.Admin{}
			defer func() {
				for _, admin := range admins {
					admin.Close()
				}
			}()
			for _, root := range roots {
				admin, err := bus.NewAdmin(nc, bus.WithRoot(root), bus.WithoutLifecycle())
				if err != nil {
					return err
				}
				admins[root] = admin
				cfg.Root, cfg.Shards = root, a.shards
				info, err := admin.Provision(ctx, cfg)
				if err != nil {
					return refused(ctx, err)
				}
				if err := printStream(a.stdout, info); err != nil {
					return err
				}
			}
			for _, w := range cfg.Warnings() {
				a.warnf("%s (--peak-rate)", w)
			}
			for _, agent := range agents {
				k, _ := subjects.ShardOf(agent, a.shards) // both checked above
				root, _ := subjects.ShardRoot(a.root, k, a.shards)
				admin, ok := admins[root]
				if !ok {
					continue // on a shard --shard left out
				}
				if err := admin.EnsureConsumers(ctx, agent); err != nil {
					return refused(ctx, fmt.Errorf("agent %s: %w", agent, err))
				}
				var on string
				if a.shards > 1 {
					on = " root=" + root
				}
				if _, err := fmt.Fprintf(a.stdout, "agent %s%s consumers=%d\n", agent, on, subjects.ConsumersPerAgent); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Replicas, "replicas", 1, "copies of each message in a cluster (1..5)")
	f.DurationVar(&cfg.MaxAge, "max-age", bus.DefaultMaxAge, "how long a message is kept")
	f.DurationVar(&cfg.DuplicateWindow, "dedup-window", bus.DefaultDuplicateWindow, "how long a message ID is remembered to drop republished copies (at most --max-age)")
	f.IntVar(&cfg.MaxConsumers, "max-consumers", bus.DefaultMaxConsumers, "most consumers on the stream (six per agent)")
	f.StringArrayVar(&agents, "agent", nil, "also create this agent's consumers (repeatable)")
	f.IntVar(&cfg.PeakPublishRate, "peak-rate", 0, "most messages per second the stream takes, all publishers together; bounds the dedup window's memory with --dedup-budget (0: not stated, warn)")
	f.IntVar(&shard, "shard", -1, "with --shards (1.."+strconv.Itoa(subjects.MaxShards)+"), provision this shard only (0..N-1; default all)")
	f.StringArrayVar(&cfg.Tags, "tag", nil, "place the streams and buckets on servers with this server tag (repeatable)")
	f.Var(&budget, "dedup-budget", "most memory on each server for the dedup window's IDs at --peak-rate, in bytes or with KiB, MiB, GiB, TiB")
	return cmd
}

// shardRoots returns the roots provision sets up: every shard's of an
// installation under root split into shards, or only shard's when it is
// not -1.
func shardRoots(root string, shards, shard int) ([]string, error) {
	if shard != -1 && (shard < 0 || shard >= shards) {
		return nil, fmt.Errorf("--shard %d is not one of --shards %d (0..%d)", shard, shards, shards-1)
	}
	var roots []string
	for k := range shards {
		if shard != -1 && k != shard {
			continue
		}
		r, err := subjects.ShardRoot(root, k, shards)
		if err != nil {
			return nil, fmt.Errorf("--shards: %w", err)
		}
		roots = append(roots, r)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("--shards %d is not 1 to %d", shards, subjects.MaxShards)
	}
	return roots, nil
}

// byteSize is a flag value in bytes, written as a whole number with an
// optional binary unit: 1048576, 512KiB, 256MiB, 2GiB, 1TiB.
type byteSize int64

func (b *byteSize) String() string {
	for _, u := range byteUnits {
		if *b != 0 && int64(*b)%u.size == 0 {
			return strconv.FormatInt(int64(*b)/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	n, size := s, int64(1)
	for _, u := range byteUnits {
		if v, ok := strings.CutSuffix(s, u.name); ok {
			n, size = v, u.size
			break
		}
	}
	v, err := strconv.ParseInt(n, 10, 64)
	switch {
	case err != nil:
		return errors.New("want a whole number of bytes, optionally with KiB, MiB, GiB or TiB")
	case v < 0:
		return errors.New("negative size")
	case v > math.MaxInt64/size:
		return errors.New("size out of range")
	}
	*b = byteSize(v * size)
	return nil
}

func (b *byteSize) Type() string { return "size" }

// byteUnits are the units byteSize reads and prints, largest first.
var byteUnits = []struct {
	name string
	size int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// printStream prints the one-line summary of a provisioned stream; it ends
// with schedules=<stream> when the stream takes in a schedule stream's
// messages (nats-server 2.12 and later).
func printStream(w io.Writer, info *jetstream.StreamInfo) error {
	c := info.Config
	var sched string
	for _, src := range c.Sources {
		sched += " schedules=" + src.Name
	}
	_, err := fmt.Fprintf(w, "stream %s subjects=%s storage=%s replicas=%d max-age=%s dedup-window=%s max-consumers=%d messages=%d%s\n",
		c.Name, strings.Join(c.Subjects, ","), strings.ToLower(c.Storage.String()), c.Replicas,
		formatDuration(c.MaxAge), formatDuration(c.Duplicates), c.MaxConsumers, info.State.Msgs, sched)
	return err
}
