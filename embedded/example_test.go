package embedded_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded"
)

// Start a server, connect in-process, and store and read back a message
// with JetStream.
func Example() {
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
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "GREETINGS", Subjects: []string{"greetings.>"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := js.Publish(ctx, "greetings.world", []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	msg, err := stream.GetMsg(ctx, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("JetStream enabled:", srv.NATS().JetStreamEnabled())
	fmt.Printf("%s: %s\n", msg.Subject, msg.Data)
	// Output:
	// JetStream enabled: true
	// greetings.world: hello
}

// Log the server's output through log/slog, at warning level and above.
func ExampleSlogLogger() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := embedded.Start(embedded.Options{Logger: embedded.SlogLogger(logger)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	fmt.Println(srv.Running())
	// Output: true
}

// A three-node cluster in which a replicated stream survives the loss of
// its leader. (Not run as a test: forming a cluster takes seconds.)
func ExampleStartCluster() {
	c, err := embedded.StartCluster(3, embedded.ClusterOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Shutdown()

	nc, err := c.Connect(nats.MaxReconnects(-1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Replicas: 3}); err != nil {
		fmt.Println(err)
		return
	}
	leader, err := c.WaitForStreamLeader(ctx, "", "ORDERS")
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = c.StopServer(c.Index(leader))
	next, err := c.WaitForStreamLeader(ctx, "", "ORDERS")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("new leader:", next != leader)
}
