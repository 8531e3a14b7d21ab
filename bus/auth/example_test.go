package auth_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/bus/auth"
	"github.com/agentbus/agentbus/embedded"
)

// Generate users with passwords for two agents, and see who they are, what
// an agent may send and receive, and which files `agentbus auth init`
// would write. The passwords are random; only their bcrypt hashes go into
// the server config.
func Example() {
	setup, err := auth.Generate(auth.Config{
		Agents: []string{"planner", "worker-1"},
		Mode:   auth.ModePasswords,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range setup.Identities {
		fmt.Printf("%-18s user %-9s account %s\n", id, id.User, id.Account)
	}

	worker, _ := setup.Agent("worker-1")
	// The first three subjects are the messages it sends, direct (with
	// and without the message's index) and broadcast; the rest are the JetStream API of its consumers and
	// status records.
	fmt.Println("worker-1 sends on:", worker.Permissions.Publish[:3])
	fmt.Println("worker-1 receives on:", worker.Permissions.Subscribe)

	for _, f := range setup.Files() {
		fmt.Println("file:", f.Name)
	}
	// Output:
	// admin              user admin     account AGENTBUS
	// system user        user sys       account SYS
	// agent "planner"    user planner   account AGENTBUS
	// agent "worker-1"   user worker-1  account AGENTBUS
	// worker-1 sends on: [agentbus.agent.*.*.worker-1.* agentbus.agent.*.*.worker-1.*.*.* agentbus.all.*.worker-1.*]
	// worker-1 receives on: [_INBOX.worker-1.> agentbus.agent.worker-1.> agentbus.firing.agent.worker-1.> agentbus.processes.worker-1 $SRV.* $SRV.*.agentbus $SRV.*.agentbus.*]
	// file: auth.conf
	// file: admin.env
	// file: sys.env
	// file: agents/planner.env
	// file: agents/worker-1.env
}

// Run a server with the generated authorization and log in as an agent:
// the server lets it in with its own credentials, and refuses to let it
// read another agent's messages.
func ExampleIdentity_Option() {
	setup, err := auth.Generate(auth.Config{Agents: []string{"planner", "worker-1"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, err := os.MkdirTemp("", "agentbus-auth")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	config := filepath.Join(dir, auth.ConfigFileName)
	if err := os.WriteFile(config, setup.ServerConfig(), 0o600); err != nil {
		fmt.Println(err)
		return
	}
	srv, err := embedded.Start(embedded.Options{ConfigFile: config})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()

	if _, err := nats.Connect(srv.ClientURL()); err != nil {
		fmt.Println("refused without credentials:", errors.Is(err, nats.ErrAuthorization))
	}

	worker, _ := setup.Agent("worker-1")
	nc, err := nats.Connect(srv.ClientURL(), worker.Option(),
		// NextMsg returns the server's refusal of a subscription; the
		// handler of asynchronous errors need not print it too.
		nats.PermissionErrOnSubscribe(true),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	fmt.Println("worker-1 connected:", nc.IsConnected())

	sub, err := nc.SubscribeSync("agentbus.agent.planner.>")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = sub.NextMsg(10 * time.Second)
	fmt.Println("reading planner's messages refused:", errors.Is(err, nats.ErrPermissionViolation))
	// Output:
	// refused without credentials: true
	// worker-1 connected: true
	// reading planner's messages refused: true
}
