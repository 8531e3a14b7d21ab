// Package auth generates the identities of a bus and the nats-server
// authorization that gives each one its permissions:
//
//   - one identity per agent, allowed exactly what the agent's work needs
//     (subjects.Scheme.AgentPermissions): sending as itself, its own six
//     consumers, its dead letters, the status records naming it and its
//     reply inbox;
//   - an admin identity with the whole account, for provisioning, dead-letter
//     handling and the operator's tools;
//   - unless left out, a user of the system account, for monitoring.
//
// Identities are NATS nkeys (ModeNKeys, the default), or users with
// passwords (ModePasswords), whose bcrypt hashes go into the config.
// Setup.ServerConfig renders the accounts in nats-server syntax: a file that
// `agentbus serve --auth` runs, and a fragment that an existing cluster
// includes. docs/security.md has the threat model and the deployment steps.
//
// # Generating and using a setup
//
// [Generate] makes fresh keys or passwords for the agents of a [Config];
// [Setup.Files] returns what to write into a directory, as `agentbus auth
// init` does: the server config [ConfigFileName] and one secret credential
// file per identity. The server runs the config, and each program logs in
// with its own [Identity]:
//
//	setup, err := auth.Generate(auth.Config{Agents: []string{"planner", "worker-1"}})
//	if err != nil { ... }
//	// write setup.ServerConfig() to auth.conf and run the server with it:
//	// agentbus serve --auth auth.conf, or embedded.Options{ConfigFile: ...}
//
//	id, _ := setup.Agent("worker-1")
//	b, err := bus.Connect(url, "worker-1", bus.WithNATSOptions(id.Option()))
//
// The admin, [Setup.Admin], provisions the stream; an agent's identity cannot.
package auth
