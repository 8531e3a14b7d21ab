package bus_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// BenchmarkIndexBySubject compares, with raw nats.go alone, two ways of
// finding a message by its ID: a status record per message, as the bus
// keeps today, and the message's subject carrying its ID and conversation
// key, so that the stream's own subject index finds it. Three
// sub-benchmarks on a fresh server each, b.N messages of 1 KiB to 1,000
// agents (half of them to one), each in a conversation of its own:
//
//	shared  the bus's subjects today, <root>.agent.<to>.p3.<from>.<type>,
//	        and no index: the baseline
//	record  shared, plus each message's pending status record as the bus
//	        writes it (rawPendingRecord) in a bucket configured alike
//	unique  shared's subjects followed by .<message ID>.<conversation key>
//
// Each reports its publish rate (PublishMsgAsync until the last ack), the
// server heap each message adds (a GC before and after; the server runs in
// this process), the consume rate of the busy agent's consumer (filter
// <root>.agent.<to>.p3.>, Consume and ack), and, for record and unique,
// the p50 and p99 of finding a message by its ID alone, as a status lookup
// must: a direct get of the key filter *.<id>.*.* in the bucket (record)
// or of <root>.agent.*.*.*.*.<id>.* in the stream (unique). They also
// report their publish and consume rates and heap as ratios to shared's.
// Run:
//
//	go test -run '^$' -bench '^BenchmarkIndexBySubject$' -benchtime 200000x ./bus
func BenchmarkIndexBySubject(b *testing.B) {
	var shared struct{ publish, consume, heap float64 }
	for _, name := range []string{"shared", "record", "unique"} {
		unique, record := name == "unique", name == "record"
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
			subject := func(i int) string {
				to := "worker"
				if i%2 == 1 {
					to = "agent-" + strconv.Itoa(i%1000)
				}
				subj := "ix.agent." + to + ".p3." + senderAgent + "." + benchType
				if unique {
					subj += "." + ids[i] + "." + subjects.ConversationKey(ids[i])
				}
				return subj
			}
			for i := range ids {
				ids[i] = uuid.NewString()
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
					publishPendingRecord(b, js, prefix, m)
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
