// Package dirlock holds a directory for one process at a time: an
// exclusive flock(2) on the directory itself, which the kernel releases
// when the process ends, killed or not, so no stale lock file is left.
//
// The same lock tells a live owner from a dead one: MkdirTemp makes a
// scratch directory and holds its lock, and RemoveStale removes the
// directories of that name whose lock nobody holds, those a killed
// process left behind.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrHeld is returned by Lock when another open of the directory, in
// this process or another, holds it.
var ErrHeld = errors.New("dirlock: held")

// Lock takes dir's exclusive lock, at once or not at all (ErrHeld).
// Closing the file releases it.
func Lock(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrHeld, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}
