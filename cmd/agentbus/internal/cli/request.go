package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) requestCommand() *cobra.Command {
	in := &messageInput{m: bus.Message{Priority: subjects.DefaultPriority}}
	var (
		timeout time.Duration
		asJSON  bool
		follow  bool
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
(Delivery.Progress) as it arrives, one line each, then the reply:

  progress <n> [<percent>%] <message>    (--json: the update as CloudEvents JSON)

Without a reply within --timeout it exits 1 with an error that names the
request. The request is not withdrawn: it stays queued for --to, a reply
that comes later goes to the inbox of --from (marked late), and
'agentbus status ID' shows where the request is.`,
		Example: `  agentbus request --from lead --to worker --type REVIEW --data 'PR 42' --timeout 30s
  agentbus request --from lead --to worker --type REVIEW --data 'PR 42' --json | jq .data`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			switch {
			case timeout <= 0:
				return usagef("--timeout %v: must be > 0", timeout)
			case in.profile != "" && asJSON:
				return usagef("--profile cannot be used with --json")
			}
			m, err := in.message(cmd, a, "from", "to", "type")
			if err != nil {
				return err
			}
			if m.To == bus.Broadcast {
				return usagef("--to '*': a request needs one recipient, not every agent")
			}
			return a.request(cmd.Context(), m, requestFlags{timeout: timeout, profile: in.profile, asJSON: asJSON, follow: follow})
		}),
	}
	in.addFlags(cmd, "from", "to", "type", "priority", "id", "correlation-id", "content-type")
	f := cmd.Flags()
	f.Lookup("from").Usage = "requesting agent, which gets the reply (required)"
	f.Lookup("to").Usage = "agent to ask (required)"
	f.DurationVar(&timeout, "timeout", bus.DefaultRequestTimeout, "how long to wait for the reply, e.g. 30s or 10m")
	f.BoolVar(&asJSON, "json", false, "print the reply as one line of CloudEvents JSON")
	f.BoolVar(&follow, "follow", false, "print the recipient's progress updates as they arrive, before the reply")
	return cmd
}

// requestFlags are how request waits and prints.
type requestFlags struct {
	timeout time.Duration
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
	d, err := b.Request(rctx, m, opts...)
	if err != nil {
		return requestError(err, m, timeout)
	}
	out, err := deliveryOutput(d, profile, asJSON)
	if err != nil {
		return fmt.Errorf("reply %s to request %s: %w", d.ID, m.ID, err)
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

// requestError explains a failed Request of m: for a timeout or an
// interruption, which request it was and where to look for it.
func requestError(err error, m bus.Message, timeout time.Duration) error {
	if !errors.Is(err, bus.ErrRequestTimeout) {
		return fmt.Errorf("request to %s: %w", m.To, err)
	}
	why := "no reply within " + formatDuration(timeout)
	if errors.Is(err, context.Canceled) {
		why = "interrupted before the reply came"
	}
	return fmt.Errorf("request %s to %s: %s; it stays queued for %s, and 'agentbus status %s' shows where it is",
		m.ID, m.To, why, m.To, m.ID)
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
