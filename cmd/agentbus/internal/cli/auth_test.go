package cli

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// checkMode checks that path exists with permission bits mode.
func checkMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != mode {
		t.Errorf("%s has mode %v, want %v", path, got, mode)
	}
}

// TestAuthInitServeNKeys: auth init writes a config the server loads and
// one nkey per identity; serve --auth runs it, logged in as the admin, and
// agents work with --nkey.
func TestAuthInitServeNKeys(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	list := filepath.Join(t.TempDir(), "agents.txt")
	if err := os.WriteFile(list, []byte("# the reviewers\n  reviewer  \n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "auth", "init", "--agents", "lead,w1", "--agents-file", list, "--out", dir)
	files := []string{"auth.conf", "admin.nk", "sys.nk", "agents/lead.nk", "agents/w1.nk", "agents/reviewer.nk"}
	for _, f := range files {
		path := filepath.Join(dir, f)
		checkMode(t, path, 0o600)
		if !strings.Contains(out, "wrote "+path) {
			t.Errorf("summary %q does not name %s", out, path)
		}
	}
	checkMode(t, dir, 0o700)
	checkMode(t, filepath.Join(dir, "agents"), 0o700)
	conf := filepath.Join(dir, "auth.conf")
	admin := filepath.Join(dir, "admin.nk")
	if want := "agentbus serve --auth " + conf + " --nkey " + admin; !strings.Contains(out, want) {
		t.Errorf("summary %q does not show %q", out, want)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server cannot load auth.conf: %v", err)
	}
	if len(opts.Nkeys) != 5 || opts.SystemAccount != "SYS" {
		t.Errorf("auth.conf has %d nkey users, system account %q; want 5, SYS", len(opts.Nkeys), opts.SystemAccount)
	}

	// Existing files are kept unless --force.
	before, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	r := checkFails(t, exitError, "auth", "init", "--agents", "lead", "--out", dir)
	if !strings.Contains(r.stderr, "exists") {
		t.Errorf("stderr %q, want the file that exists", r.stderr)
	}
	if after, _ := os.ReadFile(conf); string(after) != string(before) {
		t.Error("auth.conf changed without --force")
	}

	checkFails(t, exitUsage, "serve", "--listen", "127.0.0.1:0", "--store", t.TempDir(), "--auth", conf)
	s := startServe(t, "", "--auth", conf, "--nkey", admin)
	lead := []string{"--nkey", filepath.Join(dir, "agents", "lead.nk")}
	id := publish(t, s.url, append(lead, "--from", "lead", "--to", "w1", "--type", "T", "--data", "signed")...)
	evs := events(t, mustRun(t, "--server", s.url, "--nkey", filepath.Join(dir, "agents", "w1.nk"),
		"subscribe", "--agent", "w1", "--count", "1", "--json"))
	if len(evs) != 1 || evs[0].msg.ID != id || string(evs[0].msg.Data) != "signed" {
		t.Fatalf("w1 got %+v, want message %s", evs, id)
	}
	// Without credentials nothing gets in.
	checkFails(t, exitError, "--server", s.url, "publish", "--from", "lead", "--to", "w1", "--type", "T")
	// What lead's identity may not do is refused as such, naming what the
	// server refused, rather than ending in "context deadline exceeded".
	for _, cmd := range [][]string{
		{"subscribe", "--agent", "w1", "--count", "1"},
		{"status", id},
		{"status", id, "--agent", "w1"},
		{"trace", id},
		{"dlq", "list"},
		{"provision"},
	} {
		// The refusal may also show as a warning line before the error.
		r := runIn(t, "", append(append([]string{"--server", s.url}, lead...), cmd...)...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		last := lines[len(lines)-1]
		if r.code != exitError || !strings.Contains(last, "permission denied") || !strings.Contains(last, "Permissions Violation for") {
			t.Errorf("%v as lead: exit %d, stderr %q; want exit 1, permission denied naming what was refused", cmd, r.code, r.stderr)
		}
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("serve exited %d after cancel; stderr %q", code, s.stderr.String())
	}

	mustRun(t, "auth", "init", "--agents", "lead", "--out", dir, "--force")
	if after, _ := os.ReadFile(conf); string(after) == string(before) {
		t.Error("auth.conf unchanged with --force")
	}
}

// readEnvFile returns the variables of a .env file auth init wrote.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			vars[k] = v
		}
	}
	return vars
}

// TestAuthInitServePasswords: with --mode passwords every identity is a
// user with a password in a .env file, the admin's as given.
func TestAuthInitServePasswords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The lowest bcrypt cost: the in-process server checks every login's
	// password, and the default cost takes seconds under -race.
	mustRun(t, "auth", "init", "--mode", "passwords", "--agents", "lead,w1", "--out", dir,
		"--admin-password", "change-me-admin", "--no-system-account", "--account", "BUS", "--bcrypt-cost", "4")
	admin := readEnvFile(t, filepath.Join(dir, "admin.env"))
	if admin["NATS_USER"] != "admin" || admin["NATS_PASSWORD"] != "change-me-admin" {
		t.Fatalf("admin.env = %v", admin)
	}
	if _, err := os.Stat(filepath.Join(dir, "sys.env")); !os.IsNotExist(err) {
		t.Errorf("sys.env with --no-system-account: %v", err)
	}
	lead := readEnvFile(t, filepath.Join(dir, "agents", "lead.env"))
	if lead["NATS_USER"] != "lead" || len(lead["NATS_PASSWORD"]) < 32 {
		t.Fatalf("lead.env = %v", lead)
	}

	s := startServe(t, "", "--auth", filepath.Join(dir, "auth.conf"), "--user", "admin", "--password", "change-me-admin")
	publish(t, s.url, "--user", "lead", "--password", lead["NATS_PASSWORD"], "--from", "lead", "--to", "w1", "--type", "T")
	checkFails(t, exitError, "--server", s.url, "--user", "lead", "--password", "wrong", "publish", "--from", "lead", "--to", "w1", "--type", "T")
}

// TestEmptyPathFlags: an empty --store or --auth of serve, or --out of
// auth init, is refused rather than taken for the default store, no
// authentication, or the current directory.
func TestEmptyPathFlags(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // where auth init --out "" would write
	for _, args := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--store", ""},
		{"serve", "--listen", "127.0.0.1:0", "--store", dir, "--auth", ""},
		{"auth", "init", "--agents", "a", "--out", ""},
	} {
		r := checkFails(t, exitUsage, args...)
		if !strings.Contains(r.stderr, ": must not be empty") {
			t.Errorf("agentbus %q: stderr %q, want the empty flag named", args, r.stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed runs wrote %d files", len(entries))
	}
}

func TestAuthInitUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--agents", "lead"},
		{"--out", dir},
		{"--out", dir, "--agents", "*"},
		{"--out", dir, "--agents", "a,a"},
		{"--out", dir, "--agents", "a", "--mode", "jwt"},
		{"--out", dir, "--agents", "a", "--admin-password", "p"},
		{"--out", dir, "--agents", "a", "--account", "SYS"},
		{"--out", dir, "--agents", "admin", "--mode", "passwords"},
		{"--out", dir, "--agents", "a", "--schedulers", "b"},
	} {
		checkFails(t, exitUsage, append([]string{"auth", "init"}, args...)...)
	}
	if r := checkFails(t, exitUsage, "auth", "init", "--out", dir, "--agents-file", filepath.Join(dir, "missing")); !strings.HasPrefix(r.stderr, "agentbus: --agents-file: ") {
		t.Errorf("stderr %q, want --agents-file named", r.stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed runs wrote %d files", len(entries))
	}
}
