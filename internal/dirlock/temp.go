package dirlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Temporary directories that outlive a killed owner. A process that keeps
// scratch files in a directory of its own (MkdirTemp) holds the
// directory's lock for as long as it uses it; if it is killed (SIGKILL
// runs no deferred RemoveAll), the kernel releases the lock and the
// directory is left behind. RemoveStale, run by the next process of the
// same kind, removes those whose lock it can take: their owner is gone.
// A directory whose lock is held, by its owner or by any process that
// inherited the locked file (a child started with it in ExtraFiles), is
// live and left alone.
//
// A directory has its name only once it is locked: MkdirTemp makes it
// under a hidden name (a dot before the prefix), locks it, and renames it
// (without replacing anything) to its name. A RemoveStale never sees it
// unlocked, so it never takes a new directory for a stale one. A process
// killed between the making and the renaming leaves an empty directory of
// the hidden name, which nothing removes: RemoveStale could not tell it
// from one that is about to be locked.

// renameAttempts bounds MkdirTemp's tries at a name no file has (each a
// fresh 64-bit random suffix).
const renameAttempts = 10

// MkdirTemp makes a new directory in parent, named prefix and a random
// suffix, and returns it with its lock held: closing the file releases
// the lock (remove the directory first). prefix must not begin with a
// dot.
func MkdirTemp(parent, prefix string) (dir string, lock *os.File, err error) {
	hidden, err := os.MkdirTemp(parent, "."+prefix+"*")
	if err != nil {
		return "", nil, err
	}
	if lock, err = Lock(hidden); err != nil {
		os.Remove(hidden)
		return "", nil, err
	}
	for range renameAttempts {
		dir = filepath.Join(parent, prefix+strconv.FormatUint(rand.Uint64(), 36))
		err = unix.Renameat2(unix.AT_FDCWD, hidden, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE)
		if err == nil {
			return dir, lock, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	lock.Close()
	os.Remove(hidden)
	return "", nil, fmt.Errorf("dirlock: naming %s: %w", hidden, err)
}

// RemoveStale removes each directory in parent whose name begins with
// prefix, that is this process's user's, and whose lock it can take (no
// process holds it: its owner is gone), with everything in it. It
// returns the directories it removed, and the errors of those it could
// not remove, joined; a parent that does not exist holds none. Links and
// files of that name, directories of other users and locked directories
// are left as they are.
func RemoveStale(parent, prefix string) (removed []string, err error) {
	entries, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) { // a link is not IsDir
			continue
		}
		dir := filepath.Join(parent, e.Name())
		gone, err := removeIfStale(dir)
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// removeIfStale removes dir if it is a directory of this process's user
// whose lock nobody holds, and reports whether it did.
func removeIfStale(dir string) (bool, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return false, nil // gone, or replaced by a link or a file meanwhile
		}
		return false, fmt.Errorf("dirlock: %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("dirlock: %s: %w", dir, err)
	}
	if int(st.Uid) != os.Geteuid() {
		return false, nil // another user's
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil // live
		}
		return false, fmt.Errorf("dirlock: lock %s: %w", dir, err)
	}
	// Locked: the directory's owner is gone, unless what the name holds
	// now is another directory (removed and made again meanwhile).
	if !sameFile(f, dir) {
		return false, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("dirlock: removing stale %s: %w", dir, err)
	}
	return true, nil
}

// sameFile reports whether the name path holds the file f has open.
func sameFile(f *os.File, path string) bool {
	var held, named unix.Stat_t
	return unix.Fstat(int(f.Fd()), &held) == nil && unix.Lstat(path, &named) == nil &&
		held.Dev == named.Dev && held.Ino == named.Ino
}
