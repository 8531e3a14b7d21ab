package deploy_test

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"
	"gopkg.in/yaml.v3"

	"github.com/agentbus/agentbus/subjects"
)

// The admin user of nats/auth.conf and its documented sample password.
const (
	adminUser     = "admin"
	adminPassword = "change-me-admin"
)

// nodes are the server names of the cluster, in node-N.conf order.
var nodes = []string{"nats-1", "nats-2", "nats-3"}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeBuilt()
		os.Exit(code)
	}))
}

// nodeOptions parses nats/node-<i+1>.conf with the server's own parser.
func nodeOptions(t *testing.T, i int) *server.Options {
	t.Helper()
	file := filepath.Join("nats", fmt.Sprintf("node-%d.conf", i+1))
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server cannot load %s: %v", file, err)
	}
	return opts
}

// TestNATSNodeConfigs: the three node files, read by nats-server, form one
// JetStream cluster: unique names, the same cluster name, routes to the
// two other nodes, a store and limits, the shared settings and accounts.
func TestNATSNodeConfigs(t *testing.T) {
	first := nodeOptions(t, 0)
	for i, name := range nodes {
		t.Run(name, func(t *testing.T) {
			o := nodeOptions(t, i)
			if o.ServerName != name {
				t.Errorf("server_name = %q, want %q", o.ServerName, name)
			}
			if want := "node:" + name; !slices.Equal([]string(o.Tags), []string{want}) {
				t.Errorf("server_tags = %v, want [%s]", o.Tags, want)
			}
			if o.Port != 4222 || o.HTTPPort != 8222 || o.Cluster.Port != 6222 {
				t.Errorf("ports: client %d, http %d, cluster %d; want 4222, 8222, 6222", o.Port, o.HTTPPort, o.Cluster.Port)
			}
			if o.Cluster.Name != "agentbus" {
				t.Errorf("cluster name = %q, want agentbus", o.Cluster.Name)
			}
			var routes []string
			for _, r := range o.Routes {
				routes = append(routes, r.Host)
			}
			var want []string
			for _, other := range nodes {
				if other != name {
					want = append(want, fmt.Sprintf("%s:%d", other, o.Cluster.Port))
				}
			}
			if !slices.Equal(routes, want) {
				t.Errorf("routes = %v, want the other two nodes %v", routes, want)
			}
			if !o.JetStream || o.StoreDir != "/data/jetstream" {
				t.Errorf("jetstream %v, store_dir %q; want enabled, /data/jetstream", o.JetStream, o.StoreDir)
			}
			if o.JetStreamMaxMemory <= 0 || o.JetStreamMaxStore < 1<<30 {
				t.Errorf("max_memory_store %d, max_file_store %d; want set, the file store at least 1 GiB", o.JetStreamMaxMemory, o.JetStreamMaxStore)
			}
			if o.MaxPayload != 1<<20 {
				t.Errorf("max_payload = %d, want 1 MiB", o.MaxPayload)
			}
			if o.WriteDeadline != 10*time.Second || o.LameDuckDuration < 30*time.Second {
				t.Errorf("write_deadline %v, lame_duck_duration %v; want 10s and at least 30s (the server's minimum)", o.WriteDeadline, o.LameDuckDuration)
			}
			// common.conf and auth.conf are shared: the same settings on every node.
			if o.MaxPayload != first.MaxPayload || o.MaxPending != first.MaxPending ||
				o.PingInterval != first.PingInterval || o.MaxPingsOut != first.MaxPingsOut ||
				o.JetStreamMaxStore != first.JetStreamMaxStore || o.JetStreamMaxMemory != first.JetStreamMaxMemory {
				t.Errorf("limits differ from node-1.conf")
			}
			checkAccounts(t, o)
		})
	}
}

// checkAccounts checks the accounts and users auth.conf gives a server.
func checkAccounts(t *testing.T, o *server.Options) {
	t.Helper()
	var accounts []string
	for _, a := range o.Accounts {
		accounts = append(accounts, a.Name)
	}
	if !slices.Contains(accounts, "AGENTBUS") || !slices.Contains(accounts, "SYS") {
		t.Errorf("accounts = %v, want AGENTBUS and SYS", accounts)
	}
	if o.SystemAccount != "SYS" {
		t.Errorf("system_account = %q, want SYS", o.SystemAccount)
	}
	users := map[string]string{}
	for _, u := range o.Users {
		if !strings.HasPrefix(u.Password, "$2a$") {
			t.Errorf("user %s: password is not a bcrypt hash", u.Username)
		}
		if u.Account != nil {
			users[u.Username] = u.Account.Name
		}
	}
	if users[adminUser] != "AGENTBUS" || users["sys"] != "SYS" {
		t.Errorf("users and their accounts = %v, want admin in AGENTBUS and sys in SYS", users)
	}
}

// sampleAgents are the agents nats/auth.conf was generated for.
var sampleAgents = []string{"orchestrator", "worker-1", "worker-2", "reviewer"}

// TestAuthFragment: auth.conf stands alone (it is included by the node files
// and by the Helm chart's config), enables JetStream for the AGENTBUS account,
// documents the sample passwords it holds and how it was generated, and is
// still what `agentbus auth init` writes: its admin and sys passwords are the
// documented ones, and every sample agent has exactly the permissions the
// subject scheme gives it today.
func TestAuthFragment(t *testing.T) {
	file := filepath.Join("nats", "auth.conf")
	m, err := conf.ParseFile(file)
	if err != nil {
		t.Fatal(err)
	}
	accounts, _ := m["accounts"].(map[string]any)
	agentbus, _ := accounts["AGENTBUS"].(map[string]any)
	if js := agentbus["jetstream"]; js != "enabled" {
		t.Errorf("accounts.AGENTBUS.jetstream = %v, want enabled", js)
	}
	text := readFile(t, file)
	for _, want := range []string{"agentbus auth init --mode passwords", strings.Join(sampleAgents, ","), adminPassword, "change-me-sys"} {
		if !strings.Contains(text, want) {
			t.Errorf("auth.conf does not mention %q", want)
		}
	}

	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	for user, password := range map[string]string{adminUser: adminPassword, "sys": "change-me-sys"} {
		if u := users[user]; u == nil || bcrypt.CompareHashAndPassword([]byte(u.Password), []byte(password)) != nil {
			t.Errorf("user %s does not have the sample password %s", user, password)
		}
	}
	for _, agent := range sampleAgents {
		want, err := subjects.Default().AgentPermissions(agent)
		if err != nil {
			t.Fatal(err)
		}
		u := users[agent]
		if u == nil || u.Account == nil || u.Account.Name != "AGENTBUS" || u.Permissions == nil ||
			!slices.Equal(u.Permissions.Publish.Allow, want.Publish) || !slices.Equal(u.Permissions.Subscribe.Allow, want.Subscribe) ||
			(u.Permissions.Response != nil) != want.Responses {
			t.Errorf("agent %s: user %+v, want the permissions of subjects.AgentPermissions; regenerate auth.conf", agent, u)
		}
	}
	if len(users) != len(sampleAgents)+2 {
		t.Errorf("%d users, want admin, sys and the %d sample agents", len(users), len(sampleAgents))
	}
}

func readFile(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// decodeYAML decodes every YAML document of file into a new T. strict
// refuses unknown fields, so that a misspelt key fails the test.
func decodeYAML[T any](t *testing.T, file string, strict bool) []T {
	t.Helper()
	d := yaml.NewDecoder(strings.NewReader(readFile(t, file)))
	d.KnownFields(strict)
	var docs []T
	for {
		var v T
		err := d.Decode(&v)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		docs = append(docs, v)
	}
}

type composeFile struct {
	Name     string                    `yaml:"name"`
	XNats    any                       `yaml:"x-nats"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Hostname    string            `yaml:"hostname"`
	Restart     string            `yaml:"restart"`
	StopSignal  string            `yaml:"stop_signal"`
	StopGrace   string            `yaml:"stop_grace_period"`
	Command     []string          `yaml:"command"`
	WorkingDir  string            `yaml:"working_dir"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Environment map[string]string `yaml:"environment"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

// TestCompose: compose.yaml runs three nats servers from nats/node-N.conf,
// with host names that match the routes, a health check on the monitoring
// port, and a provision service that waits for all three and provisions with
// three replicas as the admin user.
func TestCompose(t *testing.T) {
	docs := decodeYAML[composeFile](t, "compose.yaml", true)
	if len(docs) != 1 {
		t.Fatalf("compose.yaml holds %d documents, want 1", len(docs))
	}
	c := docs[0]
	var natsServices []string
	for name, s := range c.Services {
		if strings.HasPrefix(s.Image, "nats:") {
			natsServices = append(natsServices, name)
		}
	}
	slices.Sort(natsServices)
	if !slices.Equal(natsServices, nodes) {
		t.Fatalf("nats services = %v, want %v", natsServices, nodes)
	}
	var servers []string
	for i, name := range nodes {
		s := c.Services[name]
		o := nodeOptions(t, i)
		if !strings.HasPrefix(s.Image, "nats:2.15") {
			t.Errorf("%s: image %q, want nats:2.15", name, s.Image)
		}
		if s.Hostname != o.ServerName {
			t.Errorf("%s: hostname %q, want the server_name %q that the other nodes' routes name", name, s.Hostname, o.ServerName)
		}
		config := fmt.Sprintf("/etc/nats/node-%d.conf", i+1)
		if !slices.Equal(s.Command, []string{"nats-server", "--config", config}) {
			t.Errorf("%s: command %q, want nats-server --config %s", name, s.Command, config)
		}
		checkMount(t, name, s.Volumes, "/etc/nats", filepath.Base(config))
		if s.Healthcheck == nil || !slices.Contains(s.Healthcheck.Test, fmt.Sprintf("http://127.0.0.1:%d/healthz?js-meta-only=true", o.HTTPPort)) {
			t.Errorf("%s: health check %+v, want /healthz?js-meta-only=true on the monitoring port %d", name, s.Healthcheck, o.HTTPPort)
		}
		if s.StopSignal != "SIGUSR2" {
			t.Errorf("%s: stop_signal %q, want SIGUSR2 (lame duck mode)", name, s.StopSignal)
		}
		if grace, err := time.ParseDuration(s.StopGrace); err != nil || grace < o.LameDuckGracePeriod+o.LameDuckDuration {
			t.Errorf("%s: stop_grace_period %q, want at least the lame duck grace period and duration, %v", name, s.StopGrace, o.LameDuckGracePeriod+o.LameDuckDuration)
		}
		servers = append(servers, fmt.Sprintf("nats://%s:%d", name, o.Port))
	}

	p, ok := c.Services["provision"]
	if !ok {
		t.Fatal("no provision service")
	}
	args := strings.Join(p.Command, " ")
	for _, want := range []string{" ./cmd/agentbus ", " provision", " --replicas 3", " --server " + strings.Join(servers, ",")} {
		if !strings.Contains(args, want) {
			t.Errorf("provision command %q does not contain %q", args, want)
		}
	}
	checkMount(t, "provision", p.Volumes, p.WorkingDir, "cmd/agentbus")
	for _, name := range nodes {
		if got := p.DependsOn[name].Condition; got != "service_healthy" {
			t.Errorf("provision depends on %s with condition %q, want service_healthy", name, got)
		}
	}
	if p.Environment["NATS_USER"] != adminUser || p.Environment["NATS_PASSWORD"] != adminPassword {
		t.Errorf("provision environment %v, want the admin user of auth.conf", p.Environment)
	}
	// The dead-letter watcher runs as long as the cluster, once provisioned
	// (before 2026-11-28 none did: a message a crashed subscriber never
	// settled read delivered for good).
	w, ok := c.Services["dlq-watch"]
	if !ok {
		t.Fatal("no dlq-watch service")
	}
	if args := strings.Join(w.Command, " "); !strings.Contains(args, " --server "+strings.Join(servers, ",")) || !strings.HasSuffix(args, " dlq watch") {
		t.Errorf("dlq-watch command %q, want agentbus --server %s dlq watch", args, strings.Join(servers, ","))
	}
	if w.DependsOn["provision"].Condition != "service_completed_successfully" || w.Restart != "unless-stopped" {
		t.Errorf("dlq-watch depends on %+v, restart %q; want provision completed, unless-stopped", w.DependsOn, w.Restart)
	}
	if w.Environment["NATS_USER"] != adminUser || w.Environment["NATS_PASSWORD"] != adminPassword {
		t.Errorf("dlq-watch environment %v, want the admin user of auth.conf", w.Environment)
	}
	// The sample admin password is public: the ports are this host's alone.
	for _, name := range nodes {
		for _, port := range c.Services[name].Ports {
			if !strings.HasPrefix(port, "127.0.0.1:") {
				t.Errorf("%s publishes port %q on every interface, want 127.0.0.1", name, port)
			}
		}
	}
}

// checkMount checks that volumes mount a directory of this checkout at
// target, and that it holds file.
func checkMount(t *testing.T, service string, volumes []string, target, file string) {
	t.Helper()
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || parts[1] != target {
			continue
		}
		if _, err := os.Stat(filepath.Join(filepath.FromSlash(parts[0]), filepath.FromSlash(file))); err != nil {
			t.Errorf("%s: volume %q does not hold %s: %v", service, v, file, err)
		}
		return
	}
	t.Errorf("%s: no volume mounted at %s in %q", service, target, volumes)
}

// get walks a decoded YAML document along keys; list elements are named
// by their index.
func get(t *testing.T, v any, keys ...any) any {
	t.Helper()
	for i, k := range keys {
		switch c := v.(type) {
		case map[string]any:
			v = c[k.(string)]
		case []any:
			n := k.(int)
			if n >= len(c) {
				t.Fatalf("%v: only %d elements", keys[:i+1], len(c))
			}
			v = c[n]
		default:
			t.Fatalf("%v: not found", keys[:i+1])
		}
	}
	return v
}

// The chart mounts its generated nats.conf in this directory.
const chartConfigDir = "/etc/nats-config"

// TestHelmValues: values.yaml follows the chart's values layout: a
// three-replica cluster with JetStream on a volume per server, the limits
// of common.conf and the accounts of auth.conf, mounted from a Secret. The
// merged part is rendered as the chart renders it and loaded by nats-server.
func TestHelmValues(t *testing.T) {
	docs := decodeYAML[map[string]any](t, filepath.Join("kubernetes", "values.yaml"), true)
	if len(docs) != 1 {
		t.Fatalf("values.yaml holds %d documents, want 1", len(docs))
	}
	v := docs[0]
	for _, c := range []struct {
		keys []any
		want any
	}{
		{[]any{"config", "cluster", "enabled"}, true},
		{[]any{"config", "cluster", "replicas"}, 3},
		{[]any{"config", "jetstream", "enabled"}, true},
		{[]any{"config", "jetstream", "fileStore", "enabled"}, true},
		{[]any{"config", "jetstream", "fileStore", "pvc", "enabled"}, true},
		{[]any{"config", "jetstream", "fileStore", "pvc", "size"}, "20Gi"},
		{[]any{"container", "patch", 0, "op"}, "add"},
		{[]any{"container", "patch", 0, "path"}, "/volumeMounts/-"},
		{[]any{"podTemplate", "patch", 0, "op"}, "add"},
		{[]any{"podTemplate", "patch", 0, "path"}, "/spec/volumes/-"},
	} {
		if got := get(t, v, c.keys...); got != c.want {
			t.Errorf("%v = %v, want %v", c.keys, got, c.want)
		}
	}

	// The Secret's volume is mounted where the include points.
	mount := get(t, v, "container", "patch", 0, "value").(map[string]any)
	volume := get(t, v, "podTemplate", "patch", 0, "value").(map[string]any)
	if mount["name"] != volume["name"] {
		t.Errorf("the volume mount names %v, the volume is %v", mount["name"], volume["name"])
	}
	secret, _ := get(t, v, "podTemplate", "patch", 0, "value", "secret", "secretName").(string)
	merge := get(t, v, "config", "merge").(map[string]any)
	include, _ := merge["$include"].(string)
	authPath := path.Join(chartConfigDir, include)
	if want := path.Join(mount["mountPath"].(string), "auth.conf"); authPath != want {
		t.Fatalf("config.merge.$include %q names %s, want the mounted Secret's %s", include, authPath, want)
	}
	readme := readFile(t, filepath.Join("kubernetes", "README.md"))
	if want := "kubectl create secret generic " + secret + " --from-file=auth.conf="; !strings.Contains(readme, want) {
		t.Errorf("kubernetes/README.md does not create the Secret with %q", want)
	}

	// Render config.merge the way the chart does (strings in "<< >>" raw,
	// $include as an include directive) beside a copy of auth.conf at the
	// mount path, and load it.
	root := t.TempDir()
	var rendered strings.Builder
	for _, k := range slices.Sorted(maps.Keys(merge)) {
		switch val := merge[k].(type) {
		case string:
			if raw, ok := strings.CutPrefix(val, "<< "); ok {
				fmt.Fprintf(&rendered, "%s: %s\n", k, strings.TrimSuffix(raw, " >>"))
			} else if k == "$include" {
				fmt.Fprintf(&rendered, "include %s;\n", val)
			} else {
				fmt.Fprintf(&rendered, "%s: %q\n", k, val)
			}
		default:
			fmt.Fprintf(&rendered, "%s: %v\n", k, val)
		}
	}
	writeFile(t, filepath.Join(root, filepath.FromSlash(chartConfigDir), "nats.conf"), rendered.String())
	writeFile(t, filepath.Join(root, filepath.FromSlash(authPath)), readFile(t, filepath.Join("nats", "auth.conf")))
	o, err := server.ProcessConfigFile(filepath.Join(root, filepath.FromSlash(chartConfigDir), "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server cannot load the merged config:\n%s\n%v", rendered.String(), err)
	}
	checkAccounts(t, o)
	node := nodeOptions(t, 0)
	if o.MaxPayload != node.MaxPayload || o.MaxPending != node.MaxPending || o.WriteDeadline != node.WriteDeadline ||
		o.PingInterval != node.PingInterval || o.MaxPingsOut != node.MaxPingsOut {
		t.Errorf("the merged limits differ from common.conf's:\n%s", rendered.String())
	}
}

func writeFile(t testing.TB, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		Template struct {
			Spec struct {
				RestartPolicy string `yaml:"restartPolicy"`
				Containers    []struct {
					Image   string   `yaml:"image"`
					Command []string `yaml:"command"`
					Args    []string `yaml:"args"`
					Env     []struct {
						Name      string `yaml:"name"`
						Value     string `yaml:"value"`
						ValueFrom struct {
							SecretKeyRef struct {
								Name string `yaml:"name"`
								Key  string `yaml:"key"`
							} `yaml:"secretKeyRef"`
						} `yaml:"valueFrom"`
					} `yaml:"env"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestProvisionJob: provision-job.yaml is one Job that runs
// `agentbus provision --replicas 3` against the chart's Service with the
// admin credentials from a Secret.
func TestProvisionJob(t *testing.T) {
	// Not strict: a Job has many fields this test does not look at.
	jobs := decodeYAML[k8sObject](t, filepath.Join("kubernetes", "provision-job.yaml"), false)
	if len(jobs) != 1 || jobs[0].APIVersion != "batch/v1" || jobs[0].Kind != "Job" {
		t.Fatalf("provision-job.yaml holds %+v, want one batch/v1 Job", jobs)
	}
	pod := jobs[0].Spec.Template.Spec
	if pod.RestartPolicy != "Never" && pod.RestartPolicy != "OnFailure" {
		t.Errorf("restartPolicy %q, a Job needs Never or OnFailure", pod.RestartPolicy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	cmd := strings.Join(append(slices.Clone(ctr.Command), ctr.Args...), " ")
	for _, want := range []string{"agentbus", " provision", " --replicas 3", " --server nats://nats:4222"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("command %q does not contain %q", cmd, want)
		}
	}
	secrets := map[string]string{}
	for _, e := range ctr.Env {
		if r := e.ValueFrom.SecretKeyRef; r.Name != "" {
			secrets[e.Name] = r.Name + "/" + r.Key
		}
	}
	if secrets["NATS_USER"] == "" || secrets["NATS_PASSWORD"] == "" {
		t.Errorf("NATS_USER and NATS_PASSWORD come from %v, want a Secret", secrets)
	}
}

// built caches the binaries TestCluster builds, once per test binary; TestMain
// removes them.
var built struct {
	dir string
	err error
}

func removeBuilt() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// TestDeadLetterWatcherDeployment: dlq-watch.yaml is one Deployment that
// runs `agentbus dlq watch` against the chart's Service with the admin
// credentials of the provision Job's Secret.
func TestDeadLetterWatcherDeployment(t *testing.T) {
	objs := decodeYAML[k8sObject](t, filepath.Join("kubernetes", "dlq-watch.yaml"), false)
	if len(objs) != 1 || objs[0].APIVersion != "apps/v1" || objs[0].Kind != "Deployment" {
		t.Fatalf("dlq-watch.yaml holds %+v, want one apps/v1 Deployment", objs)
	}
	pod := objs[0].Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	if cmd := strings.Join(append(slices.Clone(ctr.Command), ctr.Args...), " "); !strings.Contains(cmd, "agentbus") ||
		!strings.Contains(cmd, " dlq watch --server nats://nats:4222") {
		t.Errorf("command %q, want agentbus dlq watch --server nats://nats:4222", cmd)
	}
	secrets := map[string]string{}
	for _, e := range ctr.Env {
		if r := e.ValueFrom.SecretKeyRef; r.Name != "" {
			secrets[e.Name] = r.Name + "/" + r.Key
		}
	}
	if secrets["NATS_USER"] != "agentbus-admin/user" || secrets["NATS_PASSWORD"] != "agentbus-admin/password" {
		t.Errorf("NATS_USER and NATS_PASSWORD come from %v, want the Secret agentbus-admin", secrets)
	}
}
