package embedded_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/agentbus/agentbus/embedded"
)

// recordHandler keeps every slog record it handles.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func TestSlogLoggerLevels(t *testing.T) {
	t.Parallel()
	h := &recordHandler{}
	l := embedded.SlogLogger(slog.New(h))
	l.Tracef("t %d", 1)
	l.Debugf("d %d", 2)
	l.Noticef("n %d", 3)
	l.Warnf("w %d", 4)
	l.Errorf("e %d", 5)
	l.Fatalf("f %d", 6) // must not exit

	want := []struct {
		level slog.Level
		msg   string
		fatal bool
	}{
		{embedded.LevelTrace, "t 1", false},
		{slog.LevelDebug, "d 2", false},
		{slog.LevelInfo, "n 3", false},
		{slog.LevelWarn, "w 4", false},
		{slog.LevelError, "e 5", false},
		{slog.LevelError, "f 6", true},
	}
	if len(h.records) != len(want) {
		t.Fatalf("%d records, want %d", len(h.records), len(want))
	}
	for i, w := range want {
		r := h.records[i]
		var fatal bool
		r.Attrs(func(a slog.Attr) bool {
			fatal = a.Key == "fatal" && a.Value.Bool()
			return !fatal
		})
		if r.Level != w.level || r.Message != w.msg || fatal != w.fatal {
			t.Errorf("record %d = %v %q fatal=%v, want %v %q fatal=%v", i, r.Level, r.Message, fatal, w.level, w.msg, w.fatal)
		}
	}

	// A nil *slog.Logger discards.
	embedded.SlogLogger(nil).Fatalf("discarded")
}

func TestSlogLoggerReceivesServerOutput(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	h := &recordHandler{}
	_, err = embedded.Start(embedded.Options{
		Port:     busy.Addr().(*net.TCPAddr).Port,
		StoreDir: t.TempDir(),
		Logger:   embedded.SlogLogger(slog.New(h)),
	})
	if !errors.Is(err, embedded.ErrStart) {
		t.Fatalf("Start error %v, want ErrStart", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.ContainsFunc(h.records, func(r slog.Record) bool { return r.Level == slog.LevelInfo }) {
		t.Error("no notices logged at Info")
	}
	// Marked fatal=true, as SlogLogger's doc says; before 2026-11-28 it
	// came as an Error prefixed "fatal: " (found by a helper session).
	fatal := func(r slog.Record) (found bool) {
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == "fatal" && a.Value.Bool()
			return !found
		})
		return r.Level == slog.LevelError && found
	}
	if !slices.ContainsFunc(h.records, fatal) {
		t.Error("the fatal report was not logged at Error with fatal=true")
	}
}
