//go:build unix

package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

var buildOnce sync.Once

// binaries builds nats-server, from the version this module requires, and
// the agentbus command, once per test binary, and returns their paths.
// go test puts its own toolchain first on PATH.
func binaries(t testing.TB) (natsServer, agentbus string) {
	t.Helper()
	buildOnce.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "agentbus-deploy-test-"); built.err != nil {
			return
		}
		built.err = embeddedtest.GoBuild(built.dir, "..", "github.com/nats-io/nats-server/v2", "github.com/agentbus/agentbus/cmd/agentbus")
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, "nats-server"), filepath.Join(built.dir, "agentbus")
}

// A node is one nats-server process started from nats/node-N.conf.
type node struct {
	name                  string
	client, cluster, http int
	log                   string
	cmd                   *exec.Cmd
	exited                chan struct{} // closed once the process has exited
	stopOnce              sync.Once
}

func (n *node) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.client) }

// kill ends the node's process group at once, as a crash would, and waits
// for the process to exit.
func (n *node) kill() {
	n.stopOnce.Do(func() {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.exited
	})
}

func (n *node) hasExited() bool {
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// writeConfigs copies nats/ into dir, rewriting the listen addresses, the
// routes and the store directories of the node files to those of ns. Each
// rewritten string must occur once, so a change to the files that this
// test would silently miss fails it instead.
func writeConfigs(t testing.TB, dir string, ns []*node) {
	t.Helper()
	for _, f := range []string{"common.conf", "auth.conf"} {
		writeFile(t, filepath.Join(dir, f), readFile(t, filepath.Join("nats", f)))
	}
	addr := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	for i, n := range ns {
		file := fmt.Sprintf("node-%d.conf", i+1)
		text := readFile(t, filepath.Join("nats", file))
		replace := []string{
			"0.0.0.0:4222", addr(n.client),
			"0.0.0.0:8222", addr(n.http),
			"0.0.0.0:6222", addr(n.cluster),
			`"/data/jetstream"`, strconv.Quote(filepath.Join(dir, n.name, "jetstream")),
		}
		for _, other := range ns {
			if other != n {
				replace = append(replace, other.name+":6222", addr(other.cluster))
			}
		}
		for k := 0; k < len(replace); k += 2 {
			if c := strings.Count(text, replace[k]); c != 1 {
				t.Fatalf("%s: %q occurs %d times; the test rewrites it and expects it once", file, replace[k], c)
			}
			text = strings.Replace(text, replace[k], replace[k+1], 1)
		}
		writeFile(t, filepath.Join(dir, file), text)
	}
}

// monitorClient polls the monitoring endpoints; no idle connections are
// kept, so no goroutine outlives the test.
var monitorClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// healthy reports whether n answers 200 on path of its monitoring port.
func (n *node) healthy(path string) (bool, string) {
	resp, err := monitorClient.Get(fmt.Sprintf("http://127.0.0.1:%d%s", n.http, path))
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b := make([]byte, 512)
	k, _ := resp.Body.Read(b)
	return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b[:k])))
}

// errPortTaken reports that a node could not bind a port chosen for it.
var errPortTaken = errors.New("a port was taken before the node bound it")

// startCluster starts the three nodes of nats/ as processes on free ports
// and waits until each is in contact with a JetStream meta leader: the
// condition compose.yaml's health check waits for before provisioning.
func startCluster(t testing.TB, natsServer string) []*node {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ns, err := tryStartCluster(t, natsServer)
		if err == nil {
			return ns
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; again on other ports", attempt, err)
	}
}

func tryStartCluster(t testing.TB, natsServer string) ([]*node, error) {
	dir := t.TempDir()
	ports := embeddedtest.FreePorts(t, 3*len(nodes))
	var ns []*node
	for i, name := range nodes {
		ns = append(ns, &node{
			name:    name,
			client:  ports[3*i],
			cluster: ports[3*i+1],
			http:    ports[3*i+2],
			log:     filepath.Join(dir, name+".log"),
			exited:  make(chan struct{}),
		})
	}
	writeConfigs(t, dir, ns)
	for i, n := range ns {
		logFile, err := os.Create(n.log)
		if err != nil {
			t.Fatal(err)
		}
		n.cmd = exec.Command(natsServer, "--config", filepath.Join(dir, fmt.Sprintf("node-%d.conf", i+1)))
		n.cmd.Stdout, n.cmd.Stderr = logFile, logFile
		n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = n.cmd.Start()
		logFile.Close()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = n.cmd.Wait()
			close(n.exited)
		}()
		t.Cleanup(n.kill)
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(n.log)
				t.Logf("%s log (%s):\n%s", n.name, n.log, tail(string(b), 80))
			}
		})
	}
	var last string
	err := poll(90*time.Second, func() bool {
		for _, n := range ns {
			if n.hasExited() {
				return true
			}
			ok, state := n.healthy("/healthz?js-meta-only=true")
			if !ok {
				last = n.name + ": " + state
				return false
			}
		}
		return true
	})
	for _, n := range ns {
		if n.hasExited() {
			b, _ := os.ReadFile(n.log)
			for _, m := range ns {
				m.kill()
			}
			if strings.Contains(string(b), "address already in use") {
				return nil, fmt.Errorf("%s: %w", n.name, errPortTaken)
			}
			return nil, fmt.Errorf("%s exited while the cluster formed: %s", n.name, tail(string(b), 20))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the cluster did not form: %w; last: %s", err, last)
	}
	return ns, nil
}

// poll calls cond until it returns true, every 50 ms, for at most d.
func poll(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", d)
		}
		<-tick.C
	}
	return nil
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = append([]string{"..."}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}

// environ is the test's environment without the nats CLI's and
// OpenTelemetry's variables, which the agentbus command would read.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NATS_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// TestCluster runs the cluster of nats/ for real: three nats-server
// processes built from this module's dependency, on free ports. It
// provisions with the agentbus command as the admin user of auth.conf,
// passes a message from a client of nats-1 to a subscriber on nats-3, then
// kills the stream's leader and shows that a message still goes through
// with two of the three nodes.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-process NATS cluster; skipped with -short")
	}
	start := time.Now()
	natsServer, agentbus := binaries(t)
	t.Logf("built nats-server and agentbus in %v", time.Since(start).Round(time.Millisecond))

	phase := time.Now()
	ns := startCluster(t, natsServer)
	t.Logf("cluster formed in %v", time.Since(phase).Round(time.Millisecond))

	// Provision as an operator would: the documented command, all three
	// servers, the admin user.
	phase = time.Now()
	var urls []string
	for _, n := range ns {
		urls = append(urls, n.url())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentbus, "--server", strings.Join(urls, ","), "--user", adminUser, "--password", adminPassword,
		"provision", "--replicas", "3")
	cmd.Env = environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agentbus provision --replicas 3: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "stream AGENTBUS ") || !strings.Contains(string(out), " replicas=3 ") {
		t.Fatalf("agentbus provision printed %q, want the AGENTBUS stream with replicas=3", out)
	}
	t.Logf("provisioned in %v: %s", time.Since(phase).Round(time.Millisecond), strings.TrimSpace(string(out)))

	login := bus.WithNATSOptions(nats.UserInfo(adminUser, adminPassword))
	connect := func(n *node, agent string) *bus.Bus {
		t.Helper()
		b, err := bus.Connect(n.url(), agent, login)
		if err != nil {
			t.Fatalf("connect %s to %s: %v", agent, n.name, err)
		}
		t.Cleanup(func() { _ = b.Close() })
		if got := b.Conn().ConnectedServerName(); got != n.name {
			t.Fatalf("%s is connected to %s, want %s", agent, got, n.name)
		}
		return b
	}
	planner := connect(ns[0], "planner")
	worker := connect(ns[2], "worker-1")

	// Every replica of the stream is current before a node is lost.
	js, err := jetstream.New(planner.Conn())
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	streamInfo := func() (*jetstream.StreamInfo, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "AGENTBUS")
		if err != nil {
			return nil, err
		}
		return s.Info(ctx)
	}
	var last string
	if err := poll(60*time.Second, func() bool {
		i, err := streamInfo()
		if err != nil {
			last = err.Error()
			return false
		}
		info, last = i, fmt.Sprintf("%+v", i.Cluster)
		if i.Config.Replicas != 3 || i.Cluster == nil || i.Cluster.Leader == "" || len(i.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range i.Cluster.Replicas {
			if !r.Current {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("stream AGENTBUS with three current replicas: %v; last: %s", err, last)
	}

	received := make(chan *bus.Delivery, 100)
	if _, err := worker.Subscribe(context.Background(), func(ctx context.Context, d *bus.Delivery) error {
		select {
		case received <- d:
		case <-ctx.Done():
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(id string) *bus.Delivery {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case d := <-received:
				if d.ID == id {
					return d
				}
			case <-timeout:
				t.Fatalf("message %s did not reach worker-1 within 60s", id)
			}
		}
	}

	// Across nodes: published through nats-1, consumed through nats-3.
	phase = time.Now()
	pubCtx, pubCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pubCancel()
	ack, err := planner.Publish(pubCtx, bus.Message{To: "worker-1", Type: "deploy.check", Data: []byte("three nodes")})
	if err != nil {
		t.Fatalf("publish through nats-1: %v", err)
	}
	if d := waitFor(ack.ID); string(d.Data) != "three nodes" || d.From != "planner" {
		t.Fatalf("worker-1 received %q from %s", d.Data, d.From)
	}
	t.Logf("a message went from nats-1 to nats-3 in %v", time.Since(phase).Round(time.Millisecond))

	// Lose the stream's leader; two of three nodes are a quorum.
	var leader *node
	for _, n := range ns {
		if n.name == info.Cluster.Leader {
			leader = n
		}
	}
	if leader == nil {
		t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
	}
	phase = time.Now()
	leader.kill()
	t.Logf("killed %s, the stream leader", leader.name)

	// Publish until the server acknowledges; a retry of the same ID is
	// stored once.
	m := bus.Message{ID: fmt.Sprintf("after-%s-%d", leader.name, time.Now().UnixNano()), To: "worker-1", Type: "deploy.check", Data: []byte("two nodes")}
	if err := poll(90*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := planner.Publish(ctx, m)
		if err != nil {
			last = err.Error()
		}
		return err == nil
	}); err != nil {
		t.Fatalf("publish with %s down: %v; last error: %s", leader.name, err, last)
	}
	published := time.Since(phase)
	if d := waitFor(m.ID); string(d.Data) != "two nodes" {
		t.Fatalf("worker-1 received %q", d.Data)
	}
	t.Logf("with %s down: published after %v, received after %v", leader.name,
		published.Round(time.Millisecond), time.Since(phase).Round(time.Millisecond))

	if err := poll(30*time.Second, func() bool {
		i, err := streamInfo()
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%+v", i.Cluster)
		return i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != leader.name
	}); err != nil {
		t.Fatalf("a new stream leader: %v; last: %s", err, last)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}
