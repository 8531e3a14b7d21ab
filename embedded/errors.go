package embedded

import (
	"errors"
	"fmt"
)

var (
	// ErrStart is returned by [Start], [StartCluster] and
	// [Cluster.RestartServer] when a server could not be started, did not
	// become ready in time, or came up without JetStream. The error also
	// wraps the cause where there is one, so for example
	// errors.Is(err, syscall.EADDRINUSE) reports a port already in use.
	ErrStart = errors.New("embedded: start nats-server")

	// ErrInvalidOption is returned (wrapped, together with [ErrStart]) when
	// [Options] or [ClusterOptions] fail validation, before anything is
	// started.
	ErrInvalidOption = errors.New("embedded: invalid option")

	// ErrShutdown is returned by calls on a [Server] or [Cluster] after its
	// Shutdown.
	ErrShutdown = errors.New("embedded: server shut down")
)

// fatalError is what the server reported through Logger.Fatalf. Where the
// server passed error values as arguments, they are kept so that callers can
// inspect them with errors.Is and errors.As.
type fatalError struct {
	msg  string
	errs []error
}

func newFatalError(format string, v ...any) *fatalError {
	fe := &fatalError{msg: fmt.Sprintf(format, v...)}
	for _, a := range v {
		if err, ok := a.(error); ok {
			fe.errs = append(fe.errs, err)
		}
	}
	return fe
}

func (e *fatalError) Error() string   { return e.msg }
func (e *fatalError) Unwrap() []error { return e.errs }

// startError wraps cause so that it matches both ErrStart and cause.
func startError(what string, cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: %s", ErrStart, what)
	}
	return fmt.Errorf("%w: %s: %w", ErrStart, what, cause)
}
