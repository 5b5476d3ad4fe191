package shm

import (
	"iter"
	"os"
	"path/filepath"
	"time"

	"github.com/embcache/embcache/payload"
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
