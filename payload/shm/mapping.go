package shm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

// fileID names one version of a file: a file replaced under its name, or
// written in place (which moves its mtime or ctime), is another file, and
// is mapped and verified afresh.
type fileID struct {
	dev, ino     uint64
	size         int64 // the whole file, trailer included
	mtime, ctime unix.Timespec
}

// mapping is one read-only map of a file, shared by every value Get
// returns for it and verified once, when it is made. It is unmapped when
// the last of those values is closed; the next Get maps and verifies the
// file again.
type mapping struct {
	id    fileID
	ready chan struct{} // closed once mem, trailer and err are set; they do not change after

	mem     []byte           // the whole file, trailer included
	trailer payload.Checksum // the checksum the file ends with (with verification: that its encoding hashes to)
	err     error            // the file is unusable: not mapped, or its encoding does not hash to its trailer

	refs int // values (and waiters) holding it; guarded by Store.mu
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// encoding is the mapped file without its trailer.
func (m *mapping) encoding() []byte {
	n := len(m.mem) - trailerSize
	return m.mem[:n:n]
}

// acquire returns obj's file mapped, with one reference for the caller to
// release. A file this Store has mapped already, unchanged, is not mapped
// or hashed again; concurrent first Gets of a file share one hash.
func (s *Store) acquire(ctx context.Context, obj payload.ObjectID, want int64) (*mapping, error) {
	if err := obj.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := s.path(obj)
	f, err := openFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v", payload.ErrNotFound, obj)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("shm: stat: %w", err)
	}
	if size := st.Size - int64(trailerSize); size < payload.PreludeSize || size != want {
		return nil, fmt.Errorf("%w: %v holds %d bytes, want %d", payload.ErrCorrupt, obj, size, want)
	}
	id := idOf(&st)

	s.mu.Lock()
	if m := s.maps[id]; m != nil {
		m.refs++
		s.mu.Unlock()
		select {
		case <-m.ready:
		case <-ctx.Done():
			s.release(m)
			return nil, ctx.Err()
		}
		if m.err != nil {
			s.release(m)
			return nil, m.err
		}
		return m, nil
	}
	m := &mapping{id: id, ready: make(chan struct{}), refs: 1}
	if s.maps == nil {
		s.maps = make(map[fileID]*mapping)
	}
	s.maps[id] = m
	_, hashed := s.recv[id]
	delete(s.recv, id)
	s.mu.Unlock()

	// Map and hash outside the lock; later Gets of this file wait on ready.
	m.err = s.mapVerified(m, f, obj, hashed)
	if m.err != nil {
		s.mu.Lock()
		if s.maps[id] == m {
			delete(s.maps, id) // the next Get tries again
		}
		s.mu.Unlock()
	}
	close(m.ready)
	if m.err != nil {
		s.release(m)
		return nil, m.err
	}
	return m, nil
}

// sumOf hashes mem, a mapping of a file that its owner may cut short
// meanwhile: a read past the file's new end faults (SIGBUS), which is then
// an error, not the end of the process.
func sumOf(mem []byte) (sum payload.Checksum, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the file changed while it was hashed (%v)", r)
		}
	}()
	return payload.Checksum(blake3.Sum256(mem)), nil
}

// mapVerified maps f into m and reads its trailer; with verification, it
// hashes the encoding too (unless Receive hashed it as it wrote it), and
// removes a file whose encoding does not hash to its trailer (so that a
// writer can put the value in place again).
func (s *Store) mapVerified(m *mapping, f *os.File, obj payload.ObjectID, hashed bool) error {
	mem, err := unix.Mmap(int(f.Fd()), 0, int(m.id.size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("shm: mmap: %w", err)
	}
	m.mem = mem
	copy(m.trailer[:], mem[len(mem)-trailerSize:])
	if !s.verifyData || hashed {
		return nil
	}
	s.hashes.Add(1)
	got, err := sumOf(m.encoding())
	if err != nil {
		return fmt.Errorf("%w: %v: %v", payload.ErrCorrupt, obj, err)
	}
	if got != m.trailer {
		s.removeIfSame(s.path(obj), m.id)
		return fmt.Errorf("%w: %v hashes to %v, its trailer says %v", payload.ErrCorrupt, obj, got, m.trailer)
	}
	return nil
}

// release drops a reference to m and unmaps it with the last one.
func (s *Store) release(m *mapping) error {
	s.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last && s.maps[m.id] == m {
		delete(s.maps, m.id)
	}
	s.mu.Unlock()
	if !last || m.mem == nil {
		return nil
	}
	return unix.Munmap(m.mem)
}

// removeIfSame removes the file at path if it is still the file id names
// (not one written under the name since).
func (s *Store) removeIfSame(path string, id fileID) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Dev != id.dev || st.Ino != id.ino {
		return
	}
	if os.Remove(path) == nil {
		s.mu.Lock()
		s.used = max(0, s.used-id.size)
		s.mu.Unlock()
	}
}

// maxReceived bounds the files Receive remembers as hashed; past it they
// are forgotten, and hashed at their first map like any other.
const maxReceived = 64

// noteReceived remembers the file Receive just put in place at path, whose
// bytes it hashed as it wrote them: the Get that follows (the router's,
// right after) maps it without a second pass. Any change to the file
// (another file under the name, a write, a chmod) makes it another fileID,
// which is hashed.
func (s *Store) noteReceived(path string) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return
	}
	s.mu.Lock()
	if s.recv == nil || len(s.recv) >= maxReceived {
		s.recv = make(map[fileID]struct{})
	}
	s.recv[idOf(&st)] = struct{}{}
	s.mu.Unlock()
}
