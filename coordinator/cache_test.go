package coordinator

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

func TestComputeOnceThenHits(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, srv.ClientURL(), store)
	b := newCache(t, srv.ClientURL(), store)
	var cnt counter
	ctx := context.Background()

	v, path, err := a.GetOrComputePath(ctx, "r1", ref(1), cnt.fn(1))
	if err != nil || path != PathComputed {
		t.Fatalf("first: %v %v", path, err)
	}
	sameValue(t, v, 1)
	if _, path, _ = a.GetOrComputePath(ctx, "r2", ref(1), cnt.fn(1)); path != PathLocalHit {
		t.Fatalf("second in the same process: %v", path)
	}
	v, path, err = b.GetOrComputePath(ctx, "r3", ref(1), cnt.fn(1))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("another process: %v %v", path, err)
	}
	sameValue(t, v, 1)
	if n := cnt.n[1].Load(); n != 1 {
		t.Fatalf("computed %d times", n)
	}
	if a.Release("r1") != 1 || b.Release("r3") != 1 {
		t.Fatal("pins")
	}
	if s := a.Stats(); s.Computes != 1 || s.LocalHits != 1 || !s.StoreReachable {
		t.Fatalf("stats a %+v", s)
	}
}

func TestManyCachesComputeEachKeyOnce(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	var cnt counter
	caches := make([]*Cache, 4)
	for i := range caches {
		caches[i] = newCache(t, srv.ClientURL(), store)
	}
	const keys = 20
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for ci, c := range caches {
		for g := range 6 {
			wg.Go(func() {
				for k := range keys {
					req := reqID(ci, "-", g, "-", k)
					v, err := c.GetOrCompute(context.Background(), req, ref(k), cnt.fn(k))
					if err != nil {
						errs <- err
						return
					}
					sameValue(t, v, k)
					c.Release(req)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if n := cnt.n[k].Load(); n != 1 {
			t.Errorf("key %d computed %d times", k, n)
		}
	}
}

func TestComputeFailureAbandonsKey(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, srv.ClientURL(), store)
	b := newCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	boom := errors.New("CUDA out of memory")
	release := make(chan struct{})
	started := make(chan struct{})
	failing := func(context.Context) (*payload.Value, error) {
		close(started)
		<-release
		return nil, boom
	}
	errA := make(chan error, 1)
	go func() { _, err := a.GetOrCompute(ctx, "a", ref(5), failing); errA <- err }()
	<-started
	// b waits on a's lease, then takes over once a abandons it.
	var cnt counter
	resB := make(chan error, 1)
	go func() {
		v, path, err := b.GetOrComputePath(ctx, "b", ref(5), cnt.fn(5))
		if err == nil && (path != PathComputed || v == nil) {
			err = errors.New("b did not compute after the abandon: " + path.String())
		}
		resB <- err
	}()
	close(release)
	if err := <-errA; !errors.Is(err, boom) {
		t.Fatalf("a got %v", err)
	}
	if err := <-resB; err != nil {
		t.Fatal(err)
	}
	if cnt.n[5].Load() != 1 || a.Stats().ComputeErrors != 1 {
		t.Fatal("counts")
	}
	// And a can retry and get the value b committed.
	v, path, err := a.GetOrComputePath(ctx, "a2", ref(5), cnt.fn(5))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("retry: %v %v", path, err)
	}
	sameValue(t, v, 5)
}

func TestZombieCommitIsRefused(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, srv.ClientURL(), store)
	b := newCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	res, err := a.Reserve(ctx, ref(7))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, ref(7)); !errors.Is(err, ErrHeld) {
		t.Fatalf("second reserve: %v", err)
	}
	res.l.Stop() // a is paused past its lease
	// b waits, sees the lease expire (server TTL), takes over and commits.
	var cnt counter
	v, path, err := b.GetOrComputePath(ctx, "b", ref(7), cnt.fn(7))
	if err != nil || path != PathComputed {
		t.Fatalf("takeover: %v %v", path, err)
	}
	sameValue(t, v, 7)
	if b.Stats().Takeovers != 1 {
		t.Fatalf("takeovers %d", b.Stats().Takeovers)
	}
	// a wakes up and tries to commit another value: the fencing refuses it.
	zombie := embedding(99)
	if _, err := res.Commit(ctx, zombie); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("zombie commit: %v", err)
	}
	select {
	case <-res.Done():
	default:
		t.Fatal("lost lease not done")
	}
	c := newCache(t, srv.ClientURL(), store)
	v, path, err = c.GetOrComputePath(ctx, "c", ref(7), cnt.fn(7))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("reader: %v %v", path, err)
	}
	sameValue(t, v, 7) // b's value, not the zombie's
	if a.Stats().CommitsRefused != 1 {
		t.Fatal("refused commit not counted")
	}
}

func TestHeartbeatsKeepLeaseAlive(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	// A 2s lease: a renewal may come a TTL/3 late on a loaded machine
	// (-race, 2 cores) and still land before the deadline.
	a := newCache(t, srv.ClientURL(), store, WithLeaseTTL(2*time.Second))
	b := newCache(t, srv.ClientURL(), store, WithLeaseTTL(2*time.Second), WithComputeTimeout(3*time.Second))
	ctx := context.Background()
	res, err := a.Reserve(ctx, ref(8))
	if err != nil {
		t.Fatal(err)
	}
	// b waits past one and a half lease TTLs; a's heartbeats keep it holding.
	var cnt counter
	_, err = b.GetOrCompute(ctx, "b", ref(8), cnt.fn(8))
	if !errors.Is(err, ErrComputeTimeout) {
		t.Fatalf("waiter: %v", err)
	}
	if cnt.n[8].Load() != 0 {
		t.Fatal("b computed while a held a live lease")
	}
	if _, err := res.Commit(ctx, embedding(8)); err != nil {
		t.Fatalf("commit after heartbeats: %v", err)
	}
}

func TestStrictFailsFastNamingServer(t *testing.T) {
	port, _ := embedded.FreePort("127.0.0.1")
	url := "nats://127.0.0.1:" + itoa(port)
	if _, err := Connect(url, ModeStrict); !errors.Is(err, ErrStoreUnavailable) || !contains(err.Error(), url) {
		t.Fatalf("strict connect: %v", err)
	}
	nc := connect(t, url) // degrade: a connection that keeps retrying
	_, err := New(context.Background(), nc, WithMode(ModeStrict), WithOpTimeout(300*time.Millisecond))
	if !errors.Is(err, ErrStoreUnavailable) || !contains(err.Error(), "127.0.0.1:"+itoa(port)) {
		t.Fatalf("strict New: %v", err)
	}
}

func TestDegradeThenResume(t *testing.T) {
	port, _ := embedded.FreePort("127.0.0.1")
	dir := t.TempDir()
	url := "nats://127.0.0.1:" + itoa(port)
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, url, store, WithOpTimeout(200*time.Millisecond))
	ctx := context.Background()
	var cnt counter
	// Server down at start: values still come, computed locally.
	v, path, err := a.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
	if err != nil || path != PathDegraded {
		t.Fatalf("down: %v %v", path, err)
	}
	sameValue(t, v, 1)

	srv, err := embedded.Start(embedded.Options{StoreDir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	waitFor(t, func() bool { return a.Stats().StoreReachable })
	b := newCache(t, url, store)
	if _, path, err = a.GetOrComputePath(ctx, "r", ref(2), cnt.fn(2)); err != nil || path != PathComputed {
		t.Fatalf("after the server came up: %v %v", path, err)
	}
	if _, path, err = b.GetOrComputePath(ctx, "r", ref(2), cnt.fn(2)); err != nil || path != PathRemoteHit {
		t.Fatalf("sharing did not resume: %v %v", path, err)
	}

	// Server stopped mid-run: degrade; restarted: share again.
	srv.Shutdown()
	if _, path, err = a.GetOrComputePath(ctx, "r", ref(3), cnt.fn(3)); err != nil || path != PathDegraded {
		t.Fatalf("server stopped: %v %v", path, err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.nc.IsConnected() && b.nc.IsConnected() })
	// Connected is not yet answering: the restarted server recovers the
	// bucket's stream first, and a's ops time out after 200 ms.
	js, _ := jetstream.New(a.nc)
	waitFor(t, func() bool {
		octx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		kv, err := js.KeyValue(octx, lease.DefaultBucket)
		if err != nil {
			return false
		}
		_, err = kv.Status(octx)
		return err == nil
	})
	if _, path, err = a.GetOrComputePath(ctx, "r", ref(4), cnt.fn(4)); err != nil || path != PathComputed {
		t.Fatalf("after restart: %v %v", path, err)
	}
	if _, path, err = b.GetOrComputePath(ctx, "r", ref(4), cnt.fn(4)); err != nil || path != PathRemoteHit {
		t.Fatalf("after restart, b: %v %v", path, err)
	}
	if a.Stats().Degraded != 2 {
		t.Fatalf("degraded %d", a.Stats().Degraded)
	}
}

// TestAShardCountOtherThanTheBucketsIsRefused: a process started with
// another shard count than the bucket's logged "store unreachable,
// computing locally until it is back" and served degraded for good; it is
// an option error in either mode.
func TestAShardCountOtherThanTheBucketsIsRefused(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	newCache(t, srv.ClientURL(), store) // creates the bucket: one shard
	for _, mode := range []Mode{ModeDegrade, ModeStrict} {
		_, err := New(context.Background(), connect(t, srv.ClientURL()), route(t, payload.TransportMemory, store),
			WithNode("test-node"), WithLeaseShards(3), WithMode(mode))
		if !errors.Is(err, ErrInvalidOption) || !errors.Is(err, lease.ErrShards) {
			t.Fatalf("%v: %v, want ErrInvalidOption and lease.ErrShards", mode, err)
		}
	}
}
