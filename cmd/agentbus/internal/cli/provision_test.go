package cli

import (
	"strings"
	"testing"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// TestProvisionDedupBudget: without --peak-rate provision warns that the
// duplicate window's memory is not bounded; with it, a window over
// --dedup-budget is refused before anything is provisioned, naming the
// window that fits, and accepted with that window or a raised budget.
func TestProvisionDedupBudget(t *testing.T) {
	url := embeddedtest.RunServer(t).ClientURL()
	prov := func(args ...string) []string { return append([]string{"--server", url, "provision"}, args...) }
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // in the one stream line; empty for a failure
		wantStderr string // in stderr; empty for nothing on stderr
	}{
		{name: "rate not stated", args: prov(), wantStdout: " dedup-window=1h ", wantStderr: "agentbus: warning: duplicate window memory not bounded"},
		{name: "over the default budget", args: prov("--peak-rate", "50000"), wantCode: exitUsage,
			wantStderr: "use --dedup-window 17s or less, or --dedup-budget 51499MiB or more"},
		{name: "the window that fits", args: prov("--peak-rate", "50000", "--dedup-window", "17s"), wantStdout: " dedup-window=17s "},
		{name: "budget raised", args: prov("--peak-rate", "50000", "--dedup-budget", "51499MiB"), wantStdout: " dedup-window=1h "},
		{name: "within the default budget", args: prov("--peak-rate", "100"), wantStdout: " dedup-window=1h "},
		{name: "nothing fits", args: prov("--peak-rate", "10000000"), wantCode: exitUsage, wantStderr: "no window of 100ms or more fits: use --dedup-budget"},
		{name: "negative rate", args: prov("--peak-rate", "-1"), wantCode: exitUsage, wantStderr: "peak publish rate"},
		{name: "bad budget", args: prov("--dedup-budget", "lots"), wantCode: exitUsage, wantStderr: "--dedup-budget"},
		{name: "negative budget", args: prov("--dedup-budget", "-1GiB"), wantCode: exitUsage, wantStderr: "--dedup-budget"},
		{name: "no replicas", args: prov("--replicas", "0"), wantCode: exitUsage, wantStderr: "--replicas 0: 1 to 5"},
		{name: "too many replicas", args: prov("--replicas", "6"), wantCode: exitUsage, wantStderr: "replicas 6: 1 to 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runIn(t, "", tt.args...)
			if r.code != tt.wantCode {
				t.Fatalf("exit %d, want %d (stderr %q)", r.code, tt.wantCode, r.stderr)
			}
			if tt.wantCode != 0 {
				checkOneErrorLine(t, r)
			}
			if tt.wantStdout == "" && r.stdout != "" || !strings.Contains(r.stdout, tt.wantStdout) {
				t.Errorf("stdout %q, want %q in it", r.stdout, tt.wantStdout)
			}
			if tt.wantStderr == "" && r.stderr != "" || !strings.Contains(r.stderr, tt.wantStderr) {
				t.Errorf("stderr %q, want %q in it", r.stderr, tt.wantStderr)
			}
		})
	}
}

// TestProvisionShards: --shards provisions a stream per shard root and an
// agent's consumers on its own shard; --shard provisions one shard only;
// bad shard flags and tags are refused before anything is provisioned.
func TestProvisionShards(t *testing.T) {
	url := embeddedtest.RunServer(t).ClientURL()
	out := mustRun(t, "--server", url, "provision", "--shards", "3", "--agent", "worker-2", "--agent", "reviewer")
	for _, want := range []string{"stream AGENTBUS_S0 ", "stream AGENTBUS_S1 ", "stream AGENTBUS_S2 ",
		"agent worker-2 root=agentbus.s0 consumers=6", "agent reviewer root=agentbus.s1 consumers=6"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "stream AGENTBUS ") {
		t.Errorf("provisioned the unsharded root too: %q", out)
	}
	// The number is recorded: commands given another are refused, an
	// agent's and the operator's alike.
	for _, args := range [][]string{
		{"publish", "--from", "lead", "--to", "reviewer", "--type", "T"},
		{"agents"},
		{"status", "0190c0de-0000-7000-8000-000000000000"},
	} {
		r := runIn(t, "", append([]string{"--server", url, "--shards", "2"}, args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, "one of 3 shards") {
			t.Errorf("--shards 2 %v on three shards: exit %d, stderr %q; want %d naming 3 shards", args, r.code, r.stderr, exitError)
		}
	}
	out = mustRun(t, "--server", url, "--root", "team", "provision", "--shards", "3", "--shard", "1", "--agent", "worker-2", "--agent", "reviewer")
	if got := strings.Count(out, "stream "); got != 1 || !strings.Contains(out, "stream TEAM_S1 ") {
		t.Errorf("--shard 1 provisioned %q, want TEAM_S1 only", out)
	}
	if strings.Contains(out, "worker-2") || !strings.Contains(out, "agent reviewer root=team.s1 ") {
		t.Errorf("--shard 1 set up %q, want the agents of shard 1 only", out)
	}
	for _, args := range [][]string{
		{"--shards", "0"}, {"--shards", "2000"}, {"--shards", "3", "--shard", "3"}, {"--shard", "1"}, {"--tag", ""},
	} {
		r := runIn(t, "", append([]string{"--server", url, "provision"}, args...)...)
		if r.code != exitUsage {
			t.Errorf("provision %v: exit %d, want %d (stderr %q)", args, r.code, exitUsage, r.stderr)
		}
		checkOneErrorLine(t, r)
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		print   string
		wantErr bool
	}{
		{in: "0", want: 0, print: "0"},
		{in: "1000", want: 1000, print: "1000"},
		{in: "2048", want: 2048, print: "2KiB"},
		{in: "256MiB", want: 256 << 20, print: "256MiB"},
		{in: "1024MiB", want: 1 << 30, print: "1GiB"},
		{in: "2TiB", want: 2 << 40, print: "2TiB"},
		{in: "1.5GiB", wantErr: true},
		{in: "-1", wantErr: true},
		{in: "9000000TiB", wantErr: true},
		{in: "GiB", wantErr: true},
		{in: "1GB", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var b byteSize
			err := b.Set(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set(%q) = %v, want error %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if int64(b) != tt.want || b.String() != tt.print {
				t.Errorf("Set(%q) = %d printed %q, want %d printed %q", tt.in, int64(b), b.String(), tt.want, tt.print)
			}
		})
	}
}

// TestShardsCommands: with --shards, the agent commands reach each agent on
// its own shard: a message published to an agent of another shard is
// stored there and received by the agent's subscribe, and a request across
// shards is answered.
func TestShardsCommands(t *testing.T) {
	url := embeddedtest.RunServer(t).ClientURL()
	sharded := func(args ...string) []string { return append([]string{"--server", url, "--shards", "3"}, args...) }
	mustRun(t, sharded("provision", "--agent", "worker-2", "--agent", "reviewer")...)
	id := publish(t, url, "--shards", "3", "--from", "reviewer", "--to", "worker-2", "--type", "TASK", "--data", "x", "--correlation-id", "conv-1")
	got := mustRun(t, sharded("subscribe", "--agent", "worker-2", "--count", "1", "--json")...)
	if !strings.Contains(got, `"TASK"`) {
		t.Errorf("worker-2 got %q, want the TASK", got)
	}
	// An answer on the other shard, then the operator's view of both.
	mustRun(t, sharded("publish", "--from", "worker-2", "--to", "reviewer", "--type", "DONE", "--correlation-id", "conv-1")...)
	if out := mustRun(t, sharded("status", id)...); !strings.Contains(out, id+" reviewer -> worker-2 completed") {
		t.Errorf("status %s printed %q, want it completed", id, out)
	}
	trace := mustRun(t, sharded("trace", "conv-1")...)
	task, done := strings.Index(trace, " TASK "), strings.Index(trace, " DONE ")
	if task < 0 || done < task {
		t.Errorf("trace printed %q, want the TASK then the DONE", trace)
	}
	// Unsharded, the agent's own root has no stream.
	if r := runIn(t, "", "--server", url, "publish", "--from", "reviewer", "--to", "worker-2", "--type", "TASK"); r.code == 0 {
		t.Errorf("publish without --shards to an installation of shards: exit 0 (stdout %q)", r.stdout)
	}
	if r := runIn(t, "", "--server", url, "--shards", "0", "publish", "--from", "reviewer", "--to", "worker-2", "--type", "TASK"); r.code != exitUsage {
		t.Errorf("--shards 0: exit %d, want %d (stderr %q)", r.code, exitUsage, r.stderr)
	}
}
