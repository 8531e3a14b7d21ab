package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentbus/agentbus/bus/auth"
)

func (a *app) authCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Generate identities and server permissions",
		Long: `Auth generates the identities of a bus and the nats-server authorization
that keeps each agent to its own subjects. See 'agentbus auth init' and
docs/security.md.`,
	}
	cmd.AddCommand(a.authInitCommand())
	return cmd
}

func (a *app) authInitCommand() *cobra.Command {
	var (
		c          auth.Config
		mode       string
		agentsFile string
		out        string
		force      bool
	)
	cmd := &cobra.Command{
		Use:   "init --agents A,B,... --out DIR",
		Short: "Write credentials for a list of agents and the server's authorization for them",
		Long: `Init writes, into --out DIR:

  auth.conf          the accounts of the bus in nats-server syntax: account
                     AGENTBUS (--account) with JetStream, its admin user and one
                     user per agent, each agent allowed only its own subjects,
                     consumers, dead letters, status records and reply inbox;
                     and the system account SYS with a user (not with
                     --no-system-account)
  admin.nk           the admin's credentials: the whole account, for serve,
                     provision, dlq and the operator's status and trace
  sys.nk             the system user's, for server monitoring
  agents/<ID>.nk     one per agent (<ID> token-encoded, docs/subjects.md)

With --mode nkeys (the default) each credential file holds an nkey seed for
--nkey, and auth.conf the public keys. With --mode passwords each is a .env
file with NATS_USER and NATS_PASSWORD, which the CLI reads from the
environment, and auth.conf the passwords' bcrypt hashes. --admin-password and
--sys-password set those two passwords instead of random ones, for samples.
--bcrypt-cost sets the hashes' cost (default 11, as 'nats server passwd'),
which the server pays at every login.

Agents come from --agents (comma-separated) and --agents-file (one a line;
blank lines and lines starting with # are skipped, surrounding white space
trimmed). The subjects are those of --root; with --shards N, those of each of
its N shards (agentbus provision --shards), so that an agent may send to
agents on every shard.

--schedulers lists the agents that may also schedule messages ('publish
--at', --in, --every, --cron). The stream that keeps schedules must allow
rollups, so each of them can also remove every agent's schedules: list only
agents you trust with that (docs/security.md). The admin can always.

Every file is written with mode 0600, the directories with 0700. Init
refuses to overwrite a file unless --force. It prints what it wrote and how
to use it: 'agentbus serve --auth DIR/auth.conf' with the admin's
credentials, or include auth.conf in an existing server's configuration
(docs/security.md).`,
		Example: `  agentbus auth init --agents orchestrator,worker-1,worker-2 --out ./auth
  agentbus serve --auth ./auth/auth.conf --nkey ./auth/admin.nk
  agentbus --nkey ./auth/agents/worker-1.nk subscribe --agent worker-1`,
		Args: cobra.NoArgs,
		RunE: run(func(cmd *cobra.Command) error {
			if err := checkNotEmpty(cmd, "out"); err != nil {
				return err // the current directory, which --force would overwrite
			}
			fromFile, err := readAgentsFile(agentsFile)
			if err != nil {
				return err
			}
			c.Agents = append(c.Agents, fromFile...)
			c.Root, c.Mode, c.Shards = a.root, auth.Mode(mode), a.shards
			setup, err := auth.Generate(c)
			if errors.Is(err, auth.ErrInvalidConfig) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			files := setup.Files()
			if err := writeFiles(out, files, force); err != nil {
				return err
			}
			a.printAuthSummary(out, setup, files)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringSliceVar(&c.Agents, "agents", nil, "agent IDs, comma-separated")
	f.StringVar(&agentsFile, "agents-file", "", "file of agent IDs, one a line")
	f.StringSliceVar(&c.Schedulers, "schedulers", nil, "agents, among the others, that may schedule messages, comma-separated")
	f.StringVar(&out, "out", "", "directory to write into; created if missing")
	f.StringVar(&mode, "mode", string(auth.ModeNKeys), "nkeys or passwords")
	f.StringVar(&c.Account, "account", auth.DefaultAccount, "account of the bus's streams and users")
	f.BoolVar(&c.NoSystemAccount, "no-system-account", false, "leave out the system account, for a cluster that has its own")
	f.StringVar(&c.AdminPassword, "admin-password", "", "the admin's password with --mode passwords, instead of a random one")
	f.StringVar(&c.SystemPassword, "sys-password", "", "the system user's password with --mode passwords, instead of a random one")
	f.IntVar(&c.BcryptCost, "bcrypt-cost", 0, "bcrypt cost of the password hashes with --mode passwords, 4 to 31 (default 11)")
	f.BoolVar(&force, "force", false, "overwrite existing files")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// readAgentsFile reads agent IDs, one a line, skipping blank lines and
// comments; "" reads none. A file that cannot be opened is a usage error.
func readAgentsFile(name string) ([]string, error) {
	if name == "" {
		return nil, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, usageError{fmt.Errorf("--agents-file: %w", err)}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--agents-file: %w", err)
	}
	return out, nil
}

// writeFiles writes files into dir with mode 0600, creating directories
// with mode 0700. Unless force it checks first that none of them exists,
// and writes nothing if one does.
func writeFiles(dir string, files []auth.File, force bool) error {
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(dir, filepath.FromSlash(f.Name))
		if force {
			continue
		}
		if _, err := os.Lstat(paths[i]); err == nil {
			return fmt.Errorf("%s exists; --force overwrites it", paths[i])
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	for i, f := range files {
		if err := os.MkdirAll(filepath.Dir(paths[i]), 0o700); err != nil {
			return err
		}
		flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		if !force {
			flags |= os.O_EXCL
		}
		w, err := os.OpenFile(paths[i], flags, 0o600)
		if err != nil {
			return err
		}
		_, err = w.Write(f.Data)
		if err == nil {
			err = w.Chmod(0o600) // an overwritten file keeps its mode otherwise
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", paths[i], err)
		}
	}
	return nil
}

// printAuthSummary says what auth init wrote and how to use it.
func (a *app) printAuthSummary(dir string, setup *auth.Setup, files []auth.File) {
	c := setup.Config
	w := a.stdout
	var agent, admin string // an agent's and the admin's credential files
	for _, f := range files {
		path := filepath.Join(dir, filepath.FromSlash(f.Name))
		switch {
		case f.Identity == nil:
			sys := "no system account"
			if !c.NoSystemAccount {
				sys = "system account " + auth.SystemAccount
			}
			fmt.Fprintf(w, "wrote %s: account %s with the admin and %d agents, %s (root %s, mode %s)\n",
				path, c.Account, len(c.Agents), sys, c.Root, c.Mode)
			continue
		case f.Identity.Role == auth.RoleAdmin:
			admin = path
		case f.Identity.Role == auth.RoleAgent && agent == "":
			agent = path
		}
		fmt.Fprintf(w, "wrote %s: %s\n", path, f.Identity)
	}
	conf := shellQuote(filepath.Join(dir, auth.ConfigFileName))
	first := shellQuote(c.Agents[0])
	fmt.Fprintln(w, "\nRun a server with it, logged in as the admin:")
	if c.Mode == auth.ModeNKeys {
		fmt.Fprintf(w, "  agentbus serve --auth %s --nkey %s\n", conf, shellQuote(admin))
		fmt.Fprintln(w, "Connect as an agent:")
		fmt.Fprintf(w, "  agentbus --nkey %s subscribe --agent %s\n", shellQuote(agent), first)
	} else {
		fmt.Fprintf(w, "  (set -a; . %s; agentbus serve --auth %s)\n", shellQuote(admin), conf)
		fmt.Fprintln(w, "Connect as an agent:")
		fmt.Fprintf(w, "  (set -a; . %s; agentbus subscribe --agent %s)\n", shellQuote(agent), first)
	}
	fmt.Fprintf(w, "Or include %s in an existing server's configuration (docs/security.md).\n", conf)
	fmt.Fprintln(w, "Keep the credential files secret; auth.conf holds public keys or password hashes only.")
}

// shellSafe is what shellQuote leaves as it is.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./%+=:,-]+$`)

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
