package bus

import "time"

// WithLooks makes a subscriber look at the stream for the priorities it
// watches first after first and then about every every, in place of
// lateLook and lookEvery, so that a test of the looks need not wait them
// out.
func WithLooks(first, every time.Duration) SubscribeOption {
	return func(o *subscribeOptions) error {
		o.firstLook, o.lookEvery = first, every
		return nil
	}
}

// SetPublishAttemptTimeout bounds each attempt of a Publish by d until the
// test ends.
func SetPublishAttemptTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	was := publishAttemptTimeout
	publishAttemptTimeout = d
	t.Cleanup(func() { publishAttemptTimeout = was })
}

// SetProcessesWait bounds how long a process waits for another process of
// its agent to answer (anotherProcess) by d until the test ends.
func SetProcessesWait(t interface{ Cleanup(func()) }, d time.Duration) {
	was := processesWait
	processesWait = d
	t.Cleanup(func() { processesWait = was })
}

// SetBatchWait bounds how long a read through a consumer waits for one
// batch (readPending) by d until the test ends.
func SetBatchWait(t interface{ Cleanup(func()) }, d time.Duration) {
	was := batchWait
	batchWait = d
	t.Cleanup(func() { batchWait = was })
}

// SetAPIAttemptTimeout bounds each attempt of a request to the server
// whose answer may be lost (askAgain) by d until the test ends.
func SetAPIAttemptTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	was := apiAttemptTimeout
	apiAttemptTimeout = d
	t.Cleanup(func() { apiAttemptTimeout = was })
}
