package bus_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
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

	"github.com/agentbus/agentbus/bus"
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
//	windowed the bus's subjects now: shared's followed by the ID's and
//	        the conversation's 4 ms window (subjects.IndexToken,
//	        subjects.ConversationToken), the IDs made as they are sent,
//	        as the bus makes them. A lookup reads the headers of the ID's
//	        window (an ordered consumer of
//	        <root>.agent.*.*.*.*.<window>.*), as the bus does where the
//	        window's last message is another one, and a conversation's
//	        read reads those of every conversation begun in its window
//	batched shared, plus an index written in batches, the alternative
//	        docs/performance-journal.md weighs against unique: as acks come back,
//	        the messages' IDs and stream sequences (24 bytes each), at
//	        most batchedIndexSize to a record, one record per tenth of a
//	        second of the IDs' time (UUID v7) under ix.index.<tenth>.<n>.
//	        A lookup reads the records of its ID's tenth (one batched
//	        direct get) and then the message by its sequence
//
// Each reports its publish rate (PublishMsgAsync until the last ack), the
// server heap each message adds (a GC before and after; the server runs in
// this process), the consume rate of the busy agent's consumer (filter
// <root>.agent.<to>.p3.>, Consume and ack), and, but for shared, the p50
// and p99 of finding a message by its ID alone, as a status lookup must: a
// direct get of the key filter *.<id>.*.* in the bucket (record) or of
// <root>.agent.*.*.*.*.<id>.* in the stream (unique), the headers of the
// ID's window (windowed), or the index records and then the message
// (batched); and for record, unique and windowed the p50 of reading a
// conversation's ten messages, as a trace does ("conv-p50-µs"): an ordered
// consumer of the key filter <conversation>.> in the bucket (record), or
// of the headers of <root>.agent.*.*.*.*.*.<conversation> in the stream
// (unique; windowed: the conversation's window, all the conversations
// begun in it), created, read and deleted (readHeaders). They also report
// their publish and consume rates and heap as ratios to shared's.
// Run:
//
//	go test -run '^$' -bench '^BenchmarkIndexBySubject$' -benchtime 200000x ./bus
func BenchmarkIndexBySubject(b *testing.B) {
	const convLen = 10 // messages per conversation
	var shared struct{ publish, consume, heap float64 }
	for _, name := range []string{"shared", "record", "unique", "unique-v4", "windowed", "batched"} {
		unique, record, batched, windowed := strings.HasPrefix(name, "unique"), name == "record", name == "batched", name == "windowed"
		b.Run(name, func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			js, err := jetstream.New(embeddedtest.Connect(b, s))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IX", Subjects: []string{"ix.>"}, Storage: jetstream.FileStorage,
				AllowDirect: batched}); err != nil {
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
				if windowed {
					subj += "." + subjects.IndexToken(ids[i]) + "." + subjects.ConversationToken(conv(i))
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
			var acked chan indexedPublish
			indexed := make(chan struct{})
			if batched {
				acked = make(chan indexedPublish, 4*batchedIndexSize)
				go writeBatchedIndex(b, js, acked, indexed)
			}
			heapBefore := clientStats().heap
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := range b.N {
				if batched || windowed {
					// Made as it is sent, as the bus makes it: the index's
					// records, or windows, are filed by the ID's time.
					ids[i] = newID()
				}
				m := &nats.Msg{Subject: subject(i), Data: payload, Header: nats.Header{jetstream.MsgIDHeader: {ids[i]}}}
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					b.Fatal(err)
				}
				if batched {
					acked <- indexedPublish{ids[i], f}
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
			if batched {
				close(acked)
				<-indexed
			}
			waitAcked(b, js)
			b.StopTimer()
			publish := rate(b)
			heap := (clientStats().heap - heapBefore) / float64(b.N)
			b.ReportMetric(publish, "publish-msg/s")
			b.ReportMetric(heap, "server-heap-B/msg")

			if record || unique || batched || windowed {
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
				if batched {
					nc := embeddedtest.Connect(b, s)
					find = func(id string) error { return findBatched(ctx, nc, id) }
				}
				if windowed {
					find = func(id string) error {
						ids, err := readHeaders(ctx, js, "IX", "ix.agent.*.*.*.*."+subjects.IndexToken(id)+".*")
						if err == nil && !slices.Contains(ids, id) {
							err = fmt.Errorf("%s is not in its window", id)
						}
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
			if record || unique || windowed {
				// A conversation: its ten messages, and for windowed those
				// of every conversation begun in its window. (batched has
				// none to read: the alternative keeps a conversation's key
				// on its subjects.)
				stream, filter := "IX", func(c string) string { return "ix.agent.*.*.*.*.*." + subjects.ConversationKey(c) }
				switch {
				case record:
					stream, filter = "KV_"+kv.Bucket(), func(c string) string { return prefix + subjects.ConversationKey(c) + ".>" }
				case windowed:
					filter = func(c string) string { return "ix.agent.*.*.*.*.*." + subjects.ConversationToken(c) }
				}
				lat := make([]time.Duration, 0, 50)
				for range 50 * min(len(ids)/convLen, 1) {
					c := ids[rand.IntN(len(ids)/convLen)*convLen]
					start := time.Now()
					got, err := readHeaders(ctx, js, stream, filter(c))
					if err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
					if len(got) < convLen || !windowed && len(got) != convLen {
						b.Fatalf("conversation %s: %d messages, want %d", c, len(got), convLen)
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

// batchedIndexSize is the most IDs one record of the batched index holds.
const batchedIndexSize = 256

// indexedPublish is a message of the batched row and its publish's future.
type indexedPublish struct {
	id string
	f  jetstream.PubAckFuture
}

// batchedIndexSubject is the subject of the batched index's records for
// the tenth of a second of id's time (a UUID v7's first 48 bits, in ms).
func batchedIndexSubject(id uuid.UUID) string {
	ms := uint64(id[0])<<40 | uint64(id[1])<<32 | uint64(id[2])<<24 | uint64(id[3])<<16 | uint64(id[4])<<8 | uint64(id[5])
	return "ix.index." + strconv.FormatUint(ms/100, 10)
}

// writeBatchedIndex writes the batched row's index: for each publish in
// acked, in order, once its ack is back, the ID and stream sequence, in
// records of at most batchedIndexSize entries (16 bytes of ID, 8 of
// sequence), one per tenth of a second of the IDs' time. It closes done
// when acked is closed and every record is sent.
func writeBatchedIndex(b *testing.B, js jetstream.JetStream, acked <-chan indexedPublish, done chan<- struct{}) {
	defer close(done)
	pending := map[string][]byte{} // by subject
	n := 0
	flush := func() {
		for subj, rec := range pending {
			if _, err := js.PublishMsgAsync(&nats.Msg{Subject: subj + "." + strconv.Itoa(n), Data: rec}); err != nil {
				b.Error(err)
			}
			n++
		}
		clear(pending)
	}
	count := 0
	for p := range acked {
		var ack *jetstream.PubAck
		select {
		case ack = <-p.f.Ok():
		case err := <-p.f.Err():
			b.Error(err)
			continue
		}
		id, err := uuid.Parse(p.id)
		if err != nil {
			b.Error(err)
			continue
		}
		subj := batchedIndexSubject(id)
		rec := append(pending[subj], id[:]...)
		pending[subj] = binary.BigEndian.AppendUint64(rec, ack.Sequence)
		if count++; count%batchedIndexSize == 0 {
			flush()
		}
	}
	flush()
}

// findBatched finds message id through the batched index: every record of
// its ID's tenth of a second in one batched direct get, then the message
// by the sequence a record gives.
func findBatched(ctx context.Context, nc *nats.Conn, id string) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	// The records are written after their messages, so none is older than
	// the ID's time, less the publisher's clock's error (a second allowed).
	sec, nsec := u.Time().UnixTime()
	from := time.Unix(sec, nsec).Add(-time.Second)
	req, err := json.Marshal(map[string]any{"start_time": from, "next_by_subj": batchedIndexSubject(u) + ".*", "batch": 1024})
	if err != nil {
		return err
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET.IX", inbox, req); err != nil {
		return err
	}
	var seq uint64
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return err
		}
		if m.Header.Get("Status") != "" { // 204 after the last record, or 404
			break
		}
		for rec := m.Data; len(rec) >= 24; rec = rec[24:] {
			if [16]byte(rec[:16]) == u {
				seq = binary.BigEndian.Uint64(rec[16:24])
			}
		}
	}
	if seq == 0 {
		return fmt.Errorf("%s: not in the batched index", id)
	}
	resp, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.IX", []byte(`{"seq":`+strconv.FormatUint(seq, 10)+`}`))
	if err != nil {
		return err
	}
	if resp.Header.Get(jetstream.MsgIDHeader) != id {
		return fmt.Errorf("%s: sequence %d holds %q", id, seq, resp.Header.Get(jetstream.MsgIDHeader))
	}
	return nil
}

// readHeaders returns the Nats-Msg-Id of every message of stream that
// filter matches, read with an ordered consumer of their headers, deleted
// after the read, as a lookup of the bus reads a window or a conversation.
func readHeaders(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]string, error) {
	oc, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, HeadersOnly: true})
	if err != nil {
		return nil, err
	}
	defer js.DeleteConsumer(context.WithoutCancel(ctx), stream, oc.CachedInfo().Name)
	n := int(oc.CachedInfo().NumPending)
	var ids []string
	for len(ids) < n {
		batch, err := oc.Fetch(min(n-len(ids), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// BenchmarkStatusLookup measures a status lookup by ID through the bus,
// as each reader makes it: an operator (Admin.Status), the sender and the
// recipient (Bus.Status), each timed over 100 lookups of random IDs among
// the messages sent, nobody subscribed (the messages stay pending):
//
//	burst   20,000 messages published async as fast as they go, so a
//	        4 ms window holds many of them (subjects.IndexToken): the
//	        lookup reads the window's messages
//	sparse  200 messages 20 ms apart, each alone in its window: a lookup
//	        reads one message
//
// Run:
//
//	go test -run '^$' -bench '^BenchmarkStatusLookup$' -benchtime 1x ./bus
func BenchmarkStatusLookup(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
		gap  time.Duration
	}{{"burst", 20_000, 0}, {"sparse", 200, 20 * time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			s := embeddedtest.RunServer(b)
			ctx := context.Background()
			admin, err := bus.NewAdmin(embeddedtest.Connect(b, s))
			if err != nil {
				b.Fatal(err)
			}
			defer admin.Close()
			if _, err := admin.Provision(ctx, bus.StreamConfig{}); err != nil {
				b.Fatal(err)
			}
			sender, err := bus.New(embeddedtest.Connect(b, s), "sender")
			if err != nil {
				b.Fatal(err)
			}
			defer sender.Close()
			recipient, err := bus.New(embeddedtest.Connect(b, s), "recipient")
			if err != nil {
				b.Fatal(err)
			}
			defer recipient.Close()
			ids := make([]string, c.n)
			for i := range ids {
				ack, err := sender.PublishAsync(ctx, bus.Message{To: "recipient", Type: "T", Data: payload})
				if err != nil {
					b.Fatal(err)
				}
				ids[i] = ack.ID()
				if c.gap > 0 {
					time.Sleep(c.gap)
				}
			}
			if err := sender.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			for range b.N {
				for _, r := range []struct {
					name   string
					status func(context.Context, string) ([]bus.Status, error)
				}{{"admin", admin.Status}, {"sender", sender.Status}, {"recipient", recipient.Status}} {
					lat := make([]time.Duration, 0, 100)
					for range 100 {
						id := ids[rand.IntN(len(ids))]
						start := time.Now()
						sts, err := r.status(ctx, id)
						lat = append(lat, time.Since(start))
						if err != nil || len(sts) != 1 || sts[0].ID != id {
							b.Fatalf("%s's Status(%s) = %+v, %v", r.name, id, sts, err)
						}
					}
					p50, p99 := percentiles(lat)
					b.ReportMetric(p50, r.name+"-p50-µs")
					b.ReportMetric(p99, r.name+"-p99-µs")
				}
			}
		})
	}
}
