package bus_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/codec"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

// BenchmarkDefaultPath measures issue 13's rows with a file that builds on
// the commit the issue was filed against (096971f) as well as on later
// ones, so that one command measures before and after: copy this file
// into a checkout of either and run, in bus/,
//
//	go test -run '^$' -bench '^BenchmarkDefaultPath$' -benchtime 20000x
//
// It uses only what both have: New with WithProvision, WithoutLifecycle,
// WithPrefetch, Publish, PublishAsync, Flush, Subscribe, Request and
// Reply. Each bus row runs beside the raw nats.go row doing the job the
// issue's table names, on the same server in the same run: the bus's ce-
// headers and a unique Nats-Msg-Id on the plain direct subject, decoding
// the CloudEvent on consume; a raw JetStream round trip for request/reply,
// its reply decoded. The request rows run the bus's requester without a
// subscription (request/bus) and with one (request/bus-requester-subscribed).
// The bus rows report their ratio to it (bus/raw, higher is better for
// throughput, lower for latency). Every row has a stream of its own.
func BenchmarkDefaultPath(b *testing.B) {
	s := embeddedtest.RunServer(b)
	ctx := context.Background()
	var (
		root    atomic.Int64
		rawRate float64 // msg/s of the last raw throughput row
		rawP50  time.Duration
	)
	// fresh returns a bus of agent on a root of its own, provisioned.
	fresh := func(b *testing.B, agent string, opts ...bus.Option) (*bus.Bus, string) {
		r := fmt.Sprintf("dp%d", root.Add(1))
		bb, err := bus.New(embeddedtest.Connect(b, s), agent, append([]bus.Option{bus.WithRoot(r), bus.WithProvision(bus.StreamConfig{Root: r})}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bb.Close() })
		return bb, r
	}
	// rawOn returns a JetStream context on a fresh connection and the
	// scheme of a newly provisioned root.
	rawOn := func(b *testing.B) (jetstream.JetStream, subjects.Scheme) {
		bb, r := fresh(b, "setup")
		bb.Close()
		js, err := jetstream.New(embeddedtest.Connect(b, s))
		if err != nil {
			b.Fatal(err)
		}
		sc, _ := subjects.New(r)
		return js, sc
	}
	// rawMessage makes the raw side's next message: the bus's headers,
	// a new ID, the plain direct subject.
	rawMessage := func(b *testing.B, sc subjects.Scheme, to string) func() *nats.Msg {
		m := &codec.Message{From: "sender", To: to, Type: "BENCH", Data: make([]byte, 1024)}
		m.SetDefaults(time.Now())
		h, data, err := codec.Binary{}.Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		subject, err := sc.Direct(to, "sender", "BENCH", 3)
		if err != nil {
			b.Fatal(err)
		}
		return func() *nats.Msg {
			c := make(nats.Header, len(h)+1)
			for k, v := range h {
				c[k] = v
			}
			id := nuid.Next()
			c["ce-id"] = []string{id}
			c[jetstream.MsgIDHeader] = []string{id}
			return &nats.Msg{Subject: subject, Header: c, Data: data}
		}
	}
	message := bus.Message{To: "receiver", Type: "BENCH", Data: make([]byte, 1024)}
	rate := func(b *testing.B) float64 { return float64(b.N) / b.Elapsed().Seconds() }
	throughput := func(b *testing.B, r float64, raw bool) {
		b.ReportMetric(r, "msg/s")
		if raw {
			rawRate = r
		} else if rawRate > 0 {
			b.ReportMetric(r/rawRate, "bus/raw")
		}
	}
	// latency times b.N rounds, each a call of round, and reports their
	// p50 (and for a bus row its ratio to the raw row's).
	latency := func(b *testing.B, raw bool, round func() error) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := round(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		p50 := lat[len(lat)/2]
		b.ReportMetric(float64(p50)/1e3, "p50-µs")
		if raw {
			rawP50 = p50
		} else if rawP50 > 0 {
			b.ReportMetric(float64(p50)/float64(rawP50), "bus/raw-p50")
		}
	}

	b.Run("async/raw", func(b *testing.B) {
		js, sc := rawOn(b)
		next := rawMessage(b, sc, "receiver")
		b.ResetTimer()
		for range b.N {
			if _, err := js.PublishMsgAsync(next()); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		throughput(b, rate(b), true)
	})
	for _, row := range []struct {
		name string
		opts []bus.Option
	}{{"async/bus", nil}, {"async/bus-untracked", []bus.Option{bus.WithoutLifecycle()}}} {
		b.Run(row.name, func(b *testing.B) {
			bb, _ := fresh(b, "sender", row.opts...)
			b.ResetTimer()
			for range b.N {
				if _, err := bb.PublishAsync(ctx, message); err != nil {
					b.Fatal(err)
				}
			}
			if err := bb.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			throughput(b, rate(b), false)
		})
	}

	b.Run("sync/raw", func(b *testing.B) {
		js, sc := rawOn(b)
		next := rawMessage(b, sc, "receiver")
		latency(b, true, func() error {
			_, err := js.PublishMsg(ctx, next())
			return err
		})
	})
	b.Run("sync/bus", func(b *testing.B) {
		bb, _ := fresh(b, "sender")
		latency(b, false, func() error {
			_, err := bb.Publish(ctx, message)
			return err
		})
	})

	// Consume rows: the messages are stored first, untimed; the timer
	// covers draining them, each decoded and acked.
	b.Run("consume/raw", func(b *testing.B) {
		js, sc := rawOn(b)
		next := rawMessage(b, sc, "receiver")
		for range b.N {
			if _, err := js.PublishMsgAsync(next()); err != nil {
				b.Fatal(err)
			}
		}
		<-js.PublishAsyncComplete()
		filter, _ := sc.AgentFilter("receiver")
		cons, err := js.CreateOrUpdateConsumer(ctx, sc.Stream(), jetstream.ConsumerConfig{
			Durable: "raw", FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
		})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		var n atomic.Int64
		b.ResetTimer()
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
				b.Error(err)
			}
			if err := m.Ack(); err != nil {
				b.Error(err)
			}
			if n.Add(1) == int64(b.N) {
				close(done)
			}
		}, jetstream.PullMaxMessages(500))
		if err != nil {
			b.Fatal(err)
		}
		<-done
		b.StopTimer()
		cc.Stop()
		throughput(b, rate(b), true)
	})
	for _, row := range []struct {
		name string
		opts []bus.Option
		sub  []bus.SubscribeOption
	}{
		{"consume/bus-defaults", nil, nil},
		{"consume/bus-untracked-prefetch-500", []bus.Option{bus.WithoutLifecycle()}, []bus.SubscribeOption{bus.WithPrefetch(500)}},
	} {
		b.Run(row.name, func(b *testing.B) {
			sender, r := fresh(b, "sender", row.opts...)
			for range b.N {
				if _, err := sender.PublishAsync(ctx, message); err != nil {
					b.Fatal(err)
				}
			}
			if err := sender.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			receiver, err := bus.New(embeddedtest.Connect(b, s), "receiver", append([]bus.Option{bus.WithRoot(r)}, row.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			defer receiver.Close()
			done := make(chan struct{})
			var n atomic.Int64
			b.ResetTimer()
			sub, err := receiver.Subscribe(ctx, func(context.Context, *bus.Delivery) error {
				if n.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			}, row.sub...)
			if err != nil {
				b.Fatal(err)
			}
			<-done
			b.StopTimer()
			sub.Stop()
			<-sub.Done()
			throughput(b, rate(b), false)
		})
	}

	b.Run("request/raw-jetstream", func(b *testing.B) {
		// The requester publishes the request to the responder's subject
		// and reads the reply from its own with a pull consumer; the
		// responder reads requests likewise and publishes each reply.
		// A connection for each agent: js the requester's, jsR the
		// responder's.
		js, sc := rawOn(b)
		jsR, err := jetstream.New(embeddedtest.Connect(b, s))
		if err != nil {
			b.Fatal(err)
		}
		toResponder, toRequester := rawMessage(b, sc, "responder"), rawMessage(b, sc, "requester")
		consumer := func(js jetstream.JetStream, agent string) jetstream.Consumer {
			filter, _ := sc.AgentFilter(agent)
			c, err := js.CreateOrUpdateConsumer(ctx, sc.Stream(), jetstream.ConsumerConfig{Durable: agent, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				b.Fatal(err)
			}
			return c
		}
		requests, replies := consumer(jsR, "responder"), consumer(js, "requester")
		rc, err := requests.Consume(func(m jetstream.Msg) {
			if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
				b.Error(err)
			}
			if _, err := jsR.PublishMsg(ctx, toRequester()); err != nil {
				b.Error(err)
			}
			m.Ack()
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { rc.Stop(); <-rc.Closed() }()
		got := make(chan struct{}, 1)
		pc, err := replies.Consume(func(m jetstream.Msg) {
			if _, err := codec.Decode(m.Headers(), m.Data()); err != nil {
				b.Error(err)
			}
			m.Ack()
			got <- struct{}{}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { pc.Stop(); <-pc.Closed() }()
		latency(b, true, func() error {
			if _, err := js.PublishMsg(ctx, toResponder()); err != nil {
				return err
			}
			<-got
			return nil
		})
	})
	// A requester with no subscription of its own, as a caller that only
	// asks; and one that also subscribes, as an agent that both asks and
	// serves (BenchmarkRequestReply's setting).
	for _, subscribed := range []bool{false, true} {
		name := "request/bus"
		if subscribed {
			name = "request/bus-requester-subscribed"
		}
		b.Run(name, func(b *testing.B) {
			requester, r := fresh(b, "requester")
			if subscribed {
				own, err := requester.Subscribe(ctx, func(context.Context, *bus.Delivery) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				defer func() { own.Stop(); <-own.Done() }()
			}
			responder, err := bus.New(embeddedtest.Connect(b, s), "responder", bus.WithRoot(r))
			if err != nil {
				b.Fatal(err)
			}
			defer responder.Close()
			sub, err := responder.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
				_, err := responder.Reply(ctx, &d.Message, bus.Message{Type: "RESULT", Data: d.Data})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { sub.Stop(); <-sub.Done() }()
			latency(b, false, func() error {
				_, err := requester.Request(ctx, bus.Message{To: "responder", Type: "REQUEST", Data: message.Data})
				return err
			})
		})
	}
}
