//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package embedded

import "os"

// storeLocking reports whether Start locks its store directory on this
// system. Here (Windows, Solaris, illumos, AIX, ...) it does not: nothing
// stops two servers from opening the same store, which loses acknowledged
// messages. Give every server a store directory of its own.
const storeLocking = false

// tryLock takes no lock; see storeLocking.
func tryLock(*os.File) error { return nil }

func unlock(*os.File) {}
