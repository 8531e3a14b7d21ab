package bus_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// BenchmarkConversation measures reading one 10-message conversation while
// the stream and the status bucket retain many messages of other
// conversations:
//
//	index  Admin.Conversation, which reads the conversation's status keys
//	       (one literal prefix) and the headers of the stream's messages
//	       whose indexed subject names the conversation (its last token:
//	       the server matches it against every subject of the stream)
//	scan   what reading it from the stream alone costs: every retained
//	       message decoded to find the conversation's (run up to 100,000)
//
// Run (about 2 minutes, most of it publishing the million messages):
//
//	go test -run '^$' -bench Conversation -benchtime 20x -timeout 30m ./bus
func BenchmarkConversation(b *testing.B) {
	for _, retained := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("retained=%d", retained), func(b *testing.B) {
			env := conversationEnv(b, retained)
			ctx := context.Background()
			b.Run("index", func(b *testing.B) {
				for b.Loop() {
					sts, err := env.Conversation(ctx, "target")
					if err != nil || len(sts) != 10 {
						b.Fatalf("Conversation = %d records, %v; want 10", len(sts), err)
					}
				}
			})
			if retained > 100_000 {
				return
			}
			b.Run("scan", func(b *testing.B) {
				js, err := jetstream.New(env.Conn())
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if n := scanConversation(b, js, env.Subjects().Stream(), "target"); n != 10 {
						b.Fatalf("scan found %d messages, want 10", n)
					}
				}
			})
		})
	}
}

// conversationEnv returns an admin of a bus whose stream retains n single-message
// conversations and a 10-message conversation "target", published last on
// indexed subjects; their senders write no status records (no TTL). It
// reports the process's heap (client and in-process server) once they are
// stored.
func conversationEnv(b *testing.B, n int) *bus.Admin {
	b.Helper()
	s := embeddedtest.RunServer(b)
	nc := embeddedtest.Connect(b, s)
	ctx := context.Background()
	admin := newAdmin(b, nc)
	if _, err := admin.Provision(ctx, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	pb, err := bus.New(nc, "orchestrator")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pb.Close() })
	data := make([]byte, 64)
	const chunk = 1000
	for i := 0; i < n+10; i++ {
		m := bus.Message{To: fmt.Sprintf("worker-%d", i%50), Type: "TASK", Data: data}
		if i >= n {
			m.CorrelationID = "target"
		}
		if _, err := pb.PublishAsync(ctx, m); err != nil {
			b.Fatal(err)
		}
		if i%chunk == chunk-1 {
			if err := pb.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := pb.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	st, err := js.Stream(ctx, pb.Subjects().Stream())
	if err != nil {
		b.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got != uint64(n+10) {
		b.Fatalf("stream holds %d messages, want %d", got, n+10)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
	return admin
}

// scanConversation reads every message of stream with an ordered consumer
// and counts those of conversation corr.
func scanConversation(b *testing.B, js jetstream.JetStream, stream, corr string) int {
	ctx := context.Background()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	pending := c.CachedInfo().NumPending
	found := 0
	for pending > 0 {
		batch, err := c.Fetch(int(min(pending, 1000)))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			md, _ := m.Metadata()
			pending = md.NumPending
			if cm, err := codec.Decode(m.Headers(), m.Data()); err == nil && cm.CorrelationID == corr {
				found++
			}
		}
	}
	return found
}
