package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
)

func (a *app) publishCommand() *cobra.Command {
	var (
		m        bus.Message
		data     string
		dataFile string
		profile  string
	)
	cmd := &cobra.Command{
		Use:   "publish --from AGENT --to AGENT|'*' --type TYPE [flags]",
		Short: "Publish one message",
		Long: `Publish sends one message from agent --from to agent --to, or to every agent
with --to '*', and waits for the server to store it.

The payload is --data, else the contents of --data-file, else all of stdin.
Attributes left out get defaults: a random UUID for --id, priority 3, the
message ID for --correlation-id, now for the time.

On success it prints one line with the message ID and its stream sequence:

  id=<ID> seq=<N>

The message ID is also the deduplication key: publishing an ID again within
the stream's dedup window (1h by default) stores nothing and prints

  id=<ID> seq=<N> duplicate

with the sequence of the copy stored first. A duplicate is not an error (the
message is on the bus once) and exits 0, so a publish can be retried safely
with the same --id.`,
		Example: `  agentbus publish --from alice --to bob --type PING --data hello
  echo '{"task":"build"}' | agentbus publish --from lead --to '*' --type TASK --priority 1 --content-type application/json`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if cmd.Flags().Changed("data") && (cmd.Flags().Changed("data-file") || cmd.Flags().Changed("file")) {
				return usagef("--data and --data-file cannot be used together")
			}
			m.Data = []byte(data)
			if !cmd.Flags().Changed("data") {
				var err error
				if m.Data, err = a.readData(dataFile); err != nil {
					return err
				}
			}
			if profile != "" {
				return a.publishNative(cmd, profile, m)
			}
			for _, name := range []string{"from", "to", "type"} {
				if !cmd.Flags().Changed(name) {
					return usagef("required flag \"%s\" not set", name)
				}
			}
			// Check the message before connecting, so that a bad flag is
			// reported as such whether or not the server is up.
			if m.Priority == 0 {
				return usagef("--priority 0: must be 1 (most urgent) to 5")
			}
			check := m
			check.SetDefaults(time.Now())
			if err := check.Validate(); err != nil {
				return usageError{flagError(err)}
			}
			b, err := a.connect(m.From, bus.WithRoot(a.root))
			if err != nil {
				if errors.Is(err, bus.ErrInvalidOption) {
					return usageError{err}
				}
				return err
			}
			defer b.Close()
			ack, err := b.Publish(cmd.Context(), m)
			if err != nil {
				return err
			}
			return printAck(a.stdout, ack)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&m.From, "from", "", "sending agent (required)")
	f.StringVar(&m.To, "to", "", "receiving agent, or '*' for every agent (required)")
	f.StringVar(&m.Type, "type", "", "message type, e.g. TASK_ASSIGNMENT (required)")
	f.IntVar(&m.Priority, "priority", 3, "priority from 1, the most urgent, to 5")
	f.StringVar(&m.ID, "id", "", "message ID and deduplication key (default a random UUID)")
	f.StringVar(&m.CorrelationID, "correlation-id", "", "conversation the message belongs to (default the message ID)")
	f.StringVar(&m.ReplyTo, "reply-to", "", "ID of the message this one answers")
	f.DurationVar(&m.TTL, "ttl", 0, "how long the message stays deliverable, e.g. 30s or 5m (0: forever)")
	f.StringVar(&m.ContentType, "content-type", "", "media type of the data, e.g. application/json")
	f.StringVar(&data, "data", "", "payload")
	f.StringVar(&dataFile, "data-file", "", "file whose contents are the payload")
	f.StringVar(&dataFile, "file", "", "same as --data-file")
	f.StringVar(&profile, "profile", "", "the payload is a native message of this protocol ("+strings.Join(profiles.Names(), ", ")+"); addressing and priority come from it: --from and --to fill in what the format lacks, --priority overrides")
	return cmd
}

// publishNative publishes the native message m.Data of the named protocol
// profile. --from and --to fill in what the format does not carry (front
// matter, swarm); --priority overrides the protocol's priority; the bus
// identity is the native sender.
func (a *app) publishNative(cmd *cobra.Command, name string, m bus.Message) error {
	p, ok := profiles.Lookup(name)
	if !ok {
		return usagef("--profile %q: not one of %s", name, strings.Join(profiles.Names(), ", "))
	}
	addr := profiles.Addressing{From: m.From, To: m.To}
	if cmd.Flags().Changed("priority") {
		addr.Priority = m.Priority
	}
	native, err := p.Decode(m.Data, addr)
	if err != nil {
		return usageError{fmt.Errorf("--profile %s: %w", name, err)}
	}
	b, err := a.connect(native.From, bus.WithRoot(a.root))
	if err != nil {
		if errors.Is(err, bus.ErrInvalidOption) || errors.Is(err, bus.ErrInvalidAgentID) {
			return usageError{err}
		}
		return err
	}
	defer b.Close()
	ack, err := b.PublishNative(cmd.Context(), p, m.Data, addr)
	if err != nil {
		return err
	}
	return printAck(a.stdout, ack)
}

// readData reads the payload from file, or from stdin when file is "".
func (a *app) readData(file string) ([]byte, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--data-file: %w", err)
		}
		return data, nil
	}
	if f, ok := a.stdin.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprintln(a.stderr, "agentbus publish: reading the payload from the terminal; end it with Ctrl-D")
		}
	}
	data, err := io.ReadAll(a.stdin)
	if err != nil {
		return nil, fmt.Errorf("read stdin: %w", err)
	}
	return data, nil
}

// messageFlags names the publish flag that sets each codec.Message field.
var messageFlags = map[string]string{
	"ID":            "id",
	"From":          "from",
	"To":            "to",
	"Type":          "type",
	"Priority":      "priority",
	"CorrelationID": "correlation-id",
	"ReplyTo":       "reply-to",
	"TTL":           "ttl",
	"ContentType":   "content-type",
}

// flagError names the flag at fault in a validation error.
func flagError(err error) error {
	var fe *codec.FieldError
	if errors.As(err, &fe) {
		if name, ok := messageFlags[fe.Field]; ok {
			return fmt.Errorf("--%s: %w", name, err)
		}
	}
	return err
}

// printAck prints a publish receipt: "id=<ID> seq=<N>", with " duplicate"
// when the server already had the ID.
func printAck(w io.Writer, ack bus.PubAck) error {
	dup := ""
	if ack.Duplicate {
		dup = " duplicate"
	}
	_, err := fmt.Fprintf(w, "id=%s seq=%d%s\n", ack.ID, ack.Sequence, dup)
	return err
}
