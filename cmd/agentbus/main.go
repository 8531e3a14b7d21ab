// Command agentbus runs, provisions and talks to an agentbus message bus: a
// durable bus for multi-agent systems on NATS JetStream in which every
// message is a CloudEvent.
//
//	agentbus serve                      # an embedded NATS server with JetStream
//	agentbus provision                  # create or update the bus's stream
//	agentbus publish --from alice --to bob --type PING --data hello
//	agentbus subscribe --agent bob --json
//	agentbus subscribe --agent bob --exec 'handle-message.sh'
//
// Run `agentbus help <command>` for the flags of each command. The exit code
// is 0 on success, 2 for a usage error and 1 for any other error; an error is
// reported as one line "agentbus: <error>" on stderr.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default behaviour so that a second
	// one kills a process that is slow to shut down.
	context.AfterFunc(ctx, stop)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
