package consumers

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrHandlerPanic is wrapped by the error a dispatcher reports when a
// handler panicked; the message is given back for redelivery.
var ErrHandlerPanic = errors.New("consumers: handler panicked")

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

// DefaultBackoff is 1s, 2s, 4s, ... up to 1 minute.
var DefaultBackoff = ExponentialBackoff(time.Second, time.Minute)

// maxReasonLen bounds the termination reason sent to the server.
const maxReasonLen = 256

func panicError(v any) error {
	return fmt.Errorf("%w: %v", ErrHandlerPanic, v)
}
