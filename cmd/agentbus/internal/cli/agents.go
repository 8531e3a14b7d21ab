package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
)

func (a *app) agentsCommand() *cobra.Command {
	var asJSON, watch bool
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "List the registered agents and their presence",
		Long: `Agents lists the agents of the registry: each one's status (online, offline
or unknown), when it was last seen, the messages waiting for it at each
priority, its skills and its description, one row each, by name. --json
prints a JSON array of the agents' cards and presence instead.

An agent registers with 'agentbus subscribe --card FILE' or Bus.Register,
and reports its presence while it runs; one that stops without closing is
found offline three heartbeats (30 s by default) after its last one
(docs/presence.md). With --shards, agents reads every shard's registry.

--watch prints every agent's presence as it stands, then each change, one
line each, until SIGINT or SIGTERM:

  <time> <agent> <status> [(<reason>)] [since <time>]

  agentbus agents show NAME   prints one agent's card and presence as JSON`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if watch {
				if asJSON {
					return usagef("--json cannot be used with --watch") // it printed lines, not JSON
				}
				return a.withAdmins(func(admins []*bus.Admin) error {
					return watchEveryShard(cmd.Context(), admins, a.printPresenceChange, (*bus.Admin).WatchPresence)
				})
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				all, backlogs, err := agentsOnShards(cmd.Context(), admins)
				if err != nil {
					return err
				}
				if asJSON {
					return a.printJSON(agentsJSON(all))
				}
				return a.printAgents(all, backlogs)
			})
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the agents")
	cmd.Flags().BoolVar(&watch, "watch", false, "print each presence change until interrupted")
	cmd.AddCommand(a.escalateCommand())
	cmd.AddCommand(&cobra.Command{
		Use:   "show NAME",
		Short: "Print one agent's card and presence as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if err := checkAgentID("NAME", cmd.Flags().Arg(0)); err != nil {
				return err
			}
			return a.withAdminOf(cmd.Flags().Arg(0), func(admin *bus.Admin) error {
				info, err := admin.LookupAgent(cmd.Context(), cmd.Flags().Arg(0))
				if err != nil {
					return err
				}
				return a.printJSON(agentsJSON([]bus.AgentInfo{info})[0])
			})
		}),
	})
	return cmd
}

// agentJSON is one agent as agents --json prints it.
type agentJSON struct {
	Card     bus.AgentCard `json:"card"`
	Status   string        `json:"status"`
	Since    *time.Time    `json:"since,omitempty"`
	LastSeen *time.Time    `json:"lastSeen,omitempty"`
	Reason   string        `json:"reason,omitempty"`
}

func agentsJSON(all []bus.AgentInfo) []agentJSON {
	out := make([]agentJSON, len(all))
	for i, a := range all {
		out[i] = agentJSON{Card: a.Card, Status: string(a.Presence.Status), Reason: a.Presence.Reason,
			Since: timeOrNil(a.Presence.Since), LastSeen: timeOrNil(a.Presence.LastSeen)}
	}
	return out
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// backlogsAtOnce bounds the agents whose backlogs agents reads at once,
// on each shard.
const backlogsAtOnce = 16

// agentsOnShards reads the agents of every shard's registry, by name, and
// the messages waiting for each, "p1/p2/p3/p4/p5", on its shard.
func agentsOnShards(ctx context.Context, admins []*bus.Admin) ([]bus.AgentInfo, []string, error) {
	type agent struct {
		info    bus.AgentInfo
		backlog string
	}
	found, err := onEveryShard(admins, func(admin *bus.Admin) ([]agent, error) {
		all, err := admin.Agents(ctx)
		if err != nil {
			return nil, err
		}
		// Backlogs read backlogsAtOnce agents at a time: one after another,
		// 10,000 agents took as many round trips.
		out, errs := make([]agent, len(all)), make([]error, len(all))
		slots := make(chan struct{}, backlogsAtOnce)
		var wg sync.WaitGroup
		for i, ag := range all {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				b, err := admin.Backlog(ctx, ag.Card.Name)
				out[i], errs[i] = agent{ag, fmt.Sprintf("%d/%d/%d/%d/%d", b[0], b[1], b[2], b[3], b[4])}, err
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	})
	if err != nil {
		return nil, nil, err
	}
	agents := slices.Concat(found...)
	slices.SortFunc(agents, func(x, y agent) int { return strings.Compare(x.info.Card.Name, y.info.Card.Name) })
	all, backlogs := make([]bus.AgentInfo, len(agents)), make([]string, len(agents))
	for i, ag := range agents {
		all[i], backlogs[i] = ag.info, ag.backlog
	}
	return all, backlogs, nil
}

// printAgents prints one row per agent; backlogs are the agents' waiting
// messages by priority, "p1/p2/p3/p4/p5".
func (a *app) printAgents(all []bus.AgentInfo, backlogs []string) error {
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTATUS\tLAST SEEN\tBACKLOG P1/P2/P3/P4/P5\tSKILLS\tDESCRIPTION")
	for i, ag := range all {
		status := string(ag.Presence.Status)
		if ag.Presence.Reason != "" {
			status += " (" + ag.Presence.Reason + ")"
		}
		seen := "-"
		if !ag.Presence.LastSeen.IsZero() {
			seen = ag.Presence.LastSeen.UTC().Format(time.RFC3339)
		}
		var skills []string
		for _, s := range ag.Card.Skills {
			skills = append(skills, s.ID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", nameField(ag.Card.Name), status, seen, backlogs[i], orDash(strings.Join(skills, ",")), orDash(oneLine(ag.Card.Description)))
	}
	return w.Flush()
}

// printPresenceChange prints one line of agents --watch.
func (a *app) printPresenceChange(c bus.PresenceChange) {
	line := time.Now().UTC().Format(time.RFC3339) + " " + nameField(c.Agent) + " " + string(c.Presence.Status)
	if c.Presence.Reason != "" {
		line += " (" + c.Presence.Reason + ")"
	}
	if !c.Presence.Since.IsZero() {
		line += " since " + c.Presence.Since.UTC().Format(time.RFC3339)
	}
	fmt.Fprintln(a.stdout, line)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readCard reads the agent card in the JSON file path.
func readCard(path string) (*bus.AgentCard, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("--card: %w", err)}
	}
	var card bus.AgentCard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&card); err != nil {
		return nil, usageError{fmt.Errorf("--card %s: %w", path, err)}
	}
	return &card, nil
}

func (a *app) escalateCommand() *cobra.Command {
	var (
		p        bus.EscalationPolicy
		pipeline bool
	)
	cmd := &cobra.Command{
		Use:   "escalate (--agent NAME | --tag TAG) --after D --to AGENT [--pipeline]",
		Short: "Escalate agents that stay offline too long",
		Long: `Escalate watches the presence of --agent (or of every agent with a skill
tagged --tag) and, when it stays offline for --after, sends an escalation to
--to; when the agent comes back, a recovery. Each outage is escalated once,
however many escalate processes run or restart. With --pipeline the messages
are the pipeline protocol's own needs_human and info, from "pipeline";
otherwise agentbus.escalation and agentbus.recovery events from "agentbus".
It runs until SIGINT or SIGTERM, with an operator's identity
(docs/presence.md). It works on one shard of an installation split into
shards, given with --root <root>.s<K>, and refuses --shards: it watches
the agents of that shard and sends on it, so --to must live there too.`,
		Example: `  agentbus agents escalate --agent dev --after 3m --to human --pipeline`,
		Args:    cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if err := checkEscalationFlags(cmd, p); err != nil {
				return err
			}
			if pipeline {
				p.Message = bus.PipelineEscalation
			}
			return a.withAdmin(func(admin *bus.Admin) error {
				err := admin.WatchEscalations(cmd.Context(), []bus.EscalationPolicy{p})
				if errors.Is(err, bus.ErrInvalidOption) {
					return usageError{err}
				}
				return err
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&p.Agent, "agent", "", "the agent to watch")
	f.StringVar(&p.Tag, "tag", "", "watch every agent with a skill tagged so (a role), instead of --agent")
	f.DurationVar(&p.After, "after", 0, "how long an outage lasts before it is escalated, e.g. 3m")
	f.StringVar(&p.To, "to", "", "the agent that gets the escalations and recoveries")
	f.BoolVar(&pipeline, "pipeline", false, "send the pipeline protocol's needs_human and info")
	return cmd
}

// checkEscalationFlags checks the policy the flags of escalate make,
// naming the flag at fault; Admin.WatchEscalations only says that the
// policy is invalid, and watches an agent ID that cannot exist forever.
func checkEscalationFlags(cmd *cobra.Command, p bus.EscalationPolicy) error {
	f := cmd.Flags()
	switch {
	case f.Changed("agent") && f.Changed("tag"):
		return usagef("--agent and --tag cannot be used together")
	case f.Changed("agent"):
		if err := checkAgentID("--agent", p.Agent); err != nil {
			return err
		}
	case !f.Changed("tag"):
		return usagef("required flag \"agent\" or \"tag\" not set")
	case p.Tag == "":
		return usagef("--tag: empty")
	}
	if p.After <= 0 {
		return usagef("--after %v: must be > 0", p.After)
	}
	if !f.Changed("to") {
		return usagef("required flag \"to\" not set")
	}
	return checkAgentID("--to", p.To)
}
