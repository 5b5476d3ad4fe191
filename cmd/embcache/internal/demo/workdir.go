package demo

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/embcache/embcache/internal/dirlock"
)

// workPrefix names the directories a demo keeps its files in, in the
// temporary directory (its JetStream store) and in /dev/shm (its payload
// store). Demos of builds before their locking named theirs
// embcache-demo-<digits>: those are left alone, since a demo of such a
// build running now could not be told from a dead one.
const workPrefix = "embcache-demo-run-"

// defaultShmRoot is where the payload store's directory is made unless
// Config.ShmRoot says otherwise: tmpfs, where the machine has it.
const defaultShmRoot = "/dev/shm"

// workDirs are a demo's directories, each held (dirlock) for as long as
// the demo or any of its workers lives: a demo killed with SIGKILL
// leaves them, unheld, and the next demo removes them
// (removeStaleWorkDirs); a live demo's are left alone.
type workDirs struct {
	nats  string     // the embedded server's store
	shm   string     // the shm payload store
	dirs  []string   // what to remove at the end
	locks []*os.File // their locks, which the workers inherit
}

// removeStaleWorkDirs removes the directories of demos that were killed
// (no process holds their lock), in the temporary directory and in
// shmRoot, and says which it removed; what it cannot remove it only
// reports.
func removeStaleWorkDirs(shmRoot string, progress io.Writer) {
	for _, root := range []string{os.TempDir(), shmRoot} {
		removed, err := dirlock.RemoveStale(root, workPrefix)
		for _, dir := range removed {
			fmt.Fprintf(progress, "embcache demo: removed %s, left by a demo that was killed\n", dir)
		}
		if err != nil {
			fmt.Fprintf(progress, "embcache demo: leftovers of a killed demo not removed: %v\n", err)
		}
	}
}

// makeWorkDirs makes the demo's directories and takes their locks: the
// JetStream store in the temporary directory, the payload store in
// shmRoot ("" is /dev/shm, or the temporary directory's where that
// fails).
func makeWorkDirs(shmRoot string) (*workDirs, error) {
	w := &workDirs{}
	dir, lock, err := dirlock.MkdirTemp(os.TempDir(), workPrefix)
	if err != nil {
		return nil, err
	}
	w.dirs, w.locks = append(w.dirs, dir), append(w.locks, lock)
	w.nats, w.shm = filepath.Join(dir, "nats"), filepath.Join(dir, "shm")
	root := shmRoot
	if root == "" {
		root = defaultShmRoot
	}
	dir, lock, err = dirlock.MkdirTemp(root, workPrefix)
	switch {
	case err == nil:
		w.shm = dir
		w.dirs, w.locks = append(w.dirs, dir), append(w.locks, lock)
	case shmRoot != "": // asked for; without /dev/shm, the temporary directory's does
		w.remove()
		return nil, fmt.Errorf("the payload store's directory in %s: %w", root, err)
	}
	return w, nil
}

// remove removes the directories, then releases their locks.
func (w *workDirs) remove() {
	for _, dir := range w.dirs {
		os.RemoveAll(dir)
	}
	for _, l := range w.locks {
		l.Close()
	}
}
