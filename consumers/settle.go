package consumers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrHandlerPanic is wrapped by the error that stands for a handler's panic.
// The message is settled as if the handler had returned that error.
var ErrHandlerPanic = errors.New("consumers: handler panicked")

// ErrMaxDeliver is wrapped by the termination reason of a message whose
// handler failed on its last allowed delivery.
var ErrMaxDeliver = errors.New("consumers: delivery limit reached")

// permanent marks an error after which a message must not be redelivered.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as permanent: a handler that returns it has its message
// terminated at once, with err as the reason, instead of redelivered.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err, or an error it wraps, was made by
// [Permanent].
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Backoff returns how long to wait before the next delivery of a message that
// failed on its delivery-th delivery (1 for the first).
type Backoff func(delivery int) time.Duration

// ExponentialBackoff doubles the delay from base on each failed delivery up to
// max, with up to 20% random jitter so that failures do not retry in step.
func ExponentialBackoff(base, max time.Duration) Backoff {
	return func(delivery int) time.Duration {
		d := base
		for i := 1; i < delivery && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		if j := int64(d) / 5; j > 0 {
			d += time.Duration(rand.Int64N(j))
		}
		return d
	}
}

// DefaultBackoff is the backoff of a dispatcher whose Options.Backoff is nil:
// 1s, 2s, 4s, ... up to 1 minute.
var DefaultBackoff = ExponentialBackoff(time.Second, time.Minute)

// maxReasonLen bounds the termination reason sent to the server.
const maxReasonLen = 256

func termReason(err error) string {
	s := err.Error()
	if len(s) > maxReasonLen {
		s = s[:maxReasonLen]
	}
	return s
}

func panicError(v any) error {
	return fmt.Errorf("%w: %v", ErrHandlerPanic, v)
}
