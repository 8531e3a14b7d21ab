package cli

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

// TestTraceStderr: --trace-stderr prints the publish's producer span to
// stderr as one JSON object, in the trace of the message's conversation.
func TestTraceStderr(t *testing.T) {
	url := newServer(t)
	r := runIn(t, "", "--server", url, "--trace-stderr", "publish", "--from", "alice", "--to", "bob", "--type", "PING", "--correlation-id", "conv-cli", "--data", "hi")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(r.stderr))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if err := json.Unmarshal(sc.Bytes(), &span); err != nil {
			t.Fatalf("stderr line %q is not a span: %v", sc.Text(), err)
		}
		names = append(names, span.Name)
		// printf %s conv-cli | sha256sum | cut -c1-32
		if want := "954fd329132c3285c5373580a0e3f2c1"; span.SpanContext.TraceID != want {
			t.Errorf("trace ID %s, want %s", span.SpanContext.TraceID, want)
		}
	}
	if len(names) != 1 || names[0] != "send agentbus.agent.{to}.p3.{from}.{type}" {
		t.Errorf("spans on stderr %q, want the one send span", names)
	}
}

// TestNoTelemetryByDefault: without the flag or OTEL_* variables nothing is
// printed besides the command's output.
func TestNoTelemetryByDefault(t *testing.T) {
	url := newServer(t)
	r := runIn(t, "", "--server", url, "publish", "--from", "alice", "--to", "bob", "--type", "PING")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}
