package shm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

// Put writes v under obj. An object already present with v's bytes is left
// as it is, but put again: its times move to now, which gives it a new
// Generation (payload.Transport); one with other bytes is replaced. Over the
// budget, or when tmpfs is full, the error wraps payload.ErrNoSpace and
// nothing is left behind.
func (s *Store) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	if err := obj.Validate(); err != nil {
		return payload.Location{}, err
	}
	header, err := payload.Header(v)
	if err != nil {
		return payload.Location{}, err
	}
	data := v.Tensor.Data
	size := int64(len(header) + len(data))
	hasher := blake3.New()
	hasher.Write(header)
	hasher.Write(data)
	var sum payload.Checksum
	hasher.Sum(sum[:0])
	// Present already with these bytes: nothing to write. Present with
	// other bytes (a value of the key from before an invalidation, which
	// may not be served): replaced.
	if s.keep(ctx, obj, size, sum) {
		return s.location(obj, size, sum), nil
	}
	if err := ctx.Err(); err != nil {
		return payload.Location{}, err
	}
	err = s.write(ctx, obj, size, sum, func(f *os.File) error {
		for _, p := range [][]byte{header, data, sum[:]} {
			if _, err := f.Write(p); err != nil {
				return err
			}
		}
		return nil
	})
	return s.placed(obj, size, sum, err)
}

// placed is the Location after a write: of the file written, or of the
// same bytes another writer put in place first.
func (s *Store) placed(obj payload.ObjectID, size int64, sum payload.Checksum, err error) (payload.Location, error) {
	if err != nil {
		return payload.Location{}, err
	}
	return s.location(obj, size, sum), nil
}

// Receive stores under obj the encoding read from r: size bytes whose
// BLAKE3 must be sum, such as the body of a pull from another node. The
// bytes are hashed as they are written, in one pass, and the file is put
// in place only if they hash to sum and decode; else the error wraps
// payload.ErrCorrupt (a short r too) and nothing is left behind. An object
// present already with checksum sum is left as it is, put again (as by
// Put), and r is not read; one with other bytes is replaced.
// Budget and tmpfs limits are as for Put.
func (s *Store) Receive(ctx context.Context, obj payload.ObjectID, size int64, sum payload.Checksum, r io.Reader) (payload.Location, error) {
	if err := obj.Validate(); err != nil {
		return payload.Location{}, err
	}
	if size < payload.PreludeSize {
		return payload.Location{}, fmt.Errorf("%w: %d bytes, shorter than a prelude", payload.ErrCorrupt, size)
	}
	if s.keep(ctx, obj, size, sum) {
		return s.location(obj, size, sum), nil
	}
	err := s.write(ctx, obj, size, sum, func(f *os.File) error {
		got, err := copyHashing(ctx, f, r, size)
		if err != nil {
			return err
		}
		if got != sum {
			return fmt.Errorf("%w: received bytes hash to %v, want %v", payload.ErrCorrupt, got, sum)
		}
		if _, err := f.Write(sum[:]); err != nil {
			return err
		}
		return decodes(f, size)
	})
	return s.placed(obj, size, sum, err)
}

// Receive's chunks: how much is read at a time (it stays in the CPU cache
// between its read, its write and its hash), and how many are in flight.
const (
	receiveChunk  = 256 << 10
	receiveChunks = 4
)

// copyHashing copies size bytes from r to w and returns their BLAKE3. The
// hash of a chunk runs on its own goroutine while the next chunks are read
// and written: hashing costs more than either copy, and another core can
// take it. A short r is payload.ErrCorrupt.
func copyHashing(ctx context.Context, w io.Writer, r io.Reader, size int64) (payload.Checksum, error) {
	chunks := min(receiveChunks, int((size+receiveChunk-1)/receiveChunk))
	free, full := make(chan []byte, chunks), make(chan []byte, chunks)
	for range chunks {
		free <- make([]byte, min(size, receiveChunk))
	}
	summed := make(chan payload.Checksum)
	go func() {
		hasher := blake3.New()
		for b := range full {
			hasher.Write(b)
			free <- b[:cap(b)]
		}
		var sum payload.Checksum
		hasher.Sum(sum[:0])
		summed <- sum
	}()
	err := func() error {
		for off := int64(0); off < size; {
			buf := <-free // hashed and written: no one reads it any more
			n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("%w: body ended after %d of %d bytes: %w", payload.ErrCorrupt, off+int64(n), size, err)
			}
			full <- buf[:n] // the hash and the write only read it
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			off += int64(n)
		}
		return nil
	}()
	close(full)
	sum := <-summed
	return sum, err
}

// decodes checks that the first size bytes of f are a canonical encoding.
// It maps them: Decode reads the header only, so the data is not touched.
func decodes(f *os.File, size int64) error {
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("shm: mmap: %w", err)
	}
	defer unix.Munmap(m)
	_, err = payload.Decode(m)
	return err
}

// keep puts again obj's file if it holds the encoding of size bytes whose
// BLAKE3 is sum, and reports whether it did: a Put that finds its bytes
// there writes nothing. Its trailer is not taken on its word: the file
// version must have a proof of sum (the writer's, or its first reader's),
// or hash to it now; one that does not (changed in place) is removed, and
// the caller writes the value anew.
func (s *Store) keep(ctx context.Context, obj payload.ObjectID, size int64, sum payload.Checksum) bool {
	final := s.path(obj)
	f, err := lockValue(ctx, final)
	if err != nil {
		return false
	}
	defer f.Close()
	old, oldSum, st, ok := stored(f)
	if !ok || old != size || oldSum != sum {
		return false
	}
	if proved, ok := s.proofs.find(obj, idOf(&st)); !ok || proved != sum {
		h := blake3.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
			return false
		}
		if payload.Checksum(h.Sum(nil)) != sum {
			if os.Remove(final) == nil {
				s.proofs.forget(obj, st.Ino)
				s.mu.Lock()
				s.used = max(0, s.used-st.Size)
				s.mu.Unlock()
			}
			return false
		}
	}
	return putAgain(f, final, &st)
}

// putAgain moves the times of the locked file f (under path; st is its
// state before) to now, and reports whether its ctime moved: a new
// generation (payload.Generation), so a delete of the generation seen
// before leaves it, and a value put again counts as new for a sweep's minimum
// age (coordinator.WithPayloadSweep). A kernel that stamps file times by
// clock tick may give a change in the tick of the last one the same
// ctime: it is tried again in the next tick. A file whose times cannot
// be moved (another user's) is not put again: the caller writes the
// value anew.
func putAgain(f *os.File, path string, st *unix.Stat_t) bool {
	now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
	for range 3 {
		// By name: f is locked and still under it (lockValue), and every
		// change of what the name holds waits for the lock.
		if unix.UtimesNanoAt(unix.AT_FDCWD, path, now, unix.AT_SYMLINK_NOFOLLOW) != nil {
			return false
		}
		var after unix.Stat_t
		if unix.Fstat(int(f.Fd()), &after) != nil {
			return false
		}
		if after.Ctim != st.Ctim {
			return true
		}
		var tick unix.Timespec
		unix.ClockGetres(unix.CLOCK_REALTIME_COARSE, &tick)
		time.Sleep(time.Duration(tick.Nano()))
	}
	return false
}

// write reserves the budget for a file of the encoding of size bytes
// whose BLAKE3 is sum (and its trailer) and puts in place as obj's file
// the file fill writes (into a temp file, preallocated), with its proof:
// fill wrote every byte of it. A file that is there by then stands if it
// holds the same bytes (its writer proved it), put again (putAgain), and
// is replaced if not (a value of the key from before an invalidation,
// say: the caller's value is what its Location must name).
func (s *Store) write(ctx context.Context, obj payload.ObjectID, size int64, sum payload.Checksum, fill func(*os.File) error) error {
	p, written, err := s.put(ctx, s.path(obj), size, sum, fill)
	if written && p.id != (fileID{}) {
		s.proofs.add(obj, p)
	}
	return err
}

// put is write but for keeping the proof, which it returns. written is
// false when nothing new stays on disk: an error, or another writer put
// the same bytes in place first.
func (s *Store) put(ctx context.Context, final string, size int64, sum payload.Checksum, fill func(*os.File) error) (p proof, written bool, err error) {
	fileSize := size + int64(trailerSize)
	s.mu.Lock()
	if s.used+fileSize > s.maxBytes {
		used := s.used
		s.mu.Unlock()
		return proof{}, false, fmt.Errorf("%w: %d bytes used, %d more exceed the budget of %d", payload.ErrNoSpace, used, fileSize, s.maxBytes)
	}
	s.used += fileSize
	s.mu.Unlock()
	defer func() {
		if !written {
			s.mu.Lock()
			s.used -= fileSize
			s.mu.Unlock()
		}
	}()
	if err := s.tenantDir(filepath.Base(filepath.Dir(final))); err != nil {
		return proof{}, false, err
	}
	tmp, err := os.CreateTemp(filepath.Join(s.dir, tmpDir), strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return proof{}, false, fmt.Errorf("shm: %w", err)
	}
	// Locked while it is written and put in place: Sweep removes only a
	// temp file nobody holds (a writer that died: the kernel drops its
	// lock), whatever pid namespace the writer ran in.
	defer tmp.Close()
	defer func() {
		if err != nil || !written {
			os.Remove(tmp.Name())
		}
	}()
	if err := unix.Flock(int(tmp.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return proof{}, false, fmt.Errorf("shm: locking the temp file: %w", err)
	}
	if err := unix.Fallocate(int(tmp.Fd()), 0, 0, fileSize); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return proof{}, false, fmt.Errorf("%w: tmpfs: %w", payload.ErrNoSpace, err)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return proof{}, false, fmt.Errorf("shm: fallocate: %w", err)
		}
	}
	if err := fill(tmp); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return proof{}, false, fmt.Errorf("%w: tmpfs: %w", payload.ErrNoSpace, err)
		}
		return proof{}, false, fmt.Errorf("shm: %w", err)
	}
	// Read-only (a proof needs it: docs/protocol.md 2.3), and for the
	// owner only unless WithGroup.
	if s.group != localdir.NoGroup {
		if err := tmp.Chown(-1, s.group); err != nil {
			return proof{}, false, fmt.Errorf("shm: %w", err)
		}
	}
	if err := tmp.Chmod(fs.FileMode(localdir.FileMode(s.group))); err != nil {
		return proof{}, false, fmt.Errorf("shm: %w", err)
	}
	// No fsync: tmpfs has nothing to sync, and the file is a cache entry.
	for {
		err = unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
		if !errors.Is(err, unix.EEXIST) {
			if err != nil {
				return proof{}, false, fmt.Errorf("shm: rename into place: %w", err)
			}
			return placedProof(tmp, sum)
		}
		old, err := lockValue(ctx, final)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if ctx.Err() != nil {
			return proof{}, false, fmt.Errorf("shm: %w", err)
		}
		if err != nil {
			// No value file (a directory, a FIFO, a link): replaced (a
			// directory fails the rename).
			return s.replace(tmp, final, sum, -1)
		}
		oldSize, oldSum, st, ok := stored(old)
		if ok && oldSize == size && oldSum == sum && putAgain(old, final, &st) {
			old.Close()
			return proof{}, false, nil // another writer put these bytes in place first
		}
		// Other bytes got there first: ours replace them, under the old
		// file's lock.
		p, written, err = s.replace(tmp, final, sum, st.Size)
		old.Close()
		return p, written, err
	}
}

// replace renames tmp over final, whose value file of oldSize bytes (-1:
// none) it replaces. Readers that mapped the old file keep its bytes (its
// inode).
func (s *Store) replace(tmp *os.File, final string, sum payload.Checksum, oldSize int64) (p proof, written bool, err error) {
	if err := os.Rename(tmp.Name(), final); err != nil {
		return proof{}, false, fmt.Errorf("shm: rename into place: %w", err)
	}
	if oldSize >= 0 {
		s.mu.Lock()
		s.used = max(0, s.used-oldSize)
		s.mu.Unlock()
	}
	return placedProof(tmp, sum)
}

// placedProof is the proof of the file f that put has just put in place
// (its own descriptor: the name may already be another writer's file).
func placedProof(f *os.File, sum payload.Checksum) (p proof, written bool, err error) {
	p.at = coarseNow() // before the stat: see proof.at
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return proof{}, true, nil // in place, unproved: its first reader hashes it
	}
	p.id, p.sum = idOf(&st), sum
	return p, true, nil
}
