// Package embedded runs a real NATS server with JetStream inside the current
// process. agentbus's tests and examples use it instead of a mock, and
// `agentbus serve` uses it to run a broker without a separate nats-server
// binary.
//
// # A server
//
// [Start] with zero [Options] gives a standalone JetStream server on a random
// loopback port with a temporary store:
//
//	srv, err := embedded.Start(embedded.Options{})
//	if err != nil {
//		return err // wraps embedded.ErrStart; never exits the process
//	}
//	defer srv.Shutdown() // waits until stopped, removes the temporary store
//
//	nc, err := srv.Connect() // in-process connection, no TCP involved
//	...
//	js, err := jetstream.New(nc)
//
// Start returns only once the server accepts connections and JetStream is
// enabled. Clients in other processes dial [Server.ClientURL].
//
// # Keeping data across restarts
//
// Set StoreDir to keep the JetStream store after Shutdown. [Server.Options]
// returns the options with the port, name and store the server actually
// used, so passing them to Start again brings the server back where it was:
//
//	srv, _ := embedded.Start(embedded.Options{StoreDir: dir})
//	opts := srv.Options() // opts.Port is the port chosen at random
//	srv.Shutdown()
//	srv, _ = embedded.Start(opts) // same port, same streams and messages
//
// One server at a time may use a store directory. Start locks it and fails
// with [ErrStoreLocked] while another server, in this process or another,
// holds it; the lock ends with the server's Shutdown, or with its process
// if it crashed.
//
// # Configuration and logging
//
// Options covers what agentbus needs, client TLS included (Options.TLS).
// Options.ConfigFile starts the server from a nats-server configuration
// file, such as the accounts and permissions `agentbus auth init` writes,
// with the other fields applied over it; Options.Configure receives the
// nats-server options before the server is created, for the rest (TLS on
// cluster routes, a monitoring port, debug logging). The server logs nothing
// unless Options.Logger is set; [SlogLogger] adapts a *slog.Logger. nats-server
// reports start-up failures through its logger's Fatalf, which its own
// loggers implement with os.Exit: this package intercepts those reports,
// returns them from Start as errors and never calls the logger's Fatalf.
//
// # Clusters
//
// [StartCluster] starts an n-node JetStream cluster in the process, for tests
// of replication and failover:
//
//	c, err := embedded.StartCluster(3, embedded.ClusterOptions{})
//	defer c.Shutdown()
//	nc, err := c.Connect() // TCP to all nodes, fails over
//	// ... create a stream with Replicas: 3 ...
//	leader, err := c.WaitForStreamLeader(ctx, "", "ORDERS")
//	c.StopServer(c.Index(leader)) // another node takes over
//	c.RestartServer(c.Index(leader)) // back on the same ports and store
//
// StartCluster returns once every node is routed to every other and a
// JetStream meta leader knows all of them. That usually takes well under a
// second, but when the first leader election splits, the server waits out an
// election timeout of 4 to 9 seconds.
//
// # Tests
//
// Package embeddedtest wraps these calls for tests, httptest style: it
// fails the test on error, stores data in t.TempDir() and shuts everything
// down in t.Cleanup.
package embedded
