// Command agentbus runs, provisions and talks to an agentbus message bus: a
// durable bus for multi-agent systems on NATS JetStream in which every
// message is a CloudEvent.
//
// Usage:
//
//	agentbus [global flags] <command> [flags]
//
// The commands:
//
//	serve      run an embedded NATS server with JetStream and the bus's stream
//	provision  create or update the bus's stream on any server or cluster
//	publish    publish one message
//	subscribe  consume an agent's inbox in priority order
//	request    send a request and wait for its reply
//	reply      answer a request
//	attach     take up a request sent earlier and wait for its reply
//	cancel     cancel a message that is queued or being handled
//	status     show where a message is in its lifecycle
//	trace      show the messages of a conversation in order
//	history    read a conversation's messages, or an agent's, from the stream
//	redeliver  deliver a past message again to an agent (operator)
//	agents     list the registered agents, their presence and backlogs
//	group      manage groups of agents: join, leave, add, remove, list, watch
//	dlq        list, show, replay and purge dead letters; watch for unsettled ones
//	bench      measure the bus side by side with raw nats.go on one server
//	demo       watch agents talk over an embedded bus
//	auth       generate identities and server permissions (auth init)
//
// For example:
//
//	agentbus serve                      # an embedded NATS server with JetStream
//	agentbus provision                  # create or update the bus's stream
//	agentbus publish --from alice --to bob --type PING --data hello
//	agentbus subscribe --agent bob --json
//	agentbus subscribe --agent bob --exec 'handle-message.sh'
//	agentbus request --from alice --to bob --type REVIEW --data 'PR 42' --timeout 30s
//	agentbus demo
//
// The global flags --server (default $NATS_URL, else
// nats://127.0.0.1:4222) and --root (default agentbus) say which bus a
// command talks to, and --creds, --nkey, --user, --password, --tlsca,
// --tlscert, --tlskey and --tlsfirst how it logs in, as in the nats CLI.
// demo always runs on an embedded server of its own, and bench does unless
// it is given --server.
// Run `agentbus help <command>` for the flags of each command. The exit code
// is 0 on success, 2 for a usage error, 3 when subscribe --count's --timeout
// passed with fewer messages handled, and 1 for any other error; an error
// is reported as one line "agentbus: <error>" on stderr.
package main
