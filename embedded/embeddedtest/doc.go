// Package embeddedtest starts in-process NATS servers for tests, in the
// style of net/http/httptest: every helper takes a testing.TB, fails the
// test on error and registers the cleanup, so a test needs one line:
//
//	func TestPublish(t *testing.T) {
//		s := embeddedtest.RunServer(t)
//		nc := embeddedtest.Connect(t, s)
//		// ... use nc; the server and connection go away with the test.
//	}
//
// Servers store JetStream data in t.TempDir() and listen on random ports,
// so tests can run in parallel. Only tests should import this package; it
// imports testing.
//
// # Options, clusters and TLS
//
// [RunServer] takes functions that change the embedded.Options before the
// start, for a server name, a config file or TLS:
//
//	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.ConfigFile = authConf })
//
// [RunCluster] and [ConnectCluster] do the same for an n-node cluster
// (embedded.StartCluster). [GenerateCerts] writes a throwaway CA with a
// server and a client certificate into t.TempDir(), and [Certs.ServerTLS]
// turns them into the server's TLS options; a client then dials
// s.ClientURL() with nats.RootCAs(certs.CAFile), and with nats.ClientCert
// when the server verifies clients:
//
//	certs := embeddedtest.GenerateCerts(t)
//	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.TLS = certs.ServerTLS(false) })
//	nc, err := nats.Connect(s.ClientURL(), nats.RootCAs(certs.CAFile))
//
// # Waiting and temporary stores
//
// What a server does in the background (a consumer's pending count, a
// stream's replicas) is polled for with [WaitFor], with a deadline and the
// last state in the failure, never slept for. [TempDir] and [CheckEmpty]
// check that code which starts its own server under os.TempDir removes
// its store.
package embeddedtest
