package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
)

func (a *app) historyCommand() *cobra.Command {
	var (
		agent  string
		q      bus.HistoryQuery
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "history CORRELATION_ID",
		Short: "Read a conversation's messages, bodies included, from the stream",
		Long: `History prints the messages of the conversation CORRELATION_ID, in the order
they were created, read from the stream with their data, one line each:

  <time> <from> -> <to> p<N> <type> id=<id> data=<preview>

A message whose record outlived it (its TTL passed, or the stream's
retention) prints error="..." instead of its data. A page holds --limit
messages (default 1000); when more follow, a last line gives the cursor of
the next page, for --after:

  next=<cursor>

--json prints one JSON object per message: id, from, to, type, priority,
time, correlationId, stream, sequence, subject, the CloudEvent as
subscribe --json prints it ("event"), or "error"; then {"next":"<cursor>"}
when more follow.

Without --agent, history reads every message of the conversation, which
needs an operator's access (every status record, messages by sequence).
With --agent AGENT it reads, as that agent, only the messages AGENT sent or
received: what its own permissions let it read (docs/history.md). It exits
1 when the conversation has no message (for AGENT).

On an installation split into shards, history with --agent and --shards
reads every shard; as an operator it reads one shard, given with --root
<root>.s<K>, and refuses --shards.`,
		Example: `  agentbus history conv-42
  agentbus history conv-42 --agent worker --json | jq -r .event.data
  agentbus history conv-42 --limit 100 --after 1795000000.123456789.42.bS0x`,
		Args: cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			conv := cmd.Flags().Arg(0)
			if err := checkMessageID("CORRELATION_ID", conv); err != nil {
				return err
			}
			if err := (bus.HistoryQuery{Limit: q.Limit}).Validate(); err != nil {
				return usagef("--limit: %w", err)
			}
			if err := (bus.HistoryQuery{After: q.After}).Validate(); err != nil {
				return usagef("--after: %w", err)
			}
			read := func(f func(context.Context, string, bus.HistoryQuery) (bus.HistoryPage, error)) error {
				p, err := f(cmd.Context(), conv, q)
				switch {
				case errors.Is(err, bus.ErrNoStatus):
					return fmt.Errorf("no messages recorded for conversation %s", conv)
				case errors.Is(err, bus.ErrNotParticipant):
					return fmt.Errorf("agent %s sent or received no message of conversation %s", agent, conv)
				case err != nil:
					return err
				case len(p.Entries) == 0 && q.After == "":
					// Recorded, but nothing stored yet: a schedule not fired.
					return fmt.Errorf("conversation %s has no message in the stream yet; a scheduled one joins it when it fires ('agentbus status ID' shows it)", conv)
				}
				return a.printHistory(p, asJSON)
			}
			if cmd.Flags().Changed("agent") {
				return a.withBusAs(agent, func(b *bus.Bus) error { return read(b.History) })
			}
			return a.withAdmin(func(admin *bus.Admin) error { return read(admin.History) })
		}),
	}
	f := cmd.Flags()
	f.StringVar(&agent, "agent", "", "read as this agent: only the messages it sent or received (default: every message, as an operator)")
	f.IntVar(&q.Limit, "limit", 0, fmt.Sprintf("messages per page, at most %d (0: %d)", bus.MaxHistoryLimit, bus.DefaultHistoryLimit))
	f.StringVar(&q.After, "after", "", "the cursor a page printed as next=, for the page after it")
	f.BoolVar(&asJSON, "json", false, "one JSON object per message, then the next page's cursor")
	return cmd
}

// historyLine is what history --json prints for one message.
type historyLine struct {
	ID            string          `json:"id"`
	From          string          `json:"from"`
	To            string          `json:"to"`
	Type          string          `json:"type"`
	Priority      int             `json:"priority"`
	Time          time.Time       `json:"time"`
	CorrelationID string          `json:"correlationId"`
	Stream        string          `json:"stream"`
	Sequence      uint64          `json:"sequence"`
	Subject       string          `json:"subject,omitempty"`
	Event         json.RawMessage `json:"event,omitempty"`
	Error         string          `json:"error,omitempty"`
}

// printHistory prints a page, one line per message, then its next cursor.
func (a *app) printHistory(p bus.HistoryPage, asJSON bool) error {
	for _, e := range p.Entries {
		if asJSON {
			l := historyLine{ID: e.ID, From: e.From, To: e.To, Type: e.Type, Priority: e.Priority, Time: e.Time.UTC(),
				CorrelationID: e.CorrelationID, Stream: e.Stream, Sequence: e.Sequence, Subject: e.Subject}
			if e.Err != nil {
				l.Error = e.Err.Error()
			} else if l.Event, _ = codec.MarshalJSON(&e.Message); l.Event == nil {
				l.Error = "cannot render the event as JSON"
			}
			if err := a.printJSON(l); err != nil {
				return err
			}
			continue
		}
		if _, err := fmt.Fprintln(a.stdout, historyText(e)); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
	}
	if p.Next == "" {
		return nil
	}
	if asJSON {
		return a.printJSON(map[string]string{"next": p.Next})
	}
	if _, err := fmt.Fprintln(a.stdout, "next="+p.Next); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	return nil
}

// historyText renders e for a person: time, from -> to, priority, type,
// ID, and a preview of the data or what became of it.
func historyText(e bus.HistoryEntry) string {
	line := fmt.Sprintf("%s %s -> %s p%d %s id=%s", e.Time.UTC().Format(timeMillis), nameField(e.From), nameField(e.To), e.Priority, e.Type, e.ID)
	if e.Err != nil {
		return line + " error=" + strconv.Quote(e.Err.Error())
	}
	return line + " data=" + preview(e.Data)
}

func (a *app) redeliverCommand() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "redeliver ID --to AGENT",
		Short: "Deliver a past message again to an agent (operator)",
		Long: `Redeliver publishes message ID, read from the stream, again to AGENT, so that
an agent restarted from scratch gets its context back. The copy has a new ID,
the CloudEvents extension redeliveryof=<ID>, and the original's sender, type,
priority, conversation, causation, time, data and other extensions, without
its TTL. It is published in the original sender's name, which needs an
operator's credentials. It prints "id=<new ID> seq=<N>".

It exits 1 when the message has no record, or the stream no longer holds it.
It works on one shard of an installation split into shards, given with
--root <root>.s<K>, and refuses --shards.`,
		Example: `  agentbus redeliver 4b0e6c1e-6a4f-4a7e-9c55-2f1d8e0c9b7a --to worker-1`,
		Args:    cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			id := cmd.Flags().Arg(0)
			if err := checkMessageID("ID", id); err != nil {
				return err
			}
			if err := checkAgentID("--to", to); err != nil {
				return err
			}
			return a.withAdmin(func(admin *bus.Admin) error {
				ack, err := admin.Redeliver(cmd.Context(), id, to)
				if errors.Is(err, bus.ErrNoStatus) {
					return fmt.Errorf("no status recorded for message %s", id)
				}
				if err != nil {
					return err
				}
				return printAck(a.stdout, ack)
			})
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "the agent to deliver it to (required)")
	_ = cmd.MarkFlagRequired("to") // the flag exists
	return cmd
}
