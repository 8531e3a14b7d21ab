package bus

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAskAgain: a request whose answer does not come is made again, up to
// apiAttempts in all, never past the caller's context; any other error
// ends it at once.
func TestAskAgain(t *testing.T) {
	defer func(d time.Duration) { apiAttemptTimeout = d }(apiAttemptTimeout)
	apiAttemptTimeout = 50 * time.Millisecond
	lost := func(n int, calls *int) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			if *calls++; *calls <= n { // no answer: wait until the attempt ends
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 42, nil
		}
	}
	ctx := t.Context()
	var calls int
	if v, err := askAgain(ctx, lost(apiAttempts-1, &calls)); err != nil || v != 42 || calls != apiAttempts {
		t.Errorf("%d answers lost: %d, %v after %d calls; want 42 after %d", apiAttempts-1, v, err, calls, apiAttempts)
	}
	calls = 0
	if _, err := askAgain(ctx, lost(apiAttempts, &calls)); !errors.Is(err, context.DeadlineExceeded) || calls != apiAttempts {
		t.Errorf("%d answers lost: %v after %d calls; want the deadline after %d", apiAttempts, err, calls, apiAttempts)
	}
	calls = 0
	short, cancel := context.WithTimeout(ctx, apiAttemptTimeout/2)
	defer cancel()
	if _, err := askAgain(short, lost(apiAttempts, &calls)); !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Errorf("the caller's deadline first: %v after %d calls; want it after 1", err, calls)
	}
	calls = 0
	refused := errors.New("refused")
	if _, err := askAgain(ctx, func(context.Context) (int, error) { calls++; return 0, refused }); !errors.Is(err, refused) || calls != 1 {
		t.Errorf("another error: %v after %d calls; want it after 1", err, calls)
	}
}
