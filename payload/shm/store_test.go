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
	"sync"
	"testing"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"go.uber.org/goleak"
)

// TestMain doubles as the helper process of the cross-process tests: with
// SHM_HELPER set, the test binary runs one helper and exits.
func TestMain(m *testing.M) {
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
	if err := s.Delete(ctx, loc); err != nil || s.Used() != 0 {
		t.Fatalf("delete: %v, used %d", err, s.Used())
	}
	if _, err := s.Put(ctx, obj(2), testValue(2000)); err != nil {
		t.Fatalf("after delete: %v", err)
	}
}

func TestCorruption(t *testing.T) {
	ctx := context.Background()
	dir := testDir(t)
	s, _ := Open(dir)
	verifying, _ := Open(dir, WithVerifyData(true))
	loc, err := s.Put(ctx, obj(3), testValue(100))
	if err != nil {
		t.Fatal(err)
	}
	path := s.path(obj(3))
	flip := func(off int64) {
		t.Helper()
		os.Chmod(path, 0o644)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		f.ReadAt(b, off)
		b[0] ^= 1
		f.WriteAt(b, off)
		f.Close()
	}
	flip(loc.Size - 1) // last data byte
	if _, err := verifying.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("corrupt data, verifying store: %v", err)
	}
	flip(loc.Size - 1)
	flip(loc.Size) // trailer
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("corrupt trailer: %v", err)
	}
	flip(loc.Size)
	flip(9) // header: version
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrCorrupt) {
		t.Fatalf("corrupt header: %v", err)
	}
	flip(9)
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
	if err := s.Delete(ctx, loc); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, loc); err != nil {
		t.Fatal("deleting an absent object failed:", err)
	}
	if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatal("mapping lost its bytes when the file was deleted")
	}
}

func TestSweepRemovesDeadWritersTempFiles(t *testing.T) {
	s, _ := Open(testDir(t))
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadFile := filepath.Join(s.Dir(), tmpDir, strconv.Itoa(dead.Process.Pid)+"-123")
	liveFile := filepath.Join(s.Dir(), tmpDir, strconv.Itoa(os.Getpid())+"-456")
	for _, f := range []string{deadFile, liveFile} {
		if err := os.WriteFile(f, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Sweep()
	if err != nil || n != 1 {
		t.Fatalf("swept %d, %v", n, err)
	}
	if _, err := os.Stat(deadFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("dead writer's temp file left")
	}
	if _, err := os.Stat(liveFile); err != nil {
		t.Fatal("live writer's temp file removed")
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
