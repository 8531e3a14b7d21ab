package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, replay and purge dead letters",
		Long: `A message is dead-lettered when its handler failed on every allowed delivery,
rejected it for good, could not decode it, or never settled its last delivery
(a crashed subscriber). The dead letter keeps the original message and says why.

  agentbus dlq list [--agent A] [--type T] [--since D] [--limit N] [--json]
  agentbus dlq show SEQ
  agentbus dlq replay SEQ
  agentbus dlq purge [--agent A] [--type T] [--before D]
  agentbus dlq watch

SEQ is the dead letter's sequence, as list prints it.

Each shard of an installation split into shards has dead letters of its
own: dlq watch takes --shards and watches them all, the other commands work
on one shard, given with --root <root>.s<K>.`,
	}
	cmd.AddCommand(a.dlqListCommand(), a.dlqShowCommand(), a.dlqReplayCommand(), a.dlqPurgeCommand(), a.dlqWatchCommand())
	return cmd
}

func (a *app) dlqListCommand() *cobra.Command {
	var f bus.DeadLetterFilter
	var since time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Long: `List prints one line per dead letter: sequence, time, reason, agent, type,
message ID, deliveries and the last error. --json prints one JSON object per line
with those fields and the original event.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if since < 0 || f.Limit < 0 {
				return usagef("--since and --limit must not be negative")
			}
			if err := checkDeadLetterFilter(cmd, f); err != nil {
				return err
			}
			if since > 0 {
				f.Since = time.Now().Add(-since)
			}
			return a.withAdmin(func(admin *bus.Admin) error {
				dls, err := admin.DeadLetters(cmd.Context(), f)
				if err != nil {
					return err
				}
				for _, dl := range dls {
					if err := a.printDeadLetter(dl, asJSON); err != nil {
						return err
					}
				}
				return nil
			})
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Agent, "agent", "", "only the dead letters of this receiving agent")
	fl.StringVar(&f.Type, "type", "", "only this message type")
	fl.DurationVar(&since, "since", 0, "only those dead-lettered within this long, e.g. 24h")
	fl.IntVar(&f.Limit, "limit", 0, "at most this many (0: all)")
	fl.BoolVar(&asJSON, "json", false, "one JSON object per line")
	return cmd
}

func (a *app) dlqShowCommand() *cobra.Command {
	cmd := a.onDeadLetter(func(ctx context.Context, admin *bus.Admin, seq uint64) error {
		dl, err := admin.DeadLetter(ctx, seq)
		if err != nil {
			return err
		}
		return a.printDeadLetter(*dl, true)
	})
	cmd.Use, cmd.Short = "show SEQ", "Show one dead letter as JSON"
	return cmd
}

func (a *app) dlqReplayCommand() *cobra.Command {
	cmd := a.onDeadLetter(func(ctx context.Context, admin *bus.Admin, seq uint64) error {
		ack, err := admin.ReplayDeadLetter(ctx, seq)
		if err != nil {
			return err
		}
		return printAck(a.stdout, ack)
	})
	cmd.Use, cmd.Short = "replay SEQ", "Publish a dead letter again on its original subject"
	cmd.Long = `Replay publishes the dead letter's original message again, to the same agent,
marked as replayed (Agentbus-Replay-Of header; Delivery.Replayed in the library).
It prints "id=<ID> seq=<N>", with " duplicate" when it was replayed already
within the duplicate window. The dead letter stays until purged.`
	return cmd
}

// onDeadLetter is a command that takes one dead-letter sequence and runs f
// on it.
func (a *app) onDeadLetter(f func(ctx context.Context, admin *bus.Admin, seq uint64) error) *cobra.Command {
	return &cobra.Command{
		Args: cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			seq, err := parseSeq(cmd.Flags().Arg(0))
			if err != nil {
				return err
			}
			return a.withAdmin(func(admin *bus.Admin) error {
				return f(cmd.Context(), admin, seq)
			})
		}),
	}
}

func (a *app) dlqPurgeCommand() *cobra.Command {
	var f bus.DeadLetterFilter
	var before time.Duration
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Remove dead letters",
		Long: `Purge removes the dead letters selected by --agent and --type (all by default);
with --before D only those dead-lettered more than D ago. It prints how many.
An empty --agent or --type is refused, not taken to select all.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if before < 0 {
				return usagef("--before must not be negative")
			}
			if err := checkDeadLetterFilter(cmd, f); err != nil {
				return err
			}
			if before > 0 {
				f.Since = time.Now().Add(-before)
			}
			return a.withAdmin(func(admin *bus.Admin) error {
				n, err := admin.PurgeDeadLetters(cmd.Context(), f)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "purged %d\n", n)
				return err
			})
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Agent, "agent", "", "only the dead letters of this receiving agent")
	fl.StringVar(&f.Type, "type", "", "only this message type")
	fl.DurationVar(&before, "before", 0, "only those dead-lettered more than this long ago, e.g. 720h")
	return cmd
}

func (a *app) dlqWatchCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "watch",
		Short: "Dead-letter deliveries that crashed subscribers never settled",
		Long: `Watch takes the server's MAX_DELIVERIES advisories, which the unsettled
stream (AGENTBUS_UNSETTLED) keeps until a watcher runs, and dead-letters the
messages whose last allowed delivery was never acknowledged, typically because
the subscriber crashed. 'agentbus serve' does this itself; run 'dlq watch'
beside an existing cluster, with an operator identity. Several watchers share
the work. With --shards it watches every shard. It runs until SIGINT or
SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			return a.withAdmins(func(admins []*bus.Admin) error {
				return watchEveryShard(cmd.Context(), admins, nil, func(admin *bus.Admin, ctx context.Context, _ func(struct{})) error {
					return admin.WatchDeadLetters(ctx)
				})
			})
		}),
	}
}

// checkDeadLetterFilter refuses an invalid --agent or --type that cmd
// was given: an empty one would select every dead letter, as if it had
// been left out.
func checkDeadLetterFilter(cmd *cobra.Command, f bus.DeadLetterFilter) error {
	if cmd.Flags().Changed("agent") {
		if err := checkAgentID("--agent", f.Agent); err != nil {
			return err
		}
	}
	if cmd.Flags().Changed("type") {
		if err := subjects.ValidateType(f.Type); err != nil {
			return usageError{fmt.Errorf("--type: %w", err)}
		}
	}
	return nil
}

func parseSeq(s string) (uint64, error) {
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 {
		return 0, usagef("SEQ %q: want a dead-letter sequence number", s)
	}
	return seq, nil
}

// printDeadLetter prints dl as one line, or as one JSON object.
func (a *app) printDeadLetter(dl bus.DeadLetter, asJSON bool) error {
	typ, id := "?", "?"
	if dl.Message != nil {
		typ, id = dl.Message.Type, dl.Message.ID
	}
	if !asJSON {
		_, err := fmt.Fprintf(a.stdout, "%d %s %s agent=%q type=%q id=%s deliveries=%d error=%q\n",
			dl.Sequence, dl.Time.Format(time.RFC3339), dl.Reason, dl.Agent, typ, id, dl.Deliveries, dl.Error)
		return err
	}
	out := struct {
		Sequence       uint64          `json:"sequence"`
		Time           time.Time       `json:"time"`
		Reason         string          `json:"reason"`
		Error          string          `json:"error,omitempty"`
		Deliveries     uint64          `json:"deliveries"`
		Agent          string          `json:"agent"`
		Type           string          `json:"type,omitempty"`
		ID             string          `json:"id,omitempty"`
		Stream         string          `json:"stream"`
		StreamSequence uint64          `json:"stream_sequence"`
		Subject        string          `json:"subject"`
		Event          json.RawMessage `json:"event,omitempty"`
		Data           []byte          `json:"data,omitempty"` // when the original is not a CloudEvent
	}{Sequence: dl.Sequence, Time: dl.Time, Reason: string(dl.Reason), Error: dl.Error, Deliveries: dl.Deliveries, Agent: dl.Agent,
		Stream: dl.Stream, StreamSequence: dl.StreamSequence, Subject: dl.Subject}
	if dl.Message != nil {
		out.Type, out.ID = dl.Message.Type, dl.Message.ID
	}
	if dl.Message != nil {
		if ev, err := codec.MarshalJSON(dl.Message); err == nil {
			out.Event = ev
		}
	}
	if out.Event == nil {
		out.Data = dl.Data
	}
	return a.printJSON(out)
}
