package bus_test

import (
	"context"
	"fmt"
	"log"

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
