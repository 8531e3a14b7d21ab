package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// fatalLogger sits between the server and the caller's logger. The server
// reports start-up failures (port in use, unusable store directory, ...)
// only through Logger.Fatalf, and nats-server's own loggers exit the process
// there. fatalLogger never calls the wrapped Fatalf: it records the first
// fatal report so that Start can return it as an error, and passes the
// message on to the wrapped logger's Errorf, prefixed with "fatal: ".
type fatalLogger struct {
	next server.Logger

	once  sync.Once
	fatal chan struct{} // closed on the first Fatalf
	err   *fatalError   // set before fatal is closed
}

var _ server.Logger = (*fatalLogger)(nil)

func newFatalLogger(next server.Logger) *fatalLogger {
	if next == nil {
		next = discardLogger{}
	}
	return &fatalLogger{next: next, fatal: make(chan struct{})}
}

// Fatalf implements server.Logger without exiting.
func (l *fatalLogger) Fatalf(format string, v ...any) {
	l.once.Do(func() {
		l.err = newFatalError(format, v...)
		close(l.fatal)
	})
	if sl, ok := l.next.(slogLogger); ok { // as SlogLogger's doc says: marked, not prefixed
		sl.Fatalf(format, v...)
		return
	}
	l.next.Errorf("fatal: "+format, v...)
}

// fatalErr returns the first fatal report, or nil if there was none.
func (l *fatalLogger) fatalErr() error {
	select {
	case <-l.fatal:
		return l.err
	default:
		return nil
	}
}

func (l *fatalLogger) Noticef(format string, v ...any) { l.next.Noticef(format, v...) }
func (l *fatalLogger) Warnf(format string, v ...any)   { l.next.Warnf(format, v...) }
func (l *fatalLogger) Errorf(format string, v ...any)  { l.next.Errorf(format, v...) }
func (l *fatalLogger) Debugf(format string, v ...any)  { l.next.Debugf(format, v...) }
func (l *fatalLogger) Tracef(format string, v ...any)  { l.next.Tracef(format, v...) }

// discardLogger is the default logger: the library never prints on its own.
type discardLogger struct{}

var _ server.Logger = discardLogger{}

func (discardLogger) Noticef(string, ...any) {}
func (discardLogger) Warnf(string, ...any)   {}
func (discardLogger) Fatalf(string, ...any)  {}
func (discardLogger) Errorf(string, ...any)  {}
func (discardLogger) Debugf(string, ...any)  {}
func (discardLogger) Tracef(string, ...any)  {}

// LevelTrace is the slog level [SlogLogger] uses for the server's trace
// output, one step below slog.LevelDebug.
const LevelTrace = slog.LevelDebug - 4

// SlogLogger adapts l to the server's logger interface, for
// [Options.Logger]. Notices log at Info, warnings at Warn, errors and fatal
// reports at Error (fatal ones with the attribute fatal=true), debug at
// Debug and trace at [LevelTrace]. It never exits the process. The server
// only emits debug and trace output when the Configure hook sets
// server.Options.Debug or Trace. A nil l yields a logger that discards.
func SlogLogger(l *slog.Logger) server.Logger {
	if l == nil {
		return discardLogger{}
	}
	return slogLogger{l: l}
}

type slogLogger struct{ l *slog.Logger }

var _ server.Logger = slogLogger{}

func (s slogLogger) log(level slog.Level, format string, v []any, attrs ...slog.Attr) {
	ctx := context.Background()
	if !s.l.Enabled(ctx, level) {
		return
	}
	s.l.LogAttrs(ctx, level, fmt.Sprintf(format, v...), attrs...)
}

func (s slogLogger) Noticef(format string, v ...any) { s.log(slog.LevelInfo, format, v) }
func (s slogLogger) Warnf(format string, v ...any)   { s.log(slog.LevelWarn, format, v) }
func (s slogLogger) Errorf(format string, v ...any)  { s.log(slog.LevelError, format, v) }
func (s slogLogger) Debugf(format string, v ...any)  { s.log(slog.LevelDebug, format, v) }
func (s slogLogger) Tracef(format string, v ...any)  { s.log(LevelTrace, format, v) }
func (s slogLogger) Fatalf(format string, v ...any) {
	s.log(slog.LevelError, format, v, slog.Bool("fatal", true))
}
