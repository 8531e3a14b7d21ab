// Package consumers turns an agent's durable JetStream consumers, grouped
// into priority levels, into one ordered stream of handler calls.
//
// It is the engine under bus.Subscribe; most programs use that instead.
//
// # Consumers and settings
//
// A [Spec] names one durable consumer (its name, its one filter subject,
// built by package subjects, and whether a new one starts at the next
// message) and [Settings] holds what the server enforces for it: AckWait,
// MaxDeliver, MaxAckPending. [Ensure] reads the consumers, creates the
// missing ones and updates those whose settings differ, so a restarted
// agent picks up changed settings and an unchanged one costs the server no
// write.
// A consumer with a single filter is created on a subject that names the
// filter ($JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>), so server
// permissions can pin which consumer, with which filter, an agent may create.
//
// # Levels and lanes
//
// [Start] runs a [Dispatcher] over consumers, its [Lane]s, each of one
// level (0 the highest priority) or, with [AnyLevel], of every level, its
// messages placed by Options.LevelOf: bus gives each priority a lane of its
// own for the agent's direct messages and one lane for the broadcasts of
// every priority. The policy chooses a level; within the level the buffered
// message with the lowest stream sequence starts first, so the lanes of a
// level together keep the order in which their messages were published.
// The sequence is read once, when a message arrives. [Dispatcher.AddLane]
// adds a lane to a running dispatcher: bus creates a priority's direct
// consumer only when its first message comes, and adds its lane then.
//
// For each lane the dispatcher keeps an in-memory buffer filled by pull
// requests. Its size (Options.Prefetch) adapts by default: about what the
// handlers start in [PrefetchWindow] at the speed they have shown, between
// the concurrency and [MaxPrefetch]. Then:
//
//   - while a lane may hold messages at the server it asks without waiting
//     (FetchNoWait), so the answer tells whether the lane is empty;
//   - once a lane is drained it parks one waiting pull request at the
//     server, which pushes a new message to us the moment it is stored. An
//     idle agent therefore sends one request per lane per PullExpiry (30 s)
//     and nothing else.
//
// The dispatch loop first takes a free handler slot (Options.Concurrency),
// then picks a message. Under the [Strict] policy it takes the head of the
// highest level that has one, and waits rather than start a lower level, or
// a later message of the same level, while a lane of that level or a higher
// one has not yet told whether it is empty (an AnyLevel lane only while it
// has room to fetch more), or a lane made for a message found stored
// ([Lane.Stored]) has not delivered it yet, for up to [StoredWait]: with
// backlogs at every level,
// messages start in priority order, in publish order within a level, and a
// priority-1 message that arrives while lower work runs is the next to
// start. The [Weighted] policy shares starts between the levels that have
// messages in memory by weight, so a busy level cannot starve the others;
// it waits for no lane. [Dispatcher.Buffered] counts each level's lanes
// together.
//
// # Settlement and keep-alive
//
// The handler settles its message: [Msg.Ack], [Msg.Nak] with a delay or
// [Msg.Term]. What to do with a failure is the
// caller's decision (bus dead-letters before it terminates). A message
// returned unsettled, or whose handler panicked, is given back for
// redelivery at once and reported to Options.OnError.
//
// Every message held by the process, waiting in a buffer or running in a
// handler, gets an in-progress ack each AckWait/2. Neither a long handler
// nor a wait behind higher-priority work makes the server redeliver it;
// only a process that stops answering does.
//
// # Stopping
//
// Stop gives back buffered messages (nak, for immediate redelivery) and
// cancels handler contexts; Drain lets running handlers finish; Done is
// closed when every goroutine has exited and every message is settled.
// While it stops, a dispatcher sends its naks only once its subscriptions
// are gone: sent earlier, a nak could make the server redeliver the message
// to one of its own pull requests still waiting there, and the message
// would reach nobody until AckWait passed.
package consumers
