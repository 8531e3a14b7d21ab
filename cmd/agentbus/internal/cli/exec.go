package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/agentbus/agentbus/bus"
)

// execGrace is how long a --exec command has to exit after it was asked to
// terminate, and how long its output may stay open after it exited, before
// it is killed.
const execGrace = 2 * time.Second

// exec runs --exec for d: exit status 0 acknowledges the message, anything
// else makes the bus redeliver it. The command is terminated when the
// handler's context or the subscribe command's context ends.
func (s *session) exec(ctx context.Context, d *bus.Delivery) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.mainCtx, cancel)()

	cmd := exec.CommandContext(ctx, "sh", "-c", s.f.exec)
	cmd.Stdin = bytes.NewReader(d.Data)
	cmd.Stdout = childWriter(s.a.stdout)
	cmd.Stderr = childWriter(s.a.stderr)
	cmd.Env = append(append(os.Environ(), s.a.connEnv()...), execEnv(d)...)
	cmd.Env = append(cmd.Env, "AGENTBUS_AGENT="+s.f.agent)
	cmd.WaitDelay = execGrace
	ownProcessGroup(cmd)
	progress, err := s.progressPipe(ctx, cmd, d)
	if err != nil {
		return err
	}
	err = cmd.Run()
	progress()
	if ctx.Err() != nil {
		killProcessGroup(cmd) // whatever the command left behind
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		// It exited 0, but something it started kept its output open.
		err = nil
	}
	if err != nil {
		if s.mainCtx.Err() != nil {
			s.a.warnf("message %s (delivery %d): exec interrupted: %v; it will be redelivered", d.ID, d.Deliveries, err)
		} else {
			s.a.warnf("message %s (delivery %d): exec: %v", d.ID, d.Deliveries, err)
		}
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}

// progressFD is the file descriptor on which an --exec command reports
// progress: AGENTBUS_PROGRESS_FD.
const progressFD = 3

// progressPipe gives cmd a pipe on progressFD whose lines become progress
// updates on d (see parseProgress). The returned function, called once
// cmd has exited, waits until the lines are read: at most execGrace after
// the command, if something it started keeps the pipe open.
func (s *session) progressPipe(ctx context.Context, cmd *exec.Cmd, d *bus.Delivery) (wait func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("exec: progress pipe: %w", err)
	}
	cmd.ExtraFiles = []*os.File{w} // progressFD: 0, 1, 2 come first
	cmd.Env = append(cmd.Env, "AGENTBUS_PROGRESS_FD="+strconv.Itoa(progressFD))
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p, ok := parseProgress(sc.Text())
			if !ok {
				continue
			}
			if err := d.Progress(ctx, p); err != nil {
				s.a.warnf("message %s: progress: %v", d.ID, err)
			}
		}
		if err := sc.Err(); err != nil {
			// A line over the scanner's limit (64 KiB) ends the scan;
			// the pipe is still read to its end, or the command's next
			// writes would block once its buffer filled, for good.
			s.a.warnf("message %s: progress: %v; the rest of its progress is ignored", d.ID, err)
			_, _ = io.Copy(io.Discard, r)
		}
	}()
	return func() {
		w.Close() // the child has its own copy, closed when it exits
		select {
		case <-done:
		case <-time.After(execGrace):
		}
		r.Close()
		<-done
	}, nil
}

// parseProgress reads one line an --exec command wrote on progressFD: a
// JSON object with the fields of bus.Progress ({"message":...,
// "percent":40}), or text, optionally starting with a percentage ("40%
// tests pass"). A blank line, or JSON that is not a valid update, is no
// update.
func parseProgress(line string) (bus.Progress, bool) {
	line = strings.TrimSpace(line)
	if line == "" {
		return bus.Progress{}, false
	}
	if strings.HasPrefix(line, "{") {
		var p bus.Progress
		if err := json.Unmarshal([]byte(line), &p); err != nil || p.Percent != nil && (*p.Percent < 0 || *p.Percent > 100) {
			return bus.Progress{}, false
		}
		return p, true
	}
	if pct, rest, ok := strings.Cut(line, "%"); ok {
		if n, err := strconv.Atoi(pct); err == nil && n >= 0 && n <= 100 {
			return bus.Progress{Message: strings.TrimSpace(rest), Percent: &n}, true
		}
	}
	return bus.Progress{Message: line}, true
}

// childWriter is what a child process writes to: the *os.File itself when
// there is one, so the child inherits it, else w.
func childWriter(w *syncWriter) io.Writer {
	if f, ok := w.file(); ok {
		return f
	}
	return w
}

// connEnv returns the environment variables that tell an --exec command
// how subscribe reached the bus, so that an agentbus command it runs
// ('agentbus reply') reaches the same one: the server, the root, the
// shards, the credentials and --tlsfirst, each from its flag or, unset,
// its own variable. Before 2026-11-28 only the inherited environment went, and a
// reply from a subscribe given --server or --root went elsewhere.
func (a *app) connEnv() []string {
	c := a.conn.withEnv(os.Getenv)
	env := []string{"NATS_URL=" + a.server, "AGENTBUS_ROOT=" + a.root, "AGENTBUS_SHARDS=" + strconv.Itoa(a.shards)}
	for _, v := range []struct{ name, value string }{
		{"NATS_CREDS", c.creds}, {"NATS_NKEY", c.nkey}, {"NATS_USER", c.user}, {"NATS_PASSWORD", c.password},
		{"NATS_CA", c.tlsCA}, {"NATS_CERT", c.tlsCert}, {"NATS_KEY", c.tlsKey},
	} {
		if v.value != "" {
			env = append(env, v.name+"="+v.value)
		}
	}
	if c.tlsFirst {
		env = append(env, "AGENTBUS_TLSFIRST=true")
	}
	return env
}

// execEnv returns the environment variables that carry d's attributes to
// an --exec command.
func execEnv(d *bus.Delivery) []string {
	return []string{
		"AGENTBUS_ID=" + d.ID,
		"AGENTBUS_FROM=" + d.From,
		"AGENTBUS_TO=" + d.To,
		"AGENTBUS_TYPE=" + d.Type,
		"AGENTBUS_PRIORITY=" + strconv.Itoa(d.Priority),
		"AGENTBUS_CORRELATION_ID=" + d.CorrelationID,
		"AGENTBUS_CAUSATION_ID=" + d.CausationID,
		"AGENTBUS_TIME=" + d.Time.UTC().Format(time.RFC3339Nano),
		"AGENTBUS_CONTENT_TYPE=" + d.ContentType,
		"AGENTBUS_SUBJECT=" + d.Subject,
		"AGENTBUS_SEQUENCE=" + strconv.FormatUint(d.Sequence, 10),
		"AGENTBUS_DELIVERY=" + strconv.Itoa(d.Deliveries),
	}
}
