package demo_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/demo"
)

// Run the whole demo and print how each scene went. `agentbus demo` also
// prints the timeline, passing each event of Options.Events to a Printer.
// It takes a few seconds: the crash scene waits out an ack wait, the ttl
// scene a TTL, the presence scene three heartbeats, the tasks scene a
// do-by, the review scene a reply-by. (go test compiles this example but
// does not run it: TestRun runs the demo and checks what it prints here.)
func ExampleRun() {
	rep, err := demo.Run(context.Background(), demo.Options{})
	if err != nil {
		fmt.Println(err)
	}
	for _, s := range rep.Scenes {
		fmt.Println(s.Scene, s.OK)
	}
	fmt.Println("all ok:", rep.OK)
	fmt.Println("trace of", rep.Conversation, "is", rep.TraceID)
	// It prints:
	// priority true
	// crash true
	// duplicate true
	// ttl true
	// request true
	// poison true
	// presence true
	// tasks true
	// review true
	// trace true
	// all ok: true
	// trace of release-42 is 717e81e2c69e106ad7cb5c8c712e0921
}

// A Printer writes the timeline for a person, under a heading, or as JSON
// Lines with every member present.
func ExamplePrinter() {
	e := demo.Event{
		Elapsed: 31 * time.Millisecond, Scene: "priority",
		From: "orchestrator", To: "worker", Type: "ESCALATION_REQUEST", Priority: 1, ID: "esc-1",
		Event: demo.EventQueued, Detail: "basemessage escalation queued last",
	}
	demo.NewPrinter(os.Stdout, false).Event(e)
	demo.NewPrinter(os.Stdout, true).Event(e)
	// Output:
	// agentbus demo: time since start, sender -> recipient, priority, type, message ID, what happened
	// +0.031s  orchestrator -> worker   p1 ESCALATION_REQUEST  esc-1       basemessage escalation queued last
	// {"elapsed_ms":31,"scene":"priority","from":"orchestrator","to":"worker","type":"ESCALATION_REQUEST","priority":1,"id":"esc-1","event":"queued","detail":"basemessage escalation queued last"}
}
