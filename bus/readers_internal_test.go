package bus

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestReadPendingGap: a read whose consumer delivered a message that did
// not arrive fails with errReadGap rather than answer without it.
func TestReadPendingGap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc, js := unprovisioned(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "GAP", Subjects: []string{"gap.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, fmt.Sprintf("gap.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c jetstream.Consumer) (int, error) {
		n := 0
		err := readPending(ctx, c, nil, func(jetstream.Msg, *jetstream.MsgMetadata) (bool, error) {
			n++
			return false, nil
		})
		return n, err
	}

	whole, err := newReader(ctx, js, "GAP", jetstream.ConsumerConfig{FilterSubject: "gap.>"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := read(whole); n != 3 || err != nil {
		t.Fatalf("read = %d messages, %v; want 3, nil", n, err)
	}

	gap, err := newReader(ctx, js, "GAP", jetstream.ConsumerConfig{FilterSubject: "gap.>"})
	if err != nil {
		t.Fatal(err)
	}
	// The first message goes to another inbox, as to a fetch given up
	// before its messages came.
	other, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unsubscribe() //nolint:errcheck // the test is over
	name := gap.CachedInfo().Name
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.GAP."+name, other.Subject, []byte(`{"batch":1}`)); err != nil {
		t.Fatal(err)
	}
	if m, err := other.NextMsg(10 * time.Second); err != nil || m.Subject != "gap.0" {
		t.Fatalf("the first message elsewhere: %v, %v", m, err)
	}
	if n, err := read(gap); !errors.Is(err, errReadGap) {
		t.Fatalf("read after a lost delivery = %d messages, %v; want errReadGap", n, err)
	}

	reads := streamReads{js: js, onError: func(err error) { t.Error(err) }, live: context.Background()}
	for _, c := range []jetstream.Consumer{whole, gap} {
		reads.deleteReader(ctx, "GAP", c)
	}
	stream, err := js.Stream(ctx, "GAP")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Info(ctx); err != nil || info.State.Consumers != 0 {
		t.Errorf("after deleteReader: %+v consumers, %v", info.State.Consumers, err)
	}
}
