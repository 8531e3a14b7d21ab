package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentbus/agentbus/cmd/agentbus/internal/cli"
	"github.com/agentbus/agentbus/embedded"
)

// Run command lines in-process against an embedded server, as the tests
// do: provision the bus for at most 100 messages a second (so its 1 h
// duplicate window stays within the default memory budget), publish a
// message twice with the same ID, and make a usage error. Each prints its
// exit code and what it wrote.
func ExampleMain() {
	srv, err := embedded.Start(embedded.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	run := func(args ...string) {
		var stdout, stderr bytes.Buffer
		args = append([]string{"--server", srv.ClientURL()}, args...)
		code := cli.Main(ctx, args, strings.NewReader(""), &stdout, &stderr)
		fmt.Printf("exit %d: %s%s", code, stdout.String(), stderr.String())
	}
	run("provision", "--peak-rate", "100")
	run("publish", "--from", "planner", "--to", "worker-1", "--type", "TASK", "--id", "task-1", "--data", "build it")
	run("publish", "--from", "planner", "--to", "worker-1", "--type", "TASK", "--id", "task-1", "--data", "build it")
	run("publish", "--from", "planner", "--to", "worker-1", "--data", "no type")
	// Output:
	// exit 0: stream AGENTBUS subjects=agentbus.agent.*.p1.*.*,agentbus.agent.*.p2.*.*,agentbus.agent.*.p3.*.*,agentbus.agent.*.p4.*.*,agentbus.agent.*.p5.*.*,agentbus.agent.*.p1.*.*.*.*,agentbus.agent.*.p2.*.*.*.*,agentbus.agent.*.p3.*.*.*.*,agentbus.agent.*.p4.*.*.*.*,agentbus.agent.*.p5.*.*.*.*,agentbus.all.p1.*.*,agentbus.all.p2.*.*,agentbus.all.p3.*.*,agentbus.all.p4.*.*,agentbus.all.p5.*.* storage=file replicas=1 max-age=720h dedup-window=1h max-consumers=120000 messages=0 schedules=AGENTBUS_SCHED
	// exit 0: id=task-1 seq=1
	// exit 0: id=task-1 seq=1 duplicate
	// exit 2: agentbus: required flag "type" not set
}
