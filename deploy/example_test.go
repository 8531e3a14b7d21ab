package deploy_test

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
)

// Load node 1's configuration with nats-server's own parser, includes and
// all, as `nats-server --config nats/node-1.conf` does, and print what the
// cluster relies on. Only the server name and the routes differ between
// the three node files.
func Example() {
	o, err := server.ProcessConfigFile("nats/node-1.conf")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("server:", o.ServerName, "in cluster", o.Cluster.Name)
	for _, r := range o.Routes {
		fmt.Println("route:", r.Host)
	}
	fmt.Println("jetstream:", o.JetStream, "store", o.StoreDir)
	fmt.Printf("max payload: %d KiB\n", o.MaxPayload/1024)
	var accounts []string
	for _, a := range o.Accounts {
		accounts = append(accounts, a.Name)
	}
	slices.Sort(accounts)
	fmt.Println("accounts:", accounts, "system account", o.SystemAccount)
	// Output:
	// server: nats-1 in cluster agentbus
	// route: nats-2:6222
	// route: nats-3:6222
	// jetstream: true store /data/jetstream
	// max payload: 1024 KiB
	// accounts: [AGENTBUS SYS] system account SYS
}
