package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
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
	cmd.Env = append(os.Environ(), execEnv(d)...)
	cmd.WaitDelay = execGrace
	ownProcessGroup(cmd)
	err := cmd.Run()
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

// childWriter is what a child process writes to: the *os.File itself when
// there is one, so the child inherits it, else w.
func childWriter(w *syncWriter) io.Writer {
	if f, ok := w.file(); ok {
		return f
	}
	return w
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
