package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
)

// shmNode is a node wired as cmd/embcache wires one with --payload-listen:
// an shm store, served over httppull.
type shmNode struct {
	name  string
	store *shm.Store
	tr    *httppull.Transport
	srv   *httptest.Server
}

func newShmNode(t *testing.T, name string, opts ...shm.Option) *shmNode {
	t.Helper()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), append(opts, shm.WithNode(name))...)
	if err != nil {
		t.Fatal(err)
	}
	h, err := httppull.NewServer(store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr, err := httppull.NewTransport(name, srv.URL, store, httppull.WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Client().CloseIdleConnections)
	return &shmNode{name: name, store: store, tr: tr, srv: srv}
}

// cache is a process of the node, writing with the pull transport.
func (n *shmNode) cache(t *testing.T, url string, opts ...payload.RouterOption) *Cache {
	t.Helper()
	r, err := payload.NewRouter(n.name, payload.TransportHTTP, n.tr, append([]payload.RouterOption{payload.WithNodeStore(n.store)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(context.Background(), connect(t, url), WithNode(n.name), WithPayload(r), WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fileOf returns the bytes of obj's file in the node's store, or nil.
func (n *shmNode) fileOf(obj payload.ObjectID) []byte {
	b, _ := os.ReadFile(n.store.Path(obj))
	return b
}

// storedFile is what an shm store keeps for v: its encoding and checksum.
func storedFile(v *payload.Value) []byte {
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	return append(enc, sum[:]...)
}

func noCompute(t *testing.T) ComputeFunc {
	return func(context.Context) (*payload.Value, error) {
		t.Error("computed a value committed elsewhere")
		return nil, errors.New("no compute")
	}
}

// TestPullToShm: a value committed on another node lands in this node's
// store, and a later process of this node reads it from there without a
// pull.
func TestPullToShm(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	a, b := newShmNode(t, "a"), newShmNode(t, "b")
	var n counter
	if _, err := a.cache(t, url).GetOrCompute(ctx, "r", ref(1), n.fn(1)); err != nil {
		t.Fatal(err)
	}
	b1 := b.cache(t, url, payload.WithPullToNodeStore())
	v, path, err := b1.GetOrComputePath(ctx, "r", ref(1), noCompute(t))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("%v %v", path, err)
	}
	sameValue(t, v, 1)
	if !bytes.Equal(b.fileOf(ref(1).Object()), storedFile(embedding(1))) {
		t.Fatal("the pulled value is not in b's store")
	}
	a.srv.Close() // nothing more to pull from
	b2 := b.cache(t, url, payload.WithPullToNodeStore())
	v, path, err = b2.GetOrComputePath(ctx, "r", ref(1), noCompute(t))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("second process of b: %v %v", path, err)
	}
	sameValue(t, v, 1)
	if s := b2.Stats(); s.RemoteHits != 1 || s.PayloadErrors != 0 {
		t.Fatalf("second process of b: %+v", s)
	}
}

// TestPullToShmRefusesCorruptPayload: bytes that are not the committed
// value are never a value, and never a file of the store: the pull fails,
// and the key is recomputed.
func TestPullToShmRefusesCorruptPayload(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	a, b := newShmNode(t, "a"), newShmNode(t, "b")
	var n counter
	if _, err := a.cache(t, url).GetOrCompute(ctx, "r", ref(2), n.fn(2)); err != nil {
		t.Fatal(err)
	}
	// Flip a data byte of a's file; its trailer, served as the checksum, stays.
	path := a.store.Path(ref(2).Object())
	os.Chmod(path, 0o644)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xff}, 200)
	f.Close()

	bc := b.cache(t, url, payload.WithPullToNodeStore())
	var recomputed bool
	v, p, err := bc.GetOrComputePath(ctx, "r", ref(2), func(context.Context) (*payload.Value, error) {
		if got := b.fileOf(ref(2).Object()); got != nil {
			t.Error("the corrupt payload was kept in b's store")
		}
		recomputed = true
		return embedding(2), nil
	})
	if err != nil || p != PathComputed || !recomputed {
		t.Fatalf("%v %v", p, err)
	}
	sameValue(t, v, 2)
	if s := bc.Stats(); s.PayloadErrors != 1 || s.RemoteHits != 0 {
		t.Fatalf("%+v", s)
	}
	if tmps, _ := os.ReadDir(filepath.Join(b.store.Dir(), ".tmp")); len(tmps) != 0 {
		t.Fatalf("%d temp files left", len(tmps))
	}
}

// TestPullToShmFallsBack: a store without room, or holding another value
// under the name, does not stop the pull: the value is pulled into memory.
func TestPullToShmFallsBack(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	a := newShmNode(t, "a")
	var n counter
	ac := a.cache(t, url)
	for i := 3; i <= 4; i++ {
		if _, err := ac.GetOrCompute(ctx, "r", ref(i), n.fn(i)); err != nil {
			t.Fatal(err)
		}
	}

	full := newShmNode(t, "b", shm.WithMaxBytes(1000))
	v, path, err := full.cache(t, url, payload.WithPullToNodeStore()).GetOrComputePath(ctx, "r", ref(3), noCompute(t))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("no room: %v %v", path, err)
	}
	sameValue(t, v, 3)
	if full.fileOf(ref(3).Object()) != nil || full.store.Used() != 0 {
		t.Fatal("no room, yet a file")
	}

	taken := newShmNode(t, "c")
	if _, err := taken.store.Put(ctx, ref(4).Object(), embedding(9)); err != nil {
		t.Fatal(err)
	}
	v, path, err = taken.cache(t, url, payload.WithPullToNodeStore()).GetOrComputePath(ctx, "r", ref(4), noCompute(t))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("name taken: %v %v", path, err)
	}
	sameValue(t, v, 4)
	if !bytes.Equal(taken.fileOf(ref(4).Object()), storedFile(embedding(9))) {
		t.Fatal("the file under the name changed")
	}
}

func TestPullToShmNeedsShm(t *testing.T) {
	_, err := payload.NewRouter("n", payload.TransportMemory, payload.NewMemoryStore("n", 0), payload.WithPullToNodeStore())
	if !errors.Is(err, payload.ErrInvalidOption) {
		t.Fatalf("without a node store: %v", err)
	}
}

// gatedStore holds each Put until open is closed, and says when one came.
type gatedStore struct {
	*payload.MemoryStore
	entered chan struct{}
	open    chan struct{}
}

func (g gatedStore) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	g.entered <- struct{}{}
	<-g.open
	return g.MemoryStore.Put(ctx, obj, v)
}

// WaitFlight waits for the flight of its key in this process (here a
// compute whose value is being stored) and counts nothing: the Get after
// it is the one local hit. With no flight it returns at once.
func TestWaitFlightWaitsForTheFlightOfItsKey(t *testing.T) {
	g := gatedStore{payload.NewMemoryStore("test-node", 0), make(chan struct{}, 1), make(chan struct{})}
	c := newCache(t, startServer(t).ClientURL(), g)
	ctx := context.Background()
	if err := c.WaitFlight(ctx, ref(1)); err != nil {
		t.Fatal(err)
	}
	var cnt counter
	computed := make(chan error, 1)
	go func() {
		_, err := c.GetOrCompute(ctx, "a", ref(1), cnt.fn(1))
		computed <- err
	}()
	<-g.entered // computed; its payload is being stored
	waited := make(chan error, 1)
	go func() { waited <- c.WaitFlight(ctx, ref(1)) }()
	close(g.open)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if err := <-computed; err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.LocalHits != 0 {
		t.Fatalf("WaitFlight counted a hit: %+v", s)
	}
	v, path, err := c.Get(ctx, "b", ref(1))
	if err != nil || path != PathLocalHit {
		t.Fatalf("the Get after: %v %v", path, err)
	}
	sameValue(t, v, 1)
	if s := c.Stats(); s.LocalHits != 1 || cnt.n[1].Load() != 1 {
		t.Fatalf("local hits %d, computes %d", s.LocalHits, cnt.n[1].Load())
	}
}

// failingGets fails every Get with err.
type failingGets struct {
	*payload.MemoryStore
	err error
}

func (f failingGets) Get(context.Context, payload.Location) (*payload.Value, error) {
	return nil, f.err
}

// A reader that cannot reach the payload store at all (a Mooncake master
// that does not answer it) computes without sharing and leaves the
// committed record to the processes that reach the store; a payload the
// store cannot deliver (a failed transfer: its holder gone) has its
// record purged, so that the key is computed again and shared.
// (docs/protocol.md 3, rule 5.)
func TestAStoreThisProcessCannotReachKeepsTheRecord(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	writer := newCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	unreachable := fmt.Errorf("test: master down: %w (%w)", payload.ErrStoreUnreachable, payload.ErrUnavailable)
	for i, tc := range []struct {
		err   error
		mode  Mode
		stays bool
	}{
		{unreachable, ModeDegrade, true},
		// The bucket answers: strict, which is about the bucket, computes too.
		{unreachable, ModeStrict, true},
		{fmt.Errorf("test: transfer failed: %w", payload.ErrUnavailable), ModeDegrade, false},
	} {
		var cnt counter
		if _, err := writer.GetOrCompute(ctx, "w", ref(i), cnt.fn(i)); err != nil {
			t.Fatal(err)
		}
		writer.Release("w")
		reader := newCache(t, srv.ClientURL(), failingGets{store, tc.err}, WithMode(tc.mode))
		v, err := reader.GetOrCompute(ctx, "r", ref(i), cnt.fn(i))
		if err != nil {
			t.Fatalf("%v, %v: %v", tc.err, tc.mode, err)
		}
		sameValue(t, v, i)
		reader.Release("r")
		if n := cnt.n[i].Load(); n != 2 {
			t.Fatalf("%v: computed %d times, want 2 (the writer, then the reader)", tc.err, n)
		}
		cur, err := reader.bucket().Read(ctx, ref(i).KVKey())
		if err != nil {
			t.Fatal(err)
		}
		committed := cur.Live && cur.Record.State == lease.StateCommitted && cur.Record.Owner == writer.owner
		if committed != tc.stays {
			t.Fatalf("%v: the writer's committed record stayed: %v, want %v (record %+v)", tc.err, committed, tc.stays, cur)
		}
	}
}
