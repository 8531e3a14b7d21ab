package embeddedtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbus/agentbus/embedded"
)

// Certs names the PEM files of a throwaway public key infrastructure made
// by [GenerateCerts]: one CA that issued a server and a client certificate.
type Certs struct {
	// CAFile is the CA's certificate: what clients pass to nats.RootCAs and
	// a server verifying clients puts in TLSOptions.CAFile.
	CAFile string

	// ServerCertFile and ServerKeyFile are the server's certificate and key,
	// valid for 127.0.0.1, ::1 and localhost.
	ServerCertFile, ServerKeyFile string

	// ClientCertFile and ClientKeyFile are a client certificate and key
	// (common name "agentbus-test-client"), for nats.ClientCert.
	ClientCertFile, ClientKeyFile string
}

// ServerTLS returns TLS options for a server with the server certificate;
// with verifyClients the server also requires a client certificate issued
// by the CA.
func (c Certs) ServerTLS(verifyClients bool) *embedded.TLSOptions {
	t := &embedded.TLSOptions{CertFile: c.ServerCertFile, KeyFile: c.ServerKeyFile}
	if verifyClients {
		t.CAFile, t.VerifyClients = c.CAFile, true
	}
	return t
}

// GenerateCerts creates a CA, a server certificate and a client certificate
// (ECDSA P-256, valid from an hour ago for a day) in tb.TempDir(). It stops
// the test with tb.Fatal on error.
func GenerateCerts(tb testing.TB) Certs {
	tb.Helper()
	dir := tb.TempDir()
	now := time.Now()
	template := func(cn string) *x509.Certificate {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
		if err != nil {
			tb.Fatalf("embeddedtest: serial number: %v", err)
		}
		return &x509.Certificate{
			SerialNumber: serial,
			Subject:      pkix.Name{CommonName: cn, Organization: []string{"agentbus tests"}},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
		}
	}

	caKey := newKey(tb)
	ca := template("agentbus-test-ca")
	ca.IsCA = true
	ca.BasicConstraintsValid = true
	ca.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("embeddedtest: create CA certificate: %v", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatalf("embeddedtest: parse CA certificate: %v", err)
	}

	issue := func(tmpl *x509.Certificate, name string) (certFile, keyFile string) {
		key := newKey(tb)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatalf("embeddedtest: create %s certificate: %v", name, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			tb.Fatalf("embeddedtest: marshal %s key: %v", name, err)
		}
		certFile = writePEM(tb, filepath.Join(dir, name+"-cert.pem"), "CERTIFICATE", der)
		keyFile = writePEM(tb, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", keyDER)
		return certFile, keyFile
	}

	srv := template("agentbus-test-server")
	srv.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	srv.DNSNames = []string{"localhost"}
	srv.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	cli := template("agentbus-test-client")
	cli.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}

	var c Certs
	c.CAFile = writePEM(tb, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER)
	c.ServerCertFile, c.ServerKeyFile = issue(srv, "server")
	c.ClientCertFile, c.ClientKeyFile = issue(cli, "client")
	return c
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("embeddedtest: generate key: %v", err)
	}
	return key
}

func writePEM(tb testing.TB, path, blockType string, der []byte) string {
	tb.Helper()
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatalf("embeddedtest: %v", err)
	}
	return path
}
