package embeddedtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/embedded"
)

// RunServer starts a JetStream server and shuts it down when the test ends.
// Unless an option sets StoreDir, the store is tb.TempDir(), so it survives
// Shutdown and the test can restart on it with embedded.Start(s.Options()).
// opts change the embedded.Options before the start. RunServer stops the test
// with tb.Fatal if the server does not start.
func RunServer(tb testing.TB, opts ...func(*embedded.Options)) *embedded.Server {
	tb.Helper()
	var o embedded.Options
	for _, opt := range opts {
		opt(&o)
	}
	if o.StoreDir == "" {
		o.StoreDir = tb.TempDir()
	}
	s, err := embedded.Start(o)
	if err != nil {
		tb.Fatalf("embeddedtest: %v", err)
	}
	tb.Cleanup(s.Shutdown)
	return s
}

// Connect returns an in-process connection to s (see embedded.Server.Connect)
// and closes it when the test ends, before the server shuts down if the
// server was started by RunServer earlier in the test. It stops the test
// with tb.Fatal if the connection fails.
func Connect(tb testing.TB, s *embedded.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := s.Connect(opts...)
	if err != nil {
		tb.Fatalf("embeddedtest: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// RunCluster starts an n-node JetStream cluster (n ≥ 2) with its stores
// under tb.TempDir() and shuts it down when the test ends. opts change the
// embedded.ClusterOptions before the start. Forming a cluster takes from a
// fraction of a second to several seconds (see embedded.StartCluster,
// which also tries again on fresh ports when a route port it reserved is
// taken before its node binds it). RunCluster stops the test with tb.Fatal
// if the cluster does not form.
func RunCluster(tb testing.TB, n int, opts ...func(*embedded.ClusterOptions)) *embedded.Cluster {
	tb.Helper()
	var cfg embedded.ClusterOptions
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.BaseDir == "" {
		cfg.BaseDir = tb.TempDir()
	}
	c, err := embedded.StartCluster(n, cfg)
	if err != nil {
		tb.Fatalf("embeddedtest: %v", err)
	}
	tb.Cleanup(c.Shutdown)
	return c
}

// ConnectCluster returns a TCP connection to every node of c (see
// embedded.Cluster.Connect), which fails over when its node stops, and
// closes it when the test ends. It stops the test with tb.Fatal if the
// connection fails.
func ConnectCluster(tb testing.TB, c *embedded.Cluster, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := c.Connect(opts...)
	if err != nil {
		tb.Fatalf("embeddedtest: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// TempDir points $TMPDIR at a new directory of the test's own, removed when
// the test ends, and returns it: for code under test that starts an
// embedded server with its store under os.TempDir (agentbus demo and
// bench), so that its store is out of reach of whatever cleans the shared
// temporary directory, and CheckEmpty can tell whether it removed it. Like
// tb.Setenv it cannot be used in parallel tests.
func TempDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	tb.Setenv("TMPDIR", dir)
	return dir
}

// CheckEmpty fails the test for every entry left in dir, such as a store
// the code under test should have removed.
func CheckEmpty(tb testing.TB, dir string) {
	tb.Helper()
	left, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range left {
		tb.Errorf("%s left in %s", e.Name(), dir)
	}
}

// pollEvery is how often WaitFor calls its condition.
const pollEvery = 10 * time.Millisecond

// WaitFor calls cond every 10 ms until it reports true, for at most
// timeout, and otherwise stops the test with tb.Fatalf naming what it
// waited for and the state cond last described. It is for what a server
// or a dispatcher does in the background: a test polls for it with a
// deadline rather than sleep.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() (ok bool, state string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s; last state: %s", what, state)
		}
		time.Sleep(pollEvery)
	}
}

// FreePorts returns n loopback ports nothing listens on right now, for a
// server started in a process of its own (an in-process one picks its own
// with port 0).
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// GoBuild builds pkgs, import paths of this module or of its dependencies
// (such as "github.com/nats-io/nats-server/v2", at the version go.mod
// requires), with the go command into dir, from the module at moduleRoot.
// go test puts its own toolchain first on PATH; a missing go command is an
// error, not a skip.
func GoBuild(dir, moduleRoot string, pkgs ...string) error {
	gotool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("no go command on PATH to build %v with: %w", pkgs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gotool, append([]string{"build", "-buildvcs=false", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = moduleRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", pkgs, err, out)
	}
	return nil
}

// SyncBuffer is a bytes.Buffer that a test may read while other goroutines
// write to it: a logger's, a command's output.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
