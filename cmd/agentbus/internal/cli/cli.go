package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes of Main.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad flags or arguments; nothing was attempted
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
	fmt.Fprintf(a.stderr, "agentbus: %s\n", oneLine(err.Error()))
	var re runError
	if errors.As(err, &re) {
		return exitError
	}
	return exitUsage
}

// app holds what every command shares: the streams and the global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr *syncWriter

	server      string // --server
	root        string // --root
	traceStderr bool   // --trace-stderr

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

Exit status: 0 on success, 2 for a usage error, 1 for any other error. An
error is reported as one line "agentbus: <error>" on stderr.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		CompletionOptions: cobra.CompletionOptions{
			HiddenDefaultCmd: true,
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", a.server, "NATS server URL, comma-separated for a cluster; $NATS_URL sets the default")
	pf.StringVar(&a.root, "root", defaultRoot, "subject root of the bus; every process of one bus must use the same")
	pf.BoolVar(&a.traceStderr, "trace-stderr", false, "print OpenTelemetry spans to stderr, one JSON object a line; OTEL_EXPORTER_OTLP_ENDPOINT sends spans and metrics over OTLP/HTTP (docs/observability.md)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
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
		a.dlqCommand(),
	)
	return root
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

// oneLine folds a possibly multi-line message, such as cobra's "did you
// mean" suggestions, onto one line.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " ")
}

// syncWriter serializes writes from concurrent handlers so that lines never
// interleave.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
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
