package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/codec/profiles"
	"github.com/agentbus/agentbus/subjects"
)

func (a *app) publishCommand() *cobra.Command {
	in := &messageInput{m: bus.Message{Priority: subjects.DefaultPriority}}
	var (
		toGroup string
		sched   scheduleInput
	)
	cmd := &cobra.Command{
		Use:   "publish --from AGENT --to AGENT|'*' --type TYPE [flags]",
		Short: "Publish one message",
		Long: `Publish sends one message from agent --from to agent --to, or to every agent
with --to '*', and waits for the server to store it.

The payload is --data, else the contents of --data-file, else all of stdin.
Attributes left out get defaults: a random UUID for --id, priority 3, the
message ID for --correlation-id, now for the time.

With --profile NAME the payload is a native message of one of the agent
protocols (docs/protocols.md): it is checked by the protocol's rules and sent
byte for byte, and its own fields give the type, ID, conversation, sender,
recipient and priority. --from and --to, when given, override the sender and
recipient on the envelope (the native bytes stay unchanged), and supply them
for formats that carry none; --priority overrides the protocol's priority and
--ttl sets the time to live. --id, --correlation-id and --causation-id supply
what the native message leaves out (a coordination or swarm message has no
ID: give --id to retry it safely) and must agree with what it gives. --type
and --content-type are the profile's and are refused. The message is sent as
its final sender. A native message whose reply field (pipeline's replyTo) names a
message its sender received, and that goes back to that message's sender,
is sent as 'agentbus reply' sends it: in that message's conversation, which
is then recorded replied.

On success it prints one line with the message ID and its stream sequence:

  id=<ID> seq=<N>

The message ID is also the deduplication key: publishing an ID again within
the stream's dedup window (1h by default) stores nothing and prints

  id=<ID> seq=<N> duplicate

with the sequence of the copy stored first. A duplicate is not an error (the
message is on the bus once) and exits 0, so a publish can be retried safely
with the same --id.

With --at, --in, --every or --cron the message is scheduled: the server keeps
it and sends it when due, whether or not any agentbus process still runs
(docs/scheduling.md). It prints the schedule stream's sequence and when it
fires:

  id=<ID> seq=<N> scheduled="@at 2026-12-01T09:00:00Z"

Its status reads scheduled until then; 'agentbus cancel ID --agent FROM'
removes it. --every and --cron repeat it, each firing a message of its own.`,
		Example: `  agentbus publish --from alice --to bob --type PING --data hello
  echo '{"task":"build"}' | agentbus publish --from lead --to '*' --type TASK --priority 1 --content-type application/json
  agentbus publish --profile coordination --to reviewer --file result.json
  agentbus publish --from lead --to worker --type NIGHTLY_BUILD --cron '0 0 2 * * *' --cron-tz Europe/Berlin
  agentbus publish --from lead --to worker --type REMINDER --in 10m --data 'check the deploy'`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			required := []string{"from", "to", "type"}
			if cmd.Flags().Changed("to-group") {
				if cmd.Flags().Changed("to") {
					return usagef("--to and --to-group cannot be used together")
				}
				if err := checkGroupName("--to-group", toGroup); err != nil {
					return err
				}
				required, in.m.To = required[:1], bus.Broadcast // a stand-in for the checks
				required = append(required, "type")
			}
			when, scheduled, err := sched.when(cmd)
			if err != nil {
				return err
			}
			if scheduled && toGroup != "" {
				return usagef("--to-group cannot be scheduled; schedule a message to each member")
			}
			m, err := in.message(cmd, a, required...)
			if err != nil {
				return err
			}
			b, err := a.connectAs("from", m.From)
			if err != nil {
				return err
			}
			defer b.Close()
			if scheduled {
				ack, err := b.Schedule(cmd.Context(), m, when)
				if errors.Is(err, bus.ErrInvalidOption) {
					return usageError{err} // such as a --cron expression the server refuses
				}
				if err != nil {
					return err
				}
				dup := ""
				if ack.Duplicate {
					dup = " duplicate" // the schedule stored first stands
				}
				_, err = fmt.Fprintf(a.stdout, "id=%s seq=%d scheduled=%q%s\n", ack.ID, ack.Sequence, when, dup)
				return err
			}
			if toGroup != "" {
				m.To = ""
				acks, err := b.PublishGroup(cmd.Context(), toGroup, m)
				for _, ack := range acks {
					if ack.Err == nil {
						dup := ""
						if ack.Duplicate {
							dup = " duplicate"
						}
						fmt.Fprintf(a.stdout, "member=%s id=%s seq=%d%s\n", nameField(ack.Member), ack.ID, ack.Sequence, dup)
					}
				}
				return err
			}
			publish := b.Publish
			if in.profile != "" {
				publish = b.PublishAnswer // a protocol's reply field threads, as in PublishNative
			}
			ack, err := publish(cmd.Context(), m)
			if err != nil {
				return err
			}
			return printAck(a.stdout, ack)
		}),
	}
	in.addFlags(cmd, "from", "to", "type", "priority", "id", "correlation-id", "causation-id", "ttl", "content-type")
	cmd.Flags().StringVar(&toGroup, "to-group", "", "send each member of group `NAME` its own copy, instead of --to (prints member=<agent> id=<id> seq=<n> per copy)")
	sched.addFlags(cmd)
	return cmd
}

// scheduleInput is what the schedule flags of publish collect.
type scheduleInput struct {
	at     string
	in     time.Duration
	every  time.Duration
	cron   string
	cronTZ string
}

func (s *scheduleInput) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&s.at, "at", "", "send it at `TIME` (RFC 3339, e.g. 2026-12-01T09:00:00Z), to the second")
	f.DurationVar(&s.in, "in", 0, "send it after `DURATION`, e.g. 10m")
	f.DurationVar(&s.every, "every", 0, "send it every `DURATION` (whole seconds, at least 1s), the first time one interval from now")
	f.StringVar(&s.cron, "cron", "", "send it when cron `EXPR` says: six fields with seconds ('0 30 9 * * 1-5'), or @hourly, @daily, @weekly, @monthly, @yearly")
	f.StringVar(&s.cronTZ, "cron-tz", "", "the IANA time `ZONE` of --cron (default UTC)")
}

// when returns the schedule the flags ask for, and whether they ask for
// one.
func (s *scheduleInput) when(cmd *cobra.Command) (bus.When, bool, error) {
	var set []string
	for _, name := range []string{"at", "in", "every", "cron"} {
		if cmd.Flags().Changed(name) {
			set = append(set, "--"+name)
		}
	}
	switch {
	case len(set) == 0 && s.cronTZ != "":
		return bus.When{}, false, usagef("--cron-tz needs --cron")
	case len(set) == 0:
		return bus.When{}, false, nil
	case len(set) > 1:
		return bus.When{}, false, usagef("%s: choose one", strings.Join(set, " and "))
	case s.cronTZ != "" && s.cron == "":
		return bus.When{}, false, usagef("--cron-tz needs --cron")
	}
	if (s.every != 0 || s.cron != "") && cmd.Flags().Changed("ttl") {
		return bus.When{}, false, usagef("--ttl: a recurring schedule's messages cannot share one expiry")
	}
	switch {
	case s.at != "":
		t, err := time.Parse(time.RFC3339, s.at)
		if err != nil || t.IsZero() {
			return bus.When{}, false, usagef("--at %q: not an RFC 3339 time such as 2026-12-01T09:00:00Z", s.at)
		}
		return bus.At(t), true, nil
	case s.in > 0:
		return bus.In(s.in), true, nil
	case s.every > 0:
		w := bus.Every(s.every)
		if err := w.Validate(); err != nil {
			return bus.When{}, false, usagef("--every %v: whole seconds, at least 1s", s.every)
		}
		return w, true, nil
	case s.cron != "":
		var loc *time.Location
		if s.cronTZ != "" {
			var err error
			if loc, err = time.LoadLocation(s.cronTZ); err != nil {
				return bus.When{}, false, usagef("--cron-tz %q: %v", s.cronTZ, err)
			}
		}
		return bus.Cron(s.cron, loc), true, nil
	}
	switch set[0] {
	case "--at":
		return bus.When{}, false, usagef("--at: needs a time (RFC 3339, such as 2026-12-01T09:00:00Z)")
	case "--cron":
		return bus.When{}, false, usagef("--cron: needs an expression (six fields with seconds, or @daily, ...)")
	}
	return bus.When{}, false, usagef("%s: must be more than zero", set[0])
}

// messageInput is what the flags that make a message collect, for publish,
// request and reply: its attributes, its payload and its protocol profile.
type messageInput struct {
	m        bus.Message // the attribute flags; its values are their defaults
	data     string      // --data
	dataFile string      // --data-file, --file
	profile  string      // --profile
}

// attributeFlags adds, by flag name, the flag that sets one attribute of m,
// with the value m holds as its default.
var attributeFlags = map[string]func(cmd *cobra.Command, m *bus.Message){
	"from": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.From, "from", m.From, "sending agent (required)")
	},
	"to": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.To, "to", m.To, "receiving agent, or '*' for every agent (required)")
	},
	"type": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.Type, "type", m.Type, "message type, e.g. TASK_ASSIGNMENT (required)")
	},
	"priority": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().IntVar(&m.Priority, "priority", m.Priority, "priority from 1, the most urgent, to 5")
	},
	"id": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.ID, "id", m.ID, "message ID and deduplication key (default a random UUID)")
	},
	"correlation-id": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.CorrelationID, "correlation-id", m.CorrelationID, "conversation the message belongs to (default the message ID)")
	},
	"causation-id": func(cmd *cobra.Command, m *bus.Message) {
		f := cmd.Flags()
		f.StringVar(&m.CausationID, "causation-id", m.CausationID, "ID of the message this one answers or follows from")
		// The flag's earlier name.
		f.StringVar(&m.CausationID, "reply-to", m.CausationID, "")
		_ = f.MarkDeprecated("reply-to", "use --causation-id") // the flag exists
	},
	"ttl": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().DurationVar(&m.TTL, "ttl", m.TTL, "how long the message stays deliverable, e.g. 30s or 5m (0: forever)")
	},
	"content-type": func(cmd *cobra.Command, m *bus.Message) {
		cmd.Flags().StringVar(&m.ContentType, "content-type", m.ContentType, "media type of the data, e.g. application/json; a JSON type (application/json, any +json) needs data that is valid JSON")
	},
}

// addFlags adds to cmd the attribute flags named attrs (keys of
// attributeFlags) and the payload flags: --data, --data-file (alias --file)
// and --profile.
func (in *messageInput) addFlags(cmd *cobra.Command, attrs ...string) {
	for _, name := range attrs {
		attributeFlags[name](cmd, &in.m)
	}
	f := cmd.Flags()
	f.StringVar(&in.data, "data", "", "payload")
	f.StringVar(&in.dataFile, "data-file", "", "file whose contents are the payload")
	f.StringVar(&in.dataFile, "file", "", "same as --data-file")
	f.StringVar(&in.profile, "profile", "", "the payload is a native message of this protocol ("+strings.Join(profiles.Names(), ", ")+
		"); its fields address it: --from and --to, when given, override its sender and recipient, --priority its priority")
}

// message returns the message the flags of cmd describe, checked as Publish
// checks it, so that a bad flag is reported as a usage error whether or not
// the server is up. required are the flags a message needs without
// --profile.
func (in *messageInput) message(cmd *cobra.Command, a *app, required ...string) (bus.Message, error) {
	// An empty --id made a random ID: a retry with an unset variable stored
	// a new message each time.
	if err := checkNotEmpty(cmd, "id", "correlation-id", "causation-id", "content-type"); err != nil {
		return bus.Message{}, err
	}
	if cmd.Flags().Changed("priority") && in.m.Priority == 0 {
		return bus.Message{}, usagef("--priority 0: must be 1 (most urgent) to 5")
	}
	// Before the payload is read: a missing flag or an unknown profile is
	// reported at once, not after the user typed a payload.
	var p profiles.Profile
	if in.profile != "" {
		var err error
		if p, err = lookupProfile(in.profile); err != nil {
			return bus.Message{}, err
		}
	} else {
		for _, name := range required {
			if !cmd.Flags().Changed(name) {
				return bus.Message{}, usagef("required flag \"%s\" not set", name)
			}
		}
	}
	payload, err := in.payload(cmd, a)
	if err != nil {
		return bus.Message{}, err
	}
	if p == nil && len(payload) > 0 && isJSONType(in.m.ContentType) && !json.Valid(payload) {
		return bus.Message{}, usagef("%s: not valid JSON for %s", payloadSource(cmd), in.m.ContentType)
	}
	m := in.m
	m.Data = payload
	if p != nil {
		if m, err = in.native(cmd, p, payload); err != nil {
			return bus.Message{}, err
		}
	}
	check := m
	check.SetDefaults(time.Now())
	if err := check.Validate(); err != nil {
		return bus.Message{}, usageError{flagError(err)}
	}
	return m, nil
}

// payload returns --data, else the contents of --data-file, else stdin.
func (in *messageInput) payload(cmd *cobra.Command, a *app) ([]byte, error) {
	f := cmd.Flags()
	if f.Changed("data") && (f.Changed("data-file") || f.Changed("file")) {
		return nil, usagef("--data and --data-file cannot be used together")
	}
	if f.Changed("data") {
		return []byte(in.data), nil
	}
	if (f.Changed("data-file") || f.Changed("file")) && in.dataFile == "" {
		// Not stdin: an empty path is more likely an unset variable.
		return nil, usagef("%s: must not be empty", payloadSource(cmd))
	}
	return a.readData(cmd.Name(), payloadSource(cmd), in.dataFile)
}

// isJSONType reports whether the media type ct declares JSON data, as the
// CloudEvents JSON format reads it: a subtype "json" or one ending in
// "+json" (application/json, application/vnd.api+json), parameters aside.
func isJSONType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	_, sub, ok := strings.Cut(strings.ToLower(strings.TrimSpace(mt)), "/")
	return ok && (sub == "json" || strings.HasSuffix(sub, "+json"))
}

// payloadSource names where the payload of cmd came from, for an error.
func payloadSource(cmd *cobra.Command) string {
	for _, name := range []string{"data", "data-file", "file"} {
		if cmd.Flags().Changed(name) {
			return "--" + name
		}
	}
	return "stdin"
}

// native returns the native message payload of protocol p (--profile) as
// the profile prepares it (profiles.Prepare: decoded, checked by the protocol's rules,
// the findings of a lenient one attached), with --from and --to supplying
// the addressing the format lacks. When given, --from and --to then
// override the sender and recipient on the envelope, --priority the
// priority and --ttl the time to live; --id, --correlation-id and
// --causation-id fill in what the native message leaves out and must
// agree with what it gives; --type and --content-type are usage errors.
// The data, the native bytes, stays unchanged.
func (in *messageInput) native(cmd *cobra.Command, p profiles.Profile, payload []byte) (bus.Message, error) {
	f := cmd.Flags()
	addr := profiles.Addressing{From: in.m.From, To: in.m.To}
	if f.Changed("priority") {
		addr.Priority = in.m.Priority
	}
	m, err := profiles.Prepare(p, payload, addr)
	if err != nil {
		return bus.Message{}, usageError{fmt.Errorf("--profile %s: %w", in.profile, err)}
	}
	if f.Changed("from") {
		m.From = in.m.From
	}
	if f.Changed("to") {
		m.To = in.m.To
	}
	if f.Changed("ttl") {
		m.TTL = in.m.TTL // the native formats carry none
	}
	// The profile names the type and the media type. Before 2026-11-28
	// these flags were passed over without a word, and so were the three
	// below: a publish retried with one --id stored the message twice.
	for _, name := range []string{"type", "content-type"} {
		if f.Changed(name) {
			return bus.Message{}, usagef("--%s does not apply with --profile: the %s profile sets it from the native message", name, in.profile)
		}
	}
	// An ID the format carries no field for, or leaves empty, comes from
	// its flag; one that contradicts the native message is refused, as the
	// protocol's own replies refer to the native one.
	for _, id := range []struct {
		flag   string
		given  string
		native *string
	}{
		{"id", in.m.ID, &m.ID},
		{"correlation-id", in.m.CorrelationID, &m.CorrelationID},
		{"causation-id", in.m.CausationID, &m.CausationID},
	} {
		switch {
		case !f.Changed(id.flag) || id.given == *id.native:
		case *id.native == "":
			*id.native = id.given
		default:
			return bus.Message{}, usagef("--%s %q: the native message gives %q", id.flag, id.given, *id.native)
		}
	}
	return *m, nil
}

// lookupProfile returns the protocol profile --profile names; an unknown
// name is a usage error.
func lookupProfile(name string) (profiles.Profile, error) {
	p, ok := profiles.Lookup(name)
	if !ok {
		return nil, usagef("--profile %q: not one of %s", name, strings.Join(profiles.Names(), ", "))
	}
	return p, nil
}

// readData reads the payload of command name from file, given by flag, or
// from stdin when file is "". A file that cannot be read is a usage error
// naming the flag.
func (a *app) readData(name, flag, file string) ([]byte, error) {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, usageError{fmt.Errorf("%s: %w", flag, err)}
		}
		return data, nil
	}
	if f, ok := a.stdin.(*os.File); ok && isTerminal(f) {
		fmt.Fprintf(a.stderr, "agentbus %s: reading the payload from the terminal; end it with Ctrl-D\n", name)
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
	"CausationID":   "causation-id",
	"TTL":           "ttl",
	"ContentType":   "content-type",
}

// flagError names the flag at fault in a validation error, with the value
// and the rule it breaks: "--priority 9: invalid priority: 9 is outside
// 1..5". It wraps err.
func flagError(err error) error {
	var fe *codec.FieldError
	if errors.As(err, &fe) {
		if name, ok := messageFlags[fe.Field]; ok {
			return &flagErr{flag: "--" + name, value: fe.Value, err: err, rule: fe.Err}
		}
	}
	return err
}

// flagErr is a validation error of one publish flag, or of an argument
// such as a message ID.
type flagErr struct {
	flag, value string // flag: "--priority", or an argument's name
	rule        error  // why value is refused
	err         error  // the whole validation error
}

func (e *flagErr) Error() string {
	rule := e.rule.Error()
	// The packages' "codec: " and "subjects: " prefixes say nothing to a
	// user of the command line.
	for _, p := range []string{"codec: ", "subjects: "} {
		rule = strings.ReplaceAll(rule, p, "")
	}
	if e.value == "" {
		return fmt.Sprintf("%s: %s", e.flag, rule)
	}
	v := e.value
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	if strings.IndexFunc(v, func(r rune) bool { return r == '"' || !unicode.IsGraphic(r) || unicode.IsSpace(r) }) >= 0 {
		v = strconv.Quote(v)
	}
	return fmt.Sprintf("%s %s: %s", e.flag, v, rule)
}

func (e *flagErr) Unwrap() error { return e.err }

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
