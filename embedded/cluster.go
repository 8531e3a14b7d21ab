package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultFormationTimeout bounds how long StartCluster waits for the
// cluster to form when ClusterOptions.FormationTimeout is zero. Forming a
// JetStream cluster (routes, then a meta leader elected and every peer
// known) usually takes a few seconds, sometimes more on a loaded machine.
const DefaultFormationTimeout = 30 * time.Second

// pollInterval is how often the Wait methods look at the cluster.
const pollInterval = 25 * time.Millisecond

// ClusterOptions configures [StartCluster].
type ClusterOptions struct {
	// Name is the cluster name. Empty means DefaultClusterName ("agentbus").
	Name string

	// BaseDir holds the nodes' stores, one directory per node named after
	// the node ("n1", "n2", ...). Empty means a temporary directory that
	// Cluster.Shutdown removes.
	BaseDir string

	// FormationTimeout bounds how long StartCluster waits for every node to
	// be routed to every other and for a JetStream meta leader that knows
	// all peers. It is also the default deadline of the Wait methods when
	// their context has none. Zero means DefaultFormationTimeout (30s).
	FormationTimeout time.Duration

	// Node is the template every node's Options start from: Host, limits,
	// Logger, StartTimeout and Configure apply to all nodes. Its Port,
	// StoreDir, ServerName and Cluster must be left zero; StartCluster sets
	// them per node.
	Node Options
}

// Validate reports whether c is usable, with errors that wrap
// [ErrInvalidOption].
func (c ClusterOptions) Validate() error {
	if c.FormationTimeout < 0 {
		return fmt.Errorf("%w: formation timeout %s is negative", ErrInvalidOption, c.FormationTimeout)
	}
	if strings.ContainsAny(c.Name, " \t\r\n") {
		return fmt.Errorf("%w: cluster name %q contains white space", ErrInvalidOption, c.Name)
	}
	n := c.Node
	if n.Port != 0 || n.StoreDir != "" || n.ServerName != "" || n.Cluster != nil {
		return fmt.Errorf("%w: ClusterOptions.Node must leave Port, StoreDir, ServerName and Cluster zero", ErrInvalidOption)
	}
	return n.Validate()
}

// Cluster is a JetStream cluster of in-process servers, for tests and demos
// of replication and failover. Its methods are safe for concurrent use.
type Cluster struct {
	name    string
	timeout time.Duration
	baseDir string
	ownBase bool // baseDir was created by StartCluster and is removed by Shutdown

	mu      sync.Mutex
	servers []*Server // index i is node "n<i+1>"; replaced by RestartServer
	stopped []bool
	closed  bool
}

// maxFormationAttempts is how many times StartCluster tries again, on fresh
// ports, when a route port it reserved was taken before its node bound it.
const maxFormationAttempts = 3

// StartCluster starts n ≥ 2 servers named "n1".."n<n>", each with its own store
// under cfg.BaseDir, routed to each other, and waits until the cluster has
// formed: every node ready and routed to every other, and a JetStream meta
// leader that sees all n peers. It returns an error wrapping [ErrStart]
// (and [ErrInvalidOption] for bad arguments) and leaves nothing running if
// the cluster does not form within cfg.FormationTimeout.
//
// Route ports are reserved up front by listening on port 0 and closing the
// listeners just before the nodes, started concurrently, bind the ports, so
// that every node can be given routes to all nodes and knows the cluster size
// from the start. A port can be taken in that short window, by another
// process or by a connection's local port (the nodes dial each other as
// they start); when that happens (the error wraps syscall.EADDRINUSE),
// StartCluster tries again on fresh ports, up to three attempts in all: with
// BaseDir empty, or with node stores under BaseDir that the failed attempt
// made, which it removes first. Nodes started from stores that were there
// before are not tried again. Client ports are chosen by each server.
//
// A cluster needs at least two nodes: a JetStream meta group that starts
// with unknown peers assumes at least two, so a lone node never elects a
// leader. Use Start for a single server.
func StartCluster(n int, cfg ClusterOptions) (*Cluster, error) {
	if n < 2 {
		return nil, fmt.Errorf("%w: %w: cluster size %d, want at least 2", ErrStart, ErrInvalidOption, n)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultClusterName
	}
	if cfg.FormationTimeout == 0 {
		cfg.FormationTimeout = DefaultFormationTimeout
	}
	for attempt := 1; ; attempt++ {
		stored := cfg.BaseDir != "" && nodeStoresIn(cfg.BaseDir, n)
		c, err := startCluster(n, cfg)
		if err == nil || stored || attempt == maxFormationAttempts || !errors.Is(err, syscall.EADDRINUSE) {
			return c, err
		}
		if cfg.BaseDir != "" {
			for i := range n { // this attempt's, shut down
				if rerr := os.RemoveAll(filepath.Join(cfg.BaseDir, nodeName(i))); rerr != nil {
					return nil, errors.Join(err, startError("remove a failed attempt's store", rerr))
				}
			}
		}
	}
}

// nodeStoresIn reports whether any of n nodes has a store under base.
func nodeStoresIn(base string, n int) bool {
	for i := range n {
		if _, err := os.Stat(filepath.Join(base, nodeName(i))); err == nil {
			return true
		}
	}
	return false
}

func startCluster(n int, cfg ClusterOptions) (_ *Cluster, err error) {
	c := &Cluster{
		name:    cfg.Name,
		timeout: cfg.FormationTimeout,
		baseDir: cfg.BaseDir,
		servers: make([]*Server, n),
		stopped: make([]bool, n),
	}
	if c.baseDir == "" {
		dir, err := os.MkdirTemp("", "agentbus-cluster-")
		if err != nil {
			return nil, startError("create temporary cluster directory", err)
		}
		c.baseDir, c.ownBase = dir, true
	}
	defer func() {
		if err != nil {
			c.Shutdown()
		}
	}()

	host := cfg.Node.Host
	if host == "" {
		host = DefaultHost
	}
	listeners := make([]net.Listener, n)
	defer func() {
		for _, l := range listeners {
			if l != nil {
				_ = l.Close()
			}
		}
	}()
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range listeners {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, startError("reserve route port", err)
		}
		listeners[i] = l
		ports[i] = l.Addr().(*net.TCPAddr).Port
		routes[i] = "nats-route://" + net.JoinHostPort(host, strconv.Itoa(ports[i]))
	}

	// Start the nodes together, so that the routes are up before the first
	// node campaigns for meta leadership (100-800ms after it starts). A
	// fresh node's vote only counts for a candidate that hears from every
	// node, so a first election can still fail now and then; the server
	// then waits out an election timeout of 4-9s.
	opts := make([]Options, n)
	for i := range opts {
		o := cfg.Node.clone()
		o.ServerName = nodeName(i)
		o.StoreDir = filepath.Join(c.baseDir, o.ServerName)
		o.Cluster = &RouteOptions{Name: cfg.Name, Host: host, Port: ports[i], Routes: routes}
		opts[i] = o
	}
	for i, l := range listeners {
		_ = l.Close()
		listeners[i] = nil
	}
	if testHookRoutePorts != nil {
		testHookRoutePorts(ports)
	}
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range opts {
		wg.Go(func() { // each goroutine writes only element i
			servers[i], errs[i] = Start(opts[i])
			if errs[i] != nil {
				errs[i] = fmt.Errorf("cluster %s: node %s: %w", cfg.Name, opts[i].ServerName, errs[i])
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	copy(c.servers, servers) // nil where a node failed; Shutdown skips those
	c.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.FormationTimeout)
	defer cancel()
	if err := c.waitFormed(ctx); err != nil {
		return nil, startError(fmt.Sprintf("cluster %s did not form within %s", cfg.Name, cfg.FormationTimeout), err)
	}
	return c, nil
}

func nodeName(i int) string { return "n" + strconv.Itoa(i+1) }

// testHookRoutePorts, set by the tests, is called with the route ports
// reserved, between closing their listeners and starting the nodes.
var testHookRoutePorts func(ports []int)

// running returns the servers that are running, in node order.
func (c *Cluster) running() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Server, 0, len(c.servers))
	for i, s := range c.servers {
		if s != nil && !c.stopped[i] && !c.closed {
			out = append(out, s)
		}
	}
	return out
}

// waitFormed waits until every node is routed to every other and a meta
// leader sees every node as a current peer.
func (c *Cluster) waitFormed(ctx context.Context) error {
	n := len(c.servers)
	return c.poll(ctx, func(servers []*Server) (bool, string) {
		for _, s := range servers {
			if r := s.ns.NumRemotes(); r != n-1 {
				return false, fmt.Sprintf("%s is routed to %d of %d other nodes", s, r, n-1)
			}
		}
		leader := metaLeader(servers)
		if leader == nil {
			return false, "no meta leader"
		}
		if p := len(leader.ns.JetStreamClusterPeers()); p != n {
			return false, fmt.Sprintf("meta leader %s sees %d of %d peers", leader, p, n)
		}
		for _, s := range servers {
			if !s.ns.JetStreamIsCurrent() {
				return false, fmt.Sprintf("%s is not current with the meta leader %s", s, leader)
			}
		}
		return true, ""
	})
}

// poll calls cond with the running servers every pollInterval until it
// reports done or ctx ends; then it returns an error wrapping ctx.Err() and
// cond's last description of what it is waiting for. If ctx has no
// deadline, the cluster's formation timeout applies.
func (c *Cluster) poll(ctx context.Context, cond func([]*Server) (done bool, state string)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return fmt.Errorf("cluster %s: %w", c.name, ErrShutdown)
		}
		done, state := cond(c.running())
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last state: %s)", ctx.Err(), state)
		case <-tick.C:
		}
	}
}

func metaLeader(servers []*Server) *Server {
	for _, s := range servers {
		if s.ns.JetStreamIsLeader() {
			return s
		}
	}
	return nil
}

// Name returns the cluster name.
func (c *Cluster) Name() string { return c.name }

// Servers returns the cluster's servers in node order ("n1" first),
// including stopped ones. A restarted node is a new *Server, so call
// Servers again after RestartServer.
func (c *Cluster) Servers() []*Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Server(nil), c.servers...)
}

// ClientURLs returns each node's client URL in node order. A node keeps its
// URL across StopServer and RestartServer.
func (c *Cluster) ClientURLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, 0, len(c.servers))
	for _, s := range c.servers {
		if s != nil {
			urls = append(urls, s.ClientURL())
		}
	}
	return urls
}

// ClientURL returns every node's client URL joined by commas, the form
// nats.Connect accepts to connect to, and fail over between, all nodes.
func (c *Cluster) ClientURL() string {
	return strings.Join(c.ClientURLs(), ",")
}

// Connect dials the cluster over TCP with every node's URL, so that the
// connection fails over when its node stops. The connection is named
// "agentbus-embedded-cluster"; opts are applied after that default.
// Connect returns an error wrapping [ErrShutdown] after Shutdown.
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("connect to cluster %s: %w", c.name, ErrShutdown)
	}
	all := append([]nats.Option{nats.Name("agentbus-embedded-cluster")}, opts...)
	nc, err := nats.Connect(c.ClientURL(), all...)
	if err != nil {
		return nil, fmt.Errorf("connect to cluster %s: %w", c.name, err)
	}
	return nc, nil
}

// MetaLeader returns the running server that currently leads the JetStream
// meta group, or nil if there is none right now.
func (c *Cluster) MetaLeader() *Server {
	return metaLeader(c.running())
}

// WaitForMetaLeader waits until a running server leads the JetStream meta
// group and every running server is current with it. If ctx has no
// deadline, the cluster's formation timeout applies. The error wraps
// ctx.Err() (or [ErrShutdown]) and says what was still missing.
func (c *Cluster) WaitForMetaLeader(ctx context.Context) error {
	err := c.poll(ctx, func(servers []*Server) (bool, string) {
		leader := metaLeader(servers)
		if leader == nil {
			return false, "no meta leader"
		}
		for _, s := range servers {
			if !s.ns.JetStreamIsCurrent() {
				return false, fmt.Sprintf("%s is not current with the meta leader %s", s, leader)
			}
		}
		return true, ""
	})
	if err != nil {
		return fmt.Errorf("wait for meta leader of cluster %s: %w", c.name, err)
	}
	return nil
}

// StreamLeader returns the running server that currently leads stream in
// account, or nil if there is none right now. An empty account means the
// global account ("$G"), which clients use when the server has no accounts
// configured.
func (c *Cluster) StreamLeader(account, stream string) *Server {
	if account == "" {
		account = server.DEFAULT_GLOBAL_ACCOUNT
	}
	for _, s := range c.running() {
		if s.ns.JetStreamIsStreamLeader(account, stream) {
			return s
		}
	}
	return nil
}

// WaitForStreamLeader waits until a running server leads stream in account
// and returns it. An empty account means the global account ("$G"). If ctx
// has no deadline, the cluster's formation timeout applies. The error wraps
// ctx.Err() (or [ErrShutdown]).
func (c *Cluster) WaitForStreamLeader(ctx context.Context, account, stream string) (*Server, error) {
	var leader *Server
	err := c.poll(ctx, func([]*Server) (bool, string) {
		leader = c.StreamLeader(account, stream)
		return leader != nil, fmt.Sprintf("no leader for stream %q", stream)
	})
	if err != nil {
		return nil, fmt.Errorf("wait for leader of stream %q in cluster %s: %w", stream, c.name, err)
	}
	return leader, nil
}

// Index returns the node index of s in the cluster, or -1 if s is not one
// of its current servers.
func (c *Cluster) Index(s *Server) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cs := range c.servers {
		if cs == s {
			return i
		}
	}
	return -1
}

// StopServer shuts node i down (0 is "n1"), keeping its store and ports for
// RestartServer. Stopping a stopped node does nothing. It returns an error if
// i is out of range and one wrapping [ErrShutdown] after Shutdown.
func (c *Cluster) StopServer(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkIndex(i); err != nil {
		return err
	}
	c.servers[i].Shutdown()
	c.stopped[i] = true
	return nil
}

// RestartServer brings node i back (stopping it first if it is running) on
// the same store, client port, route port and name, and waits until it is
// ready for connections. It does not wait for the node to catch up with the
// cluster: use WaitForMetaLeader for that. On success Servers()[i] is the new
// server. Errors wrap [ErrStart] if the node does not start, or
// [ErrShutdown] after Shutdown.
func (c *Cluster) RestartServer(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkIndex(i); err != nil {
		return err
	}
	old := c.servers[i]
	old.Shutdown()
	c.stopped[i] = true
	s, err := Start(old.Options())
	if err != nil {
		return fmt.Errorf("restart node %s of cluster %s: %w", old, c.name, err)
	}
	c.servers[i] = s
	c.stopped[i] = false
	return nil
}

// checkIndex is called with c.mu held.
func (c *Cluster) checkIndex(i int) error {
	if c.closed {
		return fmt.Errorf("cluster %s: %w", c.name, ErrShutdown)
	}
	if i < 0 || i >= len(c.servers) {
		return fmt.Errorf("cluster %s: node index %d out of range [0, %d)", c.name, i, len(c.servers))
	}
	return nil
}

// Shutdown stops every node, waits until all have stopped and, if
// StartCluster created the base directory, removes it. It is safe to call
// more than once; later calls do nothing.
func (c *Cluster) Shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	var wg sync.WaitGroup
	for _, s := range c.servers {
		if s != nil {
			wg.Go(s.Shutdown)
		}
	}
	wg.Wait()
	if c.ownBase {
		_ = os.RemoveAll(c.baseDir)
	}
}
