package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
)

func (a *app) provisionCommand() *cobra.Command {
	var cfg bus.StreamConfig
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create or update the bus's JetStream stream",
		Long: `Provision creates the JetStream stream that carries the bus's messages on
--server, or updates it in place to match the flags. It is idempotent and safe
to run from several processes; flags left out take the defaults shown.

On success it prints one line describing the stream, for example:

  stream AGENTBUS subjects=agentbus.agent.>,agentbus.all.> storage=file replicas=1 max-age=720h dedup-window=1h max-consumers=50000 messages=0`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			cfg.Root = a.root
			if !cmd.Flags().Changed("dedup-window") {
				// A short --max-age alone shortens the dedup window with it.
				cfg.DuplicateWindow = min(cfg.DuplicateWindow, cfg.MaxAge)
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			nc, err := a.dial("provision")
			if err != nil {
				return err
			}
			defer nc.Close()
			info, err := bus.Provision(cmd.Context(), nc, cfg)
			if err != nil {
				return err
			}
			return printStream(a.stdout, info)
		}),
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Replicas, "replicas", 1, "copies of each message in a cluster (1..5)")
	f.DurationVar(&cfg.MaxAge, "max-age", bus.DefaultMaxAge, "how long a message is kept")
	f.DurationVar(&cfg.DuplicateWindow, "dedup-window", bus.DefaultDuplicateWindow, "how long a message ID is remembered to drop republished copies (at most --max-age)")
	f.IntVar(&cfg.MaxConsumers, "max-consumers", bus.DefaultMaxConsumers, "most consumers on the stream (ten per agent)")
	return cmd
}

// printStream prints the one-line summary of a provisioned stream.
func printStream(w io.Writer, info *jetstream.StreamInfo) error {
	c := info.Config
	_, err := fmt.Fprintf(w, "stream %s subjects=%s storage=%s replicas=%d max-age=%s dedup-window=%s max-consumers=%d messages=%d\n",
		c.Name, strings.Join(c.Subjects, ","), strings.ToLower(c.Storage.String()), c.Replicas,
		formatDuration(c.MaxAge), formatDuration(c.Duplicates), c.MaxConsumers, info.State.Msgs)
	return err
}

// provision provisions the stream of root on nc with the defaults; serve
// uses it.
func provision(ctx context.Context, nc *nats.Conn, root string) (*jetstream.StreamInfo, error) {
	return bus.Provision(ctx, nc, bus.StreamConfig{Root: root})
}
