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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

// DefaultDir is where the store keeps its files unless told otherwise.
const DefaultDir = "/dev/shm/embcache"

const (
	tmpDir      = ".tmp"
	trailerSize = len(payload.Checksum{})
)

var (
	// ErrUnsafeDir is returned by Open, and by Put and Receive for a
	// tenant's directory, for a directory of the store another local user
	// could change: owned by another user, a link, writable by every user,
	// or by a group other than the store's (WithGroup), or below a
	// directory of another user's. The error names the directory and why;
	// the directory is left as it is. Such a user could have read what the
	// store's clients keep there and changed a value before its commit.
	ErrUnsafeDir = localdir.ErrUnsafe
	// ErrOtherGroup is returned by Open for a store directory of another
	// group than the store's (WithGroup; none without it): one that group
	// may write (it matches ErrUnsafeDir too), or one another process of
	// the store gave to its group (set-group-ID). Every process of one
	// store directory needs the same group: the one started last would
	// otherwise take the group's access away, or give it.
	ErrOtherGroup = localdir.ErrOtherGroup
)

// Store is the shm transport of one node. Several processes may share a
// directory; each Store accounts the bytes it sees at Open and what it
// writes or deletes itself.
type Store struct {
	dir        string
	node       string
	maxBytes   int64
	verifyData bool
	group      int // WithGroup's gid, or localdir.NoGroup

	proofs *proofs // which file versions are known to hash to their trailer

	mu   sync.Mutex
	used int64               // bytes of files in dir, as this Store knows them; guarded by mu
	maps map[fileID]*mapping // the files Get has mapped, while a value holds them; guarded by mu, lazily initialized

	hashes atomic.Int64 // files hashed by Get (for tests)
}

// Option configures a Store.
type Option func(*Store) error

// WithMaxBytes sets the byte budget; a Put past it is ErrNoSpace.
func WithMaxBytes(n int64) Option {
	return func(s *Store) error {
		if n <= 0 {
			return fmt.Errorf("shm: max bytes must be > 0, got %d", n)
		}
		s.maxBytes = n
		return nil
	}
}

// WithNode names the node in the Locations the store writes (default: the hostname).
func WithNode(node string) Option {
	return func(s *Store) error {
		if node == "" {
			return errors.New("shm: empty node name")
		}
		s.node = node
		return nil
	}
}

// WithVerifyData sets whether Get checks that a file's whole encoding
// hashes to its trailer, or only checks the trailer the writer left. On by
// default: a flipped byte, on tmpfs or by another process, is then a miss,
// never a hit. The hash is paid once per file version per node, by its
// writer or first reader, which leave a proof that later readers trust
// while the file is unchanged (docs/protocol.md section 2.3 has the threat
// model and the cost).
func WithVerifyData(on bool) Option {
	return func(s *Store) error { s.verifyData = on; return nil }
}

// WithGroup lets a group read the store's values: the processes of the
// node that map them and run as another user, such as vLLM's, which reach
// them through the node agent. group is a name or a number; this process
// must run as root or be a member of it. The store's directories are then
// 0750 and set-group-ID, of that group, and its files 0440. Without it
// (the default) they are the owner's only: directories 0700, files 0400.
// The store's temp files and proofs are the owner's only either way.
func WithGroup(group string) Option {
	return func(s *Store) error {
		gid, err := localdir.LookupGroup(group)
		if err != nil {
			return fmt.Errorf("shm: %w", err)
		}
		s.group = gid
		return nil
	}
}

// Open opens (creating if needed) the store in dir ("" means DefaultDir).
// The directory, and every directory in it, must be this process's own
// (ErrUnsafeDir, ErrOtherGroup: see there); Open gives them the modes of
// WithGroup (owner-only without it), which an earlier version of the
// store left more open (0755).
func Open(dir string, opts ...Option) (*Store, error) {
	if dir == "" {
		dir = DefaultDir
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	s := &Store{dir: abs, node: host, maxBytes: 1 << 62, verifyData: true, group: localdir.NoGroup}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	// A safe directory another process of the store gave its group (an
	// unsafe one is Make's to refuse).
	var st unix.Stat_t
	if unix.Lstat(abs, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == os.Geteuid() &&
		st.Mode&(unix.S_IWGRP|unix.S_IWOTH) == 0 && st.Mode&unix.S_ISGID != 0 && int(st.Gid) != s.group {
		want := "none"
		if s.group != localdir.NoGroup {
			want = strconv.Itoa(s.group)
		}
		return nil, fmt.Errorf("shm: %w: %s is of group %d (another process's --shm-group), this process's is %s: "+
			"give every process of the directory the same", ErrOtherGroup, abs, st.Gid, want)
	}
	if err := localdir.Make(abs, localdir.DirMode(s.group), s.group); err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	// Sweeps remove files in them: a link would lead them out of the
	// store (Make refuses one).
	for _, sub := range []string{tmpDir, proofDir} {
		if err := localdir.Make(filepath.Join(abs, sub), localdir.Private, localdir.NoGroup); err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
	}
	s.proofs = newProofs(abs)
	err = filepath.WalkDir(abs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == tmpDir || d.Name() == proofDir) {
			return filepath.SkipDir
		}
		if d.IsDir() && filepath.Dir(path) == abs { // a tenant's
			if err := localdir.Make(path, localdir.DirMode(s.group), s.group); err != nil {
				return err
			}
		}
		if !d.IsDir() {
			if info, err := d.Info(); err == nil {
				s.used += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("shm: scanning %s: %w", abs, err)
	}
	return s, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Group returns the gid WithGroup gave the store, or -1 (none).
func (s *Store) Group() int { return s.group }

// tenantDir makes the directory of tenant's values, if it is not made
// already.
func (s *Store) tenantDir(tenant string) error {
	d, mode := filepath.Join(s.dir, tenant), localdir.DirMode(s.group)
	if localdir.Made(d, mode, s.group) {
		return nil
	}
	if err := localdir.Make(d, mode, s.group); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}

// Node returns the node name its Locations carry (WithNode).
func (s *Store) Node() string { return s.node }

// Used returns the bytes the store accounts for.
func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Path returns the file obj is (or would be) stored in: the encoding of
// docs/protocol.md section 2 followed by its 32-byte checksum. A process on
// this node may map it read-only.
func (s *Store) Path(obj payload.ObjectID) string { return s.path(obj) }

func (s *Store) path(obj payload.ObjectID) string {
	return filepath.Join(s.dir, obj.Tenant, obj.Key.String())
}

func (s *Store) location(obj payload.ObjectID, size int64, sum payload.Checksum) payload.Location {
	return payload.Location{Transport: payload.TransportShm, Node: s.node, Address: s.dir,
		Object: obj.String(), Size: size, Checksum: sum}
}

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
				return fmt.Errorf("%w: body ended after %d of %d bytes: %v", payload.ErrCorrupt, off+int64(n), size, err)
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

// The lock of a value file. Every change of what a value's name holds
// is made under the lock of the file it holds (flock, exclusive): a Put
// that keeps the file (putAgain) or replaces it, a Delete, a reader's
// removal of a file that failed its hash. A delete conditional on the
// generation its caller saw, and a Put of the same bytes, are then one
// before the other: the Put gives the file a new generation before the
// delete looks (which leaves it), or finds no file after it and writes
// one. Readers take no lock.
//
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

// stored reads the encoded size, the trailer and the stat of the open
// value file f.
func stored(f *os.File) (size int64, sum payload.Checksum, st unix.Stat_t, ok bool) {
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Size < int64(trailerSize) {
		return 0, sum, st, false
	}
	size = st.Size - int64(trailerSize)
	if _, err := f.ReadAt(sum[:], size); err != nil {
		return 0, sum, st, false
	}
	return size, sum, st, true
}

// generationOf is the Generation of the file st describes: its inode and its
// ctime, which every change moves (a Put of the same bytes moves its
// times) and no user can set.
func generationOf(st *unix.Stat_t) payload.Generation {
	return payload.Generation{ID: st.Ino, Changed: st.Ctim.Nano()}
}

// errNotAFile is what openFile returns for something under a value's name
// that is not a regular file.
var errNotAFile = errors.New("not a value file")

// openFile opens a value file for reading: a regular file, never through
// a link, and without blocking (a FIFO under a value's name would hold an
// open until a writer came).
func openFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: %w (%v)", path, errNotAFile, fi.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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
			return proof{}, false, fmt.Errorf("%w: tmpfs: %v", payload.ErrNoSpace, err)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return proof{}, false, fmt.Errorf("shm: fallocate: %w", err)
		}
	}
	if err := fill(tmp); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return proof{}, false, fmt.Errorf("%w: tmpfs: %v", payload.ErrNoSpace, err)
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

// Get returns the value at loc over a read-only mapping of its file;
// Close on the value releases it. Values of the same file share one
// mapping. With verification on (the default, WithVerifyData) the BLAKE3
// of the whole encoding must equal the file's trailer, proved once per
// file version on the node (by its writer or first reader), and the
// trailer must be loc's checksum (so the bytes are checked against the
// record's checksum, not only against the file's own claim). A mismatch,
// or a size other than loc's, is payload.ErrCorrupt, never a value; a file
// whose data disagrees with its own trailer is removed, so that the value
// can be written again. A missing file is payload.ErrNotFound.
func (s *Store) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	if err := loc.Validate(); err != nil {
		return nil, err
	}
	if loc.Transport != payload.TransportShm || loc.Address != s.dir {
		return nil, fmt.Errorf("%w: %s at %q is not this store (%s)", payload.ErrInvalidLocation, loc.Transport, loc.Address, s.dir)
	}
	obj, _ := loc.ObjectID()
	m, err := s.acquire(ctx, obj, loc.Size)
	if err != nil {
		return nil, err
	}
	var v *payload.Value
	if m.trailer != loc.Checksum {
		err = fmt.Errorf("%w: %v: file checksum %v, location says %v", payload.ErrCorrupt, obj, m.trailer, loc.Checksum)
	} else {
		v, err = payload.Decode(m.encoding())
	}
	if err != nil {
		s.release(m)
		return nil, err
	}
	return payload.WithRelease(v, func() error { return s.release(m) }), nil
}

// Open maps obj's file and returns its encoding and the checksum its
// trailer records (what an httppull server serves). Close unmaps it.
func (s *Store) Open(ctx context.Context, obj payload.ObjectID) (*payload.Blob, error) {
	return s.open(ctx, obj)
}

func (s *Store) open(ctx context.Context, obj payload.ObjectID) (*payload.Blob, error) {
	if err := obj.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := openFile(s.path(obj))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %v", payload.ErrNotFound, obj)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	size := info.Size() - int64(trailerSize)
	if size < payload.PreludeSize {
		return nil, fmt.Errorf("%w: %v holds %d bytes, shorter than a prelude", payload.ErrCorrupt, obj, size)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(info.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	var sum payload.Checksum
	copy(sum[:], m[size:])
	return payload.NewBlob(m[:size:size], sum, func() error { return unix.Munmap(m) }), nil
}

// Generation returns the generation of loc's object's file (the zero
// Generation if there is none): its inode and ctime, which a Put of the
// same bytes moves too.
func (s *Store) Generation(_ context.Context, loc payload.Location) (payload.Generation, error) {
	obj, err := loc.ObjectID()
	if err != nil {
		return payload.Generation{}, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.path(obj), &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return payload.Generation{}, nil
		}
		return payload.Generation{}, fmt.Errorf("shm: %w", err)
	}
	return generationOf(&st), nil
}

// Delete removes the object's file if it is loc's (its trailer is loc's
// checksum) in generation seen: a file written or put again since is left
// (payload.Transport). Mappings of it stay valid until their values are
// closed (the kernel keeps an unlinked file while it is mapped). What is
// not a regular file is left (a Put replaces it).
func (s *Store) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	obj, err := loc.ObjectID()
	if err != nil {
		return err
	}
	path := s.path(obj)
	f, err := lockValue(ctx, path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotAFile) || errors.Is(err, unix.ELOOP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	defer f.Close()
	_, sum, st, ok := stored(f)
	if generationOf(&st) != seen || ok && sum != loc.Checksum {
		return nil // put again since, or another value of the key took its place
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("shm: %w", err)
	}
	s.proofs.forget(obj, st.Ino)
	s.mu.Lock()
	s.used = max(0, s.used-st.Size)
	s.mu.Unlock()
	return nil
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

var _ payload.Transport = (*Store)(nil)
