package shm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"time"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

// fileID names one version of a file: a file replaced under its name, or
// changed in place (which moves its ctime), is another file, and is mapped
// and verified afresh.
type fileID struct {
	dev, ino     uint64
	size         int64 // the whole file, trailer included
	uid, mode    uint32
	mtime, ctime unix.Timespec
}

// mapping is one read-only map of a file, shared by every value Get
// returns for it and verified when it is made (by a proof, or by hashing
// the file). It is unmapped when the last of those values is closed.
type mapping struct {
	id    fileID
	ready chan struct{} // closed once mem, trailer and err are set; they do not change after

	mem     []byte           // the whole file, trailer included
	trailer payload.Checksum // the checksum the file ends with (with verification: that its encoding hashes to)
	err     error            // the file is unusable: not mapped, or its encoding does not hash to its trailer

	refs int // values (and waiters) holding it; guarded by Store.mu
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, uid: st.Uid, mode: st.Mode, mtime: st.Mtim, ctime: st.Ctim}
}

// encoding is the mapped file without its trailer.
func (m *mapping) encoding() []byte {
	n := len(m.mem) - trailerSize
	return m.mem[:n:n]
}

// acquire returns obj's file mapped, with one reference for the caller to
// release. A file this Store has mapped already, unchanged, is not mapped
// again; concurrent first Gets of a file share one map and check.
func (s *Store) acquire(ctx context.Context, obj payload.ObjectID, want int64) (*mapping, error) {
	if err := obj.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	at := coarseNow() // before the stat: see proof.at
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
	s.mu.Unlock()

	// Map and check outside the lock; later Gets of this file wait on ready.
	m.err = s.mapVerified(m, f, obj, at)
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

// mapVerified maps f into m and reads its trailer. With verification, a
// file version with a proof (this process's or the node's) is not hashed;
// any other is hashed, and removed if it does not match its trailer (so
// that a writer can put the value in place again). It is proved if it
// matches, may be proved (proofs.provable), and nobody had it open for
// writing from before the hash to after it: a read lease, which the
// kernel grants only while no one has the file open for writing (a write
// under way, a writable mapping), and breaks when someone opens it so. at
// is the coarse clock before m.id's stat.
func (s *Store) mapVerified(m *mapping, f *os.File, obj payload.ObjectID, at unix.Timespec) error {
	mem, err := unix.Mmap(int(f.Fd()), 0, int(m.id.size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("shm: mmap: %w", err)
	}
	m.mem = mem
	copy(m.trailer[:], mem[len(mem)-trailerSize:])
	if !s.verifyData {
		return nil
	}
	if sum, ok := s.proofs.find(obj, m.id); ok && sum == m.trailer {
		return nil
	}
	s.hashes.Add(1)
	fd := int(f.Fd())
	leased := s.proofs.provable(m.id) && setLease(fd, unix.F_RDLCK) == nil
	if leased {
		defer setLease(fd, unix.F_UNLCK)
	}
	got, err := sumOf(m.encoding())
	if err != nil {
		return fmt.Errorf("%w: %v: %w", payload.ErrCorrupt, obj, err)
	}
	if got != m.trailer {
		s.removeIfSame(obj, m.id)
		return fmt.Errorf("%w: %v hashes to %v, its trailer says %v", payload.ErrCorrupt, obj, got, m.trailer)
	}
	// A file changed while it was hashed (a Put of the same bytes moves
	// its times), or opened for writing (which breaks the lease), is
	// served as hashed, but proves nothing: its next map hashes it again.
	if !leased {
		return nil
	}
	lease, err := unix.FcntlInt(uintptr(fd), unix.F_GETLEASE, 0)
	var st unix.Stat_t
	if err == nil && lease == unix.F_RDLCK && unix.Fstat(fd, &st) == nil && idOf(&st) == m.id {
		s.proofs.add(obj, proof{id: m.id, sum: got, at: at})
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

// removeWait bounds how long a reader waits to remove a corrupt file.
const removeWait = 100 * time.Millisecond

// removeIfSame removes obj's file if it is still the file version id
// names: not one written under the name since, nor the same file put
// again (which its next reader hashes afresh). A file whose lock someone
// holds for removeWait is left: its next reader finds it corrupt again.
func (s *Store) removeIfSame(obj payload.ObjectID, id fileID) {
	path := s.path(obj)
	ctx, cancel := context.WithTimeout(context.Background(), removeWait)
	defer cancel()
	f, err := lockValue(ctx, path)
	if err != nil {
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Dev != id.dev || st.Ino != id.ino || st.Ctim != id.ctime {
		return
	}
	if os.Remove(path) == nil {
		s.proofs.forget(obj, id.ino)
		s.mu.Lock()
		s.used = max(0, s.used-id.size)
		s.mu.Unlock()
	}
}

func setLease(fd, kind int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, kind)
	return err
}
