package auth

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"github.com/agentbus/agentbus/embedded"
	"github.com/agentbus/agentbus/embedded/embeddedtest"
	"github.com/agentbus/agentbus/subjects"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) {
	bcryptCost = bcrypt.MinCost // DefaultBcryptCost takes seconds a hash under -race
	goleak.VerifyTestMain(m)
}

func generate(t *testing.T, c Config) *Setup {
	t.Helper()
	s, err := Generate(c)
	if err != nil {
		t.Fatalf("Generate(%+v): %v", c, err)
	}
	return s
}

func TestGenerateNKeys(t *testing.T) {
	s := generate(t, Config{Agents: []string{"a", "build bot"}})
	if c := s.Config; c.Root != "agentbus" || c.Mode != ModeNKeys || c.Account != DefaultAccount {
		t.Errorf("resolved config %+v", c)
	}
	var roles []string
	keys := map[string]bool{}
	for _, id := range s.Identities {
		roles = append(roles, id.String())
		if !nkeys.IsValidPublicUserKey(id.PublicKey) || keys[id.PublicKey] || id.User != "" || id.Password != "" {
			t.Errorf("%s: public key %q (seen before: %v), user %q", id, id.PublicKey, keys[id.PublicKey], id.User)
		}
		keys[id.PublicKey] = true
		kp, err := nkeys.FromSeed(id.Seed)
		if err != nil {
			t.Fatalf("%s: seed: %v", id, err)
		}
		if pub, _ := kp.PublicKey(); pub != id.PublicKey {
			t.Errorf("%s: seed's public key %s, want %s", id, pub, id.PublicKey)
		}
	}
	if want := []string{"admin", "system user", `agent "a"`, `agent "build bot"`}; !slices.Equal(roles, want) {
		t.Errorf("identities %q, want %q", roles, want)
	}
	bot, ok := s.Agent("build bot")
	want, _ := subjects.Default().AgentPermissions("build bot")
	if !ok || !slices.Equal(bot.Permissions.Publish, want.Publish) || !slices.Equal(bot.Permissions.Subscribe, want.Subscribe) {
		t.Errorf("agent permissions %+v, want %+v", bot.Permissions, want)
	}
	if a, _ := s.Agent("a"); slices.ContainsFunc(a.Permissions.Publish, func(p string) bool { return strings.Contains(p, ".sched.") }) {
		t.Errorf("agent a may schedule without being listed a scheduler: %q", a.Permissions.Publish)
	}
	sched := generate(t, Config{Agents: []string{"a", "build bot"}, Schedulers: []string{"build bot"}})
	bot, _ = sched.Agent("build bot")
	extra, _ := subjects.Default().SchedulePermissions("build bot")
	if got := bot.Permissions.Publish; !slices.Equal(got, append(slices.Clone(want.Publish), extra...)) {
		t.Errorf("a scheduler's publish permissions %q, want the agent's and %q", got, extra)
	}
	if a := s.Admin(); a.Role != RoleAdmin || !slices.Equal(a.Permissions.Publish, []string{">"}) || a.Account != DefaultAccount {
		t.Errorf("admin %+v", a)
	}
	if sys := s.Identities[1]; sys.Account != SystemAccount || len(sys.Permissions.Publish) != 0 {
		t.Errorf("system user %+v", sys)
	}
}

func TestGeneratePasswords(t *testing.T) {
	s := generate(t, Config{Agents: []string{"a", "b"}, Mode: ModePasswords, AdminPassword: "change-me-admin"})
	users := map[string]string{}
	for _, id := range s.Identities {
		if id.Seed != nil || id.PublicKey != "" {
			t.Errorf("%s has an nkey in mode passwords", id)
		}
		if err := bcrypt.CompareHashAndPassword([]byte(id.passwordHash), []byte(id.Password)); err != nil {
			t.Errorf("%s: hash does not match the password: %v", id, err)
		}
		if cost, _ := bcrypt.Cost([]byte(id.passwordHash)); cost != bcryptCost {
			t.Errorf("%s: bcrypt cost %d, want %d", id, cost, bcryptCost)
		}
		users[id.User] = id.Password
	}
	if users["admin"] != "change-me-admin" || len(users["sys"]) != 32 || len(users["a"]) != 32 || users["a"] == users["b"] {
		t.Errorf("users and passwords %v", users)
	}

	// An explicit cost wins over the default.
	s = generate(t, Config{Agents: []string{"a"}, Mode: ModePasswords, BcryptCost: bcrypt.MinCost + 1})
	for _, id := range s.Identities {
		if cost, _ := bcrypt.Cost([]byte(id.passwordHash)); cost != bcrypt.MinCost+1 {
			t.Errorf("%s: bcrypt cost %d, want %d", id, cost, bcrypt.MinCost+1)
		}
	}
}

// TestGenerateShards: an agent of an installation of shards may do on
// every shard what it may on one, with the subjects every shard shares
// (its reply inbox) listed once.
func TestGenerateShards(t *testing.T) {
	s, err := Generate(Config{Agents: []string{"worker"}, Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := s.Agent("worker")
	for k := range 3 {
		root, _ := subjects.ShardRoot("", k, 3)
		shard, _ := subjects.New(root)
		one, _ := shard.AgentPermissions("worker")
		for _, p := range one.Publish {
			if !slices.Contains(id.Permissions.Publish, p) {
				t.Errorf("shard %d: publish %s not allowed", k, p)
			}
		}
		for _, p := range one.Subscribe {
			if n := count(id.Permissions.Subscribe, p); n != 1 {
				t.Errorf("shard %d: subscribe %s listed %d times, want once", k, p, n)
			}
		}
	}
	if one, _ := subjects.Default().AgentPermissions("worker"); slices.Contains(id.Permissions.Publish, one.Publish[0]) {
		t.Errorf("the unsharded root's %s is allowed too", one.Publish[0])
	}
}

func count(list []string, s string) (n int) {
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		name    string
		c       Config
		wantErr []error
	}{
		{name: "no agents", c: Config{}},
		{name: "invalid agent", c: Config{Agents: []string{"*"}}, wantErr: []error{subjects.ErrInvalidAgentID}},
		{name: "twice", c: Config{Agents: []string{"a", "b", "a"}}},
		{name: "root", c: Config{Root: "a..b", Agents: []string{"a"}}, wantErr: []error{subjects.ErrInvalidRoot}},
		{name: "mode", c: Config{Agents: []string{"a"}, Mode: "jwt"}},
		{name: "account", c: Config{Agents: []string{"a"}, Account: "my account"}},
		{name: "system account's name", c: Config{Agents: []string{"a"}, Account: SystemAccount}},
		{name: "password with nkeys", c: Config{Agents: []string{"a"}, AdminPassword: "p"}},
		{name: "system password without SYS", c: Config{Agents: []string{"a"}, Mode: ModePasswords, NoSystemAccount: true, SystemPassword: "p"}},
		{name: "agent named like the admin", c: Config{Agents: []string{"admin"}, Mode: ModePasswords}},
		{name: "agent named like the operator's sender", c: Config{Agents: []string{"agentbus"}}, wantErr: []error{subjects.ErrInvalidAgentID}},
		{name: "agent named like the system user", c: Config{Agents: []string{"sys"}, Mode: ModePasswords}},
		{name: "bcrypt cost with nkeys", c: Config{Agents: []string{"a"}, BcryptCost: 5}},
		{name: "scheduler not an agent", c: Config{Agents: []string{"a"}, Schedulers: []string{"b"}}},
		{name: "bcrypt cost too low", c: Config{Agents: []string{"a"}, Mode: ModePasswords, BcryptCost: 3}},
		{name: "bcrypt cost too high", c: Config{Agents: []string{"a"}, Mode: ModePasswords, BcryptCost: 32}},
		{name: "no shards", c: Config{Agents: []string{"a"}, Shards: -1}, wantErr: []error{subjects.ErrInvalidShard}},
		{name: "too many shards", c: Config{Agents: []string{"a"}, Shards: subjects.MaxShards + 1}, wantErr: []error{subjects.ErrInvalidShard}},
		{name: "root too long for its shards", c: Config{Root: strings.Repeat("r", 63), Agents: []string{"a"}, Shards: 2}, wantErr: []error{subjects.ErrInvalidRoot}},
		{name: "admin password too long", c: Config{Agents: []string{"a"}, Mode: ModePasswords, AdminPassword: strings.Repeat("p", 73)},
			wantErr: []error{bcrypt.ErrPasswordTooLong}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Generate(tt.c)
			for _, want := range append(tt.wantErr, ErrInvalidConfig) {
				if !errors.Is(err, want) {
					t.Errorf("Generate error = %v, want %v", err, want)
				}
			}
		})
	}
	// With nkeys an agent may be called admin: it has a key, not a name.
	generate(t, Config{Agents: []string{"admin", "sys"}})
}

// fixedSetup is a generated Setup with its keys and hashes replaced by
// fixed ones, for golden output.
func fixedSetup(t *testing.T, mode Mode, noSys bool) *Setup {
	t.Helper()
	s := generate(t, Config{Agents: []string{"a", "b"}, Mode: mode, NoSystemAccount: noSys})
	for i := range s.Identities {
		id := &s.Identities[i]
		name := id.Agent
		switch id.Role {
		case RoleAdmin:
			name = AdminUser
		case RoleSystem:
			name = SystemUser
		}
		if mode == ModeNKeys {
			id.PublicKey = "U" + strings.ToUpper(name) + strings.Repeat("X", 55-len(name))
		} else {
			id.passwordHash = "$2a$11$hash.of." + name
		}
	}
	return s
}

// TestServerConfigGolden pins the rendered config; go test -update
// rewrites the golden files after a deliberate change.
func TestServerConfigGolden(t *testing.T) {
	for _, tt := range []struct {
		file  string
		mode  Mode
		noSys bool
	}{
		{"nkeys.conf.golden", ModeNKeys, false},
		{"passwords-no-sys.conf.golden", ModePasswords, true},
	} {
		t.Run(tt.file, func(t *testing.T) {
			got := fixedSetup(t, tt.mode, tt.noSys).ServerConfig()
			path := filepath.Join("testdata", tt.file)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("ServerConfig() differs from %s (go test -update rewrites it):\n%s", path, got)
			}
		})
	}
}

// loadConfig writes s's config to a file and loads it with nats-server's
// own parser.
func loadConfig(t *testing.T, s *Setup) (string, *server.Options) {
	t.Helper()
	path := filepath.Join(t.TempDir(), ConfigFileName)
	if err := os.WriteFile(path, s.ServerConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server cannot load the config: %v\n%s", err, s.ServerConfig())
	}
	return path, opts
}

// TestServerConfigParses: nats-server reads back every user, its account
// and its permissions.
func TestServerConfigParses(t *testing.T) {
	t.Run("nkeys", func(t *testing.T) {
		s := generate(t, Config{Root: "prod.bus-1", Agents: []string{"a", "build bot", `quote"back\slash`}})
		_, opts := loadConfig(t, s)
		if opts.SystemAccount != SystemAccount {
			t.Errorf("system_account = %q", opts.SystemAccount)
		}
		byKey := map[string]*server.NkeyUser{}
		for _, u := range opts.Nkeys {
			byKey[u.Nkey] = u
		}
		for _, id := range s.Identities {
			u := byKey[id.PublicKey]
			if u == nil || u.Account == nil || u.Account.Name != id.Account {
				t.Fatalf("%s: server user %+v, want one in account %s", id, u, id.Account)
			}
			checkPermissions(t, id, u.Permissions)
		}
		if len(opts.Nkeys) != len(s.Identities) || len(opts.Users) != 0 {
			t.Errorf("%d nkey users and %d users, want %d and none", len(opts.Nkeys), len(opts.Users), len(s.Identities))
		}
	})
	t.Run("passwords", func(t *testing.T) {
		s := generate(t, Config{Agents: []string{"a"}, Mode: ModePasswords, Account: "BUS", NoSystemAccount: true})
		_, opts := loadConfig(t, s)
		if opts.SystemAccount != "" {
			t.Errorf("system_account = %q, want none", opts.SystemAccount)
		}
		var accounts []string
		for _, a := range opts.Accounts {
			accounts = append(accounts, a.Name)
		}
		if !slices.Equal(accounts, []string{"BUS"}) {
			t.Errorf("accounts %v, want BUS", accounts)
		}
		byUser := map[string]*server.User{}
		for _, u := range opts.Users {
			byUser[u.Username] = u
		}
		for _, id := range s.Identities {
			u := byUser[id.User]
			if u == nil || u.Password != id.passwordHash || u.Account == nil || u.Account.Name != "BUS" {
				t.Fatalf("%s: server user %+v", id, u)
			}
			checkPermissions(t, id, u.Permissions)
		}
	})
}

func checkPermissions(t *testing.T, id Identity, p *server.Permissions) {
	t.Helper()
	if len(id.Permissions.Publish) == 0 {
		if p != nil {
			t.Errorf("%s: permissions %+v, want none", id, p)
		}
		return
	}
	if p == nil || p.Publish == nil || p.Subscribe == nil || (p.Response != nil) != id.Permissions.Responses ||
		!slices.Equal(p.Publish.Allow, id.Permissions.Publish) || len(p.Publish.Deny) != 0 ||
		!slices.Equal(p.Subscribe.Allow, id.Permissions.Subscribe) || len(p.Subscribe.Deny) != 0 {
		t.Errorf("%s: server permissions %+v, want %+v", id, p, id.Permissions)
	}
}

// TestServerConfigRuns: a server started on the config admits every
// identity with its credentials and nobody else.
func TestServerConfigRuns(t *testing.T) {
	for _, mode := range []Mode{ModeNKeys, ModePasswords} {
		t.Run(string(mode), func(t *testing.T) {
			s := generate(t, Config{Agents: []string{"a"}, Mode: mode})
			path, _ := loadConfig(t, s)
			srv := embeddedtest.RunServer(t, func(o *embedded.Options) { o.ConfigFile = path })
			for _, id := range s.Identities {
				nc, err := nats.Connect(srv.ClientURL(), id.Option())
				if err != nil {
					t.Fatalf("%s cannot log in: %v", id, err)
				}
				nc.Close()
			}
			if nc, err := nats.Connect(srv.ClientURL()); err == nil {
				nc.Close()
				t.Error("a client without credentials logged in")
			}
			other := generate(t, Config{Agents: []string{"a"}, Mode: mode})
			if nc, err := nats.Connect(srv.ClientURL(), other.Admin().Option()); err == nil {
				nc.Close()
				t.Error("another setup's admin logged in")
			}
		})
	}
}

func TestFiles(t *testing.T) {
	t.Run("nkeys", func(t *testing.T) {
		s := generate(t, Config{Agents: []string{"a", "build bot"}})
		var names []string
		for _, f := range s.Files() {
			names = append(names, f.Name)
			if f.Identity == nil {
				if string(f.Data) != string(s.ServerConfig()) {
					t.Errorf("%s is not the server config", f.Name)
				}
				continue
			}
			kp, err := nkeys.ParseDecoratedNKey(f.Data)
			if err != nil {
				t.Fatalf("%s: %v", f.Name, err)
			}
			if pub, _ := kp.PublicKey(); pub != f.Identity.PublicKey {
				t.Errorf("%s holds the key of %s, want %s", f.Name, pub, f.Identity.PublicKey)
			}
		}
		if want := []string{"auth.conf", "admin.nk", "sys.nk", "agents/a.nk", "agents/build%20bot.nk"}; !slices.Equal(names, want) {
			t.Errorf("files %q, want %q", names, want)
		}
	})
	t.Run("passwords", func(t *testing.T) {
		s := generate(t, Config{Agents: []string{"a"}, Mode: ModePasswords, NoSystemAccount: true})
		var names []string
		for _, f := range s.Files()[1:] {
			names = append(names, f.Name)
			want := "\nNATS_USER=" + f.Identity.User + "\nNATS_PASSWORD=" + f.Identity.Password + "\n"
			if !strings.HasSuffix(string(f.Data), want) {
				t.Errorf("%s = %q, want it to end %q", f.Name, f.Data, want)
			}
		}
		if want := []string{"admin.env", "agents/a.env"}; !slices.Equal(names, want) {
			t.Errorf("files %q, want %q", names, want)
		}
	})
}
