package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// historyMessages is the size of the conversation BenchmarkHistory reads.
const historyMessages = 10_000

// BenchmarkHistory measures one full read of a 10,000-message conversation
// between two agents (1 KiB each, alternating sender), page by page until
// there is no next page, beside raw nats.go reading the same messages:
//
//	raw-get       a stream message get by sequence per message, one after
//	              another, each decoded (codec.Decode): what the operator
//	              path does, without the index or paging
//	raw-ordered   one ordered consumer from the conversation's first
//	              sequence, every message decoded: what the agent path
//	              does, without the index, paging or the filters
//	bus-operator  Admin.History at DefaultHistoryLimit (1,000) a page
//	bus-operator-page100, -page10000  the same at 100 and 10,000 a page:
//	              each page reads every record of the conversation again
//	bus-agent     Bus.History of one of the two agents, DefaultHistoryLimit
//	              a page (and -page10000)
//
// Each reports ms per full read ("ms/read"); the bus ones also as a ratio
// to each raw one that ran before them ("ms-bus/raw-get", above 1 is
// slower). Run (about a minute):
//
//	go test -run '^$' -bench '^BenchmarkHistory$' -benchtime 1x -timeout 20m ./bus
func BenchmarkHistory(b *testing.B) {
	s := embeddedtest.RunServer(b)
	ctx := context.Background()
	admin := newAdmin(b, embeddedtest.Connect(b, s))
	if _, err := admin.Provision(ctx, bus.StreamConfig{}); err != nil {
		b.Fatal(err)
	}
	agents := [2]*bus.Bus{}
	for i, name := range []string{"alice", "bob"} {
		bb, err := bus.New(embeddedtest.Connect(b, s), name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bb.Close() })
		agents[i] = bb
	}
	seqs := make([]uint64, 0, historyMessages)
	for chunk := 0; chunk < historyMessages; chunk += 1000 {
		var fs []*bus.PublishFuture
		for i := chunk; i < chunk+1000; i++ {
			from, to := agents[i%2], agents[(i+1)%2]
			f, err := from.PublishAsync(ctx, bus.Message{To: to.Agent(), Type: "TURN", CorrelationID: "big", Data: payload})
			if err != nil {
				b.Fatal(err)
			}
			fs = append(fs, f)
		}
		for _, f := range fs {
			ack, err := f.Wait(ctx)
			if err != nil {
				b.Fatal(err)
			}
			seqs = append(seqs, ack.Sequence)
		}
	}
	for _, bb := range agents {
		if err := bb.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	js, err := jetstream.New(embeddedtest.Connect(b, s))
	if err != nil {
		b.Fatal(err)
	}
	stream, err := js.Stream(ctx, "AGENTBUS")
	if err != nil {
		b.Fatal(err)
	}

	bl := newBaselines()
	perRead := func(b *testing.B) float64 {
		ms := float64(b.Elapsed().Milliseconds()) / float64(b.N)
		b.ReportMetric(ms, "ms/read")
		return ms
	}
	b.Run("raw-get", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, seq := range seqs {
				raw, err := stream.GetMsg(ctx, seq)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := codec.Decode(raw.Header, raw.Data); err != nil {
					b.Fatal(err)
				}
			}
		}
		bl.set("ms-", "raw-get", perRead(b))
	})
	b.Run("raw-ordered", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := js.OrderedConsumer(ctx, "AGENTBUS", jetstream.OrderedConsumerConfig{
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seqs[0]})
			if err != nil {
				b.Fatal(err)
			}
			for n := 0; n < historyMessages; {
				batch, err := c.Fetch(min(256, historyMessages-n), jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				got := 0
				for m := range batch.Messages() {
					if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
						b.Fatal(err)
					}
					got++
				}
				if err := batch.Error(); err != nil || got == 0 {
					b.Fatalf("read %d messages, then %v", n, err)
				}
				n += got
			}
		}
		bl.set("ms-", "raw-ordered", perRead(b))
	})
	read := func(b *testing.B, history func(context.Context, string, bus.HistoryQuery) (bus.HistoryPage, error), limit int) {
		b.ReportAllocs()
		for b.Loop() {
			n, q := 0, bus.HistoryQuery{Limit: limit}
			for {
				p, err := history(ctx, "big", q)
				if err != nil {
					b.Fatal(err)
				}
				for _, e := range p.Entries {
					if e.Err != nil {
						b.Fatal(e.Err)
					}
				}
				n += len(p.Entries)
				if q.After = p.Next; q.After == "" {
					break
				}
			}
			if n != historyMessages {
				b.Fatalf("read %d messages, want %d", n, historyMessages)
			}
		}
		bl.report(b, "ms-", perRead(b))
	}
	b.Run("bus-operator", func(b *testing.B) { read(b, admin.History, 0) })
	b.Run("bus-operator-page100", func(b *testing.B) { read(b, admin.History, 100) })
	b.Run("bus-operator-page10000", func(b *testing.B) { read(b, admin.History, bus.MaxHistoryLimit) })
	b.Run("bus-agent", func(b *testing.B) { read(b, agents[1].History, 0) })
	b.Run("bus-agent-page10000", func(b *testing.B) { read(b, agents[1].History, bus.MaxHistoryLimit) })
}
