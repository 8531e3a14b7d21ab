// Package bus is the agentbus client: the message bus of one agent on NATS
// JetStream.
//
// An agent process creates one [Bus] for its identity, publishes messages
// to other agents, and subscribes to its own inbox:
//
//	b, err := bus.Connect("nats://127.0.0.1:4222", "orchestrator")
//	if err != nil { ... }
//	defer b.Close()
//
//	ack, err := b.Publish(ctx, bus.Message{
//		To:       "worker-1",
//		Type:     "TASK_ASSIGNMENT",
//		Priority: 2,
//		Data:     []byte(`{"task":"build"}`),
//	})
//
//	sub, err := b.Subscribe(ctx, func(ctx context.Context, d *bus.Delivery) error {
//		fmt.Println(d.From, d.Type, string(d.Data))
//		return nil // ack; an error redelivers with backoff
//	})
//
// [New] takes an existing *nats.Conn instead, and leaves it open on Close.
//
// On a server that gives each agent its own permissions (package bus/auth,
// docs/security.md) an agent connects with its own credentials, passed with
// [WithNATSOptions]; [Connect] takes replies on the agent's inbox prefix,
// [InboxPrefix], which a connection for [New] sets with
// nats.CustomInboxPrefix.
//
// # Messages
//
// Every message is a CloudEvent (see package codec and docs/cloudevents.md):
// [Publish] fills in the ID (a UUID, which is also the JetStream
// Nats-Msg-Id, so a republished ID is stored once and reported as
// [PubAck].Duplicate), the time, priority 3 and the correlation ID. To is
// another agent's ID, or [Broadcast] for every agent. A TTL makes the
// message expire: the server removes it, and a subscriber never handles it
// after its expiry.
//
// # Subscriptions
//
// [Bus.Subscribe] consumes the agent's direct messages and the broadcasts
// through five durable consumers, one per priority (docs/subjects.md). The
// default [Strict] policy starts the highest-priority message waiting,
// FIFO within a level; [Weighted] prevents starvation. Nothing is lost when
// a process stops or crashes: an unacknowledged message is redelivered after
// the ack wait to another process of the same agent, or to this one when it
// returns, and several processes of one agent split the work between them.
// A handler error redelivers the message with exponential backoff until
// MaxDeliver, then terminates it; [Permanent] terminates it at once.
//
// # Stream
//
// [Provision] creates or updates the stream (file storage, 30-day
// retention, 1-hour duplicate window, per-message TTL). Run it once per
// deployment, with the CLI's `agentbus provision`, or with [WithProvision].
//
// # Errors
//
// Errors a caller can act on are sentinels tested with errors.Is:
// [ErrInvalidMessage], [ErrInvalidAgentID], [ErrPayloadTooLarge],
// [ErrNotProvisioned], [ErrUnsupportedServer], [ErrClosed],
// [ErrInvalidOption]. Errors that happen in the background go to
// [WithErrorHandler]; the library never prints, and logs only to the
// *slog.Logger given with [WithLogger].
package bus
