package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) groupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "group",
		Short: "Manage groups of agents: join, leave, add, remove, list, watch",
		Long: `Groups are named sets of agents kept in the registry (docs/groups.md). A
message to a group ('agentbus publish --to-group', Bus.PublishGroup) reaches
each member's own inbox; 'agentbus request --to-group' asks every member and
gathers the replies. An agent joins and leaves itself; an operator adds and
removes anyone. Group names follow the rules of agent IDs.`,
		Args: cobra.NoArgs,
	}
	var agent string
	join := &cobra.Command{
		Use:   "join NAME --agent AGENT",
		Short: "Join group NAME as AGENT",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if err := checkGroupName("NAME", cmd.Flags().Arg(0)); err != nil {
				return err
			}
			return a.withBusAs(agent, func(b *bus.Bus) error { return b.JoinGroup(cmd.Context(), cmd.Flags().Arg(0)) })
		}),
	}
	leave := &cobra.Command{
		Use:   "leave NAME --agent AGENT",
		Short: "Leave group NAME as AGENT",
		Args:  cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if err := checkGroupName("NAME", cmd.Flags().Arg(0)); err != nil {
				return err
			}
			return a.withBusAs(agent, func(b *bus.Bus) error { return b.LeaveGroup(cmd.Context(), cmd.Flags().Arg(0)) })
		}),
	}
	for _, c := range []*cobra.Command{join, leave} {
		c.Flags().StringVar(&agent, "agent", "", "the agent that joins or leaves (required)")
		_ = c.MarkFlagRequired("agent")
	}
	var query bus.AgentQuery
	add := &cobra.Command{
		Use:   "add NAME [AGENT...] [--skill SKILL] [--tag TAG]",
		Short: "Add agents to group NAME, as an operator",
		Long: `Add makes the agents named members of group NAME, as an operator. With
--skill or --tag it also adds every registered agent whose card has that
skill (a skill ID) or a skill with that tag, both when both are given, and
prints their names, one per line; an agent that registers later is not
added. A query that finds no agent, with no AGENT named, exits 1.`,
		Example: `  agentbus group add reviewers r1 r2
  agentbus group add reviewers --skill review`,
		Args: cobra.MinimumNArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			args := cmd.Flags().Args()
			byQuery := query.Skill != "" || query.Tag != ""
			if len(args) == 1 && !byQuery {
				return usagef("name the agents to add, or select them with --skill or --tag")
			}
			if err := checkGroupArgs(args); err != nil {
				return err
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				if err := setMembers(cmd.Context(), admins, args[0], args[1:], (*bus.Admin).AddToGroup); err != nil || !byQuery {
					return err
				}
				found, err := onEveryShard(admins, func(admin *bus.Admin) ([]string, error) {
					return admin.AddMatchingToGroup(cmd.Context(), args[0], query)
				})
				if err != nil {
					return err
				}
				added := slices.Sorted(slices.Values(slices.Concat(found...)))
				if len(added) == 0 && len(args) == 1 {
					return fmt.Errorf("no registered agent has %s", describeQuery(query))
				}
				for _, name := range added {
					fmt.Fprintln(a.stdout, name)
				}
				return nil
			})
		}),
	}
	add.Flags().StringVar(&query.Skill, "skill", "", "add every registered agent with this skill ID")
	add.Flags().StringVar(&query.Tag, "tag", "", "add every registered agent with a skill tagged so")
	remove := &cobra.Command{
		Use:   "remove NAME AGENT...",
		Short: "Remove agents from group NAME, as an operator",
		Args:  cobra.MinimumNArgs(2),
		RunE: run(func(cmd *cobra.Command) error {
			args := cmd.Flags().Args()
			if err := checkGroupArgs(args); err != nil {
				return err
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				return setMembers(cmd.Context(), admins, args[0], args[1:], (*bus.Admin).RemoveFromGroup)
			})
		}),
	}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [NAME]",
		Short: "List the groups and their members, or the members of NAME",
		Long: `List prints one line per group, "<group> <member> <member> ...", by name; with
NAME only that group's members, one per line. --json prints a JSON object of
groups to sorted member arrays. A name with a space or a quote is written as
a quoted Go string.`,
		Args: cobra.MaximumNArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if cmd.Flags().NArg() == 1 {
				if err := checkGroupName("NAME", cmd.Flags().Arg(0)); err != nil {
					return err
				}
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				groups, err := groupsOnShards(cmd.Context(), admins, cmd.Flags().Arg(0))
				if err != nil {
					return err
				}
				if cmd.Flags().NArg() == 1 {
					members := append([]string{}, groups[cmd.Flags().Arg(0)]...)
					if asJSON {
						return a.printJSON(members)
					}
					for _, m := range members {
						fmt.Fprintln(a.stdout, m)
					}
					return nil
				}
				if asJSON {
					return a.printJSON(groups)
				}
				for _, g := range slices.Sorted(maps.Keys(groups)) {
					fields := []string{nameField(g)}
					for _, m := range groups[g] {
						fields = append(fields, nameField(m))
					}
					fmt.Fprintln(a.stdout, strings.Join(fields, " "))
				}
				return nil
			})
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	watch := &cobra.Command{
		Use:   "watch [NAME]",
		Short: "Print every membership as it stands, then each change",
		Long: `Watch prints the memberships of every group (or of NAME) as they stand, then
each change as it happens, until SIGINT or SIGTERM, one line each:

  <time> <group> <agent> joined [by <who>]
  <time> <group> <agent> left`,
		Args: cobra.MaximumNArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if cmd.Flags().NArg() == 1 {
				if err := checkGroupName("NAME", cmd.Flags().Arg(0)); err != nil {
					return err // an empty NAME would watch every group
				}
			}
			printChange := func(c bus.GroupChange) {
				line := c.At.UTC().Format(time.RFC3339) + " " + nameField(c.Group) + " " + nameField(c.Agent)
				if c.Joined {
					line += " joined by " + nameField(c.By)
				} else {
					line += " left"
				}
				fmt.Fprintln(a.stdout, line)
			}
			return a.withAdmins(func(admins []*bus.Admin) error {
				return watchEveryShard(cmd.Context(), admins, printChange, func(admin *bus.Admin, ctx context.Context, f func(bus.GroupChange)) error {
					return admin.WatchGroups(ctx, cmd.Flags().Arg(0), f)
				})
			})
		}),
	}
	cmd.AddCommand(join, leave, add, remove, list, watch)
	return cmd
}

// setMembers adds agents to group, or removes them (set), as an operator,
// each on its own shard: where its membership is kept.
func setMembers(ctx context.Context, admins []*bus.Admin, group string, agents []string,
	set func(*bus.Admin, context.Context, string, ...string) error) error {
	for _, agent := range agents {
		k, err := subjects.ShardOf(agent, len(admins))
		if err != nil {
			return usageError{err}
		}
		if err := set(admins[k], ctx, group, agent); err != nil {
			return onShard(admins, k, err)
		}
	}
	return nil
}

// groupsOnShards reads the groups of every shard, or group's alone when it
// is not empty, and merges their members: each agent's membership is kept
// on its own shard.
func groupsOnShards(ctx context.Context, admins []*bus.Admin, group string) (map[string][]string, error) {
	found, err := onEveryShard(admins, func(admin *bus.Admin) (map[string][]string, error) {
		if group != "" {
			members, err := admin.GroupMembers(ctx, group)
			return map[string][]string{group: members}, err
		}
		return admin.Groups(ctx)
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, groups := range found {
		for g, members := range groups {
			if len(members) > 0 {
				out[g] = append(out[g], members...)
			}
		}
	}
	for g, members := range out {
		slices.Sort(members)
		out[g] = slices.Compact(members)
	}
	return out, nil
}

// checkGroupArgs checks the arguments NAME AGENT... of group add and
// remove.
func checkGroupArgs(args []string) error {
	if err := checkGroupName("NAME", args[0]); err != nil {
		return err
	}
	return checkAgentIDs("AGENT", args[1:])
}

// describeQuery says what group add --skill/--tag looked for.
func describeQuery(q bus.AgentQuery) string {
	var parts []string
	if q.Skill != "" {
		parts = append(parts, "skill "+q.Skill)
	}
	if q.Tag != "" {
		parts = append(parts, "a skill tagged "+q.Tag)
	}
	return strings.Join(parts, " and ")
}
