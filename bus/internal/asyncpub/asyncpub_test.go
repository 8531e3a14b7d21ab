package asyncpub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, embeddedtest.IgnoreServerGoroutines()...)
}

// withStream returns a server with stream ORDERS on orders.>, a
// connection to it, and the server.
func withStream(t *testing.T) (*nats.Conn, *embedded.Server) {
	t.Helper()
	s := embeddedtest.RunServer(t)
	nc := embeddedtest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	return nc, s
}

// pending returns how many publishes p has in flight.
func pending(p *Publisher) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// wait returns f's result once it resolves, failing the test after 10 s.
func wait(t *testing.T, f *Future) (*jetstream.PubAck, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Result()
	case <-time.After(10 * time.Second):
		t.Fatalf("publish of %s never resolved", f.msg.Subject)
		return nil, nil
	}
}

func TestPublishResolvesWithAcks(t *testing.T) {
	nc, _ := withStream(t)
	var mu sync.Mutex
	var acked []uint64
	p := New(nc, Options{MaxPending: 100, Timeout: time.Minute, OnAck: func(m *nats.Msg, ack *jetstream.PubAck) {
		mu.Lock()
		acked = append(acked, ack.Sequence)
		mu.Unlock()
	}})
	defer p.Close()
	const n = 1000
	futures := make([]*Future, n)
	for i := range n {
		// The bound is 100 in flight: the rest wait for room.
		var err error
		if futures[i], err = p.Publish(&nats.Msg{Subject: "orders.new", Data: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for i, f := range futures {
		ack, err := wait(t, f)
		if err != nil || ack.Stream != "ORDERS" || ack.Sequence != uint64(i+1) || ack.Duplicate {
			t.Fatalf("publish %d: ack %+v, error %v", i, ack, err)
		}
	}
	<-p.Complete()
	if n := pending(p); n != 0 {
		t.Errorf("%d pending after Complete", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(acked) != n {
		t.Errorf("OnAck called %d times, want %d", len(acked), n)
	}
}

func TestPublishDuplicate(t *testing.T) {
	nc, _ := withStream(t)
	p := New(nc, Options{})
	defer p.Close()
	for _, want := range []bool{false, true} {
		f, err := p.Publish(&nats.Msg{Subject: "orders.new", Header: nats.Header{jetstream.MsgIDHeader: []string{"order-1"}}})
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := wait(t, f); err != nil || ack.Sequence != 1 || ack.Duplicate != want {
			t.Errorf("ack %+v, error %v; want sequence 1, duplicate %v", ack, err, want)
		}
	}
}

func TestPublishAPIError(t *testing.T) {
	nc, _ := withStream(t)
	reported := make(chan error, 1)
	p := New(nc, Options{OnError: func(m *nats.Msg, err error) { reported <- err }})
	defer p.Close()
	f, err := p.Publish(&nats.Msg{Subject: "orders.new", Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"7"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = wait(t, f)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("error %v, want an API error with code %d", err, jetstream.JSErrCodeStreamWrongLastSequence)
	}
	if got := <-reported; got != err {
		t.Errorf("OnError got %v, want %v", got, err)
	}
}

func TestPublishNoResponders(t *testing.T) {
	nc, _ := withStream(t)
	p := New(nc, Options{RetryWait: time.Millisecond})
	defer p.Close()
	f, err := p.Publish(&nats.Msg{Subject: "nobody.listens"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, f); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("error %v, want jetstream.ErrNoStreamResponse", err)
	}
	if f.retries != DefaultRetryAttempts {
		t.Errorf("sent again %d times, want %d", f.retries, DefaultRetryAttempts)
	}
}

// silent subscribes to subject on nc, so that publishes to it are received
// and never acknowledged.
func silent(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestPublishTimeout(t *testing.T) {
	nc, _ := withStream(t)
	silent(t, nc, "silent")
	const timeout = 80 * time.Millisecond
	reported := make(chan error, 3)
	p := New(nc, Options{Timeout: timeout, OnError: func(m *nats.Msg, err error) { reported <- err }})
	defer p.Close()
	var futures []*Future
	for range 3 {
		f, err := p.Publish(&nats.Msg{Subject: "silent"})
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	acked, err := p.Publish(&nats.Msg{Subject: "orders.new"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, acked); err != nil {
		t.Fatalf("the acknowledged publish: %v", err)
	}
	for _, f := range futures {
		if _, err := wait(t, f); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("error %v, want jetstream.ErrAsyncPublishTimeout", err)
		}
	}
	for range futures {
		if err := <-reported; !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("OnError got %v", err)
		}
	}
	// The sweep stops with nothing in flight, and starts again.
	embeddedtest.WaitFor(t, 5*time.Second, "the sweep to stop", func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.sweeping, fmt.Sprintf("sweeping, %d pending", len(p.pending))
	})
	f, err := p.Publish(&nats.Msg{Subject: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, f); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("after a pause: error %v, want jetstream.ErrAsyncPublishTimeout", err)
	}
}

// TestPublishTimeoutCountsWholeTicks: a publish without an ack fails at
// the sweep after timeoutTicks full ones, never before: the timeout is
// never cut short. The sweeps are run by hand (the Publisher's own would
// come after an hour).
func TestPublishTimeoutCountsWholeTicks(t *testing.T) {
	nc, _ := withStream(t)
	silent(t, nc, "silent")
	p := New(nc, Options{Timeout: time.Hour})
	defer p.Close()
	f, err := p.Publish(&nats.Msg{Subject: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range timeoutTicks {
		p.sweep()
		select {
		case <-f.Done():
			t.Fatalf("timed out at sweep %d, before %d full ticks", i+1, timeoutTicks)
		default:
		}
	}
	p.sweep()
	select {
	case <-f.Done():
		if _, err := f.Result(); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("error %v, want jetstream.ErrAsyncPublishTimeout", err)
		}
	default:
		t.Errorf("not timed out at sweep %d", timeoutTicks+1)
	}
}

func TestPublishStalls(t *testing.T) {
	nc, _ := withStream(t)
	silent(t, nc, "silent")
	p := New(nc, Options{MaxPending: 2, StallWait: 20 * time.Millisecond})
	defer p.Close()
	for range 2 {
		if _, err := p.Publish(&nats.Msg{Subject: "silent"}); err != nil {
			t.Fatal(err)
		}
	}
	m := &nats.Msg{Subject: "silent"}
	if _, err := p.Publish(m); !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		t.Fatalf("third publish: error %v, want jetstream.ErrTooManyStalledMsgs", err)
	}
	if m.Reply != "" || pending(p) != 2 {
		t.Errorf("refused publish left reply %q, %d pending", m.Reply, pending(p))
	}
}

func TestCloseFailsWhatIsInFlight(t *testing.T) {
	nc, _ := withStream(t)
	silent(t, nc, "silent")
	p := New(nc, Options{Timeout: time.Minute})
	f, err := p.Publish(&nats.Msg{Subject: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	done := f.Done()
	p.Close()
	p.Close()
	<-done
	if _, err := f.Result(); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("in flight at Close: error %v, want nats.ErrConnectionClosed", err)
	}
	if _, err := p.Publish(&nats.Msg{Subject: "orders.new"}); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("after Close: error %v, want nats.ErrConnectionClosed", err)
	}
	select {
	case <-p.Complete():
	default:
		t.Error("Complete not closed after Close")
	}
}

func TestDisconnectFailsWhatIsInFlight(t *testing.T) {
	nc, s := withStream(t)
	silent(t, nc, "silent")
	p := New(nc, Options{Timeout: time.Minute})
	defer p.Close()
	f, err := p.Publish(&nats.Msg{Subject: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	if _, err := wait(t, f); !errors.Is(err, nats.ErrDisconnected) {
		t.Errorf("error %v, want nats.ErrDisconnected", err)
	}
}

// TestSendAgainOnReconnect: with SendAgainOnReconnect, a publish in flight
// when the connection drops is not failed, and goes out again once the
// connection is back.
func TestSendAgainOnReconnect(t *testing.T) {
	s := embeddedtest.RunServer(t)
	nc, err := nats.Connect(s.ClientURL(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("silent")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := New(nc, Options{Timeout: time.Minute, SendAgainOnReconnect: true})
	defer p.Close()
	f, err := p.Publish(&nats.Msg{Subject: "silent", Data: []byte("record")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("the first copy: %v", err)
	}
	// More publishes go out meanwhile. One still being sent when the
	// connection comes back is left to Publish: a resend of it raced with
	// Publish setting its reply subject, which a stress run under -race
	// found (this loop gives the race detector the chance, rarely taken).
	more := make(chan struct{})
	go func() {
		defer close(more)
		for range 2000 {
			if _, err := p.Publish(&nats.Msg{Subject: "silent"}); err != nil {
				return
			}
		}
	}()
	opts := s.Options()
	s.Shutdown()
	again, err := embedded.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Shutdown()
	<-more
	waitFor := time.Now().Add(10 * time.Second)
	for {
		m, err := sub.NextMsg(time.Until(waitFor))
		if err != nil {
			t.Fatalf("not sent again after the reconnect: %v", err)
		}
		if string(m.Data) == "record" {
			break // the others are the loop's
		}
	}
	select {
	case <-f.Done():
		_, err := f.Result()
		t.Errorf("resolved by the disconnect: %v, want still in flight", err)
	default:
	}
	if pending(p) == 0 {
		t.Errorf("nothing in flight, want the first publish still")
	}
}

func TestPublishRefusesReply(t *testing.T) {
	nc, _ := withStream(t)
	p := New(nc, Options{})
	defer p.Close()
	if _, err := p.Publish(&nats.Msg{Subject: "orders.new", Reply: "mine"}); !errors.Is(err, ErrReplySet) {
		t.Errorf("error %v, want ErrReplySet", err)
	}
	if _, err := p.Publish(&nats.Msg{Subject: "orders.new", Data: make([]byte, nc.MaxPayload()+1)}); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("oversize: error %v, want nats.ErrMaxPayload", err)
	}
	if n := pending(p); n != 0 {
		t.Errorf("%d pending after refused publishes", n)
	}
}

func TestParseAck(t *testing.T) {
	for _, tc := range []struct {
		data string
		want *jetstream.PubAck
		fast bool
	}{
		{`{"stream":"ORDERS","seq":12}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 12}, true},
		{`{"stream":"ORDERS","domain":"hub","seq":1}`, &jetstream.PubAck{Stream: "ORDERS", Domain: "hub", Sequence: 1}, true},
		{`{"stream":"ORDERS","seq":3,"duplicate": true}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 3, Duplicate: true}, true},
		{`{"stream":"ORDERS","seq":18446744073709551615}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 1<<64 - 1}, true},
		{`{"stream":"ORDERS","seq":4,"val":"5"}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 4, Value: "5"}, false},
		{`{"stream":"OR\u0044ERS","seq":4}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 4}, false},
		{`{"seq":4,"stream":"ORDERS"}`, &jetstream.PubAck{Stream: "ORDERS", Sequence: 4}, false},
		{`{"stream":"ORDERS","seq":04}`, nil, false},
		{`{"stream":"","seq":4}`, nil, false},
		{`{"stream":"ORDERS","seq":4}x`, nil, false},
		{``, nil, false},
	} {
		t.Run(tc.data, func(t *testing.T) {
			_, fast := parseCommonAck([]byte(tc.data))
			if fast != tc.fast {
				t.Errorf("read without encoding/json: %v, want %v", fast, tc.fast)
			}
			got, err := parseAck([]byte(tc.data))
			if tc.want == nil {
				if !errors.Is(err, jetstream.ErrInvalidJSAck) {
					t.Errorf("ack %+v, error %v; want jetstream.ErrInvalidJSAck", got, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ack %+v, error %v; want %+v", got, err, tc.want)
			}
		})
	}
	_, err := parseAck([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 0"},"stream":"ORDERS","seq":0}`))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10071 || apiErr.Code != 400 {
		t.Errorf("error ack: %v", err)
	}
}

// FuzzParseAck checks that an ack read without encoding/json reads as
// encoding/json reads it, and that no ack panics.
func FuzzParseAck(f *testing.F) {
	for _, s := range []string{
		`{"stream":"ORDERS","seq":12}`, `{"stream":"ORDERS","domain":"hub","seq":1}`,
		`{"stream":"ORDERS","seq":3,"duplicate": true}`, `{"error":{"code":503}}`, `{"stream":"a\"b","seq":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gotErr := parseAck(data)
		fast, ok := parseCommonAck(data)
		if !ok {
			return
		}
		var want jetstream.PubAck
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("%q read as %+v, but encoding/json fails: %v", data, fast, err)
		}
		if !reflect.DeepEqual(*fast, want) || gotErr != nil || !reflect.DeepEqual(got, fast) {
			t.Fatalf("%q: read as %+v, encoding/json reads %+v", data, fast, want)
		}
	})
}

func TestTokens(t *testing.T) {
	for _, n := range []uint64{0, 1, 61, 62, 3843, 1 << 32, 1<<64 - 1} {
		subject := replySubject("_INBOX.x.", n)
		got, ok := decodeToken(lastToken(subject))
		if !ok || got != n {
			t.Errorf("%d: reply %q reads back as %d, %v", n, subject, got, ok)
		}
	}
	for _, bad := range []string{"", "00", "0a", "a.b", "-1", "zzzzzzzzzzz", "123456789012"} {
		if n, ok := decodeToken(bad); ok && replySubject("", n) != bad {
			t.Errorf("%q decodes as %d, which encodes otherwise", bad, n)
		}
	}
}

// FuzzDecodeToken checks that a token decodes only to the number that
// encodes to it.
func FuzzDecodeToken(f *testing.F) {
	f.Add("0")
	f.Add("LygHa16AHYF")
	f.Fuzz(func(t *testing.T, token string) {
		if n, ok := decodeToken(token); ok && replySubject("", n) != token {
			t.Fatalf("%q decodes as %d, which encodes as %q", token, n, replySubject("", n))
		}
	})
}
