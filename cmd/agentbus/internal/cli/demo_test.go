package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestDemoJSON runs `agentbus demo --json`: it exits 0, prints only JSON
// lines, the last of them a successful summary, and removes its server's
// store.
func TestDemoJSON(t *testing.T) {
	tmp := embeddedtest.TempDir(t)
	r := runIn(t, "", "demo", "--json")
	embeddedtest.CheckEmpty(t, tmp)
	if r.code != 0 {
		t.Fatalf("demo --json: exit %d, stderr %q\n%s", r.code, r.stderr, r.stdout)
	}
	if r.stderr != "" {
		t.Errorf("stderr %q, want nothing", r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) < 10 {
		t.Fatalf("%d lines:\n%s", len(lines), r.stdout)
	}
	var last map[string]any
	for i, l := range lines {
		last = nil
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("line %d is not JSON: %v: %s", i+1, err, l)
		}
	}
	if last["event"] != "summary" || last["ok"] != true {
		t.Errorf("last line %v, want a successful summary", last)
	}
}

func TestDemoUsage(t *testing.T) {
	r := runIn(t, "", "demo", "extra")
	if r.code != exitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, "agentbus: ") {
		t.Errorf("demo extra: exit %d, stdout %q, stderr %q; want a usage error", r.code, r.stdout, r.stderr)
	}
}
