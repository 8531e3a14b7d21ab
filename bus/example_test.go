package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
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

// New takes a connection the program already has; it stays the program's
// to close.
func ExampleNew() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix(bus.InboxPrefix("planner")))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	b, err := bus.New(nc, "planner", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	ack, err := b.Publish(context.Background(), bus.Message{ID: "plan-1", To: "reviewer", Type: "PLAN"})
	fmt.Println(ack.ID, ack.Sequence, err)
	// Output:
	// plan-1 1 <nil>
}

// A planner asks a reviewer and waits for the answer; the reviewer's
// handler answers the delivery it holds.
func ExampleBus_Request() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	reviewer, err := bus.Connect(srv.ClientURL(), "reviewer", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer reviewer.Close()
	_, err = reviewer.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "REVIEW_RESULT", Data: []byte("approved: " + string(d.Data))})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	planner, err := bus.Connect(srv.ClientURL(), "planner")
	if err != nil {
		log.Fatal(err)
	}
	defer planner.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reply, err := planner.Request(ctx, bus.Message{ID: "review-7", To: "reviewer", Type: "REVIEW_REQUEST", Data: []byte("plan 7")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(reply.Type, "from", reply.From, "answering", reply.CausationID+":", string(reply.Data))
	// Output:
	// REVIEW_RESULT from reviewer answering review-7: approved: plan 7
}

// The sender looks up where its message is: pending while the recipient
// is away, completed once it handled it.
func ExampleBus_Status() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	// Bounds the polling below.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	orch, err := bus.Connect(srv.ClientURL(), "orchestrator", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer orch.Close()
	ack, err := orch.Publish(ctx, bus.Message{To: "worker", Type: "TASK"})
	if err != nil {
		log.Fatal(err)
	}
	state := func() bus.State {
		for {
			sts, err := orch.Status(ctx, ack.ID)
			if err == nil {
				return sts[0].State
			}
			if !errors.Is(err, bus.ErrNoStatus) { // the record is written just after the ack
				log.Fatal(err)
			}
		}
	}
	fmt.Println(state())

	worker, err := bus.Connect(srv.ClientURL(), "worker")
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	handled := make(chan struct{})
	_, err = worker.Subscribe(ctx, func(context.Context, *bus.Delivery) error {
		defer close(handled)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	<-handled
	for state() != bus.StateCompleted { // until the ack has reached the server
	}
	fmt.Println(bus.StateCompleted)
	// Output:
	// pending
	// completed
}

// An operator provisions the bus, then reads what happened to an agent's
// messages: a conversation's records and the dead letters.
func ExampleAdmin() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	// Bounds the polling below.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := bus.ConnectAdmin(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	info, err := admin.Provision(ctx, bus.StreamConfig{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stream", info.Config.Name)

	orch, err := bus.Connect(srv.ClientURL(), "orchestrator")
	if err != nil {
		log.Fatal(err)
	}
	defer orch.Close()
	worker, err := bus.Connect(srv.ClientURL(), "worker")
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	_, err = worker.Subscribe(ctx, func(_ context.Context, d *bus.Delivery) error {
		if d.Type == "BROKEN" {
			return bus.Permanent(errors.New("cannot parse the task"))
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, typ := range []string{"TASK", "BROKEN"} {
		if _, err := orch.Publish(ctx, bus.Message{To: "worker", Type: typ, CorrelationID: "release-1"}); err != nil {
			log.Fatal(err)
		}
	}

	var dls []bus.DeadLetter
	for len(dls) == 0 {
		if dls, err = admin.DeadLetters(ctx, bus.DeadLetterFilter{Agent: "worker"}); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("dead letter:", dls[0].Message.Type, dls[0].Reason, dls[0].Error)
	sts, err := admin.Conversation(ctx, "release-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("conversation release-1:", len(sts), "messages")
	// Output:
	// stream AGENTBUS
	// dead letter: BROKEN rejected cannot parse the task
	// conversation release-1: 2 messages
}

// An installation split into four shards: the orchestrator and a worker
// live on different shards, each with its own stream, and the
// orchestrator's request reaches the worker on the worker's.
func ExampleShards() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	ctx := context.Background()
	const shards = 4
	provision := bus.WithProvision(bus.StreamConfig{}) // each shard's root, as its bus is made
	worker, err := bus.NewShards(nc, "worker-2", shards, provision)
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()
	sub, err := worker.Bus().Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
		_, err := d.Reply(ctx, bus.Message{Type: "RESULT", Data: []byte("done: " + string(d.Data))})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Stop()

	orch, err := bus.NewShards(nc, "orchestrator", shards, provision)
	if err != nil {
		log.Fatal(err)
	}
	defer orch.Close()
	reply, err := orch.Bus().Request(ctx, bus.Message{To: "worker-2", Type: "TASK", Data: []byte("write the tests")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("orchestrator lives on", orch.Bus().Subjects().Root())
	fmt.Println("worker-2 lives on", worker.Bus().Subjects().Root())
	fmt.Printf("%s: %s\n", reply.Type, reply.Data)
	// Output:
	// orchestrator lives on agentbus.s1
	// worker-2 lives on agentbus.s0
	// RESULT: done: write the tests
}

// MaxConcurrency is the most handlers a subscription can run at once: the
// messages the agent's six consumers hand out unacknowledged at once.
// Subscribe refuses more.
func ExampleMaxConcurrency() {
	fmt.Println(bus.MaxConcurrency(0))   // WithMaxAckPending left at its default
	fmt.Println(bus.MaxConcurrency(100)) // WithMaxAckPending(100)
	// Output:
	// 6000
	// 600
}
