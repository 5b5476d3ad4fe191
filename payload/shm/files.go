package shm

import (
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"time"

	"github.com/embcache/embcache/payload"
	"golang.org/x/sys/unix"
)

// File is a value's file in the store, as Files lists it.
type File = payload.StoredFile

// Files lists the values' files in the store (not the temp files of
// writers at work), one directory read per tenant; a file that goes or
// does not parse while it is listed is skipped.
func (s *Store) Files() iter.Seq[File] {
	return func(yield func(File) bool) {
		tenants, err := os.ReadDir(s.dir)
		if err != nil {
			return
		}
		for _, t := range tenants {
			if !t.IsDir() || t.Name() == tmpDir || t.Name() == proofDir {
				continue
			}
			names, err := os.ReadDir(filepath.Join(s.dir, t.Name()))
			if err != nil {
				continue
			}
			for _, n := range names {
				obj, err := payload.ParseObjectID(t.Name() + "/" + n.Name())
				if err != nil {
					continue
				}
				f, err := openFile(s.path(obj))
				if err != nil {
					continue
				}
				size, sum, st, ok := stored(f)
				f.Close()
				if !ok {
					continue
				}
				file := File{Location: s.location(obj, size, sum), ModTime: time.Unix(st.Mtim.Unix()), Generation: generationOf(&st)}
				if !yield(file) {
					return
				}
			}
		}
	}
}

// Sweep removes the temp files of writers that died mid-write (and
// returns how many) and the proofs of value files that are gone. A temp
// file is removed when no process holds it locked (a writer
// holds its own until it is in place; the kernel drops the lock of one
// that died), older than tempGrace (a file just created is locked a moment
// later). It was a file whose name's pid no longer ran, which in another
// pid namespace (a container sharing the node's tmpfs) names another
// process or none.
func (s *Store) Sweep() (int, error) {
	dir := filepath.Join(s.dir, tmpDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("shm: %w", err)
	}
	n := 0
	for _, e := range entries {
		if e.Type()&fs.ModeType != 0 {
			continue // only regular files are temp files
		}
		if removeIfAbandoned(filepath.Join(dir, e.Name())) {
			n++
		}
	}
	s.proofs.sweep()
	return n, nil
}

// tempGrace is how old a temp file nobody holds must be to be removed.
const tempGrace = time.Minute

func removeIfAbandoned(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // its writer holds it
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || time.Since(time.Unix(st.Mtim.Unix())) < tempGrace {
		return false
	}
	return os.Remove(path) == nil
}
