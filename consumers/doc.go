// Package consumers turns an agent's durable JetStream consumers, grouped
// into priority levels, into one ordered stream of handler calls.
//
// It is the engine under bus.Subscribe; most programs use that instead.
//
// # Levels and settings
//
// A [Level] names one durable consumer (its name and its one filter subject,
// built by package subjects) and [Settings] holds what the server enforces
// for it: AckWait, MaxDeliver, MaxAckPending. [Ensure] creates the consumers
// or updates them in place, so a restarted agent picks up changed settings.
// A consumer with a single filter is created on a subject that names the
// filter ($JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>), so server
// permissions can pin which consumer, with which filter, an agent may create.
//
// # Levels and lanes
//
// [Start] runs a [Dispatcher] over the consumers grouped by level, highest
// priority first. A level may have several consumers, its lanes: bus gives
// each priority two, the agent's direct messages and the broadcasts. The
// policy chooses a level; within the level the buffered message with the
// lowest stream sequence starts first, so the lanes of a level together keep
// the order in which their messages were published. The sequence is read
// once, when a message arrives.
//
// For each lane the dispatcher keeps a small in-memory buffer
// (Options.Prefetch messages) filled by pull requests:
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
// one has not yet told whether it is empty: with backlogs at every level,
// messages start in priority order, in publish order within a level, and a
// priority-1 message that arrives while lower work runs is the next to
// start. The [Weighted] policy shares starts between the levels that have
// messages in memory by weight, so a busy level cannot starve the others;
// it waits for no lane. [Dispatcher.Buffered] counts each level's lanes
// together.
//
// # Settlement and keep-alive
//
// A handler that returns nil acks its message. An error naks it with a
// [Backoff] delay, or terminates it on its last allowed delivery or when it
// is [Permanent]. A panic is recovered and counts as an error wrapping
// [ErrHandlerPanic].
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
package consumers
