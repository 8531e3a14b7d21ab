package embeddedtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunServer(t *testing.T) {
	t.Parallel()
	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.ServerName = "unit" })
	if got := s.Options().ServerName; got != "unit" {
		t.Errorf("ServerName = %q, want the option's %q", got, "unit")
	}
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("x")); err != nil {
		t.Fatal(err)
	}

	// The store is the test's, so it outlives the server for a restart.
	s.Shutdown()
	if _, err := os.Stat(filepath.Join(s.Options().StoreDir, "jetstream")); err != nil {
		t.Errorf("store gone after Shutdown: %v", err)
	}
}

// fatalTB records Fatalf and ends the goroutine as testing.T does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (tb *fatalTB) Helper() {}

func (tb *fatalTB) Fatalf(format string, args ...any) {
	tb.mu.Lock()
	tb.msg = fmt.Sprintf(format, args...)
	tb.mu.Unlock()
	runtime.Goexit()
}

func TestRunServerFailsTheTest(t *testing.T) {
	t.Parallel()
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		embeddedtest.RunServer(tb, func(o *embedded.Options) { o.Port = -1 })
		t.Error("RunServer returned after a failed start")
	}()
	<-done
	if !strings.Contains(tb.msg, "invalid option") {
		t.Errorf("Fatalf message %q, want the start error", tb.msg)
	}
}

func TestRunCluster(t *testing.T) {
	t.Parallel()
	c := embeddedtest.RunCluster(t, 3, func(cfg *embedded.ClusterOptions) { cfg.Name = "unit" })
	if c.Name() != "unit" || len(c.Servers()) != 3 {
		t.Fatalf("cluster %q with %d servers, want unit with 3", c.Name(), len(c.Servers()))
	}
	nc := embeddedtest.ConnectCluster(t, c)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForStreamLeader(ctx, "", "R3"); err != nil {
		t.Fatal(err)
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	calls := 0
	embeddedtest.WaitFor(t, time.Minute, "the third call", func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprint(calls, " calls")
	})
	if calls != 3 {
		t.Errorf("cond called %d times, want 3", calls)
	}

	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		embeddedtest.WaitFor(tb, 50*time.Millisecond, "nothing", func() (bool, string) { return false, "still nothing" })
		t.Error("WaitFor returned after its deadline")
	}()
	<-done
	if want := "timed out waiting for nothing; last state: still nothing"; tb.msg != want {
		t.Errorf("Fatalf message %q, want %q", tb.msg, want)
	}
}
