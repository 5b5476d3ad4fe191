package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The lock of a value file. Every change of what a value's name holds
// is made under the lock of the file it holds (flock, exclusive): a Put
// that keeps the file (putAgain) or replaces it, a Delete, a reader's
// removal of a file that failed its hash. A delete conditional on the
// generation its caller saw, and a Put of the same bytes, are then one
// before the other: the Put gives the file a new generation before the
// delete looks (which leaves it), or finds no file after it and writes
// one. Readers take no lock.

// lockValue opens the value file under path and locks it, once the file
// it locked is still the one under that name (a file removed or replaced
// while it waited is not; the file there now is locked instead). The
// caller closes the file, which unlocks it. No file there is an error
// wrapping fs.ErrNotExist; anything but a regular file, one wrapping
// errNotAFile (or ELOOP, a link). It waits for the lock until ctx ends
// (then ctx's error): whoever can open the file can hold its lock (a
// process paused with it, or another local user), and a writer or a
// deleter must not wait on them for ever.
func lockValue(ctx context.Context, path string) (*os.File, error) {
	for {
		f, err := openFile(path)
		if err != nil {
			return nil, err
		}
		if err := flockContext(ctx, f); err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Lstat(path, &named) == nil &&
			held.Dev == named.Dev && held.Ino == named.Ino {
			return f, nil
		}
		f.Close()
	}
}

// flockContext takes f's exclusive lock, polling (as gofrs/flock's
// TryLockContext does: flock has no timeout) until ctx ends.
func flockContext(ctx context.Context, f *os.File) error {
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}
