package embedded

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

const (
	// DefaultHost is the interface a server listens on when Options.Host is
	// empty: loopback only.
	DefaultHost = "127.0.0.1"

	// DefaultStartTimeout bounds how long Start waits for a server to be
	// ready for connections when Options.StartTimeout is zero.
	DefaultStartTimeout = 10 * time.Second

	// DefaultClusterName is the cluster name used when
	// RouteOptions.Name or ClusterOptions.Name is empty.
	DefaultClusterName = "agentbus"
)

// Options configures a server started by [Start]. The zero value is a
// standalone JetStream server on a random loopback port with a temporary
// store, which is what tests and demos want.
type Options struct {
	// Host is the interface clients connect on. Empty means DefaultHost
	// (127.0.0.1).
	Host string

	// Port is the client port. Zero means a free port chosen when the server
	// starts; Server.Options reports the port actually used.
	Port int

	// StoreDir is the JetStream file store directory; the server keeps its
	// data in a "jetstream" directory inside it and creates it if needed.
	// One server at a time may use it: Start locks it (see [Start]).
	// Empty means a new temporary directory that Shutdown removes, so data
	// does not outlive the server: set StoreDir to restart on the same data.
	StoreDir string

	// ServerName names the server in logs, monitoring and the JetStream
	// cluster. Empty means a generated "agentbus-<random hex>" name;
	// Server.Options reports it so a restart keeps the same identity.
	ServerName string

	// MaxPayload is the largest message the server accepts, in bytes. Zero
	// means the server default (1 MiB).
	MaxPayload int32

	// JetStreamMaxMemory is the limit on memory-backed stream storage, in
	// bytes. Zero or negative means the server default (a share of system
	// memory).
	JetStreamMaxMemory int64

	// JetStreamMaxStore is the limit on file-backed stream storage, in bytes.
	// Zero or negative means the server default (a share of the free disk).
	JetStreamMaxStore int64

	// Cluster, when set, makes the server a node of a JetStream cluster.
	// Nil means standalone. [StartCluster] fills it in for you.
	Cluster *RouteOptions

	// TLS, when set, makes the server require TLS on client connections
	// (and, with TLSOptions.VerifyClients, a client certificate). Nil means
	// plain TCP. ClientURL then has the tls:// scheme.
	TLS *TLSOptions

	// Logger receives the server's log output. Nil discards it. Whatever the
	// logger, the server's Fatalf reports never reach its Fatalf (which for
	// nats-server's own loggers exits the process): they are returned by
	// Start as errors and passed to the logger's Errorf, prefixed "fatal: ".
	// Debug and trace output is off unless Configure sets
	// server.Options.Debug or Trace. See [SlogLogger] to log through
	// log/slog.
	Logger server.Logger

	// StartTimeout bounds how long Start waits for the server to be ready
	// for connections. Zero means DefaultStartTimeout (10s).
	StartTimeout time.Duration

	// ConfigFile, if set, is a nats-server configuration file, as for
	// nats-server --config, that the server starts from: typically the
	// accounts, users and permissions of an authorization fragment. The
	// fields above are applied over it: Host, Port, StoreDir and ServerName
	// always (their defaults included, so a port in the file is not used),
	// MaxPayload, JetStreamMaxMemory, JetStreamMaxStore, Cluster and TLS
	// when set; JetStream is always enabled. Start reports a file the server
	// cannot load with an error wrapping ErrInvalidOption.
	ConfigFile string

	// Configure, if set, is called with the server options just before the
	// server is created, after every field above has been applied, for
	// anything this type does not cover (authorization, accounts, TLS
	// settings beyond TLSOptions, monitoring port, Debug/Trace logging,
	// ...). Nil changes nothing.
	Configure func(*server.Options)
}

// RouteOptions makes a server a node of a JetStream cluster. JetStream
// clustering needs a cluster name and at least one route.
type RouteOptions struct {
	// Name is the cluster name, the same on every node. Empty means
	// DefaultClusterName ("agentbus").
	Name string

	// Host is the interface route connections are accepted on. Empty means
	// Options.Host.
	Host string

	// Port is the route port. Zero means a free port chosen when the server
	// starts; Server.Options reports the port actually used.
	Port int

	// Routes are the route URLs of the cluster's nodes, of the form
	// nats-route://host:port. A node may list itself; the server skips it.
	// Listing every node, as StartCluster does, lets each node know the
	// cluster size before any route connects.
	Routes []string
}

// Validate reports whether o is usable, with errors that wrap
// [ErrInvalidOption]. Start calls it; conditions only the server can check
// (a port in use, an unwritable store) are reported by Start.
func (o Options) Validate() error {
	if err := validatePort("port", o.Port); err != nil {
		return err
	}
	if err := validateHost("host", o.Host); err != nil {
		return err
	}
	if o.MaxPayload < 0 {
		return fmt.Errorf("%w: max payload %d is negative", ErrInvalidOption, o.MaxPayload)
	}
	if strings.ContainsAny(o.ServerName, " \t\r\n") {
		return fmt.Errorf("%w: server name %q contains white space", ErrInvalidOption, o.ServerName)
	}
	if o.StartTimeout < 0 {
		return fmt.Errorf("%w: start timeout %s is negative", ErrInvalidOption, o.StartTimeout)
	}
	if c := o.Cluster; c != nil {
		if err := validatePort("cluster port", c.Port); err != nil {
			return err
		}
		if err := validateHost("cluster host", c.Host); err != nil {
			return err
		}
		if len(c.Routes) == 0 {
			return fmt.Errorf("%w: a cluster needs at least one route", ErrInvalidOption)
		}
		if strings.ContainsAny(c.Name, " \t\r\n") {
			return fmt.Errorf("%w: cluster name %q contains white space", ErrInvalidOption, c.Name)
		}
		if _, err := parseRoutes(c.Routes); err != nil {
			return err
		}
	}
	if o.TLS != nil {
		if err := o.TLS.Validate(); err != nil {
			return err
		}
	}
	return nil
}

func validatePort(what string, p int) error {
	if p < 0 || p > 65535 {
		return fmt.Errorf("%w: %s %d is out of range [0, 65535]", ErrInvalidOption, what, p)
	}
	return nil
}

// validateHost reports whether h can be a host to listen on: a name or an
// IP address, without a port or brackets (the server adds the port). One
// with a port passed, and Start failed on a name lookup of it.
func validateHost(what, h string) error {
	if h == "" || net.ParseIP(h) != nil {
		return nil
	}
	if strings.ContainsAny(h, ":[]/ \t\r\n") {
		return fmt.Errorf("%w: %s %q is not a host name or an IP address (no port, no brackets)", ErrInvalidOption, what, h)
	}
	return nil
}

func parseRoutes(routes []string) ([]*url.URL, error) {
	urls := make([]*url.URL, 0, len(routes))
	for _, r := range routes {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("%w: route %q: %w", ErrInvalidOption, r, err)
		}
		port, perr := strconv.Atoi(u.Port())
		if u.Scheme != "nats-route" && u.Scheme != "nats" && u.Scheme != "tls" || u.Hostname() == "" || perr != nil || port < 1 || port > 65535 {
			return nil, fmt.Errorf("%w: route %q is not of the form nats-route://host:port", ErrInvalidOption, r)
		}
		urls = append(urls, u)
	}
	return urls, nil
}

// clone returns a copy of o that shares no slices or pointers with it.
func (o Options) clone() Options {
	if o.Cluster != nil {
		c := *o.Cluster
		c.Routes = append([]string(nil), c.Routes...)
		o.Cluster = &c
	}
	if o.TLS != nil {
		t := *o.TLS
		o.TLS = &t
	}
	return o
}

// withDefaults fills in every default that does not need the server.
func (o Options) withDefaults() Options {
	o = o.clone()
	if o.Host == "" {
		o.Host = DefaultHost
	}
	if o.ServerName == "" {
		o.ServerName = "agentbus-" + randomHex(6)
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if c := o.Cluster; c != nil {
		if c.Name == "" {
			c.Name = DefaultClusterName
		}
		if c.Host == "" {
			c.Host = o.Host
		}
	}
	return o
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b)
}

// serverOptions translates o, with defaults applied, to nats-server options.
func (o Options) serverOptions() (*server.Options, error) {
	so := &server.Options{}
	if o.ConfigFile != "" {
		var err error
		if so, err = server.ProcessConfigFile(o.ConfigFile); err != nil {
			return nil, fmt.Errorf("%w: config file: %w", ErrInvalidOption, err)
		}
	}
	so.ServerName = o.ServerName
	so.Host = o.Host
	so.Port = orRandom(o.Port)
	so.JetStream = true
	so.StoreDir = o.StoreDir
	if o.MaxPayload != 0 {
		so.MaxPayload = o.MaxPayload
	}
	if o.JetStreamMaxMemory != 0 {
		so.JetStreamMaxMemory = o.JetStreamMaxMemory
	}
	if o.JetStreamMaxStore != 0 {
		so.JetStreamMaxStore = o.JetStreamMaxStore
	}
	// An embedded server must never install signal handlers: the process
	// that embeds it owns its signals.
	so.NoSigs = true
	so.NoLog = true
	if c := o.Cluster; c != nil {
		routes, err := parseRoutes(c.Routes)
		if err != nil {
			return nil, err
		}
		so.Cluster = server.ClusterOpts{Name: c.Name, Host: c.Host, Port: orRandom(c.Port)}
		so.Routes = routes
	}
	if o.TLS != nil {
		if err := o.TLS.configure(so); err != nil {
			return nil, err
		}
	}
	if o.Configure != nil {
		o.Configure(so)
	}
	return so, nil
}

func orRandom(port int) int {
	if port == 0 {
		return server.RANDOM_PORT
	}
	return port
}

// Server is a nats-server with JetStream running in this process. Its
// methods are safe for concurrent use.
type Server struct {
	ns       *server.Server
	opts     Options // resolved: actual ports, store dir and name
	ownStore bool    // opts.StoreDir was created by Start and is removed by Shutdown
	log      *fatalLogger

	done         chan struct{} // closed once the server has stopped
	closed       atomic.Bool
	shutdownOnce sync.Once
}

// Start starts a server, waits until it is ready for connections (at most
// Options.StartTimeout) and checks that JetStream is enabled. It never exits
// the process: every failure is returned as an error wrapping [ErrStart], and
// [ErrInvalidOption] too if opts fail [Options.Validate]. Where the server
// reported a cause, such as syscall.EADDRINUSE for a port in use, the error
// wraps it as well. On error nothing is left running and a temporary store
// is removed.
//
// The server holds a lock on its store directory (the file [LockFileName] in
// it) until it has stopped. If another server, in this process or another,
// holds it, Start fails with a [*StoreLockedError], which matches
// [ErrStoreLocked]. The lock goes with the process, so a server that
// crashed does not keep its store from being started again. The store is
// locked on Linux, macOS and the BSDs; elsewhere nothing stops two servers
// from sharing one store.
func Start(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	o := opts.withDefaults()
	ownStore := false
	if o.StoreDir == "" {
		dir, err := os.MkdirTemp("", "agentbus-embedded-")
		if err != nil {
			return nil, startError("create temporary store", err)
		}
		o.StoreDir, ownStore = dir, true
	}
	s, err := start(o, ownStore)
	if err != nil && ownStore {
		_ = os.RemoveAll(o.StoreDir)
	}
	return s, err
}

func start(o Options, ownStore bool) (*Server, error) {
	so, err := o.serverOptions()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	// nats-server does not lock its store: two servers on one directory
	// both run, and each destroys what the other acknowledged. The lock is
	// held until the server has stopped.
	lock, err := lockStore(so.StoreDir)
	if err != nil {
		var locked *StoreLockedError
		if errors.As(err, &locked) {
			return nil, fmt.Errorf("%w: %w", ErrStart, err)
		}
		return nil, startError("store "+so.StoreDir, err)
	}
	ns, err := server.NewServer(so)
	if err != nil {
		lock.release()
		return nil, startError("configure", err)
	}
	log := newFatalLogger(o.Logger)
	ns.SetLoggerV2(log, so.Debug, so.Trace, so.TraceVerbose)

	// Server.Start returns once the listeners are set up; it runs in its own
	// goroutine only so that a start-up that hangs cannot outlast the
	// timeout. Every path below waits for it to return.
	started := make(chan struct{})
	go func() {
		defer close(started)
		ns.Start()
	}()
	fail := func(what string, cause error) (*Server, error) {
		ns.Shutdown()
		<-started
		ns.WaitForShutdown()
		lock.release()
		return nil, startError(what, cause)
	}

	timer := time.NewTimer(o.StartTimeout)
	defer timer.Stop()
	select {
	case <-started:
	case <-timer.C:
		return fail(fmt.Sprintf("server %s not started within %s", o.ServerName, o.StartTimeout), nil)
	}
	// Start has returned, early if it reported a failure. The route
	// listener comes up in a goroutine of its own, so poll until every
	// listener is up or the server reports a failure.
	for {
		if err := log.fatalErr(); err != nil {
			return fail(fmt.Sprintf("server %s", o.ServerName), err)
		}
		if ns.ReadyForConnections(50 * time.Millisecond) {
			break
		}
		select {
		case <-timer.C:
			return fail(fmt.Sprintf("server %s not ready for connections within %s", o.ServerName, o.StartTimeout), nil)
		default:
		}
	}
	if err := log.fatalErr(); err != nil {
		return fail(fmt.Sprintf("server %s", o.ServerName), err)
	}
	if !ns.JetStreamEnabled() {
		return fail(fmt.Sprintf("server %s: JetStream is not enabled", o.ServerName), nil)
	}

	// Resolve what the server chose.
	if a, ok := ns.Addr().(*net.TCPAddr); ok {
		o.Port = a.Port
	} else {
		o.Port = 0 // it does not listen for clients (DontListen): ClientURL is ""
	}
	if o.Cluster != nil {
		if a := ns.ClusterAddr(); a != nil {
			o.Cluster.Port = a.Port
		}
	}
	o.ServerName = ns.Name()
	s := &Server{ns: ns, opts: o, ownStore: ownStore, log: log, done: make(chan struct{})}
	// Owned by s: ends when the server stops, which Shutdown causes and
	// waits for. The store is unlocked once the server has let go of it,
	// however it stopped.
	go func() {
		ns.WaitForShutdown()
		lock.release()
		close(s.done)
	}()
	return s, nil
}

// ClientURL returns the URL clients connect to, such as
// nats://127.0.0.1:4222, or tls://127.0.0.1:4222 when the server requires
// TLS, or "" if the server does not listen for clients
// (server.Options.DontListen set through Configure). If the server listens
// on all interfaces the URL names the loopback address.
func (s *Server) ClientURL() string {
	if s.opts.Port == 0 {
		return ""
	}
	u, err := url.Parse(s.ns.ClientURL())
	if err != nil {
		return s.ns.ClientURL()
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if ip.To4() != nil {
			host = "127.0.0.1"
		} else {
			host = "::1"
		}
	}
	u.Host = net.JoinHostPort(host, fmt.Sprint(s.opts.Port))
	return u.String()
}

// Connect returns a connection to the server over an in-process pipe
// (nats.InProcessServer), which needs no TCP listener. The connection is
// named "agentbus-embedded"; opts are applied after that default and may
// override it. Connect returns an error wrapping [ErrShutdown] after
// Shutdown. A connection cannot reconnect to a restarted server (it is a
// different *Server); dial ClientURL for that.
//
// A client in the server's own process is faster through Connect than
// through ClientURL: over loopback TCP every hop waits on Go's network
// poller, and the server's goroutines and the clients' share the
// process's Ps. On the project's two-core machine a bus request's round
// trip took 139 µs in process and 265 µs over TCP, p50
// (docs/performance.md).
//
// On a server with TLS the connection stays plain, and no client
// certificate is asked for, unless opts ask for TLS (nats.Secure,
// nats.RootCAs, ...): the pipe never leaves the process. On a server with
// authorization (ConfigFile, Configure) opts carry the credentials; a
// login the server refuses fails only after the server's write deadline
// (10 s by default), with "read/write on closed pipe", where a TCP
// connection fails at once with nats.ErrAuthorization.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("connect to %s: %w", s.opts.ServerName, ErrShutdown)
	}
	// The URL is required by nats.Connect but unused with InProcessServer,
	// except that a tls:// scheme would make the client insist on TLS.
	u := s.ClientURL()
	if u == "" {
		u = "nats://in-process"
	} else if rest, ok := strings.CutPrefix(u, "tls://"); ok {
		u = "nats://" + rest
	}
	all := make([]nats.Option, 0, len(opts)+2)
	all = append(all, nats.Name("agentbus-embedded"))
	all = append(all, opts...)
	all = append(all, nats.InProcessServer(s.ns))
	nc, err := nats.Connect(u, all...)
	if err != nil {
		if s.closed.Load() {
			err = errors.Join(err, ErrShutdown)
		}
		return nil, fmt.Errorf("connect to %s: %w", s.opts.ServerName, err)
	}
	return nc, nil
}

// Options returns the options the server runs with, with defaults resolved
// to what the server actually uses: the client and route ports it listens
// on, its name and its store directory. Passing them to Start after
// Shutdown brings the server back on the same ports and data, provided
// StoreDir was set by the caller (a temporary store is removed by Shutdown).
func (s *Server) Options() Options {
	return s.opts.clone()
}

// NATS returns the underlying nats-server, for what this package does not
// wrap (monitoring, JetStream internals, account management).
func (s *Server) NATS() *server.Server {
	return s.ns
}

// Shutdown stops the server, waits until it has fully stopped, unlocks the
// store directory and, if Start created it, removes it. It is safe to call more than once
// and from several goroutines; every call returns after the server stopped.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() {
		s.closed.Store(true)
		s.ns.Shutdown()
		<-s.done
		if s.ownStore {
			_ = os.RemoveAll(s.opts.StoreDir)
		}
	})
}

// Done returns a channel that is closed once the server has stopped, by
// Shutdown or on its own. A program that runs a server until it stops can
// wait on it alongside its signals:
//
//	select {
//	case <-srv.Done():
//	case <-ctx.Done():
//		srv.Shutdown()
//	}
func (s *Server) Done() <-chan struct{} {
	return s.done
}

// Running reports whether the server is running, that is, it has been
// started and neither Shutdown nor a fatal server error stopped it.
func (s *Server) Running() bool {
	return !s.closed.Load() && s.ns.Running()
}

// String returns the server name.
func (s *Server) String() string {
	return s.opts.ServerName
}
