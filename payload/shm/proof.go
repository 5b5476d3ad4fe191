package shm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"

	"github.com/embcache/embcache/internal/localdir"
	"github.com/embcache/embcache/payload"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sys/unix"
)

// proofDir holds the node's proofs, one file per value:
// <dir>/.proofs/<tenant>/<keyhex> (tenant names never start with a dot).
const proofDir = ".proofs"

// A proof says that one version of a value's file (fileID) hashes to its
// trailer. Whoever read or wrote every byte of that version makes it: the
// writer, which hashed what it wrote, or a Get that hashed the mapping.
// Any change to the file through the file system (write, truncate,
// fallocate, chmod, chown, a file renamed over it) moves its ctime, which
// no user can set, so the proof no longer names the file and its next
// reader hashes it again (docs/protocol.md 2.3).
type proof struct {
	id  fileID
	sum payload.Checksum // the trailer the encoding hashes to
	// at is the kernel's coarse clock, read before the stat that gave id.
	// On a kernel that stamps file times by clock tick, a change in the
	// tick of id's ctime may keep that ctime: the proof holds only if a
	// tick had passed (at > ctime), so that any later change moves it.
	at unix.Timespec
}

// holds reports whether p proves the file version id. fine says the
// kernel gives a change made after a stat a ctime of its own, even within
// a tick (multigrain timestamps, Linux 6.13 on tmpfs).
func (p proof) holds(id fileID, fine bool) bool {
	return p.id == id && (fine || tsAfter(p.at, id.ctime))
}

func tsAfter(a, b unix.Timespec) bool {
	return a.Sec > b.Sec || a.Sec == b.Sec && a.Nsec > b.Nsec
}

// coarseNow reads the clock the kernel stamps file times with.
func coarseNow() unix.Timespec {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts)
	return ts
}

// proofs is where a Store keeps and finds proofs: in this process and on
// the node, as files beside the values that every process of this user
// trusts. Only a file of this user that nobody may write (mode without a
// write bit) is proved: its owner must change its mode, which moves its
// ctime, before writing to it, and nobody else can. Any other file is
// hashed whenever a process maps it afresh.
type proofs struct {
	dir  string // the store's directory
	euid uint32 // this process's: only files it owns, and node proofs it owns, are proved
	fine bool   // see proof.holds

	mine *lru.Cache[fileID, proof] // proved by this process
}

// provenFiles bounds the proofs a process keeps in memory; past it the
// oldest go, and a file whose node proof is gone too is hashed again.
const provenFiles = 4096

func newProofs(dir string) *proofs {
	mine, _ := lru.New[fileID, proof](provenFiles) // cannot fail: the size is positive
	return &proofs{dir: dir, euid: uint32(os.Geteuid()), fine: fineCtime(filepath.Join(dir, tmpDir)), mine: mine}
}

func (ps *proofs) path(obj payload.ObjectID) string {
	return filepath.Join(ps.dir, proofDir, obj.Tenant, obj.Key.String())
}

// provable reports whether file version id may be proved: this user's,
// and nobody may write it (another user's file could be changed by its
// owner through a mapping, which moves no time; so could one whose mode
// lets anyone write).
func (ps *proofs) provable(id fileID) bool {
	return id.uid == ps.euid && id.mode&0o222 == 0
}

// find returns the checksum proved for file version id of obj, from this
// process's proofs or the node's.
func (ps *proofs) find(obj payload.ObjectID, id fileID) (payload.Checksum, bool) {
	if !ps.provable(id) {
		return payload.Checksum{}, false
	}
	if p, ok := ps.mine.Get(id); ok && p.holds(id, ps.fine) {
		return p.sum, true
	}
	p, err := ps.read(obj)
	if err != nil || !p.holds(id, ps.fine) {
		return payload.Checksum{}, false
	}
	ps.mine.Add(id, p)
	return p.sum, true
}

// add records p for obj in this process and on the node, if its file
// may be proved. A node proof that cannot be written is no error: the
// file's next reader in another process hashes it.
func (ps *proofs) add(obj payload.ObjectID, p proof) {
	if !ps.provable(p.id) {
		return
	}
	ps.mine.Add(p.id, p)
	ps.write(obj, p)
}

// forget removes obj's node proof if it names inode ino (a file deleted or
// found corrupt), not a later file's.
func (ps *proofs) forget(obj payload.ObjectID, ino uint64) {
	if p, err := ps.read(obj); err == nil && p.id.ino == ino && ps.realDir(obj.Tenant) {
		os.Remove(ps.path(obj))
	}
}

// realDir reports whether the proofs' directory of tenant ("" for their
// root) is a directory, not a link to one: another user who made the
// store's directories first must not lead a sweep or a write out of it.
func (ps *proofs) realDir(tenant string) bool {
	dirs := []string{filepath.Join(ps.dir, proofDir)}
	if tenant != "" {
		dirs = append(dirs, filepath.Join(dirs[0], tenant))
	}
	for _, d := range dirs {
		var st unix.Stat_t
		if unix.Lstat(d, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return false
		}
	}
	return true
}

// sweep removes the node proofs whose value file is gone.
func (ps *proofs) sweep() {
	if !ps.realDir("") {
		return
	}
	root := filepath.Join(ps.dir, proofDir)
	tenants, _ := os.ReadDir(root)
	for _, t := range tenants {
		if !t.IsDir() { // a link is not followed
			continue
		}
		names, _ := os.ReadDir(filepath.Join(root, t.Name()))
		for _, n := range names {
			value := filepath.Join(ps.dir, t.Name(), n.Name())
			if _, err := os.Lstat(value); errors.Is(err, os.ErrNotExist) {
				os.Remove(filepath.Join(root, t.Name(), n.Name()))
			}
		}
	}
}

// A node proof's file: a magic, the fileID and at as little-endian
// integers, and the checksum.
const (
	proofMagic = "ecp1"
	proofSize  = len(proofMagic) + 12*8 + len(payload.Checksum{})
)

func (p proof) encode() []byte {
	b := make([]byte, 0, proofSize)
	b = append(b, proofMagic...)
	for _, n := range []uint64{p.id.dev, p.id.ino, uint64(p.id.size), uint64(p.id.uid),
		uint64(p.id.mtime.Sec), uint64(p.id.mtime.Nsec), uint64(p.id.ctime.Sec), uint64(p.id.ctime.Nsec),
		uint64(p.at.Sec), uint64(p.at.Nsec), uint64(p.id.mode), 0} {
		b = binary.LittleEndian.AppendUint64(b, n)
	}
	return append(b, p.sum[:]...)
}

var errNoProof = errors.New("shm: no valid proof")

func decodeProof(b []byte) (proof, error) {
	if len(b) != proofSize || string(b[:len(proofMagic)]) != proofMagic {
		return proof{}, errNoProof
	}
	var n [12]uint64
	for i := range n {
		n[i] = binary.LittleEndian.Uint64(b[len(proofMagic)+8*i:])
	}
	p := proof{id: fileID{dev: n[0], ino: n[1], size: int64(n[2]), uid: uint32(n[3]), mode: uint32(n[10]),
		mtime: unix.Timespec{Sec: int64(n[4]), Nsec: int64(n[5])},
		ctime: unix.Timespec{Sec: int64(n[6]), Nsec: int64(n[7])}},
		at: unix.Timespec{Sec: int64(n[8]), Nsec: int64(n[9])}}
	copy(p.sum[:], b[len(proofMagic)+12*8:])
	return p, nil
}

// read returns obj's node proof: a regular file, not a link, owned by this
// process's user (a file another user put there proves nothing).
func (ps *proofs) read(obj payload.ObjectID) (proof, error) {
	fd, err := unix.Open(ps.path(obj), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return proof{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return proof{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != ps.euid || st.Size != int64(proofSize) {
		return proof{}, errNoProof
	}
	var b [proofSize]byte
	if n, err := unix.Pread(fd, b[:], 0); err != nil || n != proofSize {
		return proof{}, errNoProof
	}
	return decodeProof(b[:])
}

// write puts p in place as obj's node proof, whole (a temp file renamed).
func (ps *proofs) write(obj payload.ObjectID, p proof) {
	final := ps.path(obj)
	if d := filepath.Dir(final); !localdir.Made(d, localdir.Private, localdir.NoGroup) {
		if localdir.Make(d, localdir.Private, localdir.NoGroup) != nil {
			return
		}
	}
	if !ps.realDir(obj.Tenant) {
		return
	}
	tmp, err := os.CreateTemp(filepath.Join(ps.dir, tmpDir), "proof-*")
	if err != nil {
		return
	}
	_, err = tmp.Write(p.encode())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), final)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}

// fineCtime reports whether files in dir get a new ctime for a change
// made right after a stat, even within a clock tick: eight writes, each
// after a stat, each seen. On a kernel that stamps by tick, eight in a row
// landing in different ticks is all but impossible (a tick is 1-10 ms, a
// round a few microseconds).
func fineCtime(dir string) bool {
	f, err := os.CreateTemp(dir, "probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(f.Name())
	defer f.Close()
	fd := int(f.Fd())
	var before, after unix.Stat_t
	for i := range 8 {
		if unix.Fstat(fd, &before) != nil {
			return false
		}
		if _, err := unix.Pwrite(fd, []byte{byte(i)}, 0); err != nil {
			return false
		}
		if unix.Fstat(fd, &after) != nil || after.Ctim == before.Ctim {
			return false
		}
	}
	return true
}
