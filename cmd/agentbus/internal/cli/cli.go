package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/subjects"
)

// Exit codes of Main.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad flags or arguments; nothing was attempted
	exitShort = 3 // subscribe --count: --timeout passed with fewer messages handled
)

// defaultServer is the server a command talks to when neither --server nor
// $NATS_URL names one.
const defaultServer = "nats://127.0.0.1:4222"

// defaultRoot is the subject root when --root is not given; it matches the
// bus package's default.
const defaultRoot = "agentbus"

// Main runs the agentbus command line with args (without the program name)
// and returns the process exit code: 0 on success, 2 for a usage error (an
// unknown command or flag, a missing or conflicting flag), 1 for any other
// error. A failure is reported as exactly one line "agentbus: <error>" on
// stderr. ctx ends long-running commands (serve, subscribe) cleanly; the
// caller cancels it on SIGINT or SIGTERM.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{
		stdin:  stdin,
		stdout: &syncWriter{w: stdout},
		stderr: &syncWriter{w: stderr},
		server: os.Getenv("NATS_URL"),
	}
	if a.server == "" {
		a.server = defaultServer
	}
	defer a.stdout.close()
	defer a.stderr.close()
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	err := root.ExecuteContext(ctx)
	if a.telemetry != nil {
		if terr := a.telemetry.close(ctx); terr != nil {
			a.warnf("flush telemetry: %v", terr)
		}
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(a.stderr, "agentbus: %s\n", redactURLs(oneLine(err.Error()), a.server))
	var re runError
	var short shortError
	switch {
	case errors.As(err, &short):
		return exitShort
	case errors.As(err, &re):
		return exitError
	}
	return exitUsage
}

// app holds what every command shares: the streams and the global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr *syncWriter

	server      string    // --server
	conn        connFlags // --creds, --nkey, --user, --password, --tls*
	root        string    // --root
	shards      int       // --shards
	traceStderr bool      // --trace-stderr
	command     string    // the command run, "agentbus dlq list"

	telemetry *telemetry // set up before a command runs; nil before
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "agentbus",
		Short: "A durable message bus for multi-agent systems on NATS JetStream",
		Long: `agentbus is a durable message bus for multi-agent systems on NATS JetStream.
Every message is a CloudEvent addressed from one agent to another, or to
every agent ('*'), at a priority from 1 (most urgent) to 5.

Start a server with 'agentbus serve', or point --server (or $NATS_URL) at a
NATS server with JetStream and run 'agentbus provision' once. Then publish
with 'agentbus publish' and consume an agent's inbox with 'agentbus subscribe'.

Every command that connects authenticates and secures its connection as the
nats CLI does: --creds, --nkey, --user and --password (or user:password@ in
the server URL), and --tlsca, --tlscert and --tlskey for TLS; each has the
nats CLI's environment variable as its default. See docs/security.md.

Exit status: 0 on success, 2 for a usage error, 3 when subscribe --count
stopped at --timeout with fewer messages, 1 for any other error. An error
is reported as one line "agentbus: <error>" on stderr.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		CompletionOptions: cobra.CompletionOptions{
			HiddenDefaultCmd: true,
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", a.server, "NATS server URL, comma-separated for a cluster; $NATS_URL sets the default")
	a.conn.addFlags(root)
	pf.StringVar(&a.root, "root", cmp.Or(os.Getenv("AGENTBUS_ROOT"), defaultRoot), "subject root of the bus; every process of one bus must use the same; $AGENTBUS_ROOT sets the default")
	pf.IntVar(&a.shards, "shards", envInt("AGENTBUS_SHARDS", 1), "shards of the installation under --root (provision --shards), 1 to "+strconv.Itoa(subjects.MaxShards)+": an agent's commands reach each agent on its shard; every process must use the same; $AGENTBUS_SHARDS sets the default")
	pf.BoolVar(&a.traceStderr, "trace-stderr", false, "print OpenTelemetry spans to stderr, one JSON object a line; OTEL_EXPORTER_OTLP_ENDPOINT sends spans and metrics over OTLP/HTTP (docs/observability.md)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		a.command = cmd.CommandPath()
		if err := a.checkRootAndShards(cmd); err != nil {
			return err
		}
		t, err := a.setupTelemetry(cmd.Context(), a.traceStderr)
		if err != nil {
			return runError{err}
		}
		a.telemetry = t
		return nil
	}
	root.AddCommand(
		a.serveCommand(),
		a.provisionCommand(),
		a.publishCommand(),
		a.subscribeCommand(),
		a.requestCommand(),
		a.replyCommand(),
		a.statusCommand(),
		a.cancelCommand(),
		a.attachCommand(),
		a.groupCommand(),
		a.traceCommand(),
		a.historyCommand(),
		a.redeliverCommand(),
		a.agentsCommand(),
		a.dlqCommand(),
		a.benchCommand(),
		a.demoCommand(),
		a.authCommand(),
	)
	root.InitDefaultCompletionCmd() // now, for refuseUnknownSubcommands to see it
	refuseUnknownSubcommands(root)
	return root
}

// checkRootAndShards checks the global --root and --shards once for every
// command, whether or not it reads them, naming the flag at fault, and
// the variables that set global flags' defaults.
func (a *app) checkRootAndShards(cmd *cobra.Command) error {
	if err := checkNotEmpty(cmd, "root", "server"); err != nil {
		return err // "" would be the default root, or nats.go's default URL
	}
	if _, err := subjects.New(a.root); err != nil {
		return usageError{&flagErr{flag: "--root", rule: err, err: err}} // the rule quotes the root
	}
	// A variable that is not a value of its flag is refused, not passed
	// over for the flag's default: a process on one shard of several
	// would send where nobody reads.
	if v := os.Getenv("AGENTBUS_SHARDS"); v != "" && !cmd.Flags().Changed("shards") {
		if _, err := strconv.Atoi(v); err != nil {
			return usagef("$AGENTBUS_SHARDS %q: not a number of shards, 1 to %d", v, subjects.MaxShards)
		}
	}
	if v := os.Getenv("AGENTBUS_TLSFIRST"); v != "" && !cmd.Flags().Changed("tlsfirst") {
		if _, err := strconv.ParseBool(v); err != nil {
			return usagef("$AGENTBUS_TLSFIRST %q: not true or false", v)
		}
	}
	if a.shards < 1 || a.shards > subjects.MaxShards {
		return usagef("--shards %d: not 1 to %d", a.shards, subjects.MaxShards)
	}
	// The last shard's root is the longest.
	if _, err := subjects.ShardRoot(a.root, a.shards-1, a.shards); err != nil {
		return usageError{&flagErr{flag: "--root", rule: fmt.Errorf("with --shards %d: %w", a.shards, err), err: err}}
	}
	return nil
}

// refuseUnknownSubcommands makes each command under cmd that only groups
// subcommands (dlq, group, auth) refuse an argument that names none of
// them as an unknown command, a usage error, as the root does; cobra would
// print the command's help and exit 0. Without arguments it still prints
// its help.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
	if !cmd.HasParent() || !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return errors.New(msg)
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
}

// run adapts a command body to cobra. Errors it returns are runtime errors
// (exit 1) unless the body marked them as usage errors; everything cobra
// reports on its own (flags, arguments) is a usage error (exit 2).
func run(body func(cmd *cobra.Command) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		err := body(cmd)
		if err == nil {
			return nil
		}
		var ue usageError
		if errors.As(err, &ue) {
			return err
		}
		return runError{err}
	}
}

// runError is an error from a command that ran.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// usageError is a bad combination of flags found by a command's body.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// checkAgentID returns a usage error naming what, a flag ("--agent") or
// an argument ("NAME"), unless id can name an agent or a group
// (subjects.ValidateID).
func checkAgentID(what, id string) error {
	if err := subjects.ValidateID(id); err != nil {
		return usageError{&flagErr{flag: what, rule: err, err: err}} // the rule quotes id
	}
	return nil
}

// checkGroupName returns a usage error naming what ("NAME", "--to-group")
// unless name can name a group: group names follow the rules of agent IDs,
// and the library checks them as it builds a group's keys.
func checkGroupName(what, name string) error {
	if _, err := subjects.GroupMemberKeys(name); err != nil {
		return usageError{&flagErr{flag: what, rule: err, err: err}} // the rule quotes name
	}
	return nil
}

// checkNotEmpty refuses an empty value given to one of the flags names of
// cmd, whose "" would mean a default or the current directory: an explicit
// "" is more likely an unset shell variable than a request for that.
func checkNotEmpty(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed && f.Value.String() == "" {
			return usagef("--%s: must not be empty", name)
		}
	}
	return nil
}

// checkAgentIDs is checkAgentID for each of ids.
func checkAgentIDs(what string, ids []string) error {
	for _, id := range ids {
		if err := checkAgentID(what, id); err != nil {
			return err
		}
	}
	return nil
}

// checkMessageID returns a usage error naming what, an argument ("ID",
// "CORRELATION_ID") or a flag, unless id can be the ID of a message or a
// conversation (codec.ValidateID): one that cannot is not looked for.
func checkMessageID(what, id string) error {
	err := codec.ValidateID(what, id)
	if err == nil {
		return nil
	}
	var fe *codec.FieldError
	if errors.As(err, &fe) {
		return usageError{&flagErr{flag: what, value: id, rule: fe.Err, err: err}}
	}
	return usageError{err}
}

// envInt returns the integer environment variable name holds, or def if
// it is unset or not an integer (checkRootAndShards then refuses it).
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// nameField writes an agent's or a group's name as one field of a text line:
// as it is, or quoted as a Go string when it holds a space or a quote
// (IDs may), so that the line still splits on spaces into its fields.
func nameField(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == '"' }) {
		return strconv.Quote(s)
	}
	return s
}

// oneLine folds a possibly multi-line message, such as cobra's "did you
// mean" suggestions, onto one line.
func oneLine(s string) string {
	// strings.Fields splits at every space, tab and line break (\r too,
	// which let a line overwrite the start of its own in a terminal).
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
}

// syncWriter serializes writes from concurrent handlers so that lines never
// interleave, and drops what comes after close: a connection's callbacks can
// report an error after the command returned, when Main's caller may be
// reading what was written.
type syncWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return len(p), nil
	}
	return s.w.Write(p)
}

// close makes later writes no-ops.
func (s *syncWriter) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// file returns the underlying *os.File, if it is one, for a child process
// to inherit directly.
func (s *syncWriter) file() (*os.File, bool) {
	f, ok := s.w.(*os.File)
	return f, ok
}

// warnf reports a condition that does not stop the command on stderr.
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "agentbus: warning: %s\n", oneLine(fmt.Sprintf(format, args...)))
}

// formatDuration prints d like time.Duration.String without the zero
// minutes and seconds that make "48h0m0s" of 48h.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// connFlags are the global flags that say how a command authenticates to
// the server and secures its connection, spelled as in the nats CLI. An
// empty flag takes its default from the nats CLI's environment variable
// when the options are built, so that --help never shows a secret.
type connFlags struct {
	creds    string // --creds, $NATS_CREDS
	nkey     string // --nkey, $NATS_NKEY
	user     string // --user, $NATS_USER
	password string // --password, $NATS_PASSWORD
	tlsCA    string // --tlsca, $NATS_CA
	tlsCert  string // --tlscert, $NATS_CERT
	tlsKey   string // --tlskey, $NATS_KEY
	tlsFirst bool   // --tlsfirst
}

// addFlags adds the flags to cmd and its subcommands.
func (c *connFlags) addFlags(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&c.creds, "creds", "", "user credentials (JWT and nkey seed) file; $NATS_CREDS sets the default")
	fs.StringVar(&c.nkey, "nkey", "", "user nkey seed file; $NATS_NKEY sets the default")
	fs.StringVar(&c.user, "user", "", "user name, or a token without --password; $NATS_USER sets the default")
	fs.StringVar(&c.password, "password", "", "password of --user; $NATS_PASSWORD sets the default")
	fs.StringVar(&c.tlsCA, "tlsca", "", "CA certificate file to verify the server's certificate with; $NATS_CA sets the default")
	fs.StringVar(&c.tlsCert, "tlscert", "", "client certificate file, for servers that verify clients; $NATS_CERT sets the default")
	fs.StringVar(&c.tlsKey, "tlskey", "", "private key file of --tlscert; $NATS_KEY sets the default")
	tlsFirst, _ := strconv.ParseBool(os.Getenv("AGENTBUS_TLSFIRST")) // checked by checkRootAndShards
	fs.BoolVar(&c.tlsFirst, "tlsfirst", tlsFirst, "start with the TLS handshake, for servers configured with handshake_first; $AGENTBUS_TLSFIRST (true or false) sets the default")
}

// withEnv returns c with every empty flag set from its environment
// variable, looked up with getenv. An identity the flags give (--creds,
// --nkey or --user) is the identity: the environment's others are not
// read, and $NATS_PASSWORD only goes with a user. Before 2026-11-28 an
// exported $NATS_CREDS made every --user a usage error.
func (c connFlags) withEnv(getenv func(string) string) connFlags {
	flagIdentity := c.creds != "" || c.nkey != "" || c.user != ""
	for _, f := range []struct {
		v        *string
		env      string
		identity bool
	}{
		{&c.creds, "NATS_CREDS", true},
		{&c.nkey, "NATS_NKEY", true},
		{&c.user, "NATS_USER", true},
		{&c.tlsCA, "NATS_CA", false},
		{&c.tlsCert, "NATS_CERT", false},
		{&c.tlsKey, "NATS_KEY", false},
	} {
		if *f.v == "" && !(f.identity && flagIdentity) {
			*f.v = getenv(f.env)
		}
	}
	if c.password == "" && c.user != "" {
		c.password = getenv("NATS_PASSWORD")
	}
	return c
}

// natsOptions returns the nats.Connect options that c asks for. A
// contradiction between flags is a usage error; a credential that cannot
// be read is a runtime error.
func (c connFlags) natsOptions() ([]nats.Option, error) {
	opts, err := c.identityOptions()
	if err != nil {
		return nil, err
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return nil, usagef("--tlscert and --tlskey go together")
	}
	if c.tlsCA != "" {
		opts = append(opts, nats.RootCAs(c.tlsCA))
	}
	if c.tlsCert != "" {
		opts = append(opts, nats.ClientCert(c.tlsCert, c.tlsKey))
	}
	if c.tlsFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	return opts, nil
}

// identityOptions returns the nats.Connect option of the identity that
// --creds, --nkey, or --user and --password name, or none, leaving TLS
// aside.
func (c connFlags) identityOptions() ([]nats.Option, error) {
	var ids []string
	for _, f := range []struct{ name, v string }{{"--creds", c.creds}, {"--nkey", c.nkey}, {"--user", c.user}} {
		if f.v != "" {
			ids = append(ids, f.name)
		}
	}
	switch {
	case len(ids) > 1:
		return nil, usagef("%s cannot be used together: give one identity", strings.Join(ids, " and "))
	case c.password != "" && c.user == "":
		return nil, usagef("--password needs --user")
	}
	var opts []nats.Option
	switch {
	case c.creds != "":
		opts = append(opts, nats.UserCredentials(c.creds))
	case c.nkey != "":
		opt, err := nats.NkeyOptionFromSeed(c.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %s: %w", c.nkey, err)
		}
		opts = append(opts, opt)
	case c.user != "" && c.password == "":
		opts = append(opts, nats.Token(c.user))
	case c.user != "":
		opts = append(opts, nats.UserInfo(c.user, c.password))
	}
	return opts, nil
}

// natsOptions returns the nats.Connect options of the global connection
// flags, with their environment defaults.
func (a *app) natsOptions() ([]nats.Option, error) {
	if err := checkServerURLs(a.server); err != nil {
		return nil, err
	}
	opts, err := a.conn.withEnv(os.Getenv).natsOptions()
	if err != nil {
		return nil, err
	}
	return append(opts, a.connectionWarnings()...), nil
}

// connectionWarnings report a connection lost, and found again, as
// warnings: a command that runs on (subscribe, a watch) would otherwise go
// quiet while its server is away, as if nothing happened.
func (a *app) connectionWarnings() []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: the command closed it
				a.warnf("connection to %s lost: %v; reconnecting", bus.RedactURLs(a.server), err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			a.warnf("reconnected to %s", nc.ConnectedUrlRedacted())
		}),
	}
}

// checkServerURLs refuses a --server URL whose scheme a NATS client does
// not speak, such as http:// (the monitoring port), which nats.go would
// otherwise dial as if it were nats://.
func checkServerURLs(servers string) error {
	for _, u := range strings.Split(servers, ",") {
		scheme, _, ok := strings.Cut(strings.TrimSpace(u), "://")
		if !ok {
			continue // host:port, dialled as nats://
		}
		switch strings.ToLower(scheme) {
		case "nats", "tls", "ws", "wss":
		default:
			return usagef("--server %s: scheme %q is not one a NATS client speaks (nats://, tls://, ws://, wss://)", redactURLs(strings.TrimSpace(u), u), scheme)
		}
	}
	return nil
}

// dial connects to --server for commands that need a bare connection. The
// context it returns, derived from ctx, ends as soon as the server refuses
// one of the connection's requests for its permissions, with the refusal
// as its cause (see refused): the server reports a refusal on the
// connection, not to the request, which would otherwise wait out its
// timeout.
func (a *app) dial(ctx context.Context, what string) (*nats.Conn, context.Context, context.CancelFunc, error) {
	opts, err := a.natsOptions()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	nc, err := nats.Connect(a.server, append([]nats.Option{
		nats.Name("agentbus " + what),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cancel(fmt.Errorf("%w: %w", bus.ErrPermissionDenied, err))
			}
		}),
	}, opts...)...)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, fmt.Errorf("connect %s: %w", a.server, err)
	}
	return nc, ctx, func() { cancel(nil) }, nil
}

// refused returns the permission refusal that ended ctx, made by dial, in
// place of err, which then only says the context was cancelled.
func refused(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, bus.ErrPermissionDenied) {
		return cause
	}
	return err
}

// connectAs dials --server and returns the bus of agent under --root,
// with the global connection flags and then opts. flag names the flag that
// gave agent: an invalid agent ID is a usage error naming it, and so is a
// bad --root.
func (a *app) connectAs(flag, agent string, opts ...bus.Option) (*bus.Bus, error) {
	natsOpts, err := a.natsOptions()
	if err != nil {
		return nil, err
	}
	opts = append([]bus.Option{bus.WithNATSOptions(natsOpts...), bus.WithRoot(a.root)}, opts...)
	var b *bus.Bus
	if a.shards == 1 {
		b, err = bus.Connect(a.server, agent, opts...)
	} else {
		var s *bus.Shards
		if s, err = bus.ConnectShards(a.server, agent, a.shards, opts...); err == nil {
			b = s.Bus() // whose Close closes the other shards' buses and the connection
		}
	}
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, bus.ErrInvalidAgentID):
		return nil, usageError{&flagErr{flag: "--" + flag, rule: err, err: err}}
	case errors.Is(err, bus.ErrInvalidOption):
		return nil, usageError{err}
	}
	return nil, err
}

// withBusAs connects as agent, given by --agent, runs f and closes the
// bus. Background errors become warnings.
func (a *app) withBusAs(agent string, f func(*bus.Bus) error) error {
	b, err := a.connectAs("agent", agent, a.warnErrors())
	if err != nil {
		return err
	}
	defer b.Close()
	return f(b)
}

// warnErrors is the option that reports the bus's background errors as
// warnings.
func (a *app) warnErrors() bus.Option {
	return bus.WithErrorHandler(func(err error) { a.warnf("%v", err) })
}

// printJSON prints v as one line of JSON.
func (a *app) printJSON(v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(a.stdout, "%s\n", j); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	return nil
}

// isTerminal reports whether f is a terminal, where a hint or progress
// helps a person; in a pipe or a file it would only clutter the log. A
// character device that is not a terminal, such as /dev/null, is not one.
func isTerminal(f *os.File) bool {
	return term.IsTerminal(int(f.Fd()))
}

// redactURLs replaces, in msg, every URL of the comma-separated servers
// that carries a password or token with the URL with the secret masked
// (bus.RedactURLs).
func redactURLs(msg, servers string) string {
	for _, raw := range strings.Split(servers, ",") {
		raw = strings.TrimSpace(raw)
		if masked := bus.RedactURLs(raw); masked != raw {
			msg = strings.ReplaceAll(msg, raw, masked)
		}
	}
	return msg
}
