//go:build mooncake && cgo

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/mooncaketest"
	"github.com/embcache/embcache/internal/testproc"
	"github.com/embcache/embcache/payload"
)

// The tests against a real Mooncake Store: a mooncake_master on free
// loopback ports, and a process that holds the segment the values live in
// (the test binary again, as Mooncake's docs have a long-lived process do),
// while the test's own Store contributes none, as a short-lived writer or
// reader would.

// mooncakeCluster is a running master of a real store's directory.
type mooncakeCluster struct {
	dir string
	*mooncaketest.Master
}

// startMaster starts a real store's master (mooncaketest.StartMaster).
func startMaster(t testing.TB, dir string, flags ...string) *mooncakeCluster {
	t.Helper()
	return &mooncakeCluster{dir: dir, Master: mooncaketest.StartMaster(t, dir, flags...)}
}

// config is a Store's config for c: segment is the memory it contributes.
func (c *mooncakeCluster) config(node string, segment uint64) Config {
	return Config{Library: mooncaketest.Library(c.dir), Node: node,
		LocalHostname: "127.0.0.1", MetadataServer: c.Metadata, Protocol: "tcp", MasterServerAddr: c.Addr,
		GlobalSegmentSize: segment, LocalBufferSize: 64 << 20}
}

// startHolder runs a process that holds a segment of segment bytes in c,
// until the test ends (its stdin closes).
func startHolder(t testing.TB, c *mooncakeCluster, segment uint64) {
	t.Helper()
	p := testproc.Start(t, "TestMooncakeSegmentHolder", "EMBCACHE_MOONCAKE_HOLDER=1", "HOLDER_LIB="+c.config("", 0).Library,
		"HOLDER_MASTER="+c.Addr, "HOLDER_METADATA="+c.Metadata, "HOLDER_SEGMENT="+strconv.FormatUint(segment, 10))
	if line := p.Line(t, "holder: ", 30*time.Second); line != "ready" {
		t.Fatalf("segment holder: %s", line)
	}
}

// TestMooncakeSegmentHolder is the segment holder startHolder runs; it
// skips as a test of its own.
func TestMooncakeSegmentHolder(t *testing.T) {
	if os.Getenv("EMBCACHE_MOONCAKE_HOLDER") != "1" {
		t.Skip("the segment holder of the real-Mooncake tests: they run it")
	}
	segment, _ := strconv.ParseUint(os.Getenv("HOLDER_SEGMENT"), 10, 64)
	s, err := Open(Config{Library: os.Getenv("HOLDER_LIB"), Node: "holder", LocalHostname: "127.0.0.1",
		MetadataServer: os.Getenv("HOLDER_METADATA"), Protocol: "tcp", MasterServerAddr: os.Getenv("HOLDER_MASTER"),
		GlobalSegmentSize: segment, LocalBufferSize: 16 << 20})
	if err != nil {
		fmt.Println("holder: open:", err)
		return
	}
	fmt.Println("holder: ready")
	testproc.StdinClosed()
	s.Close()
}

// A value put by a Store that contributes no memory lands in the holder's
// segment, and is read back bit for bit (8 MiB and 1 byte); a second put
// of the same object is a no-op; a missing object is ErrNotFound.
func TestRealMooncakeRoundTrip(t *testing.T) {
	dir := mooncaketest.Dir(t)
	c := startMaster(t, dir)
	startHolder(t, c, 256<<20)
	s, err := Open(c.config("n1", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, n := range []int{8 << 20, 1} {
		v := value(n)
		loc, err := s.Put(ctx, obj, v)
		if err != nil {
			t.Fatalf("put of %d bytes: %v", n, err)
		}
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatalf("get of %d bytes: %v", n, err)
		}
		if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
			t.Fatalf("%d bytes: the value read back differs", n)
		}
		got.Close()
		if again, err := s.Put(ctx, obj, v); err != nil || again != loc {
			t.Fatalf("second put: %+v %v", again, err)
		}
		obj.Key[0]++
	}
	missing := obj
	missing.Key[1] = 0xee
	loc, err := s.Put(ctx, missing, value(10))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.remove(loc, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("a removed object: %v, want ErrNotFound", err)
	}
}

// Delete never removes an object under a reader: Mooncake leases an
// object to each reader (here for 1 s, --default_kv_lease_ttl), and
// refuses an unforced remove meanwhile. Delete's own check of the bytes
// is such a read: the first Delete is ErrBusy, and one after the lease
// lapsed removes the object without reading it again; while a reader keeps
// reading, Delete stays ErrBusy and the object stays. A Put of other bytes
// (the key's value after an invalidation) replaces an object a reader just
// got. The waits are the server's lease, in real time.
func TestRealMooncakeDeletesWaitForReaders(t *testing.T) {
	const lease = time.Second
	dir := mooncaketest.Dir(t)
	c := startMaster(t, dir, "--default_kv_lease_ttl=1000")
	startHolder(t, c, 64<<20)
	s, err := Open(c.config("n1", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	o := obj
	o.Key[2] = 0x42
	v := value(1 << 20)
	present := func(loc payload.Location) bool {
		t.Helper()
		ok, err := s.exists(loc)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	read := func(loc payload.Location) {
		t.Helper()
		got, err := s.Get(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		got.Close()
	}

	loc, err := s.Put(ctx, o, v)
	if err != nil {
		t.Fatal(err)
	}
	read(loc) // a reader
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) || !present(loc) {
		t.Fatalf("a delete while a reader holds the object: %v, present %v; want ErrBusy and the object kept", err, present(loc))
	}
	time.Sleep(lease + 500*time.Millisecond) // every lease lapsed, the delete's own check's too
	if err := s.Delete(ctx, loc, payload.Generation{}); err != nil || present(loc) {
		t.Fatalf("a delete after the leases: %v, present %v; want it removed", err, present(loc))
	}

	// A reader that keeps reading keeps the object.
	if loc, err = s.Put(ctx, o, v); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 500*time.Millisecond) // the put's own check's lease
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("the first delete (its own check): %v, want ErrBusy", err)
	}
	time.Sleep(lease / 2)
	read(loc) // the reader again, before the check's lease lapsed
	time.Sleep(lease/2 + 300*time.Millisecond)
	if err := s.Delete(ctx, loc, payload.Generation{}); !errors.Is(err, ErrBusy) || !present(loc) {
		t.Fatalf("a delete while the reader's lease holds: %v, present %v; want ErrBusy and the object kept", err, present(loc))
	}

	// Other bytes replace an object a reader just got.
	read(loc)
	other := value(1 << 20)
	other.Tensor.Data[0]++
	newLoc, err := s.Put(ctx, o, other)
	if err != nil {
		t.Fatalf("a put of other bytes after a get: %v", err)
	}
	got, err := s.Get(ctx, newLoc)
	if err != nil || !bytes.Equal(got.Tensor.Data, other.Tensor.Data) {
		t.Fatalf("the new bytes: %v", err)
	}
	got.Close()
}
