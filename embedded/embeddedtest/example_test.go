package embeddedtest_test

import (
	"fmt"

	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// ServerTLS maps the files of a Certs, as GenerateCerts writes them in a
// test, onto the server's TLS options. With verifyClients the server also
// asks every client for a certificate issued by the CA. (RunServer and the
// other helpers need a test's testing.TB; see the package documentation.)
func ExampleCerts_ServerTLS() {
	certs := embeddedtest.Certs{ // in a test: certs := embeddedtest.GenerateCerts(t)
		CAFile:         "ca.pem",
		ServerCertFile: "server-cert.pem",
		ServerKeyFile:  "server-key.pem",
	}
	for _, verifyClients := range []bool{false, true} {
		tls := certs.ServerTLS(verifyClients)
		fmt.Printf("cert %s, key %s, client CA %q, verify clients %t\n",
			tls.CertFile, tls.KeyFile, tls.CAFile, tls.VerifyClients)
	}
	// Output:
	// cert server-cert.pem, key server-key.pem, client CA "", verify clients false
	// cert server-cert.pem, key server-key.pem, client CA "ca.pem", verify clients true
}
