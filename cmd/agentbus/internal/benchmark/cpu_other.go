//go:build !unix

package benchmark

import "time"

// processCPU reports that this system's CPU time is not read.
func processCPU() (time.Duration, bool) { return 0, false }
