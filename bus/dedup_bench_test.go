package bus_test

// BenchmarkDedupMemory measures the server heap one remembered message ID
// costs: what bus.DedupBytesPerID and docs/performance.md ("Duplicate
// window and memory") state. Run:
//
//	go test -run '^$' -bench DedupMemory -benchtime 200000x ./bus
//
// The server runs in this process, so the Go heap after a full GC holds
// its duplicate map. Each sub-benchmark starts its own server and
// publishes one message per iteration, every one with a fresh
// Nats-Msg-Id, to a stream with a 1 h duplicate window, so the server
// remembers every ID. It then reports two figures per ID:
//
//	purged-B/id  the heap the IDs held, measured by shortening the window
//	             to 100 ms and waiting until the server has forgotten them
//	             (same messages, same stream, only the IDs gone)
//	vs-noid-B/id the heap the stream grew by, less what the same number of
//	             messages of the same size grows another stream by, whose
//	             header has the same length but another name
//	             ("Xats-Msg-Id"), so the server remembers nothing
//
// The streams keep their messages in memory: a file store's block cache
// (up to 8 MB, loaded and dropped on its own timer) would otherwise come
// and go between the measurements. Where the messages are stored does not
// change what an ID costs. Sub-benchmarks: uuid-36B (the bus's IDs,
// uuid.NewString) and id-200B.

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func BenchmarkDedupMemory(b *testing.B) {
	pad200 := strings.Repeat("x", 200-36)
	b.Run("uuid-36B", func(b *testing.B) { benchDedupMemory(b, uuid.NewString) })
	b.Run("id-200B", func(b *testing.B) {
		benchDedupMemory(b, func() string { return uuid.NewString() + pad200 })
	})
}

func benchDedupMemory(b *testing.B, newID func() string) {
	ctx := context.Background()
	s := embeddedtest.RunServer(b)
	nc := embeddedtest.Connect(b, s)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	stream := func(name string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: name, Subjects: []string{strings.ToLower(name) + ".>"},
			Storage: jetstream.MemoryStorage, MaxAge: 24 * time.Hour, Duplicates: time.Hour,
		}
	}
	ids, noIDs := stream("IDS"), stream("NOIDS")
	for _, cfg := range []jetstream.StreamConfig{ids, noIDs} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			b.Fatal(err)
		}
	}
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	wait := func(name string, want uint64) {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatalf("%s: publishes not acknowledged within a minute", name)
		}
		info, err := js.Stream(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if got := info.CachedInfo().State.Msgs; got != want {
			b.Fatalf("%s holds %d messages, want %d", name, got, want)
		}
	}

	// A publish waits up to a minute for room among the 4,096 in flight
	// (nats.go waits 200 ms and fails).
	stall := jetstream.WithStallWait(time.Minute)
	before := heap()
	var n, lastN uint64
	var last string
	b.ReportAllocs()
	for b.Loop() {
		last = newID()
		if _, err := js.PublishMsgAsync(&nats.Msg{
			Subject: "ids.m",
			Header:  nats.Header{jetstream.MsgIDHeader: []string{last}},
		}, stall); err != nil {
			b.Fatal(err)
		}
		n++
	}
	wait("IDS", n)
	remembered := heap()

	// Forget the IDs: a 100 ms window (the server's least) purges them at
	// once. The last ID no longer reported Duplicate means every ID is gone,
	// since the server forgets them oldest first.
	ids.Duplicates = 100 * time.Millisecond
	if _, err := js.UpdateStream(ctx, ids); err != nil {
		b.Fatal(err)
	}
	embeddedtest.WaitFor(b, 10*time.Second, "the server to forget the IDs", func() (bool, string) {
		ack, err := js.PublishMsg(ctx, &nats.Msg{
			Subject: "ids.m",
			Header:  nats.Header{jetstream.MsgIDHeader: []string{last}},
		})
		if err != nil {
			return false, err.Error()
		}
		if !ack.Duplicate {
			lastN++
		}
		return !ack.Duplicate, "last ID still a duplicate"
	})
	wait("IDS", n+lastN)
	forgotten := heap()

	for range n {
		if _, err := js.PublishMsgAsync(&nats.Msg{
			Subject: "noids.m",
			Header:  nats.Header{"Xats-Msg-Id": []string{newID()}},
		}, stall); err != nil {
			b.Fatal(err)
		}
	}
	wait("NOIDS", n)
	withNoIDs := heap()

	perID := func(d int64) float64 { return float64(d) / float64(n) }
	b.ReportMetric(perID(remembered-forgotten), "purged-B/id")
	b.ReportMetric(perID((remembered-before)-(withNoIDs-forgotten)), "vs-noid-B/id")
}

// BenchmarkDedupSlidingModel is a model, not a measurement of the server:
// a copy of nats-server 2.15.2's bookkeeping of the duplicate window
// (server/stream.go: storeMsgIdLocked, purgeMsgIds, without the timer and
// lock), fed a steady rate, to show what BenchmarkDedupMemory's fill-once
// figure misses. The server forgets an ID by deleting it from its map, but
// its array keeps pointing at the forgotten entry, so the entry and its
// string stay on the heap until the array is compacted, which happens only
// when its capacity passes three times the live IDs. Each iteration is one
// tick of 2,000 new IDs and a purge, the window is 100 ticks (200,000 live
// IDs), and from the third window on the heap is read every 5 ticks. Run:
//
//	go test -run '^$' -bench DedupSlidingModel -benchtime 2000x ./bus
//
// It reports the mean and the largest heap per live ID.
func BenchmarkDedupSlidingModel(b *testing.B) {
	const perTick, window = 2000, 100
	type ddentry struct {
		id  string
		seq uint64
		ts  int64
	}
	var (
		ddmap   = make(map[string]*ddentry)
		ddarr   []*ddentry
		ddindex int
	)
	purge := func(now int64) {
		for i, dde := range ddarr[ddindex:] {
			if now-dde.ts >= window {
				delete(ddmap, dde.id)
			} else {
				ddindex += i
				if cap(ddarr) > 3*(len(ddarr)-ddindex) {
					ddarr = append([]*ddentry(nil), ddarr[ddindex:]...)
					ddindex = 0
				}
				break
			}
		}
	}
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	var tick int64
	var seq uint64
	var sum, most float64
	var samples int
	hdr := []byte(uuid.NewString())
	for b.Loop() {
		for range perTick {
			copy(hdr, uuid.NewString())
			seq++
			// string(hdr) copies, as the server's getMsgId does.
			dde := &ddentry{string(hdr), seq, tick}
			ddmap[dde.id] = dde
			ddarr = append(ddarr, dde)
		}
		purge(tick)
		if tick >= 3*window && tick%5 == 0 {
			b.StopTimer()
			per := float64(heap()-before) / float64(len(ddmap))
			b.StartTimer()
			sum += per
			most = max(most, per)
			samples++
		}
		tick++
	}
	if samples > 0 {
		b.ReportMetric(sum/float64(samples), "mean-B/id")
		b.ReportMetric(most, "max-B/id")
	}
}
