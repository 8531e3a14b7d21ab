package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)

	began := time.Now()
	base := t.TempDir()
	c, err := embedded.StartCluster(3, embedded.ClusterOptions{Name: "failover", BaseDir: base})
	if err != nil {
		t.Fatalf("StartCluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	t.Logf("cluster formed in %s", time.Since(began))

	servers := c.Servers()
	if len(servers) != 3 {
		t.Fatalf("%d servers, want 3", len(servers))
	}
	for i, s := range servers {
		o := s.Options()
		if want := fmt.Sprintf("n%d", i+1); o.ServerName != want {
			t.Errorf("server %d is named %q, want %q", i, o.ServerName, want)
		}
		if want := filepath.Join(base, o.ServerName); o.StoreDir != want {
			t.Errorf("server %s stores in %q, want %q", o.ServerName, o.StoreDir, want)
		}
		if o.Cluster == nil || o.Cluster.Name != "failover" || o.Cluster.Port <= 0 || len(o.Cluster.Routes) != 3 {
			t.Errorf("server %s cluster options %+v, want name failover, a port and 3 routes", o.ServerName, o.Cluster)
		}
	}
	if got := len(c.ClientURLs()); got != 3 {
		t.Errorf("%d client URLs, want 3", got)
	}
	if err := c.WaitForMetaLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if c.MetaLeader() == nil {
		t.Fatal("no meta leader after WaitForMetaLeader")
	}

	// A client that knows every node, reconnecting quickly.
	nc, err := c.Connect(nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The create is idempotent, so an attempt whose answer is lost (a
	// loaded machine, the meta leader busy with the new group) is simply
	// made again, until the test's deadline.
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(actx, jetstream.StreamConfig{
			Name:     "ORDERS",
			Subjects: []string{"orders.>"},
			Replicas: 3,
		})
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create R3 stream: %v", err)
		}
		t.Logf("create R3 stream: %v; trying again", err)
	}
	// The create is answered before the stream's own group has elected a
	// leader and the servers know where it listens; a publish before that
	// finds nothing to store it ("no response from stream", seen under
	// load). Each is tried again, under its own ID, until it is stored.
	if _, err := c.WaitForStreamLeader(ctx, "", "ORDERS"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		for {
			_, err := js.Publish(ctx, "orders.new", fmt.Appendf(nil, "msg-%d", i), jetstream.WithMsgID(fmt.Sprint("msg-", i)))
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrNoStreamResponse) || ctx.Err() != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
	}

	leader, err := c.WaitForStreamLeader(ctx, "", "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	stopped := c.Index(leader)
	if stopped < 0 {
		t.Fatalf("stream leader %s is not a cluster server", leader)
	}
	leaderOpts := leader.Options()

	began = time.Now()
	if err := c.StopServer(stopped); err != nil {
		t.Fatal(err)
	}
	if leader.Running() {
		t.Fatal("stopped server still running")
	}
	newLeader, err := c.WaitForStreamLeader(ctx, "", "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if newLeader == leader {
		t.Fatalf("stream leader is still the stopped server %s", leader)
	}
	t.Logf("stream leader moved from %s to %s in %s", leader, newLeader, time.Since(began))

	// The data survived and the stream still takes writes.
	waitForMessages(ctx, t, js, "ORDERS", 10)
	// The new leader may not answer the very first publish (no response
	// from stream): retried with the same message ID, it is stored once.
	var perr error
	embeddedtest.WaitFor(t, 10*time.Second, "a publish after failover", func() (bool, string) {
		_, perr = js.Publish(ctx, "orders.new", []byte("msg-11"), jetstream.WithMsgID("msg-11"))
		return perr == nil, fmt.Sprint(perr)
	})
	checkMessages(ctx, t, js, "ORDERS", 11)

	// The stopped node comes back on the same ports and store and catches
	// up with the write it missed.
	began = time.Now()
	if err := c.RestartServer(stopped); err != nil {
		t.Fatal(err)
	}
	restarted := c.Servers()[stopped]
	if restarted == leader || !restarted.Running() {
		t.Fatal("RestartServer did not replace the stopped server with a running one")
	}
	o := restarted.Options()
	if o.Port != leaderOpts.Port || o.Cluster.Port != leaderOpts.Cluster.Port || o.StoreDir != leaderOpts.StoreDir {
		t.Errorf("restarted on port %d, route port %d, store %q; want %d, %d, %q",
			o.Port, o.Cluster.Port, o.StoreDir, leaderOpts.Port, leaderOpts.Cluster.Port, leaderOpts.StoreDir)
	}
	if err := c.WaitForMetaLeader(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "restarted node current with the stream", func() (bool, string) {
		return restarted.NATS().JetStreamIsStreamCurrent("$G", "ORDERS"), "not current"
	})
	t.Logf("restarted node caught up in %s", time.Since(began))
}

// waitForMessages polls until stream name is reachable and holds n
// messages, then checks their contents.
func waitForMessages(ctx context.Context, t *testing.T, js jetstream.JetStream, name string, n int) {
	t.Helper()
	waitFor(ctx, t, fmt.Sprintf("stream %s to hold %d messages", name, n), func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := js.Stream(rctx, name)
		if err != nil {
			return false, err.Error()
		}
		info := st.CachedInfo()
		return info.State.Msgs == uint64(n), fmt.Sprintf("%d messages", info.State.Msgs)
	})
	checkMessages(ctx, t, js, name, n)
}

// waitFor polls cond until it holds, failing the test with cond's last
// state when ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; last state: %s", what, ctx.Err(), state)
		case <-tick.C:
		}
	}
}

func TestClusterTemporaryBaseDir(t *testing.T) {
	t.Parallel()
	c, err := embedded.StartCluster(3, embedded.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(c.Servers()[0].Options().StoreDir)
	c.Shutdown()
	c.Shutdown() // idempotent
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary base dir %s still there after Shutdown (stat error %v)", base, err)
	}
	for _, s := range c.Servers() {
		if s.Running() {
			t.Errorf("server %s still running after Shutdown", s)
		}
	}
	if err := c.RestartServer(0); !errors.Is(err, embedded.ErrShutdown) {
		t.Errorf("RestartServer after Shutdown: %v, want ErrShutdown", err)
	}
	if _, err := c.Connect(); !errors.Is(err, embedded.ErrShutdown) {
		t.Errorf("Connect after Shutdown: %v, want ErrShutdown", err)
	}
	if err := c.WaitForMetaLeader(t.Context()); !errors.Is(err, embedded.ErrShutdown) {
		t.Errorf("WaitForMetaLeader after Shutdown: %v, want ErrShutdown", err)
	}
}

func TestStartClusterErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		n    int
		cfg  embedded.ClusterOptions
	}{
		{name: "no nodes", n: 0},
		{name: "one node", n: 1},
		{name: "node port set", n: 3, cfg: embedded.ClusterOptions{Node: embedded.Options{Port: 4222}}},
		{name: "node store set", n: 3, cfg: embedded.ClusterOptions{Node: embedded.Options{StoreDir: "x"}}},
		{name: "negative timeout", n: 3, cfg: embedded.ClusterOptions{FormationTimeout: -time.Second}},
		{name: "invalid node options", n: 3, cfg: embedded.ClusterOptions{Node: embedded.Options{MaxPayload: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := embedded.StartCluster(tt.n, tt.cfg)
			if err == nil {
				c.Shutdown()
				t.Fatal("StartCluster succeeded, want an error")
			}
			if !errors.Is(err, embedded.ErrStart) || !errors.Is(err, embedded.ErrInvalidOption) {
				t.Errorf("StartCluster error %v, want ErrStart and ErrInvalidOption", err)
			}
		})
	}
}

func TestClusterIndexOutOfRange(t *testing.T) {
	t.Parallel()
	c, err := embedded.StartCluster(2, embedded.ClusterOptions{BaseDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	for _, i := range []int{-1, 2} {
		if err := c.StopServer(i); err == nil {
			t.Errorf("StopServer(%d) succeeded, want an error", i)
		}
		if err := c.RestartServer(i); err == nil {
			t.Errorf("RestartServer(%d) succeeded, want an error", i)
		}
	}
}

// TestClusterTriesAgainOnATakenPort: a route port taken between its
// reservation and its node's bind, as a node's own outgoing connection
// can take it, makes StartCluster try again on fresh ports, also with a
// BaseDir, whose stores of the failed attempt it removes first (before, a
// test with a BaseDir failed: "bind: address already in use"). A cluster
// started from stores that were there before is not tried again. Not
// parallel: the hook is the package's.
func TestClusterTriesAgainOnATakenPort(t *testing.T) {
	var taken []net.Listener
	t.Cleanup(func() {
		embedded.SetRoutePortsHook(nil)
		for _, l := range taken {
			l.Close()
		}
	})
	attempts := 0
	take := func(ports []int) {
		attempts++
		if attempts == 1 {
			l, err := net.Listen("tcp", net.JoinHostPort(embedded.DefaultHost, strconv.Itoa(ports[2])))
			if err != nil {
				t.Errorf("take port %d: %v", ports[2], err)
				return
			}
			taken = append(taken, l)
		}
	}
	embedded.SetRoutePortsHook(take)
	base := t.TempDir()
	c, err := embedded.StartCluster(3, embedded.ClusterOptions{BaseDir: base})
	if err != nil {
		t.Fatalf("StartCluster with a route port taken once: %v", err)
	}
	if attempts != 2 {
		t.Errorf("%d attempts, want 2", attempts)
	}
	c.Shutdown()

	attempts = 0 // the stores are there now: not tried again
	_, err = embedded.StartCluster(3, embedded.ClusterOptions{BaseDir: base})
	if !errors.Is(err, syscall.EADDRINUSE) || attempts != 1 {
		t.Errorf("StartCluster on stores of an earlier run with a port taken: %v after %d attempts, want EADDRINUSE after 1", err, attempts)
	}
	if _, err := os.Stat(filepath.Join(base, "n1")); err != nil {
		t.Errorf("the earlier run's store: %v", err)
	}
}
