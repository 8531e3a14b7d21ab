package bus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbus/agentbus/bus"
	"github.com/agentbus/agentbus/embedded"
)

// foreignAgentsPage is the page whose listings these tests run.
const foreignAgentsPage = "../docs/foreign-agents.md"

// nodePackages are the npm packages the JavaScript listing imports, at the
// versions CI runs it with.
var nodePackages = []string{"@nats-io/transport-node@3.4.0", "@nats-io/jetstream@3.4.0"}

// listing returns the first fenced code block of language lang in
// docs/foreign-agents.md.
func listing(t *testing.T, lang string) string {
	t.Helper()
	page, err := os.ReadFile(foreignAgentsPage)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n```" + lang + "\n(.*?)\n```\n").FindSubmatch(page)
	if m == nil {
		t.Fatalf("%s has no %s listing", foreignAgentsPage, lang)
	}
	return string(m[1])
}

// nodeModules installs nodePackages, once per machine, into a directory of
// the user's cache and returns it: a script written there imports them.
func nodeModules(t *testing.T) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "agentbus-test", "node-"+strings.NewReplacer("@", "", "/", "-").Replace(strings.Join(nodePackages, "_")))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "jetstream", "package.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"install", "--no-audit", "--no-fund", "--prefix", dir}, nodePackages...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "npm", args...).CombinedOutput(); err != nil {
		t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dir
}

// TestForeignAgentJavaScript runs the JavaScript agent of
// docs/foreign-agents.md with Node.js against Go agents: it asks the Go
// worker a question and prints the answer; a Go Request to it is answered
// in the request's conversation and trace, and the status records on both
// sides read replied.
func TestForeignAgentJavaScript(t *testing.T) {
	script := listing(t, "js")
	dir := nodeModules(t)
	file := filepath.Join(dir, "agent-"+strings.ReplaceAll(t.Name(), "/", "-")+".mjs")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}

	s := newServer(t)
	ctx := testContext(t)
	orch, _ := newTracedBus(t, s, "orchestrator")
	worker := newBus(t, s, "worker")
	questions := make(chan *bus.Delivery, 1)
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if d.Message.Type != "QUESTION" {
			return bus.Permanent(errors.New("unexpected " + d.Message.Type))
		}
		if _, err := d.Reply(ctx, bus.Message{Type: "ANSWER", ContentType: "application/json", Data: []byte(`{"ready":true}`)}); err != nil {
			return err
		}
		questions <- d
		return nil
	})

	cmd := exec.Command("node", file)
	cmd.Env = append(os.Environ(), "NATS_URL="+s.ClientURL(), "AGENT=js-agent", "PEER=worker")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stopOnce sync.Once
	stop := func() error {
		var err error
		stopOnce.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			err = cmd.Wait()
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	// The agent's question reaches the worker and its answer the agent.
	var question *bus.Delivery
	select {
	case question = <-questions:
	case <-ctx.Done():
		t.Fatalf("no question from the JavaScript agent; stderr:\n%s", stderr.String())
	}
	if question.Message.From != "js-agent" || question.Message.Priority != 2 {
		t.Errorf("question %+v, want from js-agent at priority 2", question.Message)
	}
	select {
	case line := <-lines:
		if line != `answer ANSWER {"ready":true}` {
			t.Errorf("the agent printed %q, want the worker's answer", line)
		}
	case <-ctx.Done():
		t.Fatalf("the JavaScript agent printed no answer; stderr:\n%s", stderr.String())
	}
	if st := waitState(t, worker, question.Message.ID, bus.StateReplied); st.By != "worker" || st.From != "js-agent" {
		t.Errorf("the question's status %+v, want replied by worker (the agent's pending record, then the reply)", st)
	}

	// A Go Request to the agent is answered in its conversation and trace.
	d, err := orch.Request(ctx, bus.Message{To: "js-agent", Type: "ASK", Priority: 1, ContentType: "application/json", Data: []byte(`{"q":1}`)})
	if err != nil {
		t.Fatalf("Request to the JavaScript agent: %v; stderr:\n%s", err, stderr.String())
	}
	var answer struct {
		Answer   int             `json:"answer"`
		Question json.RawMessage `json:"question"`
	}
	if err := json.Unmarshal(d.Message.Data, &answer); err != nil || answer.Answer != 42 || string(answer.Question) != `{"q":1}` {
		t.Errorf("answer %s (%v)", d.Message.Data, err)
	}
	ask := d.Message.CausationID
	if d.Message.Type != "ANSWER" || d.Message.From != "js-agent" || ask == "" || d.Message.Priority != 1 {
		t.Errorf("answer %+v, want an ANSWER from js-agent at priority 1 replying to the request", d.Message)
	}
	if tp := d.Message.Extensions["traceparent"]; !strings.HasPrefix(tp, "00-"+bus.ConversationTraceID(ask).String()+"-") {
		t.Errorf("answer's traceparent %q, want a span in the request's conversation trace", tp)
	}
	if st := waitState(t, orch, ask, bus.StateReplied); st.By != "js-agent" || st.ReplyID != d.Message.ID {
		t.Errorf("the request's status %+v, want replied by js-agent with %s", st, d.Message.ID)
	}

	if err := stop(); err != nil {
		t.Errorf("the JavaScript agent did not stop cleanly on SIGTERM: %v; stderr:\n%s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("the JavaScript agent wrote to stderr:\n%s", stderr.String())
	}
}

// TestForeignAgentPython compiles the Python agent of
// docs/foreign-agents.md. It cannot run here: nats-py is on no package
// index the build machines reach.
func TestForeignAgentPython(t *testing.T) {
	file := filepath.Join(t.TempDir(), "agent.py")
	if err := os.WriteFile(file, []byte(listing(t, "python")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("python3", "-m", "py_compile", file).CombinedOutput(); err != nil {
		t.Fatalf("python3 -m py_compile: %v\n%s", err, out)
	}
}

// runJavaScriptListing runs the JavaScript agent of docs/foreign-agents.md
// as js-agent, asking worker its question, against s, until the test ends;
// it returns the lines the agent writes to stdout and to stderr.
func runJavaScriptListing(t *testing.T, s *embedded.Server) (stdout, stderr <-chan string) {
	t.Helper()
	dir := nodeModules(t)
	file := filepath.Join(dir, "agent-"+strings.ReplaceAll(t.Name(), "/", "-")+".mjs")
	if err := os.WriteFile(file, []byte(listing(t, "js")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", file)
	cmd.Env = append(os.Environ(), "NATS_URL="+s.ClientURL(), "AGENT=js-agent", "PEER=worker")
	lines := func(r io.Reader) <-chan string {
		ch := make(chan string, 16)
		go func() {
			defer close(ch)
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				ch <- sc.Text()
			}
		}()
		return ch
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return lines(out), lines(errs)
}

// TestJavaScriptListingSkipsProgress: the JavaScript agent of
// docs/foreign-agents.md asks a Go worker that reports progress before it
// replies; the agent takes the reply, not the progress update, as its
// answer. It took the first message caused by its question, whatever its
// type (found by a helper session).
func TestJavaScriptListingSkipsProgress(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	worker := newBus(t, s, "worker")
	subscribe(t, worker, func(ctx context.Context, d *bus.Delivery) error {
		if err := d.Progress(ctx, bus.Progress{Message: "thinking"}); err != nil {
			return err
		}
		_, err := d.Reply(ctx, bus.Message{Type: "ANSWER", ContentType: "application/json", Data: []byte(`{"ready":true}`)})
		return err
	})
	stdout, stderr := runJavaScriptListing(t, s)
	select {
	case line := <-stdout:
		if line != `answer ANSWER {"ready":true}` {
			t.Errorf("the agent printed %q as its answer, want the worker's reply", line)
		}
	case line := <-stderr:
		t.Fatalf("the agent wrote to stderr: %s", line)
	case <-ctx.Done():
		t.Fatal("the JavaScript agent printed no answer")
	}
}

// TestJavaScriptListingEndsAtDeadLetter: the JavaScript agent of
// docs/foreign-agents.md asks a Go worker whose handler rejects the
// question; its request carries ce-replyby, so the worker sends the
// agentbus.dead_lettered notice, and the agent ends its wait with an error
// instead of taking the notice as the answer or waiting for good (found by
// a helper session).
func TestJavaScriptListingEndsAtDeadLetter(t *testing.T) {
	s := newServer(t)
	ctx := testContext(t)
	worker := newBus(t, s, "worker", bus.WithErrorHandler(func(error) {}))
	subscribe(t, worker, func(context.Context, *bus.Delivery) error {
		return bus.Permanent(errors.New("no such question"))
	})
	stdout, stderr := runJavaScriptListing(t, s)
	select {
	case line := <-stdout:
		t.Errorf("the agent printed %q, want no answer", line)
	case line := <-stderr:
		if !strings.Contains(line, "dead-lettered") || !strings.Contains(line, "no such question") {
			t.Errorf("the agent wrote %q, want the dead-letter notice", line)
		}
	case <-ctx.Done():
		t.Fatal("the JavaScript agent neither answered nor gave up")
	}
}
