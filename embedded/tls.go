package embedded

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultTLSHandshakeTimeout bounds the TLS handshake of a client connection
// when TLSOptions.HandshakeTimeout is zero. It is longer than nats-server's
// own default (2s) so that clients on a loaded machine, or built with the
// race detector, are not cut off mid-handshake.
const DefaultTLSHandshakeTimeout = 5 * time.Second

// TLSOptions makes a server require TLS on client connections. Route
// connections between the nodes of a cluster stay plain; use
// Options.Configure to secure them.
//
// Connections made with [Server.Connect] run over an in-process pipe and
// skip TLS, and with it client verification: they are as trusted as the
// process that embeds the server.
type TLSOptions struct {
	// CertFile is the PEM file with the server's certificate, followed by
	// any intermediate certificates. Required.
	CertFile string

	// KeyFile is the PEM file with the private key of CertFile. Required.
	KeyFile string

	// CAFile is the PEM file with the certificate authorities that client
	// certificates must chain to. It is used only with VerifyClients, which
	// it is required for. Empty means no client certificates are checked.
	CAFile string

	// VerifyClients makes the server require from every client a
	// certificate issued by a CA in CAFile, and refuse the connection
	// otherwise. False means clients are not asked for a certificate.
	VerifyClients bool

	// HandshakeTimeout bounds how long a client has to complete the TLS
	// handshake. Zero means DefaultTLSHandshakeTimeout (5s).
	HandshakeTimeout time.Duration
}

// Validate reports whether t is usable, with errors that wrap
// [ErrInvalidOption]. It does not read the files; Start does, and reports
// a missing or unreadable file with an error that wraps both
// ErrInvalidOption and the cause (such as fs.ErrNotExist).
func (t TLSOptions) Validate() error {
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		return fmt.Errorf("%w: TLS needs both a certificate file and a key file", ErrInvalidOption)
	case t.VerifyClients && t.CAFile == "":
		return fmt.Errorf("%w: TLS client verification needs a CA file", ErrInvalidOption)
	case t.CAFile != "" && !t.VerifyClients:
		return fmt.Errorf("%w: TLS CA file %s is only used to verify clients; set VerifyClients", ErrInvalidOption, t.CAFile)
	case t.HandshakeTimeout < 0:
		return fmt.Errorf("%w: TLS handshake timeout %s is negative", ErrInvalidOption, t.HandshakeTimeout)
	}
	return nil
}

// configure sets up TLS on client connections of so.
func (t TLSOptions) configure(so *server.Options) error {
	files := []struct{ what, path string }{
		{"certificate", t.CertFile},
		{"key", t.KeyFile},
		{"CA", t.CAFile},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		// GenTLSConfig flattens file errors to text; reading the files
		// first keeps the cause for errors.Is.
		if _, err := os.ReadFile(f.path); err != nil {
			return fmt.Errorf("%w: TLS %s: %w", ErrInvalidOption, f.what, err)
		}
	}
	timeout := t.HandshakeTimeout
	if timeout == 0 {
		timeout = DefaultTLSHandshakeTimeout
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: t.CertFile,
		KeyFile:  t.KeyFile,
		CaFile:   t.CAFile,
		Verify:   t.VerifyClients,
		Timeout:  timeout.Seconds(),
	})
	if err != nil {
		return fmt.Errorf("%w: TLS: %w", ErrInvalidOption, err)
	}
	so.TLS = true
	so.TLSConfig = tc
	so.TLSVerify = t.VerifyClients
	so.TLSCert = t.CertFile
	so.TLSKey = t.KeyFile
	so.TLSCaCert = t.CAFile
	so.TLSTimeout = timeout.Seconds()
	return nil
}
