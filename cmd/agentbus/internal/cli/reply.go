package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec/profiles"
)

func (a *app) replyCommand() *cobra.Command {
	in := &messageInput{} // priority 0: the request's
	var requestID string
	cmd := &cobra.Command{
		Use:   "reply --from AGENT --to-message ID --type TYPE [flags]",
		Short: "Answer a request",
		Long: `Reply answers the message --to-message that was sent to agent --from, as
that agent: the reply goes to the message's sender, in its conversation,
marked as answering it, and the message's status becomes replied. A
requester still waiting in 'agentbus request' or Bus.Request gets it as its
reply; a later one finds it in its inbox, marked late.

The message is found by its lifecycle status ('agentbus status ID --agent
AGENT'), so it can be answered while it is still queued for --from. The
payload and the flags are publish's; the priority is the request's unless
--priority is given. With --profile NAME the payload is a native message of
that protocol, sent unchanged: --from overrides its sender, it goes to the
requester whatever recipient it names, and its priority is the protocol's
unless --priority is given.

On success it prints "id=<ID> seq=<N>" as publish does.`,
		Example: `  agentbus reply --from worker --to-message 4b0e6c1e-... --type RESULT --data done`,
		Args:    cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if !cmd.Flags().Changed("from") {
				return usagef("required flag \"from\" not set")
			}
			if err := checkMessageID("--to-message", requestID); err != nil {
				return err
			}
			// The recipient is the requester, known once the request is
			// found; until then the replier stands in for it, so that the
			// message can be checked before connecting.
			in.m.To = in.m.From
			m, err := in.message(cmd, a, "type")
			if err != nil {
				return err
			}
			return a.reply(cmd.Context(), requestID, m)
		}),
	}
	in.addFlags(cmd, "from", "type", "priority", "content-type")
	f := cmd.Flags()
	f.StringVar(&requestID, "to-message", "", "ID of the message to answer (required)")
	_ = cmd.MarkFlagRequired("to-message") // the flag exists
	f.Lookup("from").Usage = "agent that answers: the recipient of --to-message (required)"
	f.Lookup("priority").Usage = "priority from 1, the most urgent, to 5 (default the request's)"
	f.Lookup("profile").Usage = "the payload is a native message of this protocol (" + strings.Join(profiles.Names(), ", ") +
		"); --from overrides its sender, --priority its priority, and it goes to the requester"
	return cmd
}

// reply sends m, from the agent m.From, as the reply to the message
// requestID sent to that agent, and prints the receipt.
func (a *app) reply(ctx context.Context, requestID string, m bus.Message) error {
	b, err := a.connectAs("from", m.From)
	if err != nil {
		return err
	}
	defer b.Close()
	req, err := requestTo(ctx, b, requestID)
	if err != nil {
		return err
	}
	m.To = req.From
	ack, err := b.Reply(ctx, &req, m)
	if err != nil {
		return fmt.Errorf("reply to %s: %w", requestID, err)
	}
	return printAck(a.stdout, ack)
}

// requestTo returns message id sent to b's agent, rebuilt from its
// lifecycle record.
func requestTo(ctx context.Context, b *bus.Bus, id string) (bus.Message, error) {
	m, err := b.Received(ctx, id)
	if errors.Is(err, bus.ErrNoStatus) {
		// A message is found before it is delivered by its indexed
		// subject or its sender's record: a sender with neither (a client
		// that is not agentbus and does neither) leaves the message to be
		// answered by the handler that gets it.
		return bus.Message{}, fmt.Errorf("no message %s to %s: neither its subject nor a status record names it (see docs/foreign-agents.md)", id, b.Agent())
	}
	if err != nil {
		return bus.Message{}, fmt.Errorf("look up message %s: %w", id, err)
	}
	return m, nil
}
