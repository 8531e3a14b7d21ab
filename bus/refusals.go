package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// refusals cancels the publishes in flight on a subject as soon as the
// server reports that it refused a publish there. The server answers a
// publish its permissions forbid with an asynchronous error on the
// connection, not on the request, so without this a refused Publish would
// wait out its attempt's timeout. It needs the connection's errors, which a
// bus sees only on a connection it made itself (Connect).
type refusals struct {
	mu      sync.Mutex
	waiting map[*refusalWatch]struct{}
}

// refusalWatch is one publish in flight.
type refusalWatch struct {
	subject string
	cancel  context.CancelCauseFunc
}

// watch returns a context derived from ctx that is cancelled, with a cause
// wrapping ErrPermissionDenied, when the server refuses a publish to
// subject, and the function that stops watching.
func (r *refusals) watch(ctx context.Context, subject string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &refusalWatch{subject: subject, cancel: cancel}
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = make(map[*refusalWatch]struct{})
	}
	r.waiting[w] = struct{}{}
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		delete(r.waiting, w)
		r.mu.Unlock()
		cancel(nil)
	}
}

// refused takes an asynchronous error of the connection and cancels the
// publishes it refuses.
func (r *refusals) refused(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.waiting {
		if refusesPublish(err, w.subject) {
			w.cancel(fmt.Errorf("%w: %w", ErrPermissionDenied, err))
		}
	}
}

// refusesPublish reports whether err is the server's permissions violation
// for a publish to subject: `Permissions Violation for Publish to "<subject>"`.
func refusesPublish(err error, subject string) bool {
	return errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), "Publish to "+strconv.Quote(subject))
}
