//go:build unix

package bus_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
)

// buildCLI builds the agentbus command into a temporary directory and
// returns its path. go test puts its own toolchain first on PATH.
func buildCLI(t *testing.T) string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH to build the agentbus binary with: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "agentbus")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, gotool, "build", "-o", bin, "github.com/agentbus/agentbus/cmd/agentbus").CombinedOutput()
	if err != nil {
		t.Fatalf("go build agentbus: %v\n%s", err, out)
	}
	return bin
}

// TestCrashSubscriberKilledMidHandler: an `agentbus subscribe --exec`
// process is killed with SIGKILL while its command handles a message. Its
// messages stay in the inbox: the next subscriber of the agent gets the one
// that was being handled on its second delivery, and every other one, once
// the server's ack wait passed.
func TestCrashSubscriberKilledMidHandler(t *testing.T) {
	start := time.Now()
	bin := buildCLI(t)
	built := time.Now()
	s := newServer(t)
	sender := newBus(t, s, "sender")
	var ids []string
	for i := range 3 {
		ack := publish(t, sender, bus.Message{To: "worker", Type: "job", Data: []byte(fmt.Sprint("job-", i))})
		ids = append(ids, ack.ID)
	}

	// The command writes its pid and the message ID, then runs for a
	// minute: it is still running when its subscriber is killed.
	mark := filepath.Join(t.TempDir(), "mark")
	script := `printf '%s %s\n' "$$" "$AGENTBUS_ID" > "$MARK.tmp" && mv "$MARK.tmp" "$MARK" && exec sleep 60`
	cmd := exec.Command(bin, "subscribe", "--server", s.ClientURL(), "--agent", "worker", "--ack-wait", "1s", "--exec", script)
	cmd.Env = append(os.Environ(), "MARK="+mark)
	// Files, not buffers: the orphaned command keeps the subscriber's
	// output open, and Wait would wait for a pipe to close.
	logs := t.TempDir()
	stdout, err := os.Create(filepath.Join(logs, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(logs, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	output := func() string {
		o, _ := os.ReadFile(stdout.Name())
		e, _ := os.ReadFile(stderr.Name())
		return fmt.Sprintf("stdout %q, stderr %q", o, e)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	var handlerPID int
	var handling string
	waitFor(t, "the --exec command to start", func() (bool, string) {
		b, err := os.ReadFile(mark)
		if err != nil {
			return false, fmt.Sprintf("%v; subscriber %s", err, output())
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			t.Fatalf("mark file %q, want pid and message ID", b)
		}
		if handlerPID, err = strconv.Atoi(f[0]); err != nil {
			t.Fatalf("mark file %q: %v", b, err)
		}
		handling = f[1]
		return true, ""
	})
	// The command runs in a process group of its own, which outlives its
	// killed subscriber; end it with the test.
	t.Cleanup(func() { _ = syscall.Kill(-handlerPID, syscall.SIGKILL) })
	if !slices.Contains(ids, handling) {
		t.Fatalf("the command handles %q, not one of the published %v", handling, ids)
	}
	info, err := consumerInfo(t, sender, "worker_p3")
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending == 0 {
		t.Fatalf("the server has no message out to the subscriber: %+v", info)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err = cmd.Wait()
	exited = true
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("subscriber ended with %v, want killed by SIGKILL", err)
	}
	if err := syscall.Kill(-handlerPID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill the orphaned command: %v", err)
	}

	// The agent's next process, here a library subscriber.
	worker := newBus(t, s, "worker")
	r := newRecorder()
	subscribe(t, worker, r.handle, bus.WithAckWait(time.Second))
	got := r.waitCount(t, len(ids))
	redelivered := time.Since(killed)
	var gotIDs []string
	for _, d := range got {
		gotIDs = append(gotIDs, d.ID)
		if d.ID == handling && d.Deliveries != 2 {
			t.Errorf("message %s, killed mid-handler, came on delivery %d, want 2", d.ID, d.Deliveries)
		}
	}
	slices.Sort(gotIDs)
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(gotIDs, want) {
		t.Errorf("after the crash got %v, want each of %v once", gotIDs, want)
	}
	waitFor(t, "the inbox to be empty and every message acknowledged", func() (bool, string) {
		info, err := consumerInfo(t, worker, "worker_p3")
		if err != nil {
			return false, err.Error()
		}
		return info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream == uint64(len(ids)),
			fmt.Sprintf("pending %d, ack pending %d, ack floor %d", info.NumPending, info.NumAckPending, info.AckFloor.Stream)
	})
	waitAllInState(t, sender, bus.StateCompleted, ids) // the crash left no message delivered for good
	var deliveries []string
	for _, d := range got {
		deliveries = append(deliveries, fmt.Sprintf("%s:%d", d.ID, d.Deliveries))
	}
	t.Logf("killed the subscriber mid-handler of %s; all %d messages handled by the next subscriber %v after the kill (ack wait 1s); deliveries %v",
		handling, len(ids), redelivered.Round(time.Millisecond), deliveries)
	t.Logf("build %v, run time %v; killed subscriber's %s",
		built.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), output())
}
