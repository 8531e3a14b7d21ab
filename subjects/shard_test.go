package subjects_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentbus/agentbus/subjects"
)

// TestShardOfMatchesServerPartition checks ShardOf against nats-server's
// own {{partition}} mapping function, which a server-side mapping of the
// recipient token would use, for IDs that need no escaping and IDs that do.
func TestShardOfMatchesServerPartition(t *testing.T) {
	ids := []string{"orchestrator", "reviewer", "build orchestrator", "@agent-cto", "日本語", "a.b", "w-0"}
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("worker-%d", i))
	}
	for _, shards := range []int{1, 2, 3, 16, 1024} {
		tr, err := server.NewSubjectTransform("agentbus.agent.*", fmt.Sprintf("{{partition(%d,1)}}", shards))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, id := range ids {
			got, err := subjects.ShardOf(id, shards)
			if err != nil {
				t.Fatalf("ShardOf(%q, %d): %v", id, shards, err)
			}
			want, err := strconv.Atoi(tr.TransformSubject("agentbus.agent." + subjects.EncodeToken(id)))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("ShardOf(%q, %d) = %d, the server's partition %d", id, shards, got, want)
			}
			seen[got] = true
		}
		if shards <= 16 && len(seen) != shards {
			t.Errorf("%d IDs fell on %d of %d shards", len(ids), len(seen), shards)
		}
	}
}

func TestShardOfRejects(t *testing.T) {
	tests := []struct {
		agent  string
		shards int
		want   error
	}{
		{"reviewer", 0, subjects.ErrInvalidShard},
		{"reviewer", -1, subjects.ErrInvalidShard},
		{"reviewer", subjects.MaxShards + 1, subjects.ErrInvalidShard},
		{"", 3, subjects.ErrInvalidAgentID},
		{subjects.Broadcast, 3, subjects.ErrInvalidAgentID},
	}
	for _, tt := range tests {
		if _, err := subjects.ShardOf(tt.agent, tt.shards); !errors.Is(err, tt.want) {
			t.Errorf("ShardOf(%q, %d) = %v, want %v", tt.agent, tt.shards, err, tt.want)
		}
	}
}

func TestShardRoot(t *testing.T) {
	tests := []struct {
		root          string
		shard, shards int
		want          string
		wantErr       error
	}{
		{root: "", shard: 0, shards: 1, want: "agentbus"},
		{root: "prod.bus-1", shard: 0, shards: 1, want: "prod.bus-1"},
		{root: "", shard: 0, shards: 3, want: "agentbus.s0"},
		{root: "prod.bus-1", shard: 15, shards: 16, want: "prod.bus-1.s15"},
		{root: "", shard: 3, shards: 3, wantErr: subjects.ErrInvalidShard},
		{root: "", shard: -1, shards: 3, wantErr: subjects.ErrInvalidShard},
		{root: "", shard: 0, shards: 0, wantErr: subjects.ErrInvalidShard},
		{root: "a b", shard: 0, shards: 3, wantErr: subjects.ErrInvalidRoot},
		{root: "r234567890123456789012345678901234567890123456789012345678901", shard: 10, shards: 16, wantErr: subjects.ErrInvalidRoot},
	}
	for _, tt := range tests {
		got, err := subjects.ShardRoot(tt.root, tt.shard, tt.shards)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("ShardRoot(%q, %d, %d) = %q, %v; want %q, %v", tt.root, tt.shard, tt.shards, got, err, tt.want, tt.wantErr)
		}
	}
	// Shard roots are roots of their own, with streams that do not overlap.
	a, _ := subjects.ShardRoot("", 1, 3)
	b, _ := subjects.ShardRoot("", 2, 3)
	sa, _ := subjects.New(a)
	sb, _ := subjects.New(b)
	if sa.Stream() == sb.Stream() || sa.Stream() == subjects.Default().Stream() {
		t.Errorf("shard streams %s, %s and %s are not distinct", sa.Stream(), sb.Stream(), subjects.Default().Stream())
	}
}

func TestParseShardRoot(t *testing.T) {
	for _, tt := range []struct{ root, shards int }{{0, 2}, {1, 3}, {15, 16}, {subjects.MaxShards - 1, subjects.MaxShards}} {
		root, err := subjects.ShardRoot("prod.bus-1", tt.root, tt.shards)
		if err != nil {
			t.Fatal(err)
		}
		base, k, ok := subjects.ParseShardRoot(root)
		if !ok || base != "prod.bus-1" || k != tt.root {
			t.Errorf("ParseShardRoot(%q) = %q, %d, %v; want prod.bus-1, %d, true", root, base, k, ok, tt.root)
		}
	}
	for _, root := range []string{"agentbus", "s1", "agentbus.s", "agentbus.s01", "agentbus.s-1", "agentbus.s+1", "agentbus.sx", "agentbus.t1", "agentbus.s1024", "agentbus.s1.x"} {
		if base, k, ok := subjects.ParseShardRoot(root); ok {
			t.Errorf("ParseShardRoot(%q) = %q, %d, true; want false", root, base, k)
		}
	}
}

func ExampleShardOf() {
	shards := 4
	for _, agent := range []string{"orchestrator", "reviewer", "planner"} {
		shard, _ := subjects.ShardOf(agent, shards)
		root, _ := subjects.ShardRoot("agentbus", shard, shards)
		fmt.Println(agent, shard, root)
	}
	// Output:
	// orchestrator 1 agentbus.s1
	// reviewer 2 agentbus.s2
	// planner 3 agentbus.s3
}
