package shm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
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

var _ payload.Transport = (*Store)(nil)
