package bus_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// BenchmarkIndexBySubject compares, with raw nats.go alone, two ways of
// finding a message by its ID: a status record per message, as the bus
// kept before, and the message's subject carrying its ID and conversation
// key, so that the stream's own subject index finds it. Four
// sub-benchmarks on a fresh server each, b.N messages of 1 KiB to 1,000
// agents (half of them to one), in conversations of ten messages:
//
//	shared  the bus's subjects today, <root>.agent.<to>.p3.<from>.<type>,
//	        and no index: the baseline
//	record  shared, plus each message's pending status record as the bus
//	        writes it (rawPendingRecord) in a bucket configured alike
//	unique  shared's subjects followed by .<message ID>.<conversation key>,
//	        the ID made by codec.NewID as the bus makes it (a UUID v7)
//	unique-v4  unique with random IDs (UUID v4), as the bus made them
//	        before: what the ID's form costs the server's index
//
// Each reports its publish rate (PublishMsgAsync until the last ack), the
// server heap each message adds (a GC before and after; the server runs in
// this process), the consume rate of the busy agent's consumer (filter
// <root>.agent.<to>.p3.>, Consume and ack), and, for record and unique,
// the p50 and p99 of finding a message by its ID alone, as a status lookup
// must: a direct get of the key filter *.<id>.*.* in the bucket (record)
// or of <root>.agent.*.*.*.*.<id>.* in the stream (unique); and the p50 of
// reading a conversation's ten messages, as a trace does ("conv-p50-µs"):
// an ordered consumer of the key filter <conversation>.> in the bucket
// (record), or of the headers of <root>.agent.*.*.*.*.*.<conversation> in
// the stream (unique). They also report their publish and consume rates
// and heap as ratios to shared's.
// Run:
//
//	go test -run '^$' -bench '^BenchmarkIndexBySubject$' -benchtime 200000x ./bus
func BenchmarkIndexBySubject(b *testing.B) {
	const convLen = 10 // messages per conversation
	var shared struct{ publish, consume, heap float64 }
	for _, name := range []string{"shared", "record", "unique", "unique-v4"} {
		unique, record := strings.HasPrefix(name, "unique"), name == "record"
		b.Run(name, func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			js, err := jetstream.New(embeddedtest.Connect(b, s))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IX", Subjects: []string{"ix.>"}, Storage: jetstream.FileStorage}); err != nil {
				b.Fatal(err)
			}
			ids := make([]string, b.N)
			// Message i belongs to the conversation its group of ten's
			// first message starts.
			conv := func(i int) string { return ids[i-i%convLen] }
			subject := func(i int) string {
				to := "worker"
				if i%2 == 1 {
					to = "agent-" + strconv.Itoa(i%1000)
				}
				subj := "ix.agent." + to + ".p3." + senderAgent + "." + benchType
				if unique {
					subj += "." + ids[i] + "." + subjects.ConversationKey(conv(i))
				}
				return subj
			}
			newID := codec.NewID
			if name == "unique-v4" {
				newID = uuid.NewString
			}
			for i := range ids {
				ids[i] = newID()
			}
			var (
				kv     jetstream.KeyValue
				prefix string
			)
			if record {
				kv, prefix = rawStatusBucket(b, js)
			}
			heapBefore := clientStats().heap
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := range b.N {
				m := &nats.Msg{Subject: subject(i), Data: payload, Header: nats.Header{jetstream.MsgIDHeader: {ids[i]}}}
				if _, err := js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
				if record {
					rec, err := rawPendingRecordIn(prefix, conv(i), m)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := js.PublishMsgAsync(rec); err != nil {
						b.Fatal(err)
					}
				}
			}
			waitAcked(b, js)
			b.StopTimer()
			publish := rate(b)
			heap := (clientStats().heap - heapBefore) / float64(b.N)
			b.ReportMetric(publish, "publish-msg/s")
			b.ReportMetric(heap, "server-heap-B/msg")

			if record || unique {
				find := func(id string) error {
					_, err := kv.ListKeysFiltered(ctx, "*."+subjects.EncodeToken(id)+".*.*")
					return err
				}
				if unique {
					st, err := js.Stream(ctx, "IX")
					if err != nil {
						b.Fatal(err)
					}
					find = func(id string) error {
						_, err := st.GetMsg(ctx, 0, jetstream.WithGetMsgSubject("ix.agent.*.*.*.*."+id+".*"))
						return err
					}
				}
				lat := make([]time.Duration, 0, 100)
				for range 100 {
					start := time.Now()
					if err := find(ids[rand.IntN(len(ids))]); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				latencyFigures(b, lat)

				// A conversation: its ten messages.
				stream, filter := "IX", func(c string) string { return "ix.agent.*.*.*.*.*." + subjects.ConversationKey(c) }
				if record {
					stream, filter = "KV_"+kv.Bucket(), func(c string) string { return prefix + subjects.ConversationKey(c) + ".>" }
				}
				lat = lat[:0]
				for range 50 * min(len(ids)/convLen, 1) {
					c := ids[rand.IntN(len(ids)/convLen)*convLen]
					start := time.Now()
					oc, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
						FilterSubjects: []string{filter(c)}, HeadersOnly: true})
					if err != nil {
						b.Fatal(err)
					}
					batch, err := oc.Fetch(convLen, jetstream.FetchMaxWait(5*time.Second))
					if err != nil {
						b.Fatal(err)
					}
					got := 0
					for range batch.Messages() {
						got++
					}
					lat = append(lat, time.Since(start))
					if got != convLen {
						b.Fatalf("conversation %s: %d messages, want %d", c, got, convLen)
					}
					if err := js.DeleteConsumer(ctx, stream, oc.CachedInfo().Name); err != nil {
						b.Fatal(err)
					}
				}
				if len(lat) > 0 {
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Microsecond), "conv-p50-µs")
				}
			}

			cons, err := js.CreateOrUpdateConsumer(ctx, "IX", jetstream.ConsumerConfig{
				Durable: "worker", FilterSubject: "ix.agent.worker.p3.>", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				b.Fatal(err)
			}
			want := int64((b.N + 1) / 2)
			var n atomic.Int64
			done := make(chan struct{})
			start := time.Now()
			cc, err := cons.Consume(func(m jetstream.Msg) {
				m.Ack()
				if n.Add(1) == want {
					close(done)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			<-done
			consume := float64(want) / time.Since(start).Seconds()
			cc.Stop()
			<-cc.Closed()
			b.ReportMetric(consume, "consume-msg/s")
			if name == "shared" {
				shared.publish, shared.consume, shared.heap = publish, consume, heap
				return
			}
			if shared.publish > 0 && b.N > 1 {
				b.ReportMetric(publish/shared.publish, "publish-"+name+"/shared")
				b.ReportMetric(consume/shared.consume, "consume-"+name+"/shared")
				b.ReportMetric(heap/shared.heap, "heap-"+name+"/shared")
			}
		})
	}
}
