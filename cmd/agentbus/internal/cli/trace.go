package cli

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
)

func (a *app) traceCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "trace CORRELATION_ID",
		Short: "Show the messages of a conversation in order",
		Long: `Trace prints every message of the conversation CORRELATION_ID (the messages
published with that --correlation-id, their replies, and what handlers sent
while handling them), in the order they were created, from their lifecycle
records. A header line gives the conversation's OpenTelemetry trace ID, under
which a tracing backend shows the same messages' spans:

  conversation <correlation ID> trace_id=<32 hex digits>
  TIME  FROM -> TO  TYPE  PRIORITY  STATE  DELIVERIES  ID
  <time, RFC 3339 in ms>  <from> -> <to>  <type>  p<n>  <state>  <n>  <id>

A broadcast has a row for its sender's record and one for each recipient's.
--json prints one JSON document:

  {"correlationId":"...","traceId":"...","messages":[<records, as status --json>]}

Trace reads the records of every agent, which needs an operator's read
access to the status bucket; with --shards, of every shard. It exits 1 when
the conversation has no record.`,
		Example: `  agentbus trace conv-42
  agentbus trace conv-42 --json | jq '.messages[] | select(.state == "failed")'`,
		Args: cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			conv := cmd.Flags().Arg(0)
			if err := checkMessageID("CORRELATION_ID", conv); err != nil {
				return err
			}
			sts, err := a.recordsOnShards(func(admin *bus.Admin) ([]bus.Status, error) {
				return admin.Conversation(cmd.Context(), conv)
			})
			if errors.Is(err, bus.ErrNoStatus) {
				return fmt.Errorf("no messages recorded for conversation %s", conv)
			}
			if err != nil {
				return fmt.Errorf("conversation %s: %w", conv, err)
			}
			// Each shard's in the order they were created; the shards'
			// together likewise.
			slices.SortStableFunc(sts, func(x, y bus.Status) int { return x.Time.Compare(y.Time) })
			if asJSON {
				return a.printJSON(conversation{conv, bus.ConversationTraceID(conv).String(), sts})
			}
			return a.printConversation(conv, sts)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document with the trace ID and the records")
	return cmd
}

// conversation is what trace --json prints.
type conversation struct {
	CorrelationID string       `json:"correlationId"`
	TraceID       string       `json:"traceId"`
	Messages      []bus.Status `json:"messages"`
}

// printConversation prints the header line and a table of the records,
// one row each, in the order given.
func (a *app) printConversation(conv string, sts []bus.Status) error {
	if _, err := fmt.Fprintf(a.stdout, "conversation %s trace_id=%s\n", conv, bus.ConversationTraceID(conv)); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tFROM -> TO\tTYPE\tPRIORITY\tSTATE\tDELIVERIES\tID")
	for _, st := range sts {
		fmt.Fprintf(tw, "%s\t%s -> %s\t%s\tp%d\t%s\t%s\t%s\n",
			st.Time.UTC().Format(timeMillis), st.From, st.To, st.Type, st.Priority, st.State, strconv.Itoa(st.Deliveries), st.ID)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	return nil
}

// timeMillis is RFC 3339 with milliseconds, in UTC, as subscribe prints
// message times.
const timeMillis = "2006-01-02T15:04:05.000Z"
