package bus

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentbus/agentbus/subjects"
)

// TestTransient: what Publish retries, and what it returns at once.
func TestTransient(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{fmt.Errorf("wrapped: %w", nats.ErrNoResponders), true},
		{&jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10163, Description: "expected last sequence per subject temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence"}, false},
		{jetstream.ErrStreamNotFound, false},
		{nats.ErrMaxPayload, false},
		{context.Canceled, false},
		{errors.New("other"), false},
	}
	for _, tt := range tests {
		if got := transient(tt.err); got != tt.want {
			t.Errorf("transient(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestRecentSet: it keeps the last recentSetSize values and forgets older
// ones, and takes a few words of its bus until the first add.
func TestRecentSet(t *testing.T) {
	var s recentSet[string]
	if size := unsafe.Sizeof(s); size > 64 {
		t.Errorf("an empty recentSet takes %d bytes of every bus, want a few words", size)
	}
	if s.has("0") {
		t.Error("an empty recentSet has a value")
	}
	for i := range recentSetSize + 10 {
		s.add(fmt.Sprint(i))
	}
	if s.has("9") || !s.has("10") || !s.has(fmt.Sprint(recentSetSize+9)) {
		t.Errorf("recentSet kept the wrong values: has(9)=%v has(10)=%v", s.has("9"), s.has("10"))
	}
	if len(s.set) != recentSetSize {
		t.Errorf("recentSet holds %d values, want %d", len(s.set), recentSetSize)
	}
}

// TestRefusals: the server's refusal of a publish cancels the publishes in
// flight on that subject, and only those, with ErrPermissionDenied.
func TestRefusals(t *testing.T) {
	var r refusals
	ctxA, stopA := r.watch(context.Background(), "agentbus.agent.bob.p3.alice.order")
	ctxB, stopB := r.watch(context.Background(), "agentbus.agent.bob.p3.mallory.order")
	defer stopB()

	r.refused(errors.New("some other error"))
	r.refused(fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Subscription to "agentbus.agent.bob.p3.alice.order"`))
	if ctxA.Err() != nil {
		t.Fatalf("cancelled by an error that is not a refused publish: %v", context.Cause(ctxA))
	}
	r.refused(fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Publish to "agentbus.agent.bob.p3.alice.order"`))
	if cause := context.Cause(ctxA); !errors.Is(cause, ErrPermissionDenied) || !errors.Is(cause, nats.ErrPermissionViolation) {
		t.Errorf("cause %v, want ErrPermissionDenied wrapping nats.ErrPermissionViolation", cause)
	}
	if ctxB.Err() != nil {
		t.Errorf("a publish on another subject was cancelled: %v", context.Cause(ctxB))
	}
	stopA()
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.waiting); n != 1 {
		t.Errorf("%d publishes watched after one stopped, want 1", n)
	}
}

func TestExponentialBackoff(t *testing.T) {
	b := exponentialBackoff(100*time.Millisecond, time.Second)
	for delivery, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 5: time.Second, 50: time.Second} {
		got := b(delivery)
		if got < want || got > want+want/5 {
			t.Errorf("backoff(%d) = %v, want %v plus at most 20%%", delivery, got, want)
		}
	}
}

// TestDirectSubjects: the remembered subjects are Direct's, for many
// recipients, types and priorities from many goroutines, past the bound,
// which they never pass; bad input is refused each time and not kept.
func TestDirectSubjects(t *testing.T) {
	s, err := subjects.New("root")
	if err != nil {
		t.Fatal(err)
	}
	var d directSubjects
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 3 * maxDirectSubjects {
				to, typ, p := fmt.Sprintf("agent-%d", i%700), fmt.Sprintf("T%d", g), 1+i%5
				want, err := s.Direct(to, "sender", typ, p)
				if err != nil {
					t.Error(err)
					return
				}
				if got, err := d.of(s, to, "sender", typ, p); got != want || err != nil {
					t.Errorf("of(%s, %s, %d) = %q, %v; want %q", to, typ, p, got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	kept := 0
	d.m.Range(func(any, any) bool { kept++; return true })
	if kept > maxDirectSubjects {
		t.Errorf("%d subjects kept, more than %d", kept, maxDirectSubjects)
	}
	for range 2 {
		if _, err := d.of(s, "", "sender", "T", 1); !errors.Is(err, subjects.ErrInvalidAgentID) {
			t.Errorf("of a bad recipient: %v, want ErrInvalidAgentID", err)
		}
	}
}

// TestTTLSeconds: Nats-TTL rounds up to whole seconds, at least one, and
// the longest TTL does not wrap around: (d + time.Second - 1) overflowed
// within a second of the longest Duration, and the message carried
// Nats-TTL 1s, removed by the server a second later (found by hunt h12).
func TestTTLSeconds(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{time.Nanosecond, "1s"}, {time.Second, "1s"}, {time.Second + 1, "2s"}, {90 * time.Minute, "5400s"},
		{math.MaxInt64, "9223372037s"}, {math.MaxInt64 - time.Second + 1, "9223372036s"},
	} {
		if got := ttlSeconds(tt.d); got != tt.want {
			t.Errorf("ttlSeconds(%d) = %s, want %s", tt.d, got, tt.want)
		}
	}
}
