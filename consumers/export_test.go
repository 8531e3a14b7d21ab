package consumers

import "time"

// SetStoredWait sets how long Strict waits for a stored lane's first
// message, for the test that calls it, until restore.
func SetStoredWait(d time.Duration) (restore func()) {
	old := storedWait
	storedWait = d
	return func() { storedWait = old }
}
