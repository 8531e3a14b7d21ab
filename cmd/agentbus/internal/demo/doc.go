// Package demo is `agentbus demo`: a few agents talking over the bus on an
// embedded server, showing in a few seconds what the bus promises. It uses
// only the public API of packages bus, codec/profiles and embedded, and is
// meant to be read as an example.
//
// [Run] starts an embedded NATS server with JetStream (file storage in a
// temporary directory), provisions the bus with [bus.Admin.Provision], and
// connects each agent process on a connection of its own, as separate
// programs would: an orchestrator, two processes of the agent "worker"
// (worker#1 and worker#2, which share the agent's durable consumers), a
// reviewer, five reviewers of the group "reviewers", and an operator that
// watches for dead letters and reads what agents' permissions would not
// let them. The messages are native messages of three agent protocols
// (docs/protocols.md): Pipeline Broker work items, which carry their own
// priority, and basemessage escalations, requests and replies, published
// with [bus.Bus.PublishNative] or decoded with [profiles.Prepare] and
// published with [bus.Bus.Publish]; and the swarm protocol's
// ComponentHandoff and ReviewResult, decoded with [profiles.Prepare], asked
// of a group with [bus.Bus.GatherGroup] and answered with
// [bus.Delivery.Reply].
//
// The scenes, in order:
//
//   - priority: work items at priorities 4, 4 and 5 are queued for the
//     worker while it is offline, then a priority-1 ESCALATION_REQUEST;
//     the worker comes online and handles the escalation first.
//   - crash: worker#1 takes a work item and crashes (its connection closes
//     without an ack); after the ack wait the server redelivers it to
//     worker#2 ([bus.WithAckWait]), which sees delivery 2.
//   - duplicate: a work item is published twice with the same ID; the
//     second [bus.PubAck] is a Duplicate and the worker handles it once.
//   - ttl: a review request with a one-second TTL waits for the offline
//     reviewer and expires; its lifecycle record ([bus.Bus.Status]) reads
//     expired.
//   - request: the orchestrator's [bus.Bus.Request] gets the reviewer's
//     [bus.Delivery.Reply]; the request's record reads replied.
//   - poison: a work item the worker always fails on is retried
//     ([bus.WithMaxDeliver], [bus.WithBackoff]) and dead-lettered with the
//     reason ([bus.Admin.DeadLetters]); the item behind it flows past.
//   - presence: worker#3 registers ([bus.Bus.Register], a heartbeat a
//     second) and is killed; the registry finds it offline three
//     heartbeats later with no process watching; a request to it fails at
//     once ([bus.ErrAgentOffline]); work queues; the operator's escalation
//     policy ([bus.Admin.WatchEscalations]) calls the human with the
//     pipeline's needs_human; worker#4 comes back and drains the queue by
//     priority, and the human is told.
//   - tasks: long work. The orchestrator's [bus.Bus.Request] of a review
//     follows its progress ([bus.OnProgress]): the reviewer reports each
//     step ([bus.Delivery.Progress]) until the orchestrator cancels the
//     review while its tests run ([bus.Bus.Cancel]); the Request returns a
//     [bus.CanceledError], the reviewer's handler sees its context end with
//     [bus.ErrCanceled], and the record reads canceled. Then the reviewer
//     goes offline and another review is requested with a do-by a second
//     away ([bus.DoBy]): the Request returns a [bus.DeadlineError] at it,
//     the record reads expired, and the reviewer, back, never gets it.
//   - review: the swarm protocol's review round (docs/groups.md). Five
//     reviewers join the group "reviewers" ([bus.Bus.JoinGroup]); the
//     orchestrator, the swarm's Lead, forwards a ComponentHandoff to the
//     group with [bus.Bus.GatherGroup] and [bus.Want](3): each reviewer
//     gets its own copy and answers with a ReviewResult. Two answer at
//     once, one crashes on its copy (its connection closes), a third
//     answers, and the lead proceeds with three verdicts, told who
//     replied, failed, was offline and timed out ([bus.GatherResult]). The
//     slow reviewer answers after that, and the lead reads its verdict
//     with [bus.Bus.Attach] by its copy's ID (GatherResult.Requests). No
//     process of the crashed reviewer comes back: Attach to its copy
//     returns a [bus.DeadlineError] at the round's reply-by, and the copy
//     expires. The round is a conversation of its own: the swarm profile
//     takes the correlation ID from component_id.
//   - trace: every message but the review round's shares the correlation
//     ID [Conversation], so they form one trace
//     ([bus.ConversationTraceID]); [bus.Admin.Conversation] lists them
//     with where each ended.
//
// Each scene checks that it saw what it is meant to show, so the demo is
// also a smoke test of a build: Run returns an error naming the first scene
// that did not. The scenes wait for events (a handler running, a reply, a
// publish acknowledgement), never for a fixed time, except the TTL scene,
// which waits out its TTL, the tasks scene, whose reviewer takes its time
// over each step and whose orchestrator waits out a do-by, and the review
// scene, which waits out its round's reply-by (a second) to show what
// becomes of the crashed reviewer's copy. The bus
// writes lifecycle records and dead letters asynchronously; reading one
// right after the event it describes reads again until it is there.
//
// Run reports the timeline as [Event] values; [Printer] writes them for a
// person or as JSON Lines.
package demo
