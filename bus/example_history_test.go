package bus_test

import (
	"context"
	"fmt"
	"log"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
)

// An operator reads a conversation back from the stream, bodies included,
// two messages a page; the worker reads its own part of it.
func ExampleAdmin_History() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	ctx := context.Background()
	lead, err := bus.Connect(srv.ClientURL(), "lead", bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		log.Fatal(err)
	}
	defer lead.Close()
	worker, err := bus.Connect(srv.ClientURL(), "worker")
	if err != nil {
		log.Fatal(err)
	}
	defer worker.Close()

	for _, step := range []struct {
		from *bus.Bus
		m    bus.Message
	}{
		{lead, bus.Message{To: "worker", Type: "BUILD", Data: []byte("build v1.2")}},
		{worker, bus.Message{To: "lead", Type: "BUILT", Data: []byte("v1.2 is built")}},
		{lead, bus.Message{To: "reviewer", Type: "REVIEW", Data: []byte("review v1.2")}},
	} {
		step.m.CorrelationID = "release-1.2"
		if _, err := step.from.Publish(ctx, step.m); err != nil {
			log.Fatal(err)
		}
	}
	// The lifecycle records, the conversation's index, are written
	// asynchronously.
	for _, b := range []*bus.Bus{lead, worker} {
		if err := b.Flush(ctx); err != nil {
			log.Fatal(err)
		}
	}

	admin, err := bus.ConnectAdmin(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	q := bus.HistoryQuery{Limit: 2}
	for {
		p, err := admin.History(ctx, "release-1.2", q)
		if err != nil {
			log.Fatal(err)
		}
		for _, e := range p.Entries {
			fmt.Printf("%s -> %s %s: %s\n", e.From, e.To, e.Type, e.Data)
		}
		if p.Next == "" {
			break
		}
		fmt.Println("-- next page")
		q.After = p.Next
	}

	p, err := worker.History(ctx, "release-1.2", bus.HistoryQuery{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("-- as the worker saw it")
	for _, e := range p.Entries {
		fmt.Printf("%s -> %s %s: %s\n", e.From, e.To, e.Type, e.Data)
	}
	// Output:
	// lead -> worker BUILD: build v1.2
	// worker -> lead BUILT: v1.2 is built
	// -- next page
	// lead -> reviewer REVIEW: review v1.2
	// -- as the worker saw it
	// lead -> worker BUILD: build v1.2
	// worker -> lead BUILT: v1.2 is built
}
