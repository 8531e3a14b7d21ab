package bus

import (
	"math/rand/v2"
	"time"
)

// backoff returns how long to wait before the next delivery, or attempt,
// after a failure on the delivery-th one (1 for the first).
type backoff func(delivery int) time.Duration

// exponentialBackoff doubles the delay from base on each failure up to max,
// with up to 20% random jitter so that failures do not retry in step.
func exponentialBackoff(base, max time.Duration) backoff {
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

// defaultBackoff is a subscription's redelivery delay unless WithBackoff:
// 1s, 2s, 4s, ... up to 1 minute.
var defaultBackoff = exponentialBackoff(time.Second, time.Minute)

// publishBackoff is the delay between publish attempts (WithPublishAttempts).
var publishBackoff = exponentialBackoff(100*time.Millisecond, 2*time.Second)
