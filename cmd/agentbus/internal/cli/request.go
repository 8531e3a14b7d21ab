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
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) requestCommand() *cobra.Command {
	in := &messageInput{m: bus.Message{Priority: subjects.DefaultPriority}}
	var (
		timeout, doBy, idle, stall time.Duration
		asJSON, follow             bool
		toGroup                    string
		want                       int
	)
	cmd := &cobra.Command{
		Use:   "request --from AGENT --to AGENT --type TYPE [flags]",
		Short: "Send a request and wait for its reply",
		Long: `Request sends one message from agent --from to agent --to, as publish does,
and waits for its reply: the first message to --from that answers it, as
'agentbus reply' or the library's Bus.Reply sends it. The payload and the
attributes are publish's; --profile NAME sends a native message, addressed
as publish --profile addresses it.

It prints the reply the way subscribe prints a message, on one line:

  default    <time> p<priority> <from> -> <to> <type> id=<id> data=<preview>
  --json     the reply as one line of CloudEvents JSON
  --profile  the native reply, as subscribe --profile prints it

With --follow it first prints each progress update the recipient sends
(Delivery.Progress) as it arrives, one line each, and each question its
handler asks (Delivery.AskInput), then the reply:

  progress <n> [<percent>%] <message>    (--json: the update as CloudEvents JSON)
  input id=<question ID> <question>      answer it with 'agentbus reply'

With --to-group NAME it asks every member of the group (the agents the
registry says are offline are not asked) and prints each reply as it is
gathered, until --want replies came (all by default), --stall passed after
a reply without another, or --timeout; then, on stderr, who replied,
failed, was offline or timed out (docs/groups.md). Fewer replies than
wanted exit 1.

Deadlines (docs/tasks.md): --timeout is the reply-by; a request still
queued then expires unread. --do-by D gives the work a deadline D from now
(the handler's context ends there); --idle-timeout D gives up, and cancels
the request, when D passes without a progress update or the reply.

Without a reply in time it exits 1 with an error that names the request
and the deadline that passed; 'agentbus status ID' shows where the request
is, a reply that comes later goes to the inbox of --from (marked late), and
'agentbus attach ID --agent FROM' takes the request up again. A request canceled while
it waits ('agentbus cancel') exits 1 saying who canceled it, and one
dead-lettered while it waits (its handler rejected it or failed on every
delivery) exits 1 saying why ('agentbus dlq' shows it).`,
		Example: `  agentbus request --from lead --to worker --type REVIEW --data 'PR 42' --timeout 30s
  agentbus request --from lead --to worker --type REVIEW --data 'PR 42' --json | jq .data
  agentbus request --from lead --to worker --type REVIEW --timeout 1h --idle-timeout 2m --follow
  agentbus request --from lead --to-group reviewers --type REVIEW --want 3 --timeout 10m`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			switch {
			case timeout <= 0:
				return usagef("--timeout %v: must be > 0", timeout)
			case in.profile != "" && asJSON:
				return usagef("--profile cannot be used with --json")
			case doBy < 0 || idle < 0 || stall < 0 || want < 0:
				return usagef("--do-by, --idle-timeout, --stall and --want must not be negative")
			case cmd.Flags().Changed("to-group") && cmd.Flags().Changed("to"):
				return usagef("--to and --to-group cannot be used together")
			case !cmd.Flags().Changed("to-group") && (want > 0 || stall > 0):
				return usagef("--want and --stall go with --to-group")
			case cmd.Flags().Changed("to-group") && (follow || doBy > 0 || idle > 0):
				// A Gather has none of them: they were ignored.
				return usagef("--follow, --do-by and --idle-timeout cannot be used with --to-group")
			}
			required := []string{"from", "to", "type"}
			if cmd.Flags().Changed("to-group") {
				if err := checkGroupName("--to-group", toGroup); err != nil {
					return err
				}
				required, in.m.To = []string{"from", "type"}, bus.Broadcast // a stand-in for the checks
			}
			m, err := in.message(cmd, a, required...)
			if err != nil {
				return err
			}
			if toGroup != "" {
				m.To = ""
				return a.gather(cmd.Context(), m, toGroup, gatherFlags{timeout: timeout, want: want, stall: stall, asJSON: asJSON})
			}
			if m.To == bus.Broadcast {
				return usagef("--to '*': a request needs one recipient, not every agent")
			}
			return a.request(cmd.Context(), m, requestFlags{timeout: timeout, doBy: doBy, idle: idle, profile: in.profile, asJSON: asJSON, follow: follow})
		}),
	}
	in.addFlags(cmd, "from", "to", "type", "priority", "id", "correlation-id", "content-type")
	f := cmd.Flags()
	f.Lookup("from").Usage = "requesting agent, which gets the reply (required)"
	f.Lookup("to").Usage = "agent to ask (required)"
	f.DurationVar(&timeout, "timeout", bus.DefaultRequestTimeout, "how long to wait for the reply, e.g. 30s or 10m")
	f.BoolVar(&asJSON, "json", false, "print the reply as one line of CloudEvents JSON")
	f.BoolVar(&follow, "follow", false, "print the recipient's progress updates and questions as they arrive, before the reply")
	f.StringVar(&toGroup, "to-group", "", "ask every member of group `NAME` and gather the replies (instead of --to)")
	f.IntVar(&want, "want", 0, "with --to-group: stop after this many replies (0: all)")
	f.DurationVar(&stall, "stall", 0, "with --to-group: stop when no reply came for this long after one did (0: never)")
	f.DurationVar(&doBy, "do-by", 0, "deadline for the work, from now (0: none)")
	f.DurationVar(&idle, "idle-timeout", 0, "give up, and cancel, after this long without progress or reply (0: none)")
	return cmd
}

func (a *app) attachCommand() *cobra.Command {
	var (
		agent          string
		timeout        time.Duration
		asJSON, follow bool
	)
	cmd := &cobra.Command{
		Use:   "attach ID --agent AGENT [flags]",
		Short: "Take up a request sent earlier and wait for its reply",
		Long: `Attach takes up request ID, which agent --agent sent earlier (with request or
the library's Request), as if it had waited all along: with --follow it
prints the progress updates sent so far, read from the stream, then those
still to come, then the reply, as request prints them. A request that was
answered already prints its reply at once; one that ended without a reply
(canceled, expired, completed) exits 1 saying how it ended.`,
		Example: `  agentbus attach 4b0e6c1e-6a4f-4a7e-9c55-2f1d8e0c9b7a --agent lead --follow`,
		Args:    cobra.ExactArgs(1),
		RunE: run(func(cmd *cobra.Command) error {
			if timeout <= 0 {
				return usagef("--timeout %v: must be > 0", timeout)
			}
			id := cmd.Flags().Arg(0)
			if err := checkMessageID("ID", id); err != nil {
				return err
			}
			return a.withBusAs(agent, func(b *bus.Bus) error {
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				var opts []bus.RequestOption
				if follow {
					opts = append(opts, bus.OnProgress(func(u *bus.Delivery) { a.printProgress(u, asJSON) }))
				}
				d, err := b.Attach(ctx, id, opts...)
				if errors.Is(err, bus.ErrNoStatus) {
					return err // it says whose request it is, if --agent received it
				}
				var de *bus.DeadlineError
				if errors.As(err, &de) && de.Kind == "reply-by" {
					// The request's own reply-by, not --timeout: attach's
					// ends as ErrRequestTimeout alone.
					return fmt.Errorf("request %s to %s: expired at %s (its reply-by) without a reply; 'agentbus status %s' shows where it is",
						id, de.To, de.Deadline.UTC().Format(time.RFC3339), id)
				}
				if err != nil {
					return requestError(err, bus.Message{ID: id}, timeout)
				}
				return a.printReply(d, "", asJSON, id)
			})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&agent, "agent", "", "the agent that sent the request (required)")
	f.DurationVar(&timeout, "timeout", bus.DefaultRequestTimeout, "how long to wait for the reply")
	f.BoolVar(&asJSON, "json", false, "print as CloudEvents JSON")
	f.BoolVar(&follow, "follow", false, "print the progress updates, past and to come, before the reply")
	_ = cmd.MarkFlagRequired("agent")
	return cmd
}

// requestFlags are how request waits and prints.
type requestFlags struct {
	timeout time.Duration
	doBy    time.Duration // 0: none
	idle    time.Duration // 0: none
	profile string
	asJSON  bool
	follow  bool
}

// request sends m, waits up to rf.timeout for its reply and prints it,
// after its progress updates with rf.follow.
func (a *app) request(ctx context.Context, m bus.Message, rf requestFlags) error {
	timeout, profile, asJSON := rf.timeout, rf.profile, rf.asJSON
	// The ID is set here so that a timeout can name the request.
	m.SetDefaults(time.Now())
	b, err := a.connectAs("from", m.From)
	if err != nil {
		return err
	}
	defer b.Close()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var opts []bus.RequestOption
	if rf.follow {
		opts = append(opts, bus.OnProgress(func(u *bus.Delivery) { a.printProgress(u, asJSON) }))
	}
	if rf.doBy > 0 {
		opts = append(opts, bus.DoBy(time.Now().Add(rf.doBy)))
	}
	if rf.idle > 0 {
		opts = append(opts, bus.IdleTimeout(rf.idle))
	}
	d, err := b.Request(rctx, m, opts...)
	if err != nil {
		return requestError(err, m, timeout)
	}
	return a.printReply(d, profile, asJSON, m.ID)
}

// printReply prints d, the reply to request id.
func (a *app) printReply(d *bus.Delivery, profile string, asJSON bool, id string) error {
	out, err := deliveryOutput(d, profile, asJSON)
	if err != nil {
		return fmt.Errorf("reply %s to request %s: %w", d.ID, id, err)
	}
	if _, err := a.stdout.Write(out); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	return nil
}

// printProgress prints one progress update of request --follow.
func (a *app) printProgress(u *bus.Delivery, asJSON bool) {
	if asJSON {
		if out, err := deliveryOutput(u, "", true); err == nil {
			_, _ = a.stdout.Write(out)
		}
		return
	}
	if _, ok := u.IsInputRequest(); ok {
		fmt.Fprintf(a.stdout, "input id=%s %s\n", u.ID, oneLine(string(u.Data)))
		return
	}
	p, n, ok := u.ProgressUpdate()
	if !ok {
		return
	}
	line := "progress " + strconv.Itoa(n)
	if p.Percent != nil {
		line += " " + strconv.Itoa(*p.Percent) + "%"
	}
	if p.Message != "" {
		line += " " + oneLine(p.Message)
	}
	fmt.Fprintln(a.stdout, line)
}

// requestError explains a failed Request of m: for a deadline, a cancel or
// an interruption, which request it was and where to look for it.
func requestError(err error, m bus.Message, timeout time.Duration) error {
	var de *bus.DeadlineError
	var ce *bus.CanceledError
	var dle *bus.DeadLetteredError
	switch {
	case errors.As(err, &ce):
		return fmt.Errorf("request %s: canceled by %s", ce.ID, ce.By)
	case errors.As(err, &dle):
		return fmt.Errorf("%w; 'agentbus dlq list --agent %s' shows it", dle, dle.Agent)
	case errors.As(err, &de) && de.Kind == "idle":
		return fmt.Errorf("request %s to %s: nothing heard for %s; it was canceled", de.ID, de.To, formatDuration(de.Idle))
	case errors.As(err, &de) && de.Kind == "do-by":
		return fmt.Errorf("request %s to %s: its do-by passed; 'agentbus status %s' shows where it is", de.ID, de.To, de.ID)
	case errors.As(err, &de) && de.Kind == "conversation":
		return fmt.Errorf("request %s to %s: its conversation's deadline passed at %s; 'agentbus status %s' shows where it is",
			de.ID, de.To, de.Deadline.UTC().Format(time.RFC3339), de.ID)
	case errors.Is(err, bus.ErrRequestTimeout) && errors.Is(err, context.Canceled):
		return fmt.Errorf("request %s to %s: interrupted before the reply came; 'agentbus attach %s --agent %s' takes it up again", m.ID, m.To, m.ID, m.From)
	case errors.Is(err, bus.ErrRequestTimeout):
		return fmt.Errorf("request %s: no reply within %s; a request still queued expires unread, and 'agentbus status %s' shows where it is",
			m.ID, formatDuration(timeout), m.ID)
	}
	return fmt.Errorf("request %s: %w", m.ID, err)
}

// deliveryOutput renders d as subscribe prints a message, newline included:
// the native message of profile if one is given, else one line of
// CloudEvents JSON with asJSON, else the human-readable line.
func deliveryOutput(d *bus.Delivery, profile string, asJSON bool) ([]byte, error) {
	switch {
	case profile != "":
		return nativeOutput(profile, d)
	case asJSON:
		j, err := codec.MarshalJSON(&d.Message)
		if err != nil {
			return nil, err
		}
		return append(compactJSON(j), '\n'), nil
	}
	return []byte(humanLine(d) + "\n"), nil
}

// gatherFlags are how request --to-group gathers and prints.
type gatherFlags struct {
	timeout, stall time.Duration
	want           int
	asJSON         bool
}

// gather asks the members of group with m, prints each reply gathered,
// then who did what on stderr.
func (a *app) gather(ctx context.Context, m bus.Message, group string, gf gatherFlags) error {
	b, err := a.connectAs("from", m.From)
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(ctx, gf.timeout)
	defer cancel()
	var opts []bus.GatherOption
	if gf.want > 0 {
		opts = append(opts, bus.Want(gf.want))
	}
	if gf.stall > 0 {
		opts = append(opts, bus.StallTimeout(gf.stall))
	}
	res, err := b.GatherGroup(ctx, group, m, opts...)
	if res == nil {
		return fmt.Errorf("request to group %s: %w", group, err)
	}
	for _, d := range res.Replies {
		if perr := a.printReply(d, "", gf.asJSON, res.ID); perr != nil {
			return perr
		}
	}
	var failed []string
	for _, st := range res.Failed {
		failed = append(failed, st.To+" ("+string(st.State)+")")
	}
	replied := make([]string, len(res.Replies))
	for i, d := range res.Replies {
		replied[i] = d.From
	}
	summary := fmt.Sprintf("request %s to group %s: %d replied [%s]; failed [%s]; offline [%s]; timed out [%s]",
		res.ID, group, len(res.Replies), strings.Join(replied, " "), strings.Join(failed, " "),
		strings.Join(res.Offline, " "), strings.Join(res.TimedOut, " "))
	if err != nil {
		return fmt.Errorf("%s: %w", summary, err)
	}
	fmt.Fprintln(a.stderr, summary)
	return nil
}
