package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/subjects"
)

// defaultListen is the address serve listens on without --listen.
const defaultListen = "127.0.0.1:4222"

// serveFlags are serve's own flags.
type serveFlags struct {
	store, listen, authFile string
	tls                     embedded.TLSOptions
}

func (a *app) serveCommand() *cobra.Command {
	var fl serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a NATS server with JetStream and the bus's stream",
		Long: `Serve runs a NATS server with JetStream in this process, provisions the bus's
stream on it (the defaults of 'agentbus provision'; with --shards N, every
shard's), and serves until it receives SIGINT or SIGTERM, when it shuts down
cleanly and exits 0.

Messages are kept in --store, so they survive restarts. The default store is
$XDG_DATA_HOME/agentbus, or ~/.local/share/agentbus. One server at a time
may use a store: serve refuses, and exits 1, if another holds it (it locks
the file agentbus.lock in the store, on Linux, macOS and the BSDs; the lock
goes with the process, so a crashed server never blocks a restart).

--listen takes HOST:PORT; port 0 picks a free port, and an empty host
(":4222") listens on every interface. Without --auth the server has no
authentication: keep it on loopback unless the network is trusted.

--auth FILE runs the server with the accounts, users and permissions of
FILE, as 'agentbus auth init' writes it: every client must log in, each
agent only to its own subjects. serve's own connection (it provisions the
stream and dead-letters unsettled messages) then logs in with the global
--nkey, --creds, or --user and --password: give it the admin's.

--tls-cert and --tls-key make the server require TLS; clients then pass
--tlsca with the CA that issued the certificate. --tls-verify with --tls-ca
also requires every client to present a certificate issued by that CA
(--tlscert and --tlskey). The global TLS flags (--tlsca, ...) are for
clients; serve talks to its server in-process.

Once the server is ready, serve prints its client URL on stdout as one line
and nothing else, so that a script can read it:

  nats://127.0.0.1:4222

or, with TLS, tls://127.0.0.1:4222.

and a human-readable line on stderr. Server warnings and errors are logged
on stderr.`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			opts, login, err := a.serveOptions(cmd, fl)
			if err != nil {
				return err
			}
			s, err := a.startServer(opts)
			if err != nil {
				return err
			}
			defer s.Shutdown()
			err = a.serveUntilDone(cmd.Context(), s, login, fl.authFile)
			if err != nil && cmd.Context().Err() != nil {
				return nil // SIGINT or SIGTERM while it started: a clean stop too
			}
			return err
		}),
	}
	f := cmd.Flags()
	f.StringVar(&fl.store, "store", "", "directory for the server's data (default $XDG_DATA_HOME/agentbus or ~/.local/share/agentbus)")
	f.StringVar(&fl.listen, "listen", defaultListen, "HOST:PORT for clients; port 0 picks a free port")
	f.StringVar(&fl.authFile, "auth", "", "accounts, users and permissions file from 'agentbus auth init'; serve logs in with --nkey, --creds or --user/--password")
	f.StringVar(&fl.tls.CertFile, "tls-cert", "", "server certificate file (PEM); with --tls-key, clients must use TLS")
	f.StringVar(&fl.tls.KeyFile, "tls-key", "", "private key file (PEM) of --tls-cert")
	f.StringVar(&fl.tls.CAFile, "tls-ca", "", "CA certificate file (PEM) that client certificates must chain to; needs --tls-verify")
	f.BoolVar(&fl.tls.VerifyClients, "tls-verify", false, "require a client certificate issued by --tls-ca")
	return cmd
}

// serveOptions checks serve's flags and returns the server's options and
// the login of serve's own connection.
func (a *app) serveOptions(cmd *cobra.Command, fl serveFlags) (embedded.Options, []nats.Option, error) {
	// An empty --store would be the default store, an empty --auth a
	// server without authentication.
	if err := checkNotEmpty(cmd, "store", "auth"); err != nil {
		return embedded.Options{}, nil, err
	}
	if fl.authFile != "" {
		if _, err := os.Stat(fl.authFile); err != nil {
			return embedded.Options{}, nil, usageError{fmt.Errorf("--auth: %w", err)}
		}
	}
	host, port, err := parseListen(fl.listen)
	if err != nil {
		return embedded.Options{}, nil, usageError{err}
	}
	tlsOpts, err := serveTLS(cmd, fl.tls)
	if err != nil {
		return embedded.Options{}, nil, usageError{err}
	}
	login, err := a.serveLogin(fl.authFile)
	if err != nil {
		return embedded.Options{}, nil, err
	}
	store := fl.store
	if store == "" {
		if store, err = defaultStore(); err != nil {
			return embedded.Options{}, nil, err
		}
	}
	if store, err = filepath.Abs(store); err != nil {
		return embedded.Options{}, nil, fmt.Errorf("store: %w", err)
	}
	if err := os.MkdirAll(store, 0o700); err != nil {
		return embedded.Options{}, nil, fmt.Errorf("store: %w", err)
	}
	return embedded.Options{Host: host, Port: port, StoreDir: store, TLS: tlsOpts, ConfigFile: fl.authFile}, login, nil
}

// startServer starts the server of opts, its warnings and errors logged on
// stderr. The log is held until the server started: a failure to start is
// reported once, as the command's error.
func (a *app) startServer(opts embedded.Options) (*embedded.Server, error) {
	log := &heldWriter{w: a.stderr}
	opts.Logger = embedded.SlogLogger(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn})))
	s, err := embedded.Start(opts)
	var locked *embedded.StoreLockedError
	if errors.As(err, &locked) {
		return nil, locked // says which store and who holds it, nothing more
	}
	if err != nil {
		return nil, err
	}
	if err := log.release(); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

// serveUntilDone provisions the bus on s as an operator (logged in with
// login), every shard of --shards, dead-letters the messages whose last
// delivery was never settled, prints the client URL, and serves until ctx
// ends (nil) or the server stops on its own (an error).
func (a *app) serveUntilDone(ctx context.Context, s *embedded.Server, login []nats.Option, authFile string) error {
	nc, err := s.Connect(login...)
	if err != nil && authFile != "" {
		return fmt.Errorf("log in to the server with the admin's credentials of %s: %w", authFile, err)
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	// An operator's handle on each shard (the root itself for one shard).
	admins := make([]*bus.Admin, a.shards)
	for k := range admins {
		root, err := subjects.ShardRoot(a.root, k, a.shards)
		if err != nil {
			return usageError{fmt.Errorf("--shards: %w", err)}
		}
		admins[k], err = bus.NewAdmin(nc, bus.WithRoot(root),
			bus.WithErrorHandler(func(err error) { a.warnf("dead letters: %v", err) }))
		if err != nil {
			return err
		}
		defer admins[k].Close()
	}
	var streams []string
	var msgs uint64
	for k, admin := range admins {
		// What an operator provisioned since stays: a restart brings the
		// streams only to what the bus needs (before 2026-11-28 it put
		// their limits back to the defaults, cutting a longer retention).
		info, err := admin.EnsureProvisioned(ctx, bus.StreamConfig{Shards: a.shards})
		if err != nil {
			return onShard(admins, k, err)
		}
		streams, msgs = append(streams, info.Config.Name), msgs+info.State.Msgs
	}
	// Dead-letter the messages whose last delivery was never settled (a
	// crashed subscriber): the server only announces them.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	for _, admin := range admins {
		watching.Go(func() { admin.WatchDeadLetters(watchCtx) })
	}
	defer func() { stopWatch(); watching.Wait() }()

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.NATS().WaitForShutdown()
	}()
	defer func() {
		s.Shutdown() // ends the goroutine
		<-stopped
	}()

	url := s.ClientURL()
	if _, err := fmt.Fprintln(a.stdout, url); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "agentbus serving on %s (store %s, stream %s, %d messages)\n", url, s.Options().StoreDir, strings.Join(streams, ", "), msgs)

	select {
	case <-ctx.Done():
		// The watcher and the admin stop first, while the server still
		// stores the records they are writing (a dead letter's).
		stopWatch()
		watching.Wait()
		for _, admin := range admins {
			admin.Close()
		}
		s.Shutdown()
		fmt.Fprintln(a.stderr, "agentbus server stopped")
		return nil
	case <-stopped:
		return errors.New("server stopped unexpectedly")
	}
}

// serveLogin returns the options serve's own connection logs in with:
// none without --auth, else the identity of the global connection flags,
// which --auth needs.
func (a *app) serveLogin(authFile string) ([]nats.Option, error) {
	if authFile == "" {
		return nil, nil
	}
	login, err := a.conn.withEnv(os.Getenv).identityOptions()
	if err != nil {
		return nil, err
	}
	if len(login) == 0 {
		return nil, usagef("--auth needs the admin's credentials for serve's own connection: --nkey, --creds, or --user and --password")
	}
	return login, nil
}

// serveTLS checks serve's --tls-* flags and returns the server's TLS
// options, or nil when none is given.
func serveTLS(cmd *cobra.Command, t embedded.TLSOptions) (*embedded.TLSOptions, error) {
	f := cmd.Flags()
	if !f.Changed("tls-cert") && !f.Changed("tls-key") && !f.Changed("tls-ca") && !f.Changed("tls-verify") {
		return nil, nil
	}
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		return nil, errors.New("--tls-cert and --tls-key go together and are needed for TLS")
	case t.VerifyClients && t.CAFile == "":
		return nil, errors.New("--tls-verify needs --tls-ca")
	case t.CAFile != "" && !t.VerifyClients:
		return nil, errors.New("--tls-ca is only used with --tls-verify")
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// parseListen splits a --listen address. An empty host means every
// interface, as for net.Listen.
func parseListen(listen string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--listen %q: port must be a number 0..65535", listen)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// defaultStore is $XDG_DATA_HOME/agentbus, or ~/.local/share/agentbus when
// XDG_DATA_HOME is unset or not absolute (as the XDG spec asks).
func defaultStore() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "agentbus"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no --store given and %w", err)
	}
	return filepath.Join(home, ".local", "share", "agentbus"), nil
}

// heldWriter holds what is written to it until release, then passes it
// on.
type heldWriter struct {
	mu       sync.Mutex
	w        io.Writer
	held     bytes.Buffer
	released bool
}

func (h *heldWriter) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return h.w.Write(p)
	}
	return h.held.Write(p)
}

// release writes what was held and lets later writes through.
func (h *heldWriter) release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	_, err := h.held.WriteTo(h.w)
	return err
}
