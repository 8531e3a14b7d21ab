package cli

import (
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
)

// checkFails checks that args fail with exit code want and one error line.
func checkFails(t *testing.T, want int, args ...string) result {
	t.Helper()
	r := runIn(t, "", args...)
	checkOneErrorLine(t, r)
	if r.code != want {
		t.Errorf("agentbus %s: exit %d, want %d; stderr %q", strings.Join(args, " "), r.code, want, r.stderr)
	}
	return r
}

func TestServeTLS(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := startServe(t, "", "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile)
	if !strings.HasPrefix(s.url, "tls://") {
		t.Fatalf("serve printed %q, want a tls:// URL", s.url)
	}
	if !strings.Contains(s.stderr.String(), "agentbus serving on "+s.url) {
		t.Errorf("stderr %q, want the serving line", s.stderr.String())
	}
	ca := []string{"--server", s.url, "--tlsca", certs.CAFile}

	// Without the CA, every kind of command fails on the certificate.
	plainURL := "nats://" + strings.TrimPrefix(s.url, "tls://")
	for _, server := range []string{s.url, plainURL} {
		checkFails(t, exitError, "--server", server, "publish", "--from", "lead", "--to", "w1", "--type", "T", "--data", "x")
		checkFails(t, exitError, "--server", server, "subscribe", "--agent", "w1", "--count", "1")
		checkFails(t, exitError, "--server", server, "provision")
		checkFails(t, exitError, "--server", server, "dlq", "list")
	}

	// With it, they work.
	mustRun(t, append(ca, "provision")...)
	id := publish(t, s.url, "--tlsca", certs.CAFile, "--from", "lead", "--to", "w1", "--type", "T", "--data", "over TLS")
	evs := events(t, mustRun(t, append(ca, "subscribe", "--agent", "w1", "--count", "1", "--json")...))
	if len(evs) != 1 || evs[0].msg.ID != id || string(evs[0].msg.Data) != "over TLS" {
		t.Fatalf("w1 got %+v, want message %s", evs, id)
	}
	if out := mustRun(t, append(ca, "dlq", "list")...); out != "" {
		t.Errorf("dlq list printed %q, want nothing", out)
	}
	// A client certificate the server does not ask for does no harm.
	mustRun(t, append(ca, "--tlscert", certs.ClientCertFile, "--tlskey", certs.ClientKeyFile, "provision")...)

	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d after cancel; stderr %q", code, s.stderr.String())
	}
}

func TestServeTLSVerifyClients(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := startServe(t, "", "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile,
		"--tls-ca", certs.CAFile, "--tls-verify")
	ca := []string{"--server", s.url, "--tlsca", certs.CAFile}
	withCert := append(ca[:len(ca):len(ca)], "--tlscert", certs.ClientCertFile, "--tlskey", certs.ClientKeyFile)

	checkFails(t, exitError, append(ca, "publish", "--from", "lead", "--to", "w1", "--type", "T")...)
	checkFails(t, exitError, append(ca, "provision")...)

	id := publish(t, s.url, append(withCert[2:], "--from", "lead", "--to", "w1", "--type", "T", "--data", "verified")...)
	evs := events(t, mustRun(t, append(withCert, "subscribe", "--agent", "w1", "--count", "1", "--json")...))
	if len(evs) != 1 || evs[0].msg.ID != id {
		t.Fatalf("w1 got %+v, want message %s", evs, id)
	}
	mustRun(t, append(withCert, "provision")...)
	mustRun(t, append(withCert, "dlq", "list")...)
}

func TestServeTLSFlags(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "cert without key", args: []string{"--tls-cert", certs.ServerCertFile}, wantCode: exitUsage},
		{name: "key without cert", args: []string{"--tls-key", certs.ServerKeyFile}, wantCode: exitUsage},
		{name: "verify without CA", args: []string{"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-verify"}, wantCode: exitUsage},
		{name: "CA without verify", args: []string{"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-ca", certs.CAFile}, wantCode: exitUsage},
		{name: "missing cert file", args: []string{"--tls-cert", missing, "--tls-key", certs.ServerKeyFile}, wantCode: exitError},
		{name: "key does not match", args: []string{"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ClientKeyFile}, wantCode: exitError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--store", t.TempDir()}, tt.args...)
			checkFails(t, tt.wantCode, args...)
		})
	}
}

// newAuthServer starts an embedded server configured by configure,
// provisions the bus on it with the provision command run with auth, and
// returns its URL.
func newAuthServer(t *testing.T, configure func(*server.Options), auth ...string) string {
	t.Helper()
	s := embeddedtest.RunServer(t, func(o *embedded.Options) { o.Configure = configure })
	mustRun(t, append([]string{"--server", s.ClientURL()}, append(auth, "provision")...)...)
	return s.ClientURL()
}

func TestUserPassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-Pa55"
	srv := newAuthServer(t, func(o *server.Options) { o.Username, o.Password = "agent", secret },
		"--user", "agent", "--password", secret)
	auth := []string{"--server", srv, "--user", "agent", "--password", secret}

	id := publish(t, srv, "--user", "agent", "--password", secret, "--from", "lead", "--to", "w1", "--type", "T", "--data", "x")
	evs := events(t, mustRun(t, append(auth, "subscribe", "--agent", "w1", "--count", "1", "--json")...))
	if len(evs) != 1 || evs[0].msg.ID != id {
		t.Fatalf("w1 got %+v, want message %s", evs, id)
	}
	mustRun(t, append(auth, "dlq", "list")...)

	// user:password in the URL, as nats.go takes it.
	u, err := url.Parse(srv)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("agent", secret)
	mustRun(t, "--server", u.String(), "provision")
	publish(t, u.String(), "--from", "lead", "--to", "w2", "--type", "T")

	for _, tt := range []struct {
		name string
		args []string
	}{
		{name: "no credentials", args: []string{"--server", srv}},
		{name: "wrong password", args: []string{"--server", srv, "--user", "agent", "--password", "wrong"}},
		{name: "wrong user", args: []string{"--server", srv, "--user", "other", "--password", secret}},
		{name: "token instead", args: []string{"--server", srv, "--user", secret}},
		{name: "wrong password in URL", args: []string{"--server", strings.Replace(u.String(), secret, "wrong-Pa55", 1)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, cmd := range [][]string{
				{"publish", "--from", "lead", "--to", "w1", "--type", "T"},
				{"subscribe", "--agent", "w1", "--count", "1"},
				{"provision"},
				{"dlq", "list"},
			} {
				r := checkFails(t, exitError, append(tt.args, cmd...)...)
				if strings.Contains(r.stderr, "Pa55") {
					t.Errorf("stderr %q shows the password", r.stderr)
				}
			}
		})
	}
}

func TestToken(t *testing.T) {
	t.Parallel()
	const token = "t0ken-for-tests"
	srv := newAuthServer(t, func(o *server.Options) { o.Authorization = token }, "--user", token)
	publish(t, srv, "--user", token, "--from", "lead", "--to", "w1", "--type", "T")

	u, err := url.Parse(srv)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(token)
	publish(t, u.String(), "--from", "lead", "--to", "w1", "--type", "T")

	u.User = url.User("wrong-t0ken")
	r := checkFails(t, exitError, "--server", u.String(), "provision")
	if strings.Contains(r.stderr, "t0ken") {
		t.Errorf("stderr %q shows the token", r.stderr)
	}
}

func TestTLSFirst(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	s := embeddedtest.RunServer(t, func(o *embedded.Options) {
		o.TLS = certs.ServerTLS(false)
		o.Configure = func(so *server.Options) { so.TLSHandshakeFirst = true }
	})
	mustRun(t, "--server", s.ClientURL(), "--tlsca", certs.CAFile, "--tlsfirst", "provision")
}

func TestConnectionFlags(t *testing.T) {
	t.Parallel()
	certs := embeddedtest.GenerateCerts(t)
	srv := newServer(t)
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "password without user", args: []string{"--password", "p"}, wantCode: exitUsage},
		{name: "creds and user", args: []string{"--creds", missing, "--user", "u"}, wantCode: exitUsage},
		{name: "creds and nkey", args: []string{"--creds", missing, "--nkey", missing}, wantCode: exitUsage},
		{name: "cert without key", args: []string{"--tlscert", certs.ClientCertFile}, wantCode: exitUsage},
		{name: "key without cert", args: []string{"--tlskey", certs.ClientKeyFile}, wantCode: exitUsage},
		{name: "missing nkey", args: []string{"--nkey", missing}, wantCode: exitError},
		{name: "missing creds", args: []string{"--creds", missing}, wantCode: exitError},
		{name: "missing CA", args: []string{"--tlsca", missing}, wantCode: exitError},
		{name: "CA of a plain server", args: []string{"--tlsca", certs.CAFile}, wantCode: exitError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, cmd := range [][]string{
				{"publish", "--from", "lead", "--to", "w1", "--type", "T"},
				{"subscribe", "--agent", "w1", "--count", "1"},
				{"provision"},
				{"dlq", "list"},
			} {
				checkFails(t, tt.wantCode, append(append([]string{"--server", srv}, tt.args...), cmd...)...)
			}
		})
	}
}

func TestConnFlagsEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"NATS_CREDS": "env.creds", "NATS_NKEY": "env.nk", "NATS_USER": "env-user", "NATS_PASSWORD": "env-pass",
		"NATS_CA": "env-ca.pem", "NATS_CERT": "env-cert.pem", "NATS_KEY": "env-key.pem",
	}
	getenv := func(k string) string { return env[k] }
	for _, tt := range []struct {
		name      string
		flags     connFlags
		want      connFlags
		wantUsage bool // natsOptions refuses the result
	}{
		{
			name:  "flag user, the environment's password and TLS",
			flags: connFlags{user: "flag-user", tlsCA: "flag-ca.pem"},
			want:  connFlags{user: "flag-user", password: "env-pass", tlsCA: "flag-ca.pem", tlsCert: "env-cert.pem", tlsKey: "env-key.pem"},
		},
		{
			// Before 2026-11-28: $NATS_CREDS and $NATS_USER as well, a usage error.
			name:  "flag creds, no identity from the environment",
			flags: connFlags{creds: "flag.creds"},
			want:  connFlags{creds: "flag.creds", tlsCA: "env-ca.pem", tlsCert: "env-cert.pem", tlsKey: "env-key.pem"},
		},
		{
			name:      "no flags: the environment's, two identities",
			want:      connFlags{creds: "env.creds", nkey: "env.nk", user: "env-user", password: "env-pass", tlsCA: "env-ca.pem", tlsCert: "env-cert.pem", tlsKey: "env-key.pem"},
			wantUsage: true,
		},
	} {
		got := tt.flags.withEnv(getenv)
		if got != tt.want {
			t.Errorf("%s: withEnv = %+v, want %+v", tt.name, got, tt.want)
		}
		_, err := got.identityOptions()
		var ue usageError
		if errors.As(err, &ue) != tt.wantUsage {
			t.Errorf("%s: identityOptions: %v, want a usage error %v", tt.name, err, tt.wantUsage)
		}
	}
}

func TestRedactURLs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, msg, servers, want string
	}{
		{
			name:    "password",
			msg:     "connect nats://u:secret@h:4222: nats: Authorization Violation",
			servers: "nats://u:secret@h:4222",
			want:    "connect nats://u:xxxxx@h:4222: nats: Authorization Violation",
		},
		{
			name:    "token",
			msg:     "connect nats://tok@h:4222: x",
			servers: "nats://tok@h:4222",
			want:    "connect nats://xxxxx@h:4222: x",
		},
		{
			name:    "cluster",
			msg:     "connect nats://a:p1@h1:1,nats://h2:2: x",
			servers: "nats://a:p1@h1:1,nats://h2:2",
			want:    "connect nats://a:xxxxx@h1:1,nats://h2:2: x",
		},
		{name: "no secret", msg: "connect nats://h:1: x", servers: "nats://h:1", want: "connect nats://h:1: x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redactURLs(tt.msg, tt.servers); got != tt.want {
				t.Errorf("redactURLs = %q, want %q", got, tt.want)
			}
		})
	}
}
