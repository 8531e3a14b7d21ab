package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
)

func (a *app) statusCommand() *cobra.Command {
	var (
		agent  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Show where a message is in its lifecycle",
		Long: `Status prints the lifecycle records of message ID, one line each:

  <id> <from> -> <to> <state> [deliveries=<n>] [seq=<n>] [progress=<n>] [reason="..."] [reply=<id>] [schedule="..."] updated=<time>

A direct message has one record. A broadcast has its sender's, which stays
pending, and one for each agent that received it. The states are pending
(sent, not yet received), delivered (the recipient has received it and not
finished with it), working (the recipient reports progress; progress counts
the updates), failed (it will be delivered again), scheduled (the server
keeps it until its schedule fires: schedule says when), and the final
replied, completed, expired, canceled and dead_lettered; delivered and completed are read from
the recipient's consumer. seq is the message's stream sequence, reply the ID of the
reply that answered it. --json prints a JSON array of the records.

Without --agent, status reads every record of the message, which needs an
operator's read access to the status bucket. With --agent AGENT it reads, as
that agent, only the records naming AGENT as sender or recipient: what the
agent's own permissions let it see.

With --shards, an operator's status reads every shard.

It exits 1 when no record is found.`,
		Example: `  agentbus status 4b0e6c1e-6a4f-4a7e-9c55-2f1d8e0c9b7a
  agentbus status 4b0e6c1e-6a4f-4a7e-9c55-2f1d8e0c9b7a --agent worker --json`,
		Args: cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			id := cmd.Flags().Arg(0)
			if err := checkMessageID("ID", id); err != nil {
				return err
			}
			lookup := func(f func(ctx context.Context, id string) ([]bus.Status, error)) error {
				sts, err := f(cmd.Context(), id)
				if errors.Is(err, bus.ErrNoStatus) {
					return noStatusError(id, agent)
				}
				if err != nil {
					return fmt.Errorf("status of %s: %w", id, err)
				}
				if asJSON {
					return a.printJSON(sts)
				}
				return a.printStatuses(sts)
			}
			if cmd.Flags().Changed("agent") {
				return a.withBusAs(agent, func(b *bus.Bus) error { return lookup(b.Status) })
			}
			return lookup(func(ctx context.Context, id string) ([]bus.Status, error) {
				return a.recordsOnShards(func(admin *bus.Admin) ([]bus.Status, error) { return admin.Status(ctx, id) })
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&agent, "agent", "", "read as this agent: only the records naming it as sender or recipient (default: every record, as an operator)")
	f.BoolVar(&asJSON, "json", false, "print a JSON array of the records")
	return cmd
}

// noStatusError says that message id has no record, or none that agent
// may see when agent is not "".
func noStatusError(id, agent string) error {
	if agent == "" {
		return fmt.Errorf("no status recorded for message %s", id)
	}
	return fmt.Errorf("no status recorded for message %s naming agent %s", id, agent)
}

// printStatuses prints one line per record.
func (a *app) printStatuses(sts []bus.Status) error {
	for _, st := range sts {
		if _, err := fmt.Fprintln(a.stdout, statusLine(st)); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
	}
	return nil
}

// statusLine renders st for a person:
// <id> <from> -> <to> <state> [deliveries=N] [seq=N] [reason="..."] [reply=ID] updated=<RFC 3339>.
func statusLine(st bus.Status) string {
	parts := []string{st.ID, nameField(st.From), "->", nameField(st.To), string(st.State)}
	if st.Deliveries > 0 {
		parts = append(parts, "deliveries="+strconv.Itoa(st.Deliveries))
	}
	if st.Sequence > 0 {
		parts = append(parts, "seq="+strconv.FormatUint(st.Sequence, 10))
	}
	if st.Progress > 0 {
		parts = append(parts, "progress="+strconv.Itoa(st.Progress))
	}
	if st.Reason != "" {
		parts = append(parts, "reason="+strconv.Quote(st.Reason))
	}
	if st.ReplyID != "" {
		parts = append(parts, "reply="+st.ReplyID)
	}
	if st.State == bus.StateScheduled {
		parts = append(parts, "schedule="+strconv.Quote(st.Schedule))
	}
	parts = append(parts, "updated="+st.Updated.UTC().Format(time.RFC3339))
	return strings.Join(parts, " ")
}
