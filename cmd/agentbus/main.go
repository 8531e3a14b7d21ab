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
