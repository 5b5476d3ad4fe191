package shm

// Attacks on the proofs (proof.go) by another local user and by a buggy
// process of the store's user, as a review wrote them against the first
// version of the proofs, where each one broke.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/embcache/embcache/payload"
	"golang.org/x/sys/unix"
)

const otherUID = 4242 // "another local user"

// openAs opens path with the access rights of uid (its fsuid, on this
// thread only: root loses its file capabilities while fsuid is not 0).
func openAs(t *testing.T, uid int, path string, flags int) int {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Setfsuid(uid)
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	unix.Setfsuid(0)
	if err != nil {
		t.Fatalf("open %s as uid %d: %v", path, uid, err)
	}
	return fd
}

// letOthersIn lets every user search the store's directory and obj's
// tenant's, as an earlier version's were (0755; they are the owner's only
// since): the proofs must hold for a file another user can reach, as the
// members of a WithGroup group can.
func letOthersIn(t *testing.T, s *Store, obj payload.ObjectID) {
	t.Helper()
	for _, d := range []string{s.Dir(), filepath.Dir(s.Path(obj))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// flipThroughMapping flips a bit of the byte at off through a writable
// shared mapping of fd, as any process that may open the file for writing
// can (or a memory error under tmpfs would), and checks that the file's
// times did not move (tmpfs does not stamp writes through a mapping).
func flipThroughMapping(t *testing.T, fd int, off int64) {
	t.Helper()
	var before, after unix.Stat_t
	if err := unix.Fstat(fd, &before); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, int(before.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	mem[off] ^= 1
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(fd, &after); err != nil {
		t.Fatal(err)
	}
	if idOf(&before) != idOf(&after) {
		t.Fatalf("a write through a mapping moved the file's times: %+v -> %+v", idOf(&before), idOf(&after))
	}
}

// mustNotServe fails the test if Get served a value (and says whether its
// bytes were the changed ones).
func mustNotServe(t *testing.T, what string, got *payload.Value, err error, want []byte) {
	t.Helper()
	if err == nil {
		defer got.Close()
		changed := !bytes.Equal(got.Tensor.Data, want)
		t.Fatalf("%s: served a value (its bytes differ from the value put: %v), want ErrCorrupt", what, changed)
	}
	if !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("%s: %v, want ErrCorrupt", what, err)
	}
}

// TestAnotherUsersFileIsHashedAtEveryMap: another user's file is never proved, in this process or on the node: its owner can change it through a writable mapping, which moves no time. What broke before:
// docs 2.3 says
// "a file or proof of another user is hashed by the reader itself", but the
// in-process LRU keeps a proof of ANY file it hashed, whoever owns it. The
// other user (who owns the file, e.g. in a squatted tenant directory, with
// the genuine bytes copied in) then changes it through a writable shared
// mapping, which moves no time, and this process serves the changed bytes
// at its next Get after its mapping went (before this commit it hashed
// again). Severity: wrong value served.
func TestAnotherUsersFileIsHashedAtEveryMap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a file to another user")
	}
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir)
	v := testValue(10_000)
	loc, err := s.Put(ctx, obj(40), v)
	if err != nil {
		t.Fatal(err)
	}
	path := s.Path(obj(40))
	letOthersIn(t, s, obj(40))
	// The other user's file, with the genuine bytes, writable by them.
	if err := os.Chown(path, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	got.Close() // the mapping goes
	if n := s.hashes.Load(); n != 1 {
		t.Fatalf("another user's file: %d hashes, want 1", n)
	}
	fd := openAs(t, otherUID, path, unix.O_RDWR)
	defer unix.Close(fd)
	flipThroughMapping(t, fd, loc.Size-1)
	got, err = s.Get(ctx, loc)
	mustNotServe(t, "another user's file changed after this process hashed it", got, err, v.Tensor.Data)
}

// TestAWritableFileIsNeverProved: a file whose mode lets anyone write it is never proved. What broke before:
// a node proof is
// trusted when the file is owned by the reader's user, whatever its mode.
// A file of this user made writable to others (chmod by the owner, which
// docs 2.3 allows: "files 0444, which their owner may make writable
// again") is proved by its next reader; then ANOTHER user changes it
// through a writable mapping (no time moves), and every new process on the
// node serves the changed bytes, trusting the node proof. Before this
// commit each process hashed at its first map. Severity: wrong value
// served (needs the file writable by others).
func TestAWritableFileIsNeverProved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as another user")
	}
	ctx := context.Background()
	dir := testDir(t)
	writer, _ := Open(dir)
	v := testValue(10_000)
	loc, err := writer.Put(ctx, obj(41), v)
	if err != nil {
		t.Fatal(err)
	}
	path := writer.Path(obj(41))
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	reader, _ := Open(dir)
	got, err := reader.Get(ctx, loc) // hashes (the chmod moved the ctime) and proves it on the node
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
	letOthersIn(t, reader, obj(41))
	fd := openAs(t, otherUID, path, unix.O_RDWR) // any user may: the mode says so
	defer unix.Close(fd)
	flipThroughMapping(t, fd, loc.Size-1)
	fresh, _ := Open(dir) // a new process
	got, err = fresh.Get(ctx, loc)
	mustNotServe(t, "a file another user changed through a mapping", got, err, v.Tensor.Data)
}

// TestSweepFollowsNoLinkOutOfTheStore: a store whose .proofs is a link is refused, and Sweep follows none planted later. What broke before:
// another local user
// who made the store directory first (docs 2.3 names this case) plants
// <dir>/.proofs as a link to a directory of the store's user. Sweep's new
// proofs.sweep follows it and removes every file one level down whose
// "value" <dir>/<sub>/<name> does not exist: here the victim's
// .ssh/authorized_keys. (proofs.write and forget follow such links too.)
// Severity: arbitrary file deletion as the store's user (worse than a
// wrong value).
func TestSweepFollowsNoLinkOutOfTheStore(t *testing.T) {
	dir := testDir(t)
	home := t.TempDir() // the store user's home
	precious := filepath.Join(home, ".ssh", "authorized_keys")
	if err := os.MkdirAll(filepath.Dir(precious), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(precious, []byte("ssh-ed25519 AAAA... me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(home, filepath.Join(dir, proofDir)); err != nil { // the squatter's link
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Lchown(filepath.Join(dir, proofDir), otherUID, otherUID)
		os.Chown(dir, otherUID, otherUID)
		os.Chmod(dir, 0o777)
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("a store whose .proofs is a link opened")
	}
	// Planted after Open: Sweep does not follow it either. (The squatter's
	// directory itself is refused since: the store's own from here on.)
	os.Remove(filepath.Join(dir, proofDir))
	os.Chown(dir, os.Geteuid(), os.Getegid())
	os.Chmod(dir, 0o700)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, proofDir))
	if err := os.Symlink(home, filepath.Join(dir, proofDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("Sweep removed a file outside the store, through a link in it: %v", err)
	}
}

// TestAStoreWhoseTmpIsALinkIsRefused: a store whose .tmp is a link is refused. What broke before:
// the same for
// <dir>/.tmp, whose files Sweep removes when unlocked and a minute old.
// NOT from 26a85d0 (pre-existing), noted because it is the same hole.
// Severity: arbitrary file deletion as the store's user.
func TestAStoreWhoseTmpIsALinkIsRefused(t *testing.T) {
	dir := testDir(t)
	home := t.TempDir()
	precious := filepath.Join(home, "thesis.tex")
	if err := os.WriteFile(precious, []byte("years of work"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(precious, old, old)
	if err := os.Symlink(home, filepath.Join(dir, tmpDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("a store whose .tmp is a link opened")
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("a file outside the store was removed, through a link in it: %v", err)
	}
}

// TestAFileOpenForWritingIsNotProved: a file someone has open for writing while it is hashed (a write under way) is served as hashed but not proved: the hash holds a read lease, which the kernel grants only while nobody has the file open for writing. What broke before:
// the proof rests on "a
// change made after a stat gets a ctime of its own". But write(2) on tmpfs
// stamps the ctime BEFORE it copies the bytes (shmem_file_write_iter:
// file_update_time, then generic_perform_write), so a stat taken while a
// write is under way already names the version after the write, while the
// file still holds the bytes from before. A first reader that stats, hashes
// the old bytes (they match) and stats again (nothing moved) proves that
// version; the write then lands and moves nothing, and every process on the
// node serves the changed bytes without hashing. Here the write is held
// mid-copy, deterministically, by a userfaultfd on its source buffer; in
// real life any write whose copy outlasts a reader's stat-hash-stat (a big
// write, a source page to fault in, preemption) does it. The writer is a
// buggy process of the store's user changing the file through the file
// system, which the threat model covers. Severity: wrong value served.
func TestAFileOpenForWritingIsNotProved(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	writer, _ := Open(dir)
	v := testValue(10_000)
	loc, err := writer.Put(ctx, obj(45), v)
	if err != nil {
		t.Fatal(err)
	}
	path := writer.Path(obj(45))
	off := loc.Size - 1 // the last byte of the data
	old := make([]byte, 1)
	if f, err := os.Open(path); err != nil {
		t.Fatal(err)
	} else {
		f.ReadAt(old, off)
		f.Close()
	}
	// The buggy process: makes the file writable (as its owner may) and
	// writes one changed byte, from a buffer the kernel must fault in.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	page := os.Getpagesize()
	uffd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
	if errno != 0 {
		t.Skip("no userfaultfd:", errno)
	}
	defer unix.Close(int(uffd))
	ioctl := func(req uintptr, arg unsafe.Pointer) error {
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uffd, req, uintptr(arg)); errno != 0 {
			return errno
		}
		return nil
	}
	const (
		uffdioAPI      = 0xC018AA3F
		uffdioRegister = 0xC020AA00
		uffdioCopy     = 0xC028AA03
	)
	api := [3]uint64{0xAA, 0, 0}
	if err := ioctl(uffdioAPI, unsafe.Pointer(&api[0])); err != nil {
		t.Skip("UFFDIO_API:", err)
	}
	src, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(src)
	srcAddr := uintptr(unsafe.Pointer(unsafe.SliceData(src))) // not touched: its page is missing
	reg := [4]uint64{uint64(srcAddr), uint64(page), 1 /* MODE_MISSING */, 0}
	if err := ioctl(uffdioRegister, unsafe.Pointer(&reg[0])); err != nil {
		t.Skip("UFFDIO_REGISTER:", err)
	}

	var before unix.Stat_t
	unix.Fstat(fd, &before)
	wrote := make(chan error, 1)
	go func() {
		_, _, errno := unix.Syscall6(unix.SYS_PWRITE64, uintptr(fd), srcAddr, 1, uintptr(off), 0, 0)
		if errno != 0 {
			wrote <- errno
			return
		}
		wrote <- nil
	}()
	// Wait until the write is stuck copying its byte.
	pfd := []unix.PollFd{{Fd: int32(uffd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 5000); err != nil || n != 1 {
		t.Fatalf("the write never faulted on its buffer: %v", err)
	}
	var msg [32]byte
	if _, err := unix.Read(int(uffd), msg[:]); err != nil {
		t.Fatal(err)
	}
	var during unix.Stat_t
	unix.Fstat(fd, &during)
	if during.Ctim == before.Ctim {
		t.Fatal("the write had not stamped the file yet (the premise of this test)")
	}

	// A first reader of this version: stat, hash (old bytes: they match),
	// stat again (unchanged), proof on the node.
	reader, _ := Open(dir)
	got, err := reader.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	got.Close()
	if n := reader.hashes.Load(); n != 1 {
		t.Fatalf("the first reader of the written version hashed %d times, want 1", n)
	}

	// The write's byte arrives.
	fill := make([]byte, page)
	fill[0] = old[0] ^ 1
	cp := [5]uint64{uint64(srcAddr), uint64(uintptr(unsafe.Pointer(&fill[0]))), uint64(page), 0, 0}
	if err := ioctl(uffdioCopy, unsafe.Pointer(&cp[0])); err != nil {
		t.Fatal("UFFDIO_COPY:", err)
	}
	runtime.KeepAlive(fill)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	var after unix.Stat_t
	unix.Fstat(fd, &after)
	if idOf(&after) != idOf(&during) {
		t.Log("the write's end moved the file's times: the proof should not hold")
	}

	fresh, _ := Open(dir) // a new process
	got, err = fresh.Get(ctx, loc)
	mustNotServe(t, "a file whose write was in flight when it was proved", got, err, v.Tensor.Data)
}
