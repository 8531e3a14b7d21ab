package consumers_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/consumers"
	"github.com/agentbus/agentbus/embedded"
)

// Messages queued at three priority levels while nobody consumed them are
// handled highest priority first once a dispatcher starts, and in publish
// order within a level.
func ExampleStart() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// One stream; a message's priority is the second token of its subject.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TASKS", Subjects: []string{"tasks.>"}}); err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range []struct{ priority, task string }{
		{"p3", "tidy the docs"},
		{"p2", "review PR 7"},
		{"p3", "rename a flag"},
		{"p1", "fix the outage"},
		{"p2", "review PR 8"},
	} {
		if _, err := js.Publish(ctx, "tasks."+m.priority, []byte(m.task)); err != nil {
			fmt.Println(err)
			return
		}
	}

	// One durable consumer per level, highest priority first.
	var specs []consumers.Spec
	var lanes []consumers.Lane
	for p := 1; p <= 3; p++ {
		name := fmt.Sprintf("p%d", p)
		specs = append(specs, consumers.Spec{Name: name, FilterSubject: "tasks." + name})
		lanes = append(lanes, consumers.Lane{Consumer: name, Level: p - 1})
	}
	if _, err := consumers.Ensure(ctx, js, "TASKS", specs, consumers.Settings{}); err != nil {
		fmt.Println(err)
		return
	}

	handled := make(chan string)
	d, err := consumers.Start(nc, "TASKS", 3, lanes, func(ctx context.Context, m *consumers.Msg) {
		select {
		case handled <- fmt.Sprintf("%s %s", m.Metadata.Consumer, m.Data):
			m.Ack()
		case <-ctx.Done(): // stopping: returned unsettled, given back
		}
	}, consumers.Options{}) // the Strict policy, one handler at a time
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { d.Stop(); <-d.Done() }() // on every return

	for range 5 {
		select {
		case h := <-handled:
			fmt.Println(h)
		case <-ctx.Done():
			fmt.Println(ctx.Err())
			return
		}
	}
	// Let the last handler return and its ack go out.
	if err := d.Drain(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// p1 fix the outage
	// p2 review PR 7
	// p2 review PR 8
	// p3 tidy the docs
	// p3 rename a flag
}
