//go:build unix

package benchmark

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, user and system:
// the client's, and with an embedded server the server's too.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
