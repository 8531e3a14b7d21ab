// Package benchmark measures agentbus side by side with raw nats.go on the
// same server in the same run; `agentbus bench` prints what it finds.
//
// # Running
//
// [Run] takes a [Config] with a way to dial the server and runs the
// scenarios one after another:
//
//	rep, err := benchmark.Run(ctx, benchmark.Config{
//		Dial:     func() (*nats.Conn, error) { return nats.Connect(url) },
//		Messages: 10_000,
//	})
//	if err != nil { ... }
//	rep.WriteTable(os.Stdout)       // or encoding/json for machines
//
// Zero fields take the defaults (DefaultMessages, DefaultSize,
// DefaultAgents, DefaultRate); [Config.Validate] rejects the rest.
//
// # Scenarios
//
// Each of [Scenarios] compares the bus with the plainest raw nats.go code
// that does the same job:
//
//   - async: PublishAsync against jetstream PublishMsgAsync with the bare
//     payload, and again with exactly the headers the bus writes (the
//     CloudEvents ce- attributes from package codec and a unique ID, also
//     the Nats-Msg-Id) on the subject the bus uses, which names the
//     message (indexed, see subjects.Scheme.IndexedDirect), until every
//     publish is acknowledged;
//   - async-untracked: the same with the bus's lifecycle tracking off,
//     whose subjects name no message, and raw on such subjects too;
//   - sync: the latency of Publish against PublishMsg, one after another,
//     of the bare payload and of the bus's headers on its indexed subject,
//     each timed from making its message and the three taking turns;
//   - consume: the rate at which a handler that returns nil drains a
//     backlog, bus Subscribe (prefetch ConsumePrefetch) against a raw
//     durable consumer's Consume with explicit acks, of bare messages and
//     of messages with the bus's headers, each decoded with codec.Decode,
//     and each side's process CPU per message from its first message
//     handled to its last;
//   - consume-defaults: the same with Subscribe given no options;
//   - consume-untracked: the same with lifecycle records off, prefetch
//     ConsumePrefetch;
//   - request: the Request -> Reply round trip, both agents subscribed,
//     against raw nats.go making the same hops through the stream (request
//     published, read by the responder's durable pull consumer, reply
//     published, read by the requester's), events encoded and decoded as
//     the bus does, and against the floor: the same raw hops with the
//     request's record read before it is handled, the lifecycle I/O of a
//     tracked round trip the bus's promises need;
//   - e2e: the time from the publish call to the handler, with the send
//     time in the payload, at a fixed publish rate and default subscriber
//     settings;
//   - priority: a backlog of priorities 5, 4, 3, 2, 1, 5, ... sent to an
//     offline agent, then drained: how many handler starts took a message
//     while a more urgent one was still waiting ([CountInversions]). The
//     bus dispatches by priority (Strict); one raw consumer over all of the
//     agent's subjects goes in stream order;
//   - setup: the time to New and Subscribe many agents one after another,
//     against creating the same durable consumers (package subjects'
//     Scheme.Consumers, package consumers' default Settings) with raw
//     nats.go; with Config.Memory, also the memory growth per agent.
//
// # Isolation
//
// Every scenario gets streams of its own: the bus's (provisioned by
// bus.Admin.Provision) under the root agentbus-bench-<run>-<scenario>-bus, and a
// raw stream, configured alike, under ...-raw, each side with connections
// of its own. The scenario deletes them when it ends, so a run leaves
// nothing behind on a shared server.
//
// # Reading the figures
//
// Every ratio is the bus's figure divided by raw's ([Ratio]): below 1 for
// throughput, or above 1 for latency, time and inversions, is what the bus
// costs. Latencies are nearest-rank percentiles ([Percentiles]).
//
// One round of a scenario on a shared machine moves by a tenth or more
// from one run to the next. Config.Rounds runs each scenario several times,
// each round on streams of its own; the report keeps the median round by
// the scenario's headline ratio and the ratio's spread ([Spread]).
package benchmark
