package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/demo"
)

func (a *app) demoCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch agents talk over an embedded bus: priority, crash, duplicates, TTL, request/reply, dead letters, trace",
		Long: `Demo starts an embedded NATS server with JetStream (file storage in a
temporary directory, removed at the end), provisions the bus on it, and
runs a few agents, each on a connection of its own: an orchestrator, two
processes of the agent "worker", a reviewer, and an operator. They talk in
two of the agent protocols (pipeline work items, basemessage escalations,
requests and replies), and the demo prints what happens as a timeline:

  priority   work at priorities 4, 4, 5 is queued for an offline worker,
             then a priority-1 escalation; the escalation is handled first
  crash      worker#1 takes a work item and crashes before it acks; after
             the ack wait worker#2 gets it, delivery 2
  duplicate  a work item is published twice with the same ID; the server
             reports the second a duplicate and the worker handles it once
  ttl        a message with a 1s TTL waits for the offline reviewer and
             expires; its lifecycle record reads expired
  request    the orchestrator sends a request and waits; the reviewer replies
  poison     a work item that always fails is retried, then dead-lettered
             with the reason, while the item behind it flows past
  trace      every message shares one correlation ID: one conversation, one
             trace ID, listed with where each message ended

Each scene checks that it saw what it is meant to show. Demo exits 0 when
every scene did, and 1 naming the first that did not; it takes a few
seconds and at most 50. The global connection flags and --root are not
used: the demo always runs on a server of its own.

With --trace-stderr (or OTEL_EXPORTER_OTLP_ENDPOINT) the spans of every
message go out too, all in the one trace the demo prints.

--json prints one JSON object a line for each event, with the members
elapsed_ms, scene, from, to, type, priority, id, event and detail, and a
last line with event "summary": ok, elapsed_ms, conversation, trace_id and
each scene's result.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			p := demo.NewPrinter(a.stdout, asJSON)
			rep, err := demo.Run(cmd.Context(), demo.Options{Events: p.Event})
			p.Report(rep)
			if perr := p.Err(); perr != nil {
				return errors.Join(err, fmt.Errorf("write stdout: %w", perr))
			}
			return err
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON Lines: one object per event, then a summary")
	return cmd
}
