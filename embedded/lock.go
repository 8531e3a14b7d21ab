package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFileName is the file in Options.StoreDir that a running server holds
// an exclusive lock on, so that no second server, in this process or
// another, opens the same store. The lock is the operating system's (flock)
// and goes with the process: a server that crashed leaves the file behind
// but not the lock, and the next Start on the store succeeds. The file holds
// the process ID of the server that last locked it. It is never removed
// while the store is kept: deleting a lock file that another process may be
// about to lock would let two servers lock two different files.
const LockFileName = "agentbus.lock"

// ErrStoreLocked is returned, wrapped in a [*StoreLockedError] and together
// with [ErrStart], by [Start] when another server is using the store
// directory: two servers on one JetStream store each acknowledge messages
// that the other's writes then destroy.
var ErrStoreLocked = errors.New("embedded: store directory in use by another server")

// StoreLockedError is the error of a Start on a store directory that
// another server holds. errors.Is(err, ErrStoreLocked) reports it;
// errors.As gives the directory and the holder's process ID.
type StoreLockedError struct {
	// Dir is the store directory.
	Dir string
	// PID is the process ID of the server holding the store, as it wrote it
	// in the lock file, or 0 if it could not be read. It is this process's
	// own ID when another Server of this process holds the store.
	PID int
}

func (e *StoreLockedError) Error() string {
	holder := "another agentbus server"
	switch {
	case e.PID == os.Getpid():
		holder = "another agentbus server in this process"
	case e.PID > 0:
		holder = fmt.Sprintf("another agentbus server (pid %d)", e.PID)
	}
	return fmt.Sprintf("store directory %s is in use by %s; stop it or use another store directory", e.Dir, holder)
}

// Is reports whether target is ErrStoreLocked.
func (e *StoreLockedError) Is(target error) bool { return target == ErrStoreLocked }

// errWouldBlock is what tryLock returns when another open file holds the
// lock.
var errWouldBlock = errors.New("lock held")

// storeLock is a held lock on a store directory. Its zero value, a nil
// file, holds nothing.
type storeLock struct {
	f *os.File
}

// lockStore creates dir if needed and takes the lock on its lock file. It
// returns a *StoreLockedError if another server holds it. An empty dir,
// which only Options.Configure can leave, is the server's shared default
// under os.TempDir and is not locked.
func lockStore(dir string) (*storeLock, error) {
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := tryLock(f); err != nil {
		pid := readPID(f)
		_ = f.Close()
		if errors.Is(err, errWouldBlock) {
			return nil, &StoreLockedError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Only for the error message of a server that finds the store taken:
	// a failure to write it does not matter.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f}, nil
}

// readPID returns the process ID in the lock file f, or 0.
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid < 0 {
		return 0
	}
	return pid
}

// release gives the lock up. It is safe on a nil lock and more than once.
func (l *storeLock) release() {
	if l == nil || l.f == nil {
		return
	}
	unlock(l.f)
	_ = l.f.Close()
	l.f = nil
}
