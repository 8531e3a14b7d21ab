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
// through up to six durable consumers: one per priority for its direct
// messages, so that a backlog is read in priority order, each created with
// the first message at its priority, and one for the broadcasts of every
// priority, which starts at the agent's first subscription: a new agent is
// not handed the broadcasts of the past (docs/subjects.md). The default
// [Strict] policy starts the highest-priority message waiting, FIFO within
// a level; [Weighted] prevents starvation. Nothing is lost when a process
// stops or crashes: an unacknowledged message is redelivered after the ack
// wait to another process of the same agent, or to this one when it
// returns, and several processes of one agent split the work between them.
// A handler error redelivers the message with exponential backoff until
// MaxDeliver, then moves it to the dead-letter stream with the reason;
// [Permanent] does so at once. A message whose event does not name the
// subject's sender, or that breaks its protocol's rules, is dead-lettered
// without reaching the handler ([Admin.DeadLetters], [Admin.ReplayDeadLetter]).
//
// # Conversations, requests and replies
//
// A message published with a handler's ctx joins the handled message's
// conversation: it inherits the correlation ID and names the handled
// message as its cause. [Bus.Request] publishes and waits for the reply
// (5 minutes by default, [WithRequestTimeout]); a handler answers the
// delivery it holds with [Delivery.Reply]. A reply that comes after the
// requester gave up still reaches its handler, marked [Delivery].Late.
// Long work reports progress ([Delivery.Progress], followed with
// [OnProgress]), can be canceled ([Bus.Cancel]), given deadlines ([DoBy],
// [IdleTimeout]), ask its requester for input ([Delivery.AskInput]), and be
// taken up again after a restart ([Bus.Attach]) (docs/tasks.md).
//
// # Groups and schedules
//
// Agents join named groups ([Bus.JoinGroup], [Admin.AddToGroup],
// [Admin.AddMatchingToGroup]); [Bus.PublishGroup] gives every member its
// own copy, and [Bus.GatherGroup] asks them all and goes on with the
// replies it wants ([Want], [StallTimeout]), saying who replied, failed,
// was offline or did not answer ([GatherResult]) (docs/groups.md).
// [Bus.Schedule] has the server send a message later, once ([At], [In]) or
// again and again ([Every], [Cron]) (docs/scheduling.md).
//
// # Protocols
//
// [Bus.PublishNative] carries a message of one of the agent protocols of
// package codec/profiles as it is, addressed by its own fields and checked
// by its protocol's rules; the receiver gets the native bytes back
// unchanged (docs/protocols.md).
//
// # Lifecycle
//
// Every message has a status record per recipient, pending, delivered,
// then replied, completed, failed, expired or dead_lettered, in a
// JetStream KeyValue bucket: [Bus.Status], [Admin.Status],
// [Admin.Conversation]. The sender writes pending, with the message's stream
// sequence; delivered and completed are read from the recipient's consumer
// when a record is looked up, so handling a message writes nothing on the
// common path. Records are written asynchronously ([Bus.Flush] waits for
// them); [WithoutLifecycle] turns them off.
//
// # History
//
// The records index each conversation: [Admin.History] reads one back from
// the stream, every message with its data, in creation order, a page at a
// time ([HistoryQuery], [HistoryPage]); [Bus.History] reads the part the
// agent sent or received. [Admin.Redeliver] publishes a past message again
// to an agent that lost its context, marked [ExtRedeliveryOf]
// (docs/history.md).
//
// # Tracing and metrics
//
// Publishes and handled messages are OpenTelemetry spans and metrics on
// the global providers, or those of [WithTracerProvider] and
// [WithMeterProvider]; every message of one conversation lands in one
// trace, even across uninstrumented hops (docs/observability.md).
//
// # Stream
//
// [Admin.Provision] creates or updates the stream (file storage, 30-day
// retention, 1-hour duplicate window, per-message TTL), its dead-letter
// stream and the status bucket. Run it once per deployment, with the CLI's
// `agentbus provision`, or with [WithProvision].
//
// An installation past one stream's consumers, or one server's memory, is
// split into shards, each a root with streams of its own, placed on servers
// of the operator's choice ([StreamConfig].Tags). An agent of such an
// installation uses [NewShards]: its [Shards.Bus] subscribes on the agent's
// own shard and sends every message on its recipient's.
//
// # Errors
//
// Errors a caller can act on are sentinels tested with errors.Is:
// [ErrInvalidMessage], [ErrInvalidAgentID], [ErrPayloadTooLarge],
// [ErrNotProvisioned], [ErrUnavailable], [ErrUnsupportedServer],
// [ErrPermissionDenied], [ErrRequestTimeout], [ErrNoStatus], [ErrClosed],
// [ErrInvalidOption]; a message dead-lettered by the bus carries
// [ErrSenderMismatch], [ErrInvalidNative] or [ErrExpired] as its reason.
// Errors that happen in the background go to [WithErrorHandler]; the
// library never prints, and logs only to the *slog.Logger given with
// [WithLogger].
package bus
