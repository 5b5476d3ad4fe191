package coordinator

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
)

// rePutFirst is a node's shm store whose first payload delete lets
// before run first: a recompute of the key that puts the same bytes (keys
// are content addresses) and commits between the deleter's look at the
// record and its delete.
type rePutFirst struct {
	*shm.Store
	before  func()
	once    sync.Once
	deleted atomic.Bool // the delete that before ran ahead of has returned
}

func (s *rePutFirst) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	first := false
	s.once.Do(func() { first = true; s.before() })
	err := s.Store.Delete(ctx, loc, seen)
	if first {
		s.deleted.Store(true)
	}
	return err
}

// rePut returns a store over a fresh shm directory whose first delete
// waits for another process to compute ref(1) again, and that process.
func rePut(t *testing.T, url string, cnt *counter) (*rePutFirst, *Cache) {
	t.Helper()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	again := newCache(t, url, store, shmRoute(t, store), WithStoreTTL(time.Hour), WithPayloadSweep(-1))
	d := &rePutFirst{Store: store}
	d.before = func() {
		if _, path, err := again.GetOrComputePath(context.Background(), "again", ref(1), cnt.fn(1)); err != nil || path != PathComputed {
			t.Errorf("the recompute: %v %v", path, err)
		}
		again.Release("again")
	}
	return d, again
}

// servedAgain checks that ref(1), committed again, is served from its
// payload: not found missing (purged as corrupt) and computed a third
// time.
func servedAgain(t *testing.T, url string, store *shm.Store, cnt *counter) {
	t.Helper()
	if _, err := os.Stat(store.Path(ref(1).Object())); err != nil {
		t.Errorf("the payload the live record names: %v", err)
	}
	reader := newCache(t, url, store, shmRoute(t, store), WithPayloadSweep(-1))
	v, path, err := reader.GetOrComputePath(context.Background(), "read", ref(1), cnt.fn(1))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("the value put again and committed: %v %v, want a remote hit", path, err)
	}
	sameValue(t, v, 1)
	reader.Release("read")
	if n := cnt.n[1].Load(); n != 2 {
		t.Fatalf("%d computes, want 2", n)
	}
}

// TestAnExpiryLeavesTheSameBytesPutAgain: the reconciler reads an
// expired value's record (gone), then deletes its payload; a recompute
// that put the same bytes and committed in between only moved the file's
// times. The delete is conditional on the file it saw before reading the
// record: it leaves the one put again. (It removed it: the next reader
// found the payload missing, purged the record as corrupt and computed
// again.)
func TestAnExpiryLeavesTheSameBytesPutAgain(t *testing.T) {
	url := startServer(t).ClientURL()
	var cnt counter
	d, _ := rePut(t, url, &cnt)
	activeReconciler(t, url, d, reconciler.WithDeleter(payload.TransportShm, d))
	a := eventCache(t, url, d, shmRoute(t, d.Store), WithStoreTTL(time.Second), WithPayloadSweep(-1))
	computeUntilDeleted(t, a, d, &cnt)
	servedAgain(t, url, d.Store, &cnt)
}

// TestANoticeLeavesTheSameBytesPutAgain: the node that wrote a value
// hears of its eviction, reads the key's record (gone), then deletes the
// payload; a recompute of the same bytes came in between.
func TestANoticeLeavesTheSameBytesPutAgain(t *testing.T) {
	url := startServer(t).ClientURL()
	var cnt counter
	d, _ := rePut(t, url, &cnt)
	// Another node's reconciler: it announces the eviction and leaves the
	// payload to the node that wrote it.
	activeReconciler(t, url, d, reconciler.WithNode("other-node"), reconciler.WithDeleter(payload.TransportShm, d))
	a := eventCache(t, url, d, route(t, payload.TransportShm, d, payload.WithNodeStore(d)), WithStoreTTL(time.Second), WithPayloadSweep(-1))
	computeUntilDeleted(t, a, d, &cnt)
	servedAgain(t, url, d.Store, &cnt)
}

// TestASweepLeavesTheSameBytesPutAgain: the node's payload sweep lists a
// file, reads its key's record (gone), then deletes it; a recompute of the
// same bytes came in between.
func TestASweepLeavesTheSameBytesPutAgain(t *testing.T) {
	url := startServer(t).ClientURL()
	var cnt counter
	d, _ := rePut(t, url, &cnt)
	a := newCache(t, url, d, route(t, payload.TransportShm, d, payload.WithNodeStore(d)), WithStoreTTL(time.Second), WithPayloadSweep(-1))
	if _, err := a.GetOrCompute(context.Background(), "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	a.Release("r")
	waitFor(t, func() bool { return !readRecord(t, a, ref(1)).Live })
	a.sweepPayloads(context.Background(), 0)
	if !d.deleted.Load() {
		t.Fatal("the sweep deleted nothing")
	}
	servedAgain(t, url, d.Store, &cnt)
}

// TestASweepRemovesItsFileOfAKeyComputedOnAnotherNode: node A's value is
// invalidated, and node B computes the key again, to other bytes (the
// model fixed). A's file holds no live record's bytes, and A's sweep
// removes it; B's stays, and so does the copy a process of node C pulled
// into its store (what C's readers read). (A's sweep kept every file of
// a key while its record lived, whatever bytes it named.)
func TestASweepRemovesItsFileOfAKeyComputedOnAnotherNode(t *testing.T) {
	url := startServer(t).ClientURL()
	ctx := context.Background()
	process := func(n *shmNode, opts ...payload.RouterOption) *Cache {
		r, err := payload.NewRouter(n.name, payload.TransportHTTP, n.tr, append([]payload.RouterOption{payload.WithNodeStore(n.store)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return eventCache(t, url, n.store, WithPayload(r), WithNode(n.name), WithPayloadSweep(-1))
	}
	nodeA, nodeB, nodeC := newShmNode(t, "node-a"), newShmNode(t, "node-b"), newShmNode(t, "node-c")
	a, b, c := process(nodeA), process(nodeB), process(nodeC, payload.WithPullToNodeStore())
	var cnt counter
	if _, err := a.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	a.Release("r")
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	if _, path, err := b.GetOrComputePath(ctx, "r", ref(1), cnt.fn(2)); err != nil || path != PathComputed {
		t.Fatalf("node B: %v %v", path, err)
	}
	b.Release("r")
	if loc := readRecord(t, b, ref(1)).Record.Location; loc == nil || loc.Node != "node-b" {
		t.Fatalf("the record names %+v, want node B's payload", loc)
	}
	if _, path, err := c.GetOrComputePath(ctx, "r", ref(1), noCompute(t)); err != nil || path != PathRemoteHit {
		t.Fatalf("node C: %v %v", path, err)
	}
	c.Release("r")
	obj := ref(1).Object()
	a.sweepPayloads(ctx, 0)
	if _, err := os.Stat(nodeA.store.Path(obj)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node A's file of the key past A's sweep: %v", err)
	}
	b.sweepPayloads(ctx, 0)
	c.sweepPayloads(ctx, 0)
	for _, n := range []*shmNode{nodeB, nodeC} {
		if _, err := os.Stat(n.store.Path(obj)); err != nil {
			t.Errorf("%s's file of the live value went: %v", n.name, err)
		}
	}
}

// computeUntilDeleted computes ref(1) through a and waits for d's first
// delete of it (the re-put comes in between).
func computeUntilDeleted(t *testing.T, a *Cache, d *rePutFirst, cnt *counter) {
	t.Helper()
	if _, err := a.GetOrCompute(context.Background(), "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	a.Release("r")
	waitFor(t, d.deleted.Load)
}
