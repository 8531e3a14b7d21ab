package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdStoreEnv); dir != "" {
		os.Exit(holdStore(dir)) // re-executed by a lock test
	}
	goleak.VerifyTestMain(m, embeddedtest.IgnoreServerGoroutines()...)
}

// start starts a server on a test-owned store and shuts it down at cleanup.
func start(t *testing.T, opts embedded.Options) *embedded.Server {
	t.Helper()
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	s, err := embedded.Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t *testing.T, s *embedded.Server) *nats.Conn {
	t.Helper()
	nc, err := s.Connect()
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStartDefaults(t *testing.T) {
	t.Parallel()
	s := start(t, embedded.Options{})

	o := s.Options()
	if o.Host != embedded.DefaultHost {
		t.Errorf("Host = %q, want %q", o.Host, embedded.DefaultHost)
	}
	if o.Port <= 0 {
		t.Errorf("Port = %d, want the port chosen by the server", o.Port)
	}
	if !strings.HasPrefix(o.ServerName, "agentbus-") {
		t.Errorf("ServerName = %q, want a generated agentbus-... name", o.ServerName)
	}
	if want := fmt.Sprintf("nats://127.0.0.1:%d", o.Port); s.ClientURL() != want {
		t.Errorf("ClientURL = %q, want %q", s.ClientURL(), want)
	}
	if !s.Running() || !s.NATS().JetStreamEnabled() {
		t.Errorf("Running = %v, JetStreamEnabled = %v, want both true", s.Running(), s.NATS().JetStreamEnabled())
	}

	// Both the in-process connection and a TCP connection reach the server.
	nc := connect(t, s)
	if err := nc.Flush(); err != nil {
		t.Fatalf("Flush in-process: %v", err)
	}
	tcp, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("dial %s: %v", s.ClientURL(), err)
	}
	defer tcp.Close()
	if got := tcp.ConnectedServerName(); got != o.ServerName {
		t.Errorf("TCP connection reached %q, want %q", got, o.ServerName)
	}
}

func TestOptionsApplied(t *testing.T) {
	t.Parallel()
	var configured atomic.Bool
	s := start(t, embedded.Options{
		ServerName: "custom",
		MaxPayload: 4096,
		Configure: func(o *server.Options) {
			configured.Store(true)
			o.NoHeaderSupport = true
		},
	})
	if !configured.Load() {
		t.Fatal("Configure was not called")
	}
	if got := s.Options().ServerName; got != "custom" {
		t.Errorf("ServerName = %q, want custom", got)
	}
	nc := connect(t, s)
	if got := nc.MaxPayload(); got != 4096 {
		t.Errorf("MaxPayload = %d, want 4096", got)
	}
	if nc.HeadersSupported() {
		t.Error("server supports headers, want them disabled by Configure")
	}
}

func TestJetStreamUsable(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := start(t, embedded.Options{})
	js, err := jetstream.New(connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	writeMessages(ctx, t, js, "ORDERS", 5)
	checkMessages(ctx, t, js, "ORDERS", 5)
}

// writeMessages creates stream name on subjects "<name>.>" (if needed) and
// publishes n messages "msg-1".."msg-n" to it.
func writeMessages(ctx context.Context, t *testing.T, js jetstream.JetStream, name string, n int) {
	t.Helper()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{strings.ToLower(name) + ".>"},
		Storage:  jetstream.FileStorage,
	}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(ctx, strings.ToLower(name)+".new", fmt.Appendf(nil, "msg-%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// checkMessages reads stream name back and checks it holds exactly the n
// messages writeMessages wrote.
func checkMessages(ctx context.Context, t *testing.T, js jetstream.JetStream, name string, n int) {
	t.Helper()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("look up stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != uint64(n) {
		t.Fatalf("stream %s holds %d messages, want %d", name, info.State.Msgs, n)
	}
	for i := 1; i <= n; i++ {
		m, err := st.GetMsg(ctx, uint64(i))
		if err != nil {
			t.Fatalf("get message %d: %v", i, err)
		}
		if want := fmt.Sprintf("msg-%d", i); string(m.Data) != want {
			t.Errorf("message %d = %q, want %q", i, m.Data, want)
		}
	}
}

func TestRestartKeepsDataAndPort(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	first := start(t, embedded.Options{})
	nc := connect(t, first)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	writeMessages(ctx, t, js, "EVENTS", 3)
	nc.Close()
	opts := first.Options()
	first.Shutdown()

	second := start(t, opts)
	if got, want := second.Options(), opts; got.Port != want.Port || got.StoreDir != want.StoreDir || got.ServerName != want.ServerName {
		t.Errorf("restarted with port %d, store %q, name %q; want %d, %q, %q",
			got.Port, got.StoreDir, got.ServerName, want.Port, want.StoreDir, want.ServerName)
	}
	js2, err := jetstream.New(connect(t, second))
	if err != nil {
		t.Fatal(err)
	}
	checkMessages(ctx, t, js2, "EVENTS", 3)
}

func TestStartErrors(t *testing.T) {
	t.Parallel()

	// A port another listener holds.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	busyPort := busy.Addr().(*net.TCPAddr).Port

	// A store directory that cannot be created, even by root: its parent
	// is a regular file.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		opts    embedded.Options
		wantErr []error // every one must match with errors.Is
	}{
		{
			name:    "client port in use",
			opts:    embedded.Options{Port: busyPort},
			wantErr: []error{embedded.ErrStart, syscall.EADDRINUSE},
		},
		{
			name: "route port in use",
			opts: embedded.Options{Cluster: &embedded.RouteOptions{
				Port:   busyPort,
				Routes: []string{"nats-route://127.0.0.1:1"},
			}},
			wantErr: []error{embedded.ErrStart, syscall.EADDRINUSE},
		},
		{
			name:    "store dir under a file",
			opts:    embedded.Options{StoreDir: filepath.Join(file, "store")},
			wantErr: []error{embedded.ErrStart},
		},
		{
			name:    "cluster without routes",
			opts:    embedded.Options{Cluster: &embedded.RouteOptions{}},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		// Found by a helper session (2026-11-28): each passed Validate, and
		// Start ran a node that could never join, or failed on a name
		// lookup.
		{
			name:    "route port out of range",
			opts:    embedded.Options{Cluster: &embedded.RouteOptions{Routes: []string{"nats-route://127.0.0.1:99999"}}},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "route of another scheme",
			opts:    embedded.Options{Cluster: &embedded.RouteOptions{Routes: []string{"http://127.0.0.1:6222"}}},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "host with a port",
			opts:    embedded.Options{Host: "127.0.0.1:4222"},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "host in brackets",
			opts:    embedded.Options{Host: "[::1]"},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "server rejects options",
			opts:    embedded.Options{MaxPayload: 1 << 30}, // above the default max pending
			wantErr: []error{embedded.ErrStart},
		},
		{
			name:    "negative port",
			opts:    embedded.Options{Port: -1},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "port too large",
			opts:    embedded.Options{Port: 70000},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "negative max payload",
			opts:    embedded.Options{MaxPayload: -1},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "server name with space",
			opts:    embedded.Options{ServerName: "a b"},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
		{
			name:    "bad route",
			opts:    embedded.Options{Cluster: &embedded.RouteOptions{Routes: []string{"127.0.0.1"}}},
			wantErr: []error{embedded.ErrStart, embedded.ErrInvalidOption},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.opts.StoreDir == "" {
				tt.opts.StoreDir = t.TempDir()
			}
			s, err := embedded.Start(tt.opts)
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded, want an error")
			}
			t.Logf("Start error: %v", err)
			if s != nil {
				t.Errorf("Start returned a server with error %v", err)
			}
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Start error %q does not match %v", err, want)
				}
			}
		})
	}
}

// recordingLogger counts Fatalf calls and remembers Errorf messages.
type recordingLogger struct {
	mu     sync.Mutex
	fatals int
	errs   []string
}

func (l *recordingLogger) Fatalf(string, ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fatals++
}

func (l *recordingLogger) Errorf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf(format, v...))
}

func (l *recordingLogger) Noticef(string, ...any) {}
func (l *recordingLogger) Warnf(string, ...any)   {}
func (l *recordingLogger) Debugf(string, ...any)  {}
func (l *recordingLogger) Tracef(string, ...any)  {}

func TestFatalReportsNeverReachLoggerFatalf(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	log := &recordingLogger{}
	_, err = embedded.Start(embedded.Options{
		Port:     busy.Addr().(*net.TCPAddr).Port,
		StoreDir: t.TempDir(),
		Logger:   log,
	})
	if !errors.Is(err, embedded.ErrStart) {
		t.Fatalf("Start error = %v, want ErrStart", err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.fatals != 0 {
		t.Errorf("logger Fatalf called %d times, want 0", log.fatals)
	}
	var found bool
	for _, e := range log.errs {
		found = found || strings.HasPrefix(e, "fatal: ")
	}
	if !found {
		t.Errorf("no fatal report among the logged errors %q", log.errs)
	}
}

func TestShutdownIdempotent(t *testing.T) {
	t.Parallel()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
		t.Fatal("Done closed while the server runs")
	default:
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	s.Shutdown()
	select {
	case <-s.Done():
	default:
		t.Error("Done not closed after Shutdown")
	}
	if s.Running() || s.NATS().Running() {
		t.Error("server still running after Shutdown")
	}
	if _, err := s.Connect(); !errors.Is(err, embedded.ErrShutdown) {
		t.Errorf("Connect after Shutdown: error %v, want ErrShutdown", err)
	}
}

func TestTemporaryStore(t *testing.T) {
	t.Parallel()
	s, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Options().StoreDir
	if dir == "" {
		s.Shutdown()
		t.Fatal("resolved StoreDir is empty")
	}
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Errorf("JetStream store not in the temporary directory: %v", err)
	}
	s.Shutdown()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary store %s still there after Shutdown (stat error %v)", dir, err)
	}
}

func TestCallerStoreKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Errorf("caller's store removed by Shutdown: %v", err)
	}
}

// TestFailedStartRemovesTemporaryStore is not parallel: it counts the
// temporary stores, and the parallel tests create some.
func TestFailedStartRemovesTemporaryStore(t *testing.T) {
	pattern := filepath.Join(os.TempDir(), "agentbus-embedded-*")
	before, _ := filepath.Glob(pattern)
	// The server rejects the payload, after Start created the temporary
	// store.
	if _, err := embedded.Start(embedded.Options{MaxPayload: 1 << 30}); err == nil {
		t.Fatal("Start succeeded, want an error")
	}
	after, _ := filepath.Glob(pattern)
	if len(after) > len(before) {
		t.Errorf("temporary stores before %v, after %v", before, after)
	}
}

// TestClientURLWithoutListening: a server that does not listen for clients
// (DontListen through Configure) has no client URL, also when Options.Port
// named one. Before, ClientURL gave that port, where nobody listened
// (found by a helper session).
func TestClientURLWithoutListening(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s, err := embedded.Start(embedded.Options{
		Port:      port,
		StoreDir:  t.TempDir(),
		Configure: func(o *server.Options) { o.DontListen = true },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if u := s.ClientURL(); u != "" {
		t.Errorf("ClientURL = %q on a server that does not listen, want \"\"", u)
	}
}
