// Package subjects names everything agentbus puts on NATS: the subject of
// each message, the streams that store them and the consumers that deliver
// them. It does no I/O; the bus calls it before it publishes or subscribes.
//
// # Subjects
//
// A message goes to one agent or to all of them, at a priority from 1 (most
// urgent) to 5. Its subject says who it is for, how urgent it is, who sent it
// and what type it is, under a root that defaults to "agentbus":
//
//	agentbus.agent.reviewer.p2.orchestrator.review_request   direct
//	agentbus.all.p3.orchestrator.shutdown                    broadcast
//	agentbus.dlq.reviewer.orchestrator.review_request        dead letter
//
// A [Scheme] builds them:
//
//	s := subjects.Default()
//	subj, err := s.Direct("reviewer", "orchestrator", "review_request", 2)
//
// and takes them apart again, so a receiver learns the sender and type
// without opening the message:
//
//	addr, err := s.Parse(subj) // addr.From == "orchestrator", addr.Priority == 2
//
// Use [New] for another root, for instance one per environment:
// New("prod.bus-1").
//
// # The index
//
// A direct subject may end in the message's index, as the bus sends it when
// it tracks the lifecycle ([Scheme.IndexedDirect]): two tokens that name its
// ID ([IndexToken]) and its conversation ([ConversationToken]). The bus's
// own IDs, UUIDs version 7, are named by the 4 ms window of their time,
// which the messages made in it share ([Windowed]); any other ID by its
// own token ([IDToken], [ConversationKey]):
//
//	agentbus.agent.reviewer.p2.orchestrator.review_request.=T66ac70b4f9.=T66ac70b4f9
//	agentbus.agent.reviewer.p2.orchestrator.review_request.m-17.717e81e2c69e106ad7cb5c8c712e0921
//
// The stream's own subject index then finds a message by its ID
// ([Scheme.MessageFilters]; for a window, among the window's messages) or
// the messages of a conversation ([Scheme.ConversationFilters]), without a
// record per message. [Scheme.Parse] takes both forms and returns the
// index in [Address.Index].
//
// # Tokens
//
// Agent IDs and message types come from other systems and may hold any
// printable text: "build orchestrator", "@agent-cto", "日本語". NATS gives '.',
// '*', '>' and white space a meaning in subjects, so every ID and type is
// encoded as one token by [EncodeToken]: the bytes A-Z, a-z, 0-9, '_' and '-'
// stand for themselves and every other byte becomes %XX in upper-case hex.
// "build orchestrator" becomes "build%20orchestrator" and "a.b" becomes
// "a%2Eb". [DecodeToken] reverses it and accepts only that one spelling, so
// two different IDs never share a token and a token never has two meanings.
//
// An ID or type must be non-empty, valid UTF-8 without control characters and
// at most [MaxTokenLen] bytes once encoded. "*" is [Broadcast], the recipient
// meaning every agent, so no agent may use it as its ID. [ValidateID],
// [ValidateType] and [ValidatePriority] apply these rules, and every builder
// applies them before it builds anything: a bad input returns an error
// wrapping [ErrInvalidAgentID], [ErrInvalidType] or [ErrInvalidPriority],
// never a malformed subject.
//
// # Streams and consumers
//
// One stream, [Scheme.Stream] ("AGENTBUS"), stores the direct and broadcast
// subjects ([Scheme.StreamSubjects]); dead letters go to a second stream,
// [Scheme.DeadLetterStream] ("AGENTBUS_DLQ"). Each agent reads through six
// durable consumers, listed by [Scheme.Consumers]: one per priority for its
// direct messages ("reviewer_p2", filter "agentbus.agent.reviewer.p2.>")
// and one for the broadcasts of every priority ("reviewer_b", filter
// "agentbus.all.>"). Keeping the priorities apart lets a reader serve p1
// before p2 whatever the length of a backlog; the broadcast consumer's
// messages are placed by the priority in their subject, and the stream
// sequence merges them with the direct ones back into publish order. With
// one filter per consumer, server permissions can pin a consumer's name and
// filter together and so stop an agent from creating a consumer that reads
// another agent's messages.
//
// An installation split into shards has a root per shard, [ShardRoot]
// ("agentbus.s3"), each with the streams above; an agent lives on the shard
// [ShardOf] its ID hashes to.
//
// # Permissions
//
// [Scheme.AgentPermissions] lists every subject one agent may publish and
// subscribe to: its messages as sender, its consumers, its dead letters,
// the status records that name it, and its reply inbox ([InboxPrefix]).
// Package bus/auth turns the lists into a nats-server configuration.
//
// docs/subjects.md in the repository is the full contract, with the exact
// encoding rules and a table of examples.
package subjects
