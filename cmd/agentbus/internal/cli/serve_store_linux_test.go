package cli

import (
	"fmt"
	"testing"
)

// TestServeStoreInUse: a second serve on a store that a running serve
// holds exits 1 with an error naming the store, and the first one goes on
// serving.
func TestServeStoreInUse(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	s := startServe(t, store)
	r := runIn(t, "", "serve", "--listen", "127.0.0.1:0", "--store", store)
	if r.code != exitError {
		t.Fatalf("second serve exited %d, want %d; stderr %q", r.code, exitError, r.stderr)
	}
	want := fmt.Sprintf("agentbus: store directory %s is in use by another agentbus server in this process; stop it or use another store directory\n", store)
	if r.stderr != want || r.stdout != "" {
		t.Errorf("second serve printed stdout %q, stderr %q; want stderr %q", r.stdout, r.stderr, want)
	}
	publish(t, s.url, "--from", "lead", "--to", "w1", "--type", "NOTE", "--data", "still served")
	if code := s.stop(t); code != 0 {
		t.Fatalf("first serve exited %d; stderr %q", code, s.stderr.String())
	}
}
