//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package embedded

import (
	"errors"
	"os"
	"syscall"
)

// storeLocking reports whether Start locks its store directory on this
// system.
const storeLocking = true

// tryLock takes an exclusive flock on f without waiting. A flock belongs
// to the open file description, so a second open of the file conflicts
// even within this process, and it ends with the process, so a crash never
// leaves a stale lock.
func tryLock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errWouldBlock
		default:
			return err
		}
	}
}

func unlock(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
