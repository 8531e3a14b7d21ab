package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

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
	// inbox is the connection's reply inbox prefix: when the server
	// refuses the subscription to it, no request can get its answer.
	inbox string
	nc    *nats.Conn
	// inboxRefused is the server's refusal of the subscription to inbox,
	// made once, by the connection's first request: every call after it
	// is refused too, until the connection reconnects (and subscribes
	// again) past reconnects. inboxRefusal reads it, for every handle and
	// publisher on the connection.
	inboxRefused error
	reconnects   uint64
	anyRefused   atomic.Bool // inboxRefused was ever set: inboxRefusal's lock-free no
	// onInboxRefused end what is in flight on an inbox refusal: the
	// attempts of askAgain (reconnects.endAttempts), the asynchronous
	// publishes (asyncpub.Publisher.Fail).
	onInboxRefused []func(error)
}

// refusalWatch is one publish, or one call of JetStream API requests, in
// flight.
type refusalWatch struct {
	subject string
	prefix  bool // any subject starting with subject
	cancel  context.CancelCauseFunc
}

// watch returns a context derived from ctx that is cancelled, with a cause
// wrapping ErrPermissionDenied, when the server refuses a publish to
// subject, and the function that stops watching.
func (r *refusals) watch(ctx context.Context, subject string) (context.Context, func()) {
	return r.add(ctx, &refusalWatch{subject: subject})
}

// watchPrefix is watch for the requests of one call, such as the consumer
// requests of a Subscribe: every subject that starts with prefix.
func (r *refusals) watchPrefix(ctx context.Context, prefix string) (context.Context, func()) {
	return r.add(ctx, &refusalWatch{subject: prefix, prefix: true})
}

func (r *refusals) add(ctx context.Context, w *refusalWatch) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w.cancel = cancel
	r.mu.Lock()
	if refused := r.inboxRefusalLocked(); refused != nil {
		cancel(refused)
	}
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
	cause := fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	inboxRefused := r.inbox != "" && strings.Contains(err.Error(), "Subscription to "+quotedPrefix(r.inbox))
	var tell []func(error)
	if inboxRefused {
		cause = fmt.Errorf("%w: no answer can come (an agent connects with nats.CustomInboxPrefix(bus.InboxPrefix(agent)); an operator's handle needs an operator's credentials)", cause)
		r.inboxRefused, r.reconnects = cause, r.nc.Stats().Reconnects
		r.anyRefused.Store(true)
		tell = slices.Clone(r.onInboxRefused)
	}
	for w := range r.waiting {
		if inboxRefused || refusesPublish(err, w.subject) || w.prefix && refusesPublishUnder(err, w.subject) {
			w.cancel(cause)
		}
	}
	r.mu.Unlock()
	// Outside the lock: a publisher told fails its publishes, whose error
	// handler may publish, and read the refusal, again.
	for _, f := range tell {
		f(cause)
	}
}

// tellInboxRefused makes f, which ends what a handle has in flight, hear
// of every refusal of the connection's inbox from now on.
func (r *refusals) tellInboxRefused(f func(error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onInboxRefused = append(r.onInboxRefused, f)
}

// inboxRefusal is the server's refusal of the connection's inbox: no
// answer can come to any request. It is nil when there was none, after
// the connection reconnected since (and subscribed again), and for a nil
// r (a connection the caller made).
func (r *refusals) inboxRefusal() error {
	if r == nil || !r.anyRefused.Load() { // every call and asynchronous publish asks
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inboxRefusalLocked()
}

func (r *refusals) inboxRefusalLocked() error {
	if r.inboxRefused == nil || r.nc.Stats().Reconnects != r.reconnects {
		return nil
	}
	return r.inboxRefused
}

// quotedPrefix is prefix as it starts a quoted subject in a server error.
func quotedPrefix(prefix string) string {
	q := strconv.Quote(prefix)
	return q[:len(q)-1]
}

// refusesPublishUnder reports whether err is the server's permissions
// violation for a publish to a subject that starts with prefix.
func refusesPublishUnder(err error, prefix string) bool {
	return errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), "Publish to "+quotedPrefix(prefix))
}

// refusedCall returns the permission error that cancelled ctx, which watch
// or watchPrefix made, or err as it is: a call refused by the server then
// says so instead of "context canceled". A JetStream API that cannot
// serve now (unavailableAPI) makes it ErrUnavailable.
func refusedCall(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrPermissionDenied) {
		return cause
	}
	if unavailableAPI(err) && !errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err) // JetStream cannot serve now
	}
	return err
}

// refusesPublish reports whether err is the server's permissions violation
// for a publish to subject: `Permissions Violation for Publish to "<subject>"`.
func refusesPublish(err error, subject string) bool {
	return errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), "Publish to "+strconv.Quote(subject))
}
