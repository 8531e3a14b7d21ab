package embedded_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded"
)

// holdStoreEnv makes the test binary, re-executed by startHolder, start a
// server on the store it names instead of running the tests.
const holdStoreEnv = "AGENTBUS_TEST_HOLD_STORE"

// holdStore is the re-executed test binary: it starts a server on dir,
// says so on stdout and runs until its stdin closes or it is killed. It
// returns the process's exit code.
func holdStore(dir string) int {
	s, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Shutdown()
	fmt.Printf("serving %d\n", os.Getpid())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

func skipWithoutLocking(t *testing.T) {
	t.Helper()
	if !embedded.StoreLocking {
		t.Skip("Start does not lock the store directory on this system")
	}
}

// checkLocked fails the test unless err is Start's refusal of dir, held by
// the process pid.
func checkLocked(t *testing.T, err error, dir string, pid int) {
	t.Helper()
	if err == nil {
		t.Fatalf("Start on %s, which another server holds, succeeded", dir)
	}
	if !errors.Is(err, embedded.ErrStoreLocked) || !errors.Is(err, embedded.ErrStart) {
		t.Fatalf("Start error %v, want ErrStoreLocked and ErrStart", err)
	}
	var locked *embedded.StoreLockedError
	if !errors.As(err, &locked) {
		t.Fatalf("Start error %v is not a *StoreLockedError", err)
	}
	if locked.Dir != dir || locked.PID != pid {
		t.Errorf("StoreLockedError{Dir: %q, PID: %d}, want {%q, %d}", locked.Dir, locked.PID, dir, pid)
	}
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, "in use by another agentbus server") {
		t.Errorf("error %q does not name the store and say another server uses it", msg)
	}
}

// TestStoreLockedInProcess: a second server on a running server's store is
// refused, with a temporary store too; once the first has shut down, a new
// one starts on the store and finds its data.
func TestStoreLockedInProcess(t *testing.T) {
	skipWithoutLocking(t)
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	first, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Shutdown)
	js := jetStream(t, connect(t, first))
	writeMessages(ctx, t, js, "LOCKED", 3)

	_, err = embedded.Start(embedded.Options{StoreDir: dir})
	checkLocked(t, err, dir, os.Getpid())
	if _, err := os.Stat(filepath.Join(dir, embedded.LockFileName)); err != nil {
		t.Errorf("no lock file: %v", err)
	}

	tmp, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = embedded.Start(embedded.Options{StoreDir: tmp.Options().StoreDir})
	checkLocked(t, err, tmp.Options().StoreDir, os.Getpid())
	tmp.Shutdown()

	first.Shutdown()
	again := start(t, embedded.Options{StoreDir: dir})
	checkMessages(ctx, t, jetStream(t, connect(t, again)), "LOCKED", 3)
}

// TestStoreUnlockedAfterFailedStart: a Start that fails after taking the
// lock gives it back.
func TestStoreUnlockedAfterFailedStart(t *testing.T) {
	skipWithoutLocking(t)
	t.Parallel()
	dir := t.TempDir()
	busy := start(t, embedded.Options{})
	_, err := embedded.Start(embedded.Options{StoreDir: dir, Port: busy.Options().Port})
	if err == nil || errors.Is(err, embedded.ErrStoreLocked) {
		t.Fatalf("Start on a port in use: %v, want a failure other than the lock", err)
	}
	start(t, embedded.Options{StoreDir: dir})
}

// TestStoreLockedByAnotherProcessAndFreedByItsCrash: a server in another
// process holds the store; Start here is refused and names that process.
// Killed with SIGKILL, it never unlocks, yet the lock went with it: Start
// succeeds on the store it left.
func TestStoreLockedByAnotherProcessAndFreedByItsCrash(t *testing.T) {
	skipWithoutLocking(t)
	t.Parallel()
	dir := t.TempDir()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), holdStoreEnv+"="+dir)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
		_ = stdin.Close()
	})
	line := make(chan string, 1)
	go func() { // ends when the child's stdout closes, at the latest when it dies
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if want := fmt.Sprintf("serving %d\n", child.Process.Pid); l != want {
			t.Fatalf("child printed %q, want %q; stderr %q", l, want, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not start its server within 30s; stderr %q", stderr.String())
	}

	_, err = embedded.Start(embedded.Options{StoreDir: dir})
	checkLocked(t, err, dir, child.Process.Pid)

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waited = true
	if err := child.Wait(); err == nil {
		t.Fatal("killed child exited 0")
	}
	b, err := os.ReadFile(filepath.Join(dir, embedded.LockFileName))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(child.Process.Pid) {
		t.Errorf("lock file after the crash holds %q (%v), want the dead child's pid", b, err)
	}
	start(t, embedded.Options{StoreDir: dir})
}

func jetStream(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
