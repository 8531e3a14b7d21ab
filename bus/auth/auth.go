package auth

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/agentbus/agentbus/subjects"
)

// ErrInvalidConfig is wrapped by the errors of Generate for a Config it
// cannot generate from, and for an invalid agent ID together with
// subjects.ErrInvalidAgentID.
var ErrInvalidConfig = errors.New("auth: invalid config")

// Mode says how identities prove who they are.
type Mode string

// The modes.
const (
	// ModeNKeys gives every identity an nkey: the config holds its public
	// key and the identity keeps the seed (nats --nkey, nats.Nkey). The
	// server never sees a secret.
	ModeNKeys Mode = "nkeys"
	// ModePasswords gives every identity a user name and a random password:
	// the config holds the password's bcrypt hash (nats --user --password,
	// nats.UserInfo).
	ModePasswords Mode = "passwords"
)

// Defaults and fixed names.
const (
	// DefaultAccount is the account of the bus when Config.Account is empty.
	DefaultAccount = "AGENTBUS"
	// SystemAccount is the system account Setup.ServerConfig declares.
	SystemAccount = "SYS"
	// AdminUser and SystemUser are the user names of the admin and the
	// system account's user in ModePasswords. An agent's user name is its
	// token (subjects.EncodeToken).
	AdminUser  = "admin"
	SystemUser = "sys"
)

// DefaultBcryptCost is the cost of password hashes unless
// Config.BcryptCost says otherwise, as `nats server passwd` uses.
const DefaultBcryptCost = 11

// bcryptCost is the cost Generate hashes with when Config.BcryptCost is
// zero; this package's tests make it cheap.
var bcryptCost = DefaultBcryptCost

// passwordBytes is the entropy of a generated password.
const passwordBytes = 24

// accountName is what an account name may be: one config word.
var accountName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Config says which identities to generate.
type Config struct {
	// Root is the subject root of the bus; empty means subjects.DefaultRoot.
	Root string
	// Shards is the number of shards of an installation split over several
	// roots (bus.Shards); zero means 1, the root alone. Each agent may then
	// do on every shard what it may on one: it sends to agents of any
	// shard and reads the records of what it sent them there.
	Shards int
	// Agents are the agent IDs to generate identities for, at least one.
	Agents []string
	// Schedulers are the agents among Agents that may schedule messages
	// (bus.Bus.Schedule): subjects.Scheme.SchedulePermissions. A stream
	// that keeps schedules allows rollups, so each of them can also remove
	// every agent's schedules (docs/security.md): list only agents you
	// trust with that. The admin may always schedule.
	Schedulers []string
	// Mode is ModeNKeys or ModePasswords; empty means ModeNKeys.
	Mode Mode
	// Account is the account that holds the bus's streams and users; empty
	// means DefaultAccount. It must not be SystemAccount.
	Account string
	// NoSystemAccount leaves out the system account and its user, for a
	// cluster that has its own (see docs/security.md).
	NoSystemAccount bool
	// AdminPassword and SystemPassword, in ModePasswords, replace the
	// random passwords of the admin and the system user, for a sample
	// config with documented passwords. Empty means random.
	AdminPassword, SystemPassword string
	// BcryptCost, in ModePasswords, is the bcrypt cost of the password
	// hashes, bcrypt.MinCost (4) to bcrypt.MaxCost (31); zero means
	// DefaultBcryptCost. The server pays it on every login: a cost of 11
	// takes tens of milliseconds, each step up doubles it.
	BcryptCost int
}

// Role is what an identity is for.
type Role string

// The roles.
const (
	RoleAdmin  Role = "admin"
	RoleSystem Role = "system"
	RoleAgent  Role = "agent"
)

// Identity is one generated user and its secret.
type Identity struct {
	// Role is what the identity is for; Agent is the agent ID of a
	// RoleAgent identity.
	Role  Role
	Agent string
	// Account is the account the user belongs to.
	Account string
	// User and Password are the user name and the clear-text password in
	// ModePasswords; the config holds only the password's bcrypt hash.
	User, Password string
	// PublicKey and Seed are the user nkey in ModeNKeys: the public key
	// ("U...") goes into the config, the seed ("SU...") is the secret.
	PublicKey string
	Seed      []byte
	// Permissions are the identity's permissions in the config; with empty
	// lists it has no permissions block and may use its whole account.
	Permissions subjects.Permissions

	passwordHash string
}

// Setup is a generated set of identities.
type Setup struct {
	// Config is the configuration it was generated from, with defaults
	// filled in.
	Config Config
	// Identities are the admin, the system user (unless
	// Config.NoSystemAccount) and the agents in Config.Agents order.
	Identities []Identity
}

// Generate creates the identities c asks for, with fresh keys or passwords.
func Generate(c Config) (*Setup, error) {
	c, err := c.resolve()
	if err != nil {
		return nil, err
	}
	schemes := make([]subjects.Scheme, c.Shards)
	for k := range schemes {
		root, _ := subjects.ShardRoot(c.Root, k, c.Shards) // checked by resolve
		schemes[k], _ = subjects.New(root)
	}
	s := &Setup{Config: c}
	all := subjects.Permissions{Publish: []string{">"}, Subscribe: []string{">"}}
	admin, err := c.identity(RoleAdmin, "", c.Account, AdminUser, c.AdminPassword, all)
	if err != nil {
		return nil, err
	}
	s.Identities = append(s.Identities, admin)
	if !c.NoSystemAccount {
		sys, err := c.identity(RoleSystem, "", SystemAccount, SystemUser, c.SystemPassword, subjects.Permissions{})
		if err != nil {
			return nil, err
		}
		s.Identities = append(s.Identities, sys)
	}
	for _, agent := range c.Agents {
		var perms subjects.Permissions
		for _, scheme := range schemes {
			p, err := scheme.AgentPermissions(agent)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
			}
			perms.Publish = append(perms.Publish, p.Publish...)
			perms.Subscribe = appendNew(perms.Subscribe, p.Subscribe...)
			perms.Responses = p.Responses
			if slices.Contains(c.Schedulers, agent) {
				sched, err := scheme.SchedulePermissions(agent)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
				}
				perms.Publish = append(perms.Publish, sched...)
			}
		}
		id, err := c.identity(RoleAgent, agent, c.Account, subjects.EncodeToken(agent), "", perms)
		if err != nil {
			return nil, err
		}
		s.Identities = append(s.Identities, id)
	}
	return s, nil
}

// appendNew appends to list each of subjects it does not hold yet: the
// subjects every shard's permissions share, such as the reply inbox, once.
func appendNew(list []string, subjects ...string) []string {
	for _, s := range subjects {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

// resolve checks c and fills in its defaults.
func (c Config) resolve() (Config, error) {
	scheme, err := subjects.New(c.Root)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.Root = scheme.Root()
	if c.Shards == 0 {
		c.Shards = 1
	}
	for k := range max(c.Shards, 1) { // every shard's root is valid, and so is the count
		if _, err := subjects.ShardRoot(c.Root, k, c.Shards); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	c.Agents = append([]string(nil), c.Agents...)
	c.Schedulers = append([]string(nil), c.Schedulers...)
	if c.Mode == "" {
		c.Mode = ModeNKeys
	}
	if c.Account == "" {
		c.Account = DefaultAccount
	}
	switch {
	case c.Mode != ModeNKeys && c.Mode != ModePasswords:
		return c, fmt.Errorf("%w: mode %q is neither %q nor %q", ErrInvalidConfig, c.Mode, ModeNKeys, ModePasswords)
	case !accountName.MatchString(c.Account):
		return c, fmt.Errorf("%w: account name %q is not [A-Za-z0-9_-]+", ErrInvalidConfig, c.Account)
	case c.Account == SystemAccount:
		return c, fmt.Errorf("%w: account %q is the system account's name", ErrInvalidConfig, c.Account)
	case len(c.Agents) == 0:
		return c, fmt.Errorf("%w: no agents", ErrInvalidConfig)
	case c.Mode != ModePasswords && (c.AdminPassword != "" || c.SystemPassword != ""):
		return c, fmt.Errorf("%w: admin and system passwords need mode %q", ErrInvalidConfig, ModePasswords)
	case c.NoSystemAccount && c.SystemPassword != "":
		return c, fmt.Errorf("%w: a system password without the system account", ErrInvalidConfig)
	case c.Mode != ModePasswords && c.BcryptCost != 0:
		return c, fmt.Errorf("%w: a bcrypt cost needs mode %q", ErrInvalidConfig, ModePasswords)
	case c.BcryptCost != 0 && (c.BcryptCost < bcrypt.MinCost || c.BcryptCost > bcrypt.MaxCost):
		return c, fmt.Errorf("%w: bcrypt cost %d is outside %d..%d", ErrInvalidConfig, c.BcryptCost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	if c.Mode == ModePasswords && c.BcryptCost == 0 {
		c.BcryptCost = bcryptCost
	}
	seen := make(map[string]bool, len(c.Agents))
	for _, a := range c.Agents {
		if err := subjects.ValidateIdentity(a); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if seen[a] {
			return c, fmt.Errorf("%w: agent %q is listed twice", ErrInvalidConfig, a)
		}
		seen[a] = true
		if tok := subjects.EncodeToken(a); c.Mode == ModePasswords && (tok == AdminUser || tok == SystemUser) {
			return c, fmt.Errorf("%w: agent %q would have the user name of the %s user", ErrInvalidConfig, a, tok)
		}
	}
	for _, a := range c.Schedulers {
		if !seen[a] {
			return c, fmt.Errorf("%w: scheduler %q is not one of the agents", ErrInvalidConfig, a)
		}
	}
	return c, nil
}

// identity creates the credentials of one identity: an nkey, or the given
// password (random if empty) and its hash.
func (c Config) identity(role Role, agent, account, user, password string, perms subjects.Permissions) (Identity, error) {
	id := Identity{Role: role, Agent: agent, Account: account, Permissions: perms}
	if c.Mode == ModeNKeys {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return Identity{}, fmt.Errorf("create nkey: %w", err)
		}
		if id.PublicKey, err = kp.PublicKey(); err != nil {
			return Identity{}, fmt.Errorf("create nkey: %w", err)
		}
		if id.Seed, err = kp.Seed(); err != nil {
			return Identity{}, fmt.Errorf("create nkey: %w", err)
		}
		return id, nil
	}
	if password == "" {
		b := make([]byte, passwordBytes)
		_, _ = rand.Read(b) // crypto/rand.Read never returns an error.
		password = base64.RawURLEncoding.EncodeToString(b)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), c.BcryptCost)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: password of %s: %w", ErrInvalidConfig, user, err)
	}
	id.User, id.Password, id.passwordHash = user, password, string(hash)
	return id, nil
}

// Admin returns the admin identity.
func (s *Setup) Admin() Identity { return s.Identities[0] }

// Agent returns the identity of agent, and whether there is one.
func (s *Setup) Agent(agent string) (Identity, bool) {
	for _, id := range s.Identities {
		if id.Role == RoleAgent && id.Agent == agent {
			return id, true
		}
	}
	return Identity{}, false
}

// Option returns the nats.Connect option that logs in as id: nats.Nkey
// signing with the seed, or nats.UserInfo with the user and password.
func (id Identity) Option() nats.Option {
	if id.Seed == nil {
		return nats.UserInfo(id.User, id.Password)
	}
	seed := id.Seed
	return nats.Nkey(id.PublicKey, func(nonce []byte) ([]byte, error) {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	})
}

// String names the identity: "admin", "system user" or `agent "<ID>"`.
func (id Identity) String() string {
	switch id.Role {
	case RoleAgent:
		return fmt.Sprintf("agent %q", id.Agent)
	case RoleSystem:
		return "system user"
	}
	return string(id.Role)
}

// ConfigFileName is the name of the server config among Setup.Files.
const ConfigFileName = "auth.conf"

// File is one file of a Setup, to be written into an output directory.
type File struct {
	// Name is the file's path relative to the directory, with '/' as the
	// separator.
	Name string
	// Data is its content.
	Data []byte
	// Identity is the identity whose secret it holds, or nil for the
	// server config.
	Identity *Identity
}

// Files returns the server config, ConfigFileName, then one credential
// file per identity: in ModeNKeys "<name>.nk" with the nkey seed, for
// --nkey (nats.NkeyOptionFromSeed); in ModePasswords "<name>.env" with
// NATS_USER and NATS_PASSWORD, the environment variables the agentbus and
// nats CLIs read. <name> is "admin", "sys" or "agents/<agent token>". The
// credential files are secrets.
func (s *Setup) Files() []File {
	out := []File{{Name: ConfigFileName, Data: s.ServerConfig()}}
	for i := range s.Identities {
		id := &s.Identities[i]
		name := AdminUser
		switch id.Role {
		case RoleAgent:
			name = "agents/" + subjects.EncodeToken(id.Agent)
		case RoleSystem:
			name = SystemUser
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# agentbus %s, account %s, root %s. Keep this file secret.\n", id, id.Account, s.Config.Root)
		if id.Seed != nil {
			name += ".nk"
			fmt.Fprintf(&b, "# Public key %s. Connect with --nkey and this file.\n%s\n", id.PublicKey, id.Seed)
		} else {
			name += ".env"
			b.WriteString("# Load it into the environment the CLI reads: set -a; . <this file>; set +a\n")
			fmt.Fprintf(&b, "NATS_USER=%s\nNATS_PASSWORD=%s\n", id.User, id.Password)
		}
		out = append(out, File{Name: name, Data: []byte(b.String()), Identity: id})
	}
	return out
}
