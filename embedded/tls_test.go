package embedded_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

func TestTLSOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		tls     embedded.TLSOptions
		wantErr error
	}{
		{name: "cert and key", tls: embedded.TLSOptions{CertFile: "c", KeyFile: "k"}},
		{name: "verify clients", tls: embedded.TLSOptions{CertFile: "c", KeyFile: "k", CAFile: "ca", VerifyClients: true}},
		{name: "no key", tls: embedded.TLSOptions{CertFile: "c"}, wantErr: embedded.ErrInvalidOption},
		{name: "no cert", tls: embedded.TLSOptions{KeyFile: "k"}, wantErr: embedded.ErrInvalidOption},
		{name: "verify without CA", tls: embedded.TLSOptions{CertFile: "c", KeyFile: "k", VerifyClients: true}, wantErr: embedded.ErrInvalidOption},
		{name: "CA without verify", tls: embedded.TLSOptions{CertFile: "c", KeyFile: "k", CAFile: "ca"}, wantErr: embedded.ErrInvalidOption},
		{name: "negative timeout", tls: embedded.TLSOptions{CertFile: "c", KeyFile: "k", HandshakeTimeout: -time.Second}, wantErr: embedded.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.tls.Validate(); !errors.Is(err, tt.wantErr) {
				t.Errorf("TLSOptions.Validate() = %v, want %v", err, tt.wantErr)
			}
			if err := (embedded.Options{TLS: &tt.tls}).Validate(); !errors.Is(err, tt.wantErr) {
				t.Errorf("Options.Validate() = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr == nil {
				return
			}
			s, err := embedded.Start(embedded.Options{TLS: &tt.tls})
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded, want an error")
			}
			if !errors.Is(err, embedded.ErrStart) || !errors.Is(err, tt.wantErr) {
				t.Errorf("Start: %v, want ErrStart and %v", err, tt.wantErr)
			}
		})
	}
}

func TestStartTLSBadFiles(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name    string
		tls     embedded.TLSOptions
		wantErr error
	}{
		{name: "missing cert", tls: embedded.TLSOptions{CertFile: missing, KeyFile: certs.ServerKeyFile}, wantErr: fs.ErrNotExist},
		{name: "missing key", tls: embedded.TLSOptions{CertFile: certs.ServerCertFile, KeyFile: missing}, wantErr: fs.ErrNotExist},
		{name: "missing CA", tls: embedded.TLSOptions{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKeyFile, CAFile: missing, VerifyClients: true}, wantErr: fs.ErrNotExist},
		{name: "key of another cert", tls: embedded.TLSOptions{CertFile: certs.ServerCertFile, KeyFile: certs.ClientKeyFile}, wantErr: embedded.ErrInvalidOption},
		{name: "CA not PEM", tls: embedded.TLSOptions{CertFile: certs.ServerCertFile, KeyFile: certs.ServerKeyFile, CAFile: certs.ServerKeyFile, VerifyClients: true}, wantErr: embedded.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), TLS: &tt.tls})
			if err == nil {
				s.Shutdown()
				t.Fatal("Start succeeded, want an error")
			}
			for _, want := range []error{embedded.ErrStart, embedded.ErrInvalidOption, tt.wantErr} {
				if !errors.Is(err, want) {
					t.Errorf("Start: %v, want an error wrapping %v", err, want)
				}
			}
		})
	}
}

// dial connects over TCP to url and closes the connection at cleanup.
func dial(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts = append([]nats.Option{nats.Timeout(10 * time.Second), nats.NoReconnect()}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// roundTrip sends one message on nc's connection and waits for it.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.SubscribeSync("tls.test")
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := nc.Publish("tls.test", []byte("hello")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil || string(m.Data) != "hello" {
		t.Fatalf("NextMsg = %v, %v; want hello", m, err)
	}
}

func TestTLSServer(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := start(t, embedded.Options{TLS: certs.ServerTLS(false)})
	url := s.ClientURL()
	if !strings.HasPrefix(url, "tls://127.0.0.1:") {
		t.Fatalf("ClientURL = %q, want tls://127.0.0.1:<port>", url)
	}
	plainURL := "nats://" + strings.TrimPrefix(url, "tls://")

	t.Run("without CA", func(t *testing.T) {
		t.Parallel()
		// Neither the tls:// URL nor a nats:// one gets a client past the
		// certificate check without the CA.
		for _, u := range []string{url, plainURL} {
			_, err := dial(t, u)
			var unknown x509.UnknownAuthorityError
			if !errors.Is(err, nats.ErrTLS) || !errors.As(err, &unknown) {
				t.Errorf("connect %s without the CA: %v, want nats.ErrTLS with x509.UnknownAuthorityError", u, err)
			}
		}
	})
	t.Run("with CA", func(t *testing.T) {
		t.Parallel()
		for _, u := range []string{url, plainURL} {
			nc, err := dial(t, u, nats.RootCAs(certs.CAFile))
			if err != nil {
				t.Fatalf("connect %s with the CA: %v", u, err)
			}
			if !nc.TLSRequired() {
				t.Errorf("connect %s: TLSRequired = false", u)
			}
			if _, err := nc.TLSConnectionState(); err != nil {
				t.Errorf("connect %s: not a TLS connection: %v", u, err)
			}
			roundTrip(t, nc)
		}
	})
	t.Run("localhost", func(t *testing.T) {
		t.Parallel()
		u := strings.Replace(url, "127.0.0.1", "localhost", 1)
		nc, err := dial(t, u, nats.RootCAs(certs.CAFile))
		if err != nil {
			t.Fatalf("connect %s with the CA: %v", u, err)
		}
		roundTrip(t, nc)
	})
	t.Run("in-process", func(t *testing.T) {
		t.Parallel()
		roundTrip(t, connect(t, s))
	})
}

func TestTLSVerifyClients(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := start(t, embedded.Options{TLS: certs.ServerTLS(true)})
	url := s.ClientURL()

	if _, err := dial(t, url, nats.RootCAs(certs.CAFile)); err == nil {
		t.Error("connect without a client certificate succeeded, want refused")
	}
	// A certificate the CA did not issue is refused too: the server's own
	// certificate is issued by the CA but not for client authentication.
	if _, err := dial(t, url, nats.RootCAs(certs.CAFile), nats.ClientCert(certs.ServerCertFile, certs.ServerKeyFile)); err == nil {
		t.Error("connect with a server-only certificate succeeded, want refused")
	}
	nc, err := dial(t, url, nats.RootCAs(certs.CAFile), nats.ClientCert(certs.ClientCertFile, certs.ClientKeyFile))
	if err != nil {
		t.Fatalf("connect with the client certificate: %v", err)
	}
	roundTrip(t, nc)
	// The in-process pipe needs no certificate.
	roundTrip(t, connect(t, s))
}

// The library connects to a TLS server with the CA passed through
// bus.WithNATSOptions, and a message goes from one agent to another.
func TestTLSBus(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := start(t, embedded.Options{TLS: certs.ServerTLS(true)})
	ctx := testContext(t)
	tlsOpts := bus.WithNATSOptions(nats.RootCAs(certs.CAFile), nats.ClientCert(certs.ClientCertFile, certs.ClientKeyFile))

	if _, err := bus.Connect(s.ClientURL(), "lead"); !errors.Is(err, nats.ErrTLS) {
		t.Errorf("bus.Connect without the CA: %v, want nats.ErrTLS", err)
	}

	lead, err := bus.Connect(s.ClientURL(), "lead", tlsOpts, bus.WithProvision(bus.StreamConfig{}))
	if err != nil {
		t.Fatalf("bus.Connect lead: %v", err)
	}
	t.Cleanup(func() { _ = lead.Close() })
	worker, err := bus.Connect(s.ClientURL(), "worker", tlsOpts)
	if err != nil {
		t.Fatalf("bus.Connect worker: %v", err)
	}
	t.Cleanup(func() { _ = worker.Close() })

	if _, err := lead.Publish(ctx, bus.Message{To: "worker", Type: "TASK", Data: []byte("over TLS")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := make(chan string, 1)
	sub, err := worker.Subscribe(ctx, func(_ context.Context, d *bus.Delivery) error {
		select {
		case got <- d.From + ": " + string(d.Data):
		default:
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { sub.Stop(); <-sub.Done() })
	select {
	case m := <-got:
		if m != "lead: over TLS" {
			t.Errorf("worker got %q, want %q", m, "lead: over TLS")
		}
	case <-ctx.Done():
		t.Fatal("worker got nothing")
	}
}
