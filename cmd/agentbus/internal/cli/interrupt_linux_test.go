package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSubscribeInterruptKillsExec: cancelling subscribe (SIGINT in the
// binary) terminates the --exec command and what it started, exits 0, and
// leaves the message to be redelivered.
func TestSubscribeInterruptKillsExec(t *testing.T) {
	t.Parallel()
	url := newServer(t)
	id := publish(t, url, "--from", "alice", "--to", "bob", "--type", "SLOW", "--data", "x")
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	script := `sleep 60 & echo "$$ $!" > ` + shellQuote(pids) + `.tmp; mv ` + shellQuote(pids) + `.tmp ` + shellQuote(pids) + `; wait`

	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- Main(ctx, []string{"--server", url, "subscribe", "--agent", "bob", "--exec", script}, strings.NewReader(""), &stdout, &stderr)
	}()
	var procs []int
	waitFor(t, "the command to start", func() (bool, string) {
		b, err := os.ReadFile(pids)
		if err != nil {
			return false, err.Error()
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("pids file %q: %v", b, err)
			}
			procs = append(procs, pid)
		}
		return true, ""
	})
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("subscribe exited %d after cancel; stderr %q", c, stderr.String())
	}
	for _, pid := range procs {
		waitFor(t, "process "+strconv.Itoa(pid)+" to end", func() (bool, string) {
			stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil {
				return true, "" // gone
			}
			// A killed process whose parent is gone may stay a zombie
			// until init reaps it; it no longer runs.
			fields := bytes.Fields(stat[bytes.LastIndexByte(stat, ')')+1:])
			return len(fields) > 0 && string(fields[0]) == "Z", "stat " + string(stat)
		})
	}
	if !strings.Contains(stderr.String(), "will be redelivered") {
		t.Errorf("stderr %q, want a warning that the message will be redelivered", stderr.String())
	}
	out := mustRun(t, "--server", url, "subscribe", "--agent", "bob", "--count", "1")
	if !strings.Contains(out, "id="+id+" delivery=2 ") {
		t.Errorf("after the interrupt got %q, want message %s on delivery 2", out, id)
	}
}
