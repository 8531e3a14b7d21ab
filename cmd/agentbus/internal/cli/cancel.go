package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
)

func (a *app) cancelCommand() *cobra.Command {
	var agent string
	cmd := &cobra.Command{
		Use:   "cancel ID [--agent AGENT]",
		Short: "Cancel a message that is queued or being handled",
		Long: `Cancel cancels message ID: if it still waits for its recipient it is never
handed to a handler; if a handler runs it, the handler's context is
cancelled and what it returns is recorded. Either way its status becomes
canceled and it is not delivered again. It prints the message's status line,
as status does.

Without --agent it cancels as an operator; with --agent AGENT as that agent,
which must be the message's sender or recipient. A message that already
ended (replied, completed, expired, dead-lettered, canceled) is left alone:
cancel prints how it ended and exits 1 (docs/tasks.md).

With --shards, an operator's cancel finds the message on whichever shard
holds it, and sends its notices on that shard: a request's sender waiting
on another shard hears of it only at its reply-by. Cancel as the sender
(--agent) to end its wait at once.`,
		Example: `  agentbus cancel 4b0e6c1e-6a4f-4a7e-9c55-2f1d8e0c9b7a --agent orchestrator`,
		Args:    cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			id := cmd.Flags().Arg(0)
			if err := checkMessageID("ID", id); err != nil {
				return err
			}
			do := func(cancel func(context.Context, string) (bus.Status, error)) error {
				st, err := cancel(cmd.Context(), id)
				if errors.Is(err, bus.ErrNoStatus) {
					return noStatusError(id, agent)
				}
				if errors.Is(err, bus.ErrFinal) {
					return fmt.Errorf("message %s already ended: %s", id, statusLine(st))
				}
				if err != nil {
					return fmt.Errorf("cancel %s: %w", id, err)
				}
				_, err = fmt.Fprintln(a.stdout, statusLine(st))
				return err
			}
			if cmd.Flags().Changed("agent") {
				return a.withBusAs(agent, func(b *bus.Bus) error { return do(b.Cancel) })
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				return do(func(ctx context.Context, id string) (bus.Status, error) { return cancelOnShards(ctx, admins, id) })
			})
		}),
	}
	cmd.Flags().StringVar(&agent, "agent", "", "cancel as this agent, the message's sender or recipient (default: as an operator)")
	return cmd
}

// cancelOnShards cancels message id as an operator on every shard at once
// and returns what the shard that holds its records did (every shard's,
// for a broadcast: the first's); bus.ErrNoStatus when none holds any.
func cancelOnShards(ctx context.Context, admins []*bus.Admin, id string) (bus.Status, error) {
	type outcome struct {
		st  bus.Status
		err error
	}
	found, err := onEveryShard(admins, func(admin *bus.Admin) (outcome, error) {
		st, err := admin.Cancel(ctx, id)
		return outcome{st, err}, nil
	})
	if err != nil {
		return bus.Status{}, err
	}
	for k, o := range found {
		if !errors.Is(o.err, bus.ErrNoStatus) {
			if o.err != nil && !errors.Is(o.err, bus.ErrFinal) {
				o.err = onShard(admins, k, o.err)
			}
			return o.st, o.err
		}
	}
	return bus.Status{}, bus.ErrNoStatus
}
