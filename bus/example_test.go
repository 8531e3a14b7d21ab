package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
)

// An orchestrator sends two tasks to a worker; the worker, which was not
// listening yet, receives the urgent one first.
func Example() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()

	ctx := context.Background()
	orch, err := bus.Connect(srv.ClientURL(), "orchestrator", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer orch.Close()

	for _, m := range []bus.Message{
		{To: "worker-1", Type: "TASK_ASSIGNMENT", Priority: 3, Data: []byte("write the tests")},
		{To: "worker-1", Type: "ESCALATION", Priority: 1, Data: []byte("the build is broken")},
	} {
		if _, err := orch.Publish(ctx, m); err != nil {
			log.Fatal(err)
		}
	}

	worker, err := bus.Connect(srv.ClientURL(), "worker-1")
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	done := make(chan struct{})
	n := 0
	sub, err := worker.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		fmt.Printf("p%d %s from %s: %s\n", d.Priority, d.Type, d.From, d.Data)
		if n++; n == 2 {
			close(done)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	<-done
	sub.Stop()
	<-sub.Done()
	// Output:
	// p1 ESCALATION from orchestrator: the build is broken
	// p3 TASK_ASSIGNMENT from orchestrator: write the tests
}

// Publishing the same message ID twice stores it once.
func ExampleBus_Publish_duplicate() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	b, err := bus.Connect(srv.ClientURL(), "planner", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	m := bus.Message{ID: "plan-42", To: bus.Broadcast, Type: "PLAN_READY"}
	for range 2 {
		ack, err := b.Publish(context.Background(), m)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ack.ID, ack.Sequence, ack.Duplicate)
	}
	// Output:
	// plan-42 1 false
	// plan-42 1 true
}

// A handler whose work must happen once keys its effect by the message ID:
// delivery is at least once, and a redelivery (after a crash before the
// ack, or, as here, a failure after the work was done) finds the effect
// already there. The effect here is a record in a KeyValue bucket written
// only if absent; a database row keyed by the ID does the same.
func ExampleBus_Subscribe_idempotent() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	orch, err := bus.Connect(srv.ClientURL(), "orchestrator", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer orch.Close()
	worker, err := bus.Connect(srv.ClientURL(), "worker")
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	js, err := jetstream.New(worker.Conn())
	if err != nil {
		log.Fatal(err)
	}
	done, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "WORKER_DONE"})
	if err != nil {
		log.Fatal(err)
	}

	finished := make(chan struct{})
	_, err = worker.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		_, err := done.Create(ctx, d.ID, []byte("invoice sent"))
		switch {
		case errors.Is(err, jetstream.ErrKeyExists):
			fmt.Printf("%s: already done, delivery %d acknowledges it\n", d.ID, d.Deliveries)
			close(finished)
			return nil
		case err != nil:
			return err // not done: try again
		}
		fmt.Printf("%s: invoice sent on delivery %d\n", d.ID, d.Deliveries)
		return errors.New("lost the connection before the ack") // as a crash would
	}, bus.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := orch.Publish(ctx, bus.Message{ID: "order-7", To: "worker", Type: "SEND_INVOICE"}); err != nil {
		log.Fatal(err)
	}
	<-finished
	// Output:
	// order-7: invoice sent on delivery 1
	// order-7: already done, delivery 2 acknowledges it
}
