package consumers

import (
	"errors"
	"fmt"
)

// ErrHandlerPanic is wrapped by the error a dispatcher reports when a
// handler panicked; the message is given back for redelivery.
var ErrHandlerPanic = errors.New("consumers: handler panicked")

// maxReasonLen bounds the termination reason sent to the server.
const maxReasonLen = 256

func panicError(v any) error {
	return fmt.Errorf("%w: %v", ErrHandlerPanic, v)
}
