package embedded_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/embedded"
)

// TestConfigFile: the server starts from the file, with the Options fields
// applied over it.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "server.conf")
	conf := `
port: 1
max_payload: 2048
accounts {
  APP { jetstream: enabled, users: [ { user: app, password: secret, permissions: { publish: ["app.>", "$JS.API.>"], subscribe: "_INBOX.>" } } ] }
}
`
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, embedded.Options{ConfigFile: file})
	if port := s.Options().Port; port == 1 {
		t.Errorf("port %d from the file, want a random one", port)
	}
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		nc.Close()
		t.Errorf("connect without credentials: %v, want an authorization violation", err)
	}
	nc, err := s.Connect(nats.UserInfo("app", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != 2048 {
		t.Errorf("max payload %d, want the file's 2048", got)
	}
	// The account has JetStream: the file enables it, on the server's
	// JetStream that Start always enables.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(testContext(t)); err != nil {
		t.Errorf("account info: %v", err)
	}

	over := start(t, embedded.Options{ConfigFile: file, MaxPayload: 4096})
	nc2, err := over.Connect(nats.UserInfo("app", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if got := nc2.MaxPayload(); got != 4096 {
		t.Errorf("max payload %d, want Options.MaxPayload 4096 over the file's", got)
	}
}

func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.conf")
	if err := os.WriteFile(bad, []byte("accounts {"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		file    string
		wantErr []error
	}{
		{filepath.Join(t.TempDir(), "missing.conf"), []error{embedded.ErrStart, embedded.ErrInvalidOption, fs.ErrNotExist}},
		{bad, []error{embedded.ErrStart, embedded.ErrInvalidOption}},
	} {
		s, err := embedded.Start(embedded.Options{ConfigFile: tt.file, StoreDir: t.TempDir()})
		if err == nil {
			s.Shutdown()
			t.Fatalf("Start with %s succeeded", tt.file)
		}
		for _, want := range tt.wantErr {
			if !errors.Is(err, want) {
				t.Errorf("Start with %s: error %v, want %v", tt.file, err, want)
			}
		}
	}
}
