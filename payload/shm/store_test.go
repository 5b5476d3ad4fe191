package shm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/internal/localdir/localdirtest"
	"github.com/embcache/embcache/payload"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// TestMain doubles as the helper process of the cross-process tests: with
// SHM_HELPER set, the test binary runs one helper and exits.
func TestMain(m *testing.M) {
	localdirtest.Main() // a child acting as another user
	if mode := os.Getenv("SHM_HELPER"); mode != "" {
		os.Exit(helper(mode))
	}
	goleak.VerifyTestMain(m)
}

func helper(mode string) int {
	var loc payload.Location
	if err := json.Unmarshal([]byte(os.Getenv("SHM_LOCATION")), &loc); err != nil {
		fmt.Println("bad location:", err)
		return 3
	}
	if mode == "flip" { // another process changes a byte of the file's data, as its owner can
		obj, _ := loc.ObjectID()
		path := filepath.Join(loc.Address, obj.Tenant, obj.Key.String())
		if err := flipFileByte(path, loc.Size-1); err != nil { // the last byte of the data
			fmt.Println(err)
			return 3
		}
		return 0
	}
	s, err := Open(loc.Address, WithVerifyData(true))
	if err != nil {
		fmt.Println(err)
		return 3
	}
	v, err := s.Get(context.Background(), loc)
	if err != nil {
		fmt.Println(err)
		return 3
	}
	defer v.Close()
	switch mode {
	case "hashes": // how many files this process hashed to serve the value
		fmt.Println(s.hashes.Load())
		return 0
	case "read":
		fmt.Printf("%x\n", v.Tensor.Data) // verified by the checksum above; printed for the parent to compare
		return 0
	case "write":
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				fmt.Println("faulted:", r)
				os.Exit(0)
			}
		}()
		v.Tensor.Data[0] ^= 0xff
		fmt.Println("wrote into a mapped value without a fault")
		return 1
	}
	return 3
}

// testDir is a fresh directory on tmpfs when the machine has one.
func testDir(t testing.TB) string {
	t.Helper()
	if dir, err := os.MkdirTemp("/dev/shm", "embcache-test-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return t.TempDir()
}

func testValue(n int) *payload.Value {
	data := make([]byte, n*4)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	return payload.NewTensor(cachekey.Float32, []int64{int64(n)}, data)
}

func obj(b byte) payload.ObjectID {
	return payload.ObjectID{Tenant: "acme", Key: cachekey.Key{b, 1, 2, 3}}
}

// deleteNow deletes the file at loc in the generation it is in now.
func deleteNow(s *Store, loc payload.Location) error {
	seen, err := s.Generation(context.Background(), loc)
	if err != nil {
		return err
	}
	return s.Delete(context.Background(), loc, seen)
}

func TestPutGet(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t), WithNode("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	loc, err := s.Put(ctx, obj(1), v)
	if err != nil {
		t.Fatal(err)
	}
	if loc.Transport != payload.TransportShm || loc.Node != "node-a" || loc.Size != v.Size() || loc.Validate() != nil {
		t.Fatalf("location %+v", loc)
	}
	sum, _ := payload.Sum(v)
	if loc.Checksum != sum {
		t.Fatal("location checksum is not the value's")
	}
	got, err := s.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) || got.Tensor.Shape[0] != 1000 {
		t.Fatal("value differs")
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
	if got.Close() != nil {
		t.Fatal("second Close failed")
	}
	if s.Used() != loc.Size+int64(trailerSize) {
		t.Fatalf("used %d", s.Used())
	}
}

func TestPutIsIdempotentUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(5000)
	locs := make([]payload.Location, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range locs {
		wg.Go(func() { locs[i], errs[i] = s.Put(ctx, obj(2), v) })
	}
	wg.Wait()
	for i := range locs {
		if errs[i] != nil || locs[i] != locs[0] {
			t.Fatalf("writer %d: %+v %v", i, locs[i], errs[i])
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(s.Dir(), tmpDir))
	if len(tmps) != 0 || s.Used() != v.Size()+int64(trailerSize) {
		t.Fatalf("%d temp files left, used %d", len(tmps), s.Used())
	}
	// A second store on the same directory sees the file and does not rewrite it.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if loc, err := s2.Put(ctx, obj(2), v); err != nil || loc.Checksum != locs[0].Checksum || s2.Used() != s.Used() {
		t.Fatalf("second store: %v %v", loc, err)
	}
}

func TestBudget(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t), WithMaxBytes(10_000))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, obj(1), testValue(1000)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Put(ctx, obj(2), testValue(2000))
	if !errors.Is(err, payload.ErrNoSpace) {
		t.Fatalf("over budget: %v", err)
	}
	if _, err := os.Stat(s.path(obj(2))); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused value left a file")
	}
	tmps, _ := os.ReadDir(filepath.Join(s.Dir(), tmpDir))
	if len(tmps) != 0 {
		t.Fatal("a refused value left a temp file")
	}
	loc, _ := s.Put(ctx, obj(1), testValue(1000))
	if err := deleteNow(s, loc); err != nil || s.Used() != 0 {
		t.Fatalf("delete: %v, used %d", err, s.Used())
	}
	if _, err := s.Put(ctx, obj(2), testValue(2000)); err != nil {
		t.Fatalf("after delete: %v", err)
	}
}

// flipByte flips the bit 0 of the byte at off in the file at path (made
// writable for it), as a bit flip on tmpfs or another process would.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	if err := flipFileByte(path, off); err != nil {
		t.Fatal(err)
	}
}

// flipFileByte changes the byte at off of a value file in place, as its
// owner can: made writable, written, made read-only again.
func flipFileByte(path string, off int64) error {
	if err := os.Chmod(path, 0o644); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		return err
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b, off); err != nil {
		return err
	}
	return os.Chmod(path, 0o444)
}

// TestCorruption: what the trailer check alone catches (the checks every
// Get makes, verifying or not).
func TestCorruption(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir, WithVerifyData(false))
	loc, err := s.Put(ctx, obj(3), testValue(100))
	if err != nil {
		t.Fatal(err)
	}
	path := s.path(obj(3))
	flipByte(t, path, loc.Size) // trailer
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("corrupt trailer: %v", err)
	}
	flipByte(t, path, loc.Size)
	flipByte(t, path, 9) // header: version
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("corrupt header: %v", err)
	}
	flipByte(t, path, 9)
	wrong := loc
	wrong.Size++
	if _, err := s.Get(ctx, wrong); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("wrong size: %v", err)
	}
	wrong = loc
	wrong.Checksum[3] ^= 1
	if _, err := s.Get(ctx, wrong); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("wrong checksum: %v", err)
	}
	os.Truncate(path, 10)
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
	elsewhere := loc
	elsewhere.Address = "/etc"
	if _, err := s.Get(ctx, elsewhere); !errors.Is(err, payload.ErrInvalidLocation) {
		t.Fatalf("another directory: %v", err)
	}
	if _, err := s.Get(ctx, payload.Location{Transport: "shm", Address: dir, Object: "acme/../../etc/passwd", Size: 100}); !errors.Is(err, payload.ErrInvalidLocation) {
		t.Fatalf("traversal: %v", err)
	}
	missing := loc
	missing.Object = obj(9).String()
	if _, err := s.Get(ctx, missing); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
}

// TestFlippedDataByteIsNotServed: one flipped data byte, trailer intact,
// is ErrCorrupt from a store that verifies (the default), and the file is
// removed so that the value can be written again. Without verification
// the flip is served: that is what the option trades.
func TestFlippedDataByteIsNotServed(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	trailerOnly, _ := Open(dir, WithVerifyData(false))
	v := testValue(100_000)
	loc, err := s.Put(ctx, obj(7), v)
	if err != nil {
		t.Fatal(err)
	}
	path := s.Path(obj(7))
	flipByte(t, path, payload.DataOffset(v)+12345)

	served, err := trailerOnly.Get(ctx, loc)
	if err != nil {
		t.Fatalf("trailer only: %v", err)
	}
	if bytes.Equal(served.Tensor.Data, v.Tensor.Data) {
		t.Fatal("the flip did not reach the file")
	}
	served.Close()

	got, err := s.Get(ctx, loc)
	if !errors.Is(err, payload.ErrCorrupt) || got != nil {
		t.Fatalf("flipped data byte: a value (%v), %v; want ErrCorrupt and no value", got != nil, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) || s.Used() != 0 {
		t.Fatalf("the corrupt file is still there (%v), %d bytes used", err, s.Used())
	}
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("after removal: %v", err)
	}
	again, err := s.Put(ctx, obj(7), v)
	if err != nil || again != loc {
		t.Fatalf("put again: %+v %v", again, err)
	}
	got, err = s.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal("value differs")
	}
}

// TestConsistentRewriteIsNotServed: a file rewritten whole, trailer
// included, so that it is consistent with itself, is still not the
// record's value: the check is against the Location's checksum.
func TestConsistentRewriteIsNotServed(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir)
	other, _ := Open(t.TempDir())
	loc, err := s.Put(ctx, obj(8), testValue(1000))
	if err != nil {
		t.Fatal(err)
	}
	forged := testValue(1000)
	forged.Tensor.Data[0] ^= 1
	if _, err := other.Put(ctx, obj(8), forged); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(other.Path(obj(8)))
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(s.Path(obj(8)), 0o644)
	if err := os.WriteFile(s.Path(obj(8)), file, 0o444); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) || got != nil {
		t.Fatalf("consistent rewrite: %v, %v; want ErrCorrupt", got, err)
	}
}

// TestVerifiedOncePerNode: a file version is hashed once on the node.
// Its writer proves it; without that proof its first reader hashes it and
// proves it for the others; a process that hashed it does not hash it
// again after its mapping went; concurrent first Gets share one hash. A
// file changed since is hashed again, and refused.
func TestVerifiedOncePerNode(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	open := func() *Store { // another process's store (nothing is shared but the directory)
		t.Helper()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	writer := open()
	v := testValue(50_000)
	loc, err := writer.Put(ctx, obj(9), v)
	if err != nil {
		t.Fatal(err)
	}
	get := func(s *Store) *payload.Value {
		t.Helper()
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
			t.Fatal("value differs")
		}
		return got
	}
	reader := open()
	first, second := get(reader), get(reader)
	if &first.Tensor.Data[0] != &second.Tensor.Data[0] {
		t.Fatal("the second read did not share the first one's mapping")
	}
	first.Close()
	second.Close()
	get(writer).Close()
	if n := reader.hashes.Load() + writer.hashes.Load(); n != 0 {
		t.Fatalf("a file its writer proved was hashed %d times", n)
	}
	if len(reader.maps) != 0 {
		t.Fatalf("%d mappings left after the last value closed", len(reader.maps))
	}

	// No node proof (a writer that could not leave one): the first
	// reader hashes, and its proof serves the next.
	if err := os.Remove(writer.proofs.path(obj(9))); err != nil {
		t.Fatal(err)
	}
	first = get(reader) // reader proved nothing itself: it trusted the writer's proof, which is gone
	if n := reader.hashes.Load(); n != 0 {
		t.Fatalf("reader kept the writer's proof in memory, but hashed %d times", n)
	}
	first.Close()
	third := open()
	vals := make([]*payload.Value, 8)
	var wg sync.WaitGroup
	for i := range vals {
		wg.Go(func() {
			got, err := third.Get(ctx, loc)
			if err != nil {
				t.Error(err)
				return
			}
			vals[i] = got
		})
	}
	wg.Wait()
	for _, got := range vals {
		got.Close()
	}
	if n := third.hashes.Load(); n != 1 {
		t.Fatalf("8 concurrent first reads: %d hashes, want 1", n)
	}
	if err := os.Remove(third.proofs.path(obj(9))); err != nil {
		t.Fatalf("the first reader left no proof: %v", err)
	}
	get(third).Close() // its mapping went: its own proof stands
	if n := third.hashes.Load(); n != 1 {
		t.Fatalf("a file this process verified was hashed again after its mapping went (%d hashes)", n)
	}
	fourth := open()
	get(fourth).Close()
	get(open()).Close()
	if n := fourth.hashes.Load(); n != 1 {
		t.Fatalf("%d hashes, want 1", n)
	}

	// Changed in place (its ctime moves, whatever its mtime says): hashed
	// again, refused, removed.
	held := get(third)
	path := third.Path(obj(9))
	flipByte(t, path, loc.Size-1)
	old := time.Unix(1_000_000, 0)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("changed while mapped: %v", err)
	}
	if n := third.hashes.Load(); n != 2 {
		t.Fatalf("%d hashes, want 2", n)
	}
	held.Close()
	if len(third.maps) != 0 {
		t.Fatalf("%d mappings left", len(third.maps))
	}
	if _, err := os.Stat(third.proofs.path(obj(9))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the proof of a removed file stays: %v", err)
	}
}

// TestWrittenFileIsNotHashed: Put and Receive hash the bytes as they
// write them; no Get hashes the file after, in this process or another.
func TestWrittenFileIsNotHashed(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir)
	v := testValue(100_000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	received, err := s.Receive(ctx, obj(10), int64(len(enc)), sum, bytes.NewReader(enc))
	if err != nil {
		t.Fatal(err)
	}
	put, err := s.Put(ctx, obj(11), testValue(100_000))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := Open(dir)
	for range 2 { // the second time each maps the file afresh
		for _, loc := range []payload.Location{received, put} {
			for _, st := range []*Store{s, other} {
				got, err := st.Get(ctx, loc)
				if err != nil {
					t.Fatal(err)
				}
				got.Close()
			}
		}
	}
	if n := s.hashes.Load() + other.hashes.Load(); n != 0 {
		t.Fatalf("written files were hashed %d times", n)
	}
}

// TestAFlippedByteAfterTheNodeVerifiedIsNeverServed: another process
// changes a data byte of a file after the node proved it (its writer, a
// reader in a third process): neither the process that served it before
// nor a new one serves the changed bytes.
func TestAFlippedByteAfterTheNodeVerifiedIsNeverServed(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	writer, _ := Open(dir)
	reader, _ := Open(dir)
	v := testValue(100_000)
	for _, next := range []string{"served before", "new process"} {
		loc, err := writer.Put(ctx, obj(12), v)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := runHelper(t, "hashes", loc); err != nil || out != "0\n" {
			t.Fatalf("another process's first hit: %v, hashed %q times, want 0", err, out)
		}
		got, err := reader.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		got.Close()
		if out, err := runHelper(t, "flip", loc); err != nil {
			t.Fatalf("flip: %v\n%s", err, out)
		}
		switch next {
		case "served before":
			got, err = reader.Get(ctx, loc)
		case "new process":
			var out string
			out, err = runHelper(t, "read", loc)
			if err == nil {
				t.Fatalf("a new process served the flipped file: %.40s...", out)
			}
			if !strings.Contains(out, payload.ErrCorrupt.Error()) {
				t.Fatalf("a new process: %v\n%s", err, out)
			}
			continue
		}
		if !errors.Is(err, payload.ErrCorrupt) || got != nil {
			t.Fatalf("%s: a value (%v), %v; want ErrCorrupt and no value", next, got != nil, err)
		}
	}
}

// TestProofsTrustedOnlyFromThisUser: a node proof another user owns, or
// one of a file another user owns, proves nothing to this process: it
// hashes the file itself.
func TestProofsTrustedOnlyFromThisUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a file to another user")
	}
	ctx := context.Background()
	dir := testDir(t)
	writer, _ := Open(dir)
	hashesOf := func(loc payload.Location) int64 {
		t.Helper()
		s, _ := Open(dir)
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		got.Close()
		return s.hashes.Load()
	}

	loc, err := writer.Put(ctx, obj(13), testValue(10_000))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(writer.proofs.path(obj(13)), 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if n := hashesOf(loc); n != 1 {
		t.Fatalf("a proof of another user: %d hashes, want 1", n)
	}

	loc, err = writer.Put(ctx, obj(17), testValue(10_000))
	if err != nil {
		t.Fatal(err)
	}
	path := writer.Path(obj(17))
	if err := os.Chown(path, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	// This user's proof of the file as it is now, as a process of this
	// user that hashed it would leave (were it to leave one).
	writer.proofs.write(obj(17), proof{id: idOf(&st), sum: loc.Checksum, at: unix.Timespec{Sec: 1 << 40}})
	if n := hashesOf(loc); n != 1 {
		t.Fatalf("a file of another user: %d hashes, want 1", n)
	}
}

// TestProofsThatAreNotProofs: a node proof that is junk, a link, or of
// another version of the file proves nothing.
func TestProofsThatAreNotProofs(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	writer, _ := Open(dir)
	loc, err := writer.Put(ctx, obj(14), testValue(10_000))
	if err != nil {
		t.Fatal(err)
	}
	proofPath := writer.proofs.path(obj(14))
	good, err := os.ReadFile(proofPath)
	if err != nil {
		t.Fatal(err)
	}
	stale := bytes.Clone(good)
	stale[len(proofMagic)+8]++ // another inode
	otherSum := bytes.Clone(good)
	otherSum[len(otherSum)-1] ^= 1
	for name, put := range map[string]func() error{
		"other sum": func() error { return os.WriteFile(proofPath, otherSum, 0o644) },
		"junk":      func() error { return os.WriteFile(proofPath, []byte("not a proof"), 0o644) },
		"short":     func() error { return os.WriteFile(proofPath, good[:len(good)-1], 0o644) },
		"stale":     func() error { return os.WriteFile(proofPath, stale, 0o644) },
		"link": func() error {
			target := filepath.Join(t.TempDir(), "proof")
			if err := os.WriteFile(target, good, 0o644); err != nil {
				return err
			}
			return os.Symlink(target, proofPath)
		},
	} {
		os.Remove(proofPath)
		if err := put(); err != nil {
			t.Fatal(err)
		}
		s, _ := Open(dir)
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got.Close()
		if n := s.hashes.Load(); n != 1 {
			t.Fatalf("%s proof: %d hashes, want 1", name, n)
		}
	}
}

// TestProofHoldsOnlyAfterATick: on a kernel that stamps file times by
// clock tick, a proof taken in the tick of the file's last change does not
// hold (a change later in that tick would keep the ctime).
func TestProofHoldsOnlyAfterATick(t *testing.T) {
	id := fileID{ino: 7, ctime: unix.Timespec{Sec: 100, Nsec: 4_000_000}}
	for _, c := range []struct {
		at         unix.Timespec
		fine, want bool
	}{
		{id.ctime, false, false},
		{unix.Timespec{Sec: 100}, false, false},
		{unix.Timespec{Sec: 100, Nsec: 8_000_000}, false, true},
		{unix.Timespec{Sec: 101}, false, true},
		{id.ctime, true, true},
	} {
		if got := (proof{id: id, at: c.at}).holds(id, c.fine); got != c.want {
			t.Errorf("at %v, fine %v: holds %v, want %v", c.at, c.fine, got, c.want)
		}
	}
	other := id
	other.ctime.Nsec++
	if (proof{id: id, at: unix.Timespec{Sec: 200}}).holds(other, true) {
		t.Error("a proof holds for another version of the file")
	}
}

// TestProofsGoWithTheirFiles: Delete and Sweep remove proofs of files that
// are gone; Files and Used do not count them.
func TestProofsGoWithTheirFiles(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir)
	locA, _ := s.Put(ctx, obj(15), testValue(1000))
	locB, err := s.Put(ctx, obj(16), testValue(1000))
	if err != nil {
		t.Fatal(err)
	}
	used := s.Used()
	if again, _ := Open(dir); again.Used() != used {
		t.Fatalf("a new store accounts %d bytes, the writer %d", again.Used(), used)
	}
	n := 0
	for range s.Files() {
		n++
	}
	if n != 2 {
		t.Fatalf("Files lists %d, want 2", n)
	}
	if err := deleteNow(s, locA); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.proofs.path(obj(15))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Delete left the proof: %v", err)
	}
	os.Remove(s.Path(obj(16)))
	if _, err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.proofs.path(obj(16))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Sweep left the proof of a file that is gone: %v", err)
	}
	_ = locB
}

func TestDeleteWhileMapped(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(testDir(t))
	v := testValue(4096)
	loc, _ := s.Put(ctx, obj(4), v)
	got, err := s.Get(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if err := deleteNow(s, loc); err != nil {
		t.Fatal(err)
	}
	if err := deleteNow(s, loc); err != nil {
		t.Fatal("deleting an absent object failed:", err)
	}
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal("mapping lost its bytes when the file was deleted")
	}
}

// Sweep removes a temp file nobody holds locked once it is a minute old,
// and never one its writer holds (a live writer in another pid namespace
// too: the pid in a file's name decided before, and there named another
// process or none).
func TestSweepRemovesDeadWritersTempFiles(t *testing.T) {
	s, _ := Open(testDir(t))
	old := time.Now().Add(-2 * tempGrace)
	file := func(name string, mtime time.Time) string {
		t.Helper()
		p := filepath.Join(s.Dir(), tmpDir, name)
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := file("1-dead", old)                                // its writer died: no lock
	fresh := file("1-fresh", time.Now())                       // just created, not locked yet
	held := file(strconv.Itoa(os.Getpid()+1<<20)+"-held", old) // a writer elsewhere holds it; its pid names no process here
	f, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	n, err := s.Sweep()
	if err != nil || n != 1 {
		t.Fatalf("swept %d, %v", n, err)
	}
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("dead writer's temp file left")
	}
	for _, p := range []string{fresh, held} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s removed", filepath.Base(p))
		}
	}
}

func runHelper(t *testing.T, mode string, loc payload.Location) (string, error) {
	t.Helper()
	raw, _ := json.Marshal(loc)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHM_HELPER="+mode, "SHM_LOCATION="+string(raw))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestAnotherProcessReadsBitIdentical(t *testing.T) {
	s, _ := Open(testDir(t))
	v := testValue(64 << 10)
	loc, err := s.Put(context.Background(), obj(5), v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runHelper(t, "read", loc)
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if out != fmt.Sprintf("%x\n", v.Tensor.Data) {
		t.Fatal("the other process read different bytes")
	}
}

func TestWritingIntoMappedValueFaults(t *testing.T) {
	s, _ := Open(testDir(t))
	v := testValue(1024)
	loc, _ := s.Put(context.Background(), obj(6), v)
	out, err := runHelper(t, "write", loc)
	if err != nil || !bytes.HasPrefix([]byte(out), []byte("faulted:")) {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	got, _ := s.Get(context.Background(), loc)
	defer got.Close()
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal("the write reached the stored value")
	}
}

// TestPutReplacesOtherBytes: a Put of the same bytes leaves the file; a
// Put of other bytes under the same name (the key's value after an
// invalidation) replaces it, while a reader of the old file keeps its
// bytes; a Delete of the old Location leaves the new file alone.
func TestPutReplacesOtherBytes(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	oldV, newV := testValue(1000), testValue(1000)
	newV.Tensor.Data[0] ^= 1
	oldLoc, err := s.Put(ctx, obj(12), oldV)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Put(ctx, obj(12), oldV); err != nil || again != oldLoc {
		t.Fatalf("a Put of the same bytes: %+v %v", again, err)
	}
	held, err := s.Get(ctx, oldLoc)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	newLoc, err := s.Put(ctx, obj(12), newV)
	if err != nil || newLoc.Checksum == oldLoc.Checksum {
		t.Fatalf("a Put of other bytes: %+v %v", newLoc, err)
	}
	if !bytes.Equal(held.Tensor.Data, oldV.Tensor.Data) {
		t.Fatal("a reader of the old file saw its bytes change")
	}
	if _, err := s.Get(ctx, oldLoc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("the old Location after the replacement: %v", err)
	}
	if err := deleteNow(s, oldLoc); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, newLoc)
	if err != nil {
		t.Fatalf("the old Location's Delete removed the new file: %v", err)
	}
	if !bytes.Equal(got.Tensor.Data, newV.Tensor.Data) {
		t.Fatal("wrong bytes")
	}
	got.Close()
	if err := deleteNow(s, newLoc); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, newLoc); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("after its own Delete: %v", err)
	}
}

// filled is a value of n float32s whose every byte is b.
func filled(b byte, n int) *payload.Value {
	return payload.NewTensor(cachekey.Float32, []int64{int64(n)}, bytes.Repeat([]byte{b}, n*4))
}

// Two Puts of one new object with other bytes, at once, each return a
// Location of their own bytes, never the other's: a lapsed holder's
// value (from before an invalidation, say) must not be committed under
// the next holder's record, where it would pass the reader's checksum.
// (The loser of the race returned the winner's Location: 178 of 400 Puts.)
func TestPutsOfOtherBytesAtOnceEachNameTheirOwn(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for round := range 200 {
		o := payload.ObjectID{Tenant: "acme", Key: cachekey.Key{byte(round), byte(round >> 8), 9}}
		var wg sync.WaitGroup
		for _, v := range []*payload.Value{filled(1, 1000), filled(2, 1000)} {
			wg.Go(func() {
				want, err := payload.Sum(v)
				if err != nil {
					t.Error(err)
					return
				}
				if loc, err := s.Put(ctx, o, v); err != nil || loc.Checksum != want {
					t.Errorf("round %d: Put returned %v and a Location of checksum %v, want its own %v", round, err, loc.Checksum, want)
				}
			})
		}
		wg.Wait()
	}
}

// What is not a value file under a value's name is no value: a directory
// fails the Put (which said it had stored the bytes), and a FIFO neither
// holds up a Get nor a Put (each blocked in its open until a writer came).
func TestANonFileUnderAValuesNameIsNoValue(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.Path(obj(8)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, obj(8), testValue(10)); err == nil {
		t.Fatal("a Put over a directory said it stored the value")
	}
	if err := syscall.Mkfifo(s.Path(obj(7)), 0o644); err != nil {
		t.Fatal(err)
	}
	loc := payload.Location{Transport: payload.TransportShm, Node: s.node, Address: s.Dir(), Object: obj(7).String(), Size: 4096}
	if _, err := s.Get(ctx, loc); err == nil {
		t.Fatal("a Get of a FIFO returned a value")
	}
	v := testValue(10)
	loc, err = s.Put(ctx, obj(7), v)
	if err != nil {
		t.Fatalf("a Put over a FIFO: %v", err)
	}
	got, err := s.Get(ctx, loc)
	if err != nil || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatalf("the value put over a FIFO: %v", err)
	}
	got.Close()
}

// A file cut short after it was mapped makes its hash an error, not a
// crash of the process (a read past the end of a shared mapping faults:
// a Get crashed so when the file was truncated while it hashed).
func TestAFileCutShortWhileHashedIsAnError(t *testing.T) {
	f, err := os.Create(filepath.Join(testDir(t), "cut"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 1 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := sumOf(mem); err == nil {
		t.Fatal("a mapping past its file's end hashed without an error")
	}
}

// TestADeleteLeavesTheSameBytesPutAgain: a delete is of the generation its
// caller saw. A Put or a Receive of the bytes already in place makes
// another (one after the other, several within a clock tick), which a
// delete of an earlier one leaves; Files lists the current one, and its
// delete removes the file.
func TestADeleteLeavesTheSameBytesPutAgain(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	enc, _ := payload.Encode(v)
	loc, err := s.Put(ctx, obj(30), v)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := s.Generation(ctx, loc)
	if err != nil || prev == (payload.Generation{}) {
		t.Fatalf("the generation of a file put: %+v %v", prev, err)
	}
	gens := map[payload.Generation]bool{prev: true}
	for i := range 16 {
		again, err := s.Put(ctx, obj(30), v)
		if i%2 == 1 {
			again, err = s.Receive(ctx, obj(30), loc.Size, loc.Checksum, bytes.NewReader(enc))
		}
		if err != nil || again != loc {
			t.Fatalf("put %d again: %+v %v", i, again, err)
		}
		g, err := s.Generation(ctx, loc)
		if err != nil || gens[g] {
			t.Fatalf("put %d again: generation %+v (%v), seen before", i, g, err)
		}
		gens[g] = true
		if err := s.Delete(ctx, loc, prev); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.Path(obj(30))); err != nil {
			t.Fatalf("a delete of the generation before put %d removed the file: %v", i, err)
		}
		prev = g
	}
	for f := range s.Files() {
		if f.Generation != prev {
			t.Fatalf("Files lists generation %+v, the file is in %+v", f.Generation, prev)
		}
	}
	if err := s.Delete(ctx, loc, prev); err != nil || s.Used() != 0 {
		t.Fatalf("the delete of the current generation: %v, %d bytes used", err, s.Used())
	}
	if g, err := s.Generation(ctx, loc); err != nil || g != (payload.Generation{}) {
		t.Fatalf("the generation of no file: %+v %v", g, err)
	}
}
