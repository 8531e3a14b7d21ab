// Package deploy holds no code: the directory carries the files that run
// agentbus beside a NATS cluster, and this package exists for their test.
//
//   - nats/: nats-server configurations of a three-node JetStream cluster
//     (node-1.conf, node-2.conf, node-3.conf, common.conf) and the accounts
//     fragment auth.conf;
//   - compose.yaml: the same cluster with Docker Compose, and a one-shot
//     service that provisions the bus's streams with three replicas;
//   - kubernetes/: values for the official NATS Helm chart and a Job that
//     provisions the streams.
//
// The test parses every file with the parser that will read it (the
// nats-server configuration parser, YAML for Compose and Kubernetes) and
// checks the settings agentbus relies on. Unless -short is given, it also
// builds nats-server from this module's dependency and the agentbus
// command, starts the three-node cluster from nats/ as three processes on
// free ports, provisions with `agentbus provision --replicas 3`, passes a
// message from a client of one node to a subscriber on another, kills the
// stream's leader and shows that publishing and consuming go on with two of
// three nodes. See README.md in this directory.
package deploy
