package coordinator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go/jetstream"
)

// reconciler starts a reconciler on its own connection; stop ends it.
func startReconciler(t *testing.T, url string, store payload.Transport, opts ...reconciler.Option) (r *reconciler.Reconciler, stop func()) {
	t.Helper()
	base := []reconciler.Option{reconciler.WithDeleter(payload.TransportMemory, store), reconciler.WithNode("test-node"), reconciler.WithLeaseTTL(time.Second)}
	r, err := reconciler.New(connect(t, url), append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return r, stop
}

func eventCache(t *testing.T, url string, store payload.Transport, opts ...Option) *Cache {
	return newCache(t, url, store, append([]Option{WithEvents(200 * time.Millisecond)}, opts...)...)
}

func readRecord(t *testing.T, c *Cache, r Ref) lease.Entry {
	t.Helper()
	ls := c.bucket()
	cur, err := ls.Read(context.Background(), r.KVKey())
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// TestTouchesKeepStoreRecordAlive: while replica A keeps hitting a key
// locally, its store record outlives the original store TTL; once the
// hits stop it expires, its payload is removed, and replica B recomputes
// rather than serve a removed payload.
func TestTouchesKeepStoreRecordAlive(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	const storeTTL = 2 * time.Second
	rec, _ := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return rec.Stats().Active })
	a := eventCache(t, srv.ClientURL(), store, WithStoreTTL(storeTTL))
	b := eventCache(t, srv.ClientURL(), store, WithStoreTTL(storeTTL))
	ctx := context.Background()
	var cnt counter
	if _, path, err := a.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1)); err != nil || path != PathComputed {
		t.Fatal(path, err)
	}
	a.Release("r")
	first := readRecord(t, a, ref(1)).Record.Expires

	// The workload: a hit every 100ms for twice the store TTL.
	tick := time.NewTicker(100 * time.Millisecond)
	for end := time.Now().Add(2 * storeTTL); time.Now().Before(end); <-tick.C {
		if _, path, err := a.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1)); err != nil || path != PathLocalHit {
			t.Fatal(path, err)
		}
		a.Release("r")
	}
	tick.Stop()
	cur := readRecord(t, a, ref(1))
	if !cur.Live || cur.Record.State != lease.StateCommitted || !cur.Record.Expires.After(first.Add(storeTTL)) {
		t.Fatalf("record not kept alive: live=%v expires %v (first %v)", cur.Live, cur.Record.Expires, first)
	}
	if rec.Stats().Touches == 0 {
		t.Fatal("no touch applied")
	}
	// Hits stop: the record expires, the reconciler removes the payload.
	waitFor(t, func() bool { return !readRecord(t, a, ref(1)).Live && store.Bytes() == 0 })
	_, path, err := b.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
	if err != nil || path != PathComputed {
		t.Fatalf("B after expiry: %v %v", path, err)
	}
	if cnt.n[1].Load() != 2 {
		t.Fatalf("computes %d", cnt.n[1].Load())
	}
}

// TestEvictionDropsUnpinnedCopies: an eviction notice to the node that
// wrote a value makes that node's workers drop their copies (a pinned copy
// stays with its holder until released), once the record is gone; a
// notice while the record still names the bytes (committed again since)
// changes nothing, and a worker of another node hears none.
func TestEvictionDropsUnpinnedCopies(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, srv.ClientURL(), store)
	b := eventCache(t, srv.ClientURL(), store)
	r, err := payload.NewRouter("other-node", payload.TransportMemory, store)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := eventCache(t, srv.ClientURL(), store, WithNode("other-node"), WithPayload(r))
	ctx := context.Background()
	var cnt counter
	a.GetOrCompute(ctx, "a", ref(2), cnt.fn(2))
	a.Release("a")
	held, err := b.GetOrCompute(ctx, "holder", ref(2), cnt.fn(2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err = elsewhere.GetOrCompute(ctx, "e", ref(2), cnt.fn(2)); err != nil {
		t.Fatal(err)
	}
	elsewhere.Release("e")
	cur := readRecord(t, a, ref(2))
	nc := connect(t, srv.ClientURL())
	notice := &events.Event{Kind: events.KindEvicted, Tenant: "acme", Key: ref(2).Key,
		Cause: events.CauseExplicit, Time: time.Now(), Location: cur.Record.Location}
	// The record still names the bytes: not its record's eviction.
	if err := events.Notify(nc, notice); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().EventsDecoded >= 1 && b.Stats().EventsDecoded >= 1 })
	if a.Stats().Local.Entries != 1 || b.Stats().Local.Entries != 1 {
		t.Fatal("an eviction of a live record dropped copies")
	}
	if err := a.bucket().Purge(ctx, ref(2).KVKey(), cur.Rev); err != nil {
		t.Fatal(err)
	}
	if err := events.Notify(nc, notice); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().Local.Entries == 0 && b.Stats().Local.Entries == 0 })
	if b.Stats().Local.Bytes == 0 {
		t.Fatal("the pinned copy was dropped before its release")
	}
	sameValue(t, held, 2)
	b.Release("holder")
	if b.Stats().Local.Bytes != 0 {
		t.Fatal("the pinned copy stayed after its release")
	}
	if s := elsewhere.Stats(); s.EventsDecoded != 0 || s.Local.Entries != 1 {
		t.Fatalf("another node's worker heard the notice: %+v", s)
	}
}

// TestTouchesAreCoalesced: 10 000 local hits emit at most one touched
// event per interval.
func TestTouchesAreCoalesced(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	const interval = 5 * time.Millisecond
	a := newCache(t, srv.ClientURL(), store, WithEvents(interval))
	ctx := context.Background()
	var cnt counter
	a.GetOrCompute(ctx, "r", ref(3), cnt.fn(3))
	start := time.Now()
	for range 10_000 {
		if _, err := a.GetOrCompute(ctx, "r", ref(3), cnt.fn(3)); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	a.Release("r")
	n, limit := a.Stats().Touches, uint64(took/interval)+1
	if n > limit || n == 0 {
		t.Fatalf("%d touched events for 10000 hits in %v (want 1..%d)", n, took, limit)
	}
	t.Logf("%d touched events for 10000 hits in %v", n, took)
}

// TestAPullsTouchIsOwed: a pull is a use whose touch, like a local hit's,
// goes out at the interval's end, one for the pull and the hits after it;
// a pulled record that may end before then (within two intervals) is
// touched at once.
func TestAPullsTouchIsOwed(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	ctx := context.Background()
	var cnt counter
	writer := eventCache(t, srv.ClientURL(), store)
	for _, i := range []int{1, 2} {
		if _, err := writer.GetOrCompute(ctx, "w", ref(i), cnt.fn(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Interval 200 ms, store TTL 1 h: the touch is owed.
	owes := eventCache(t, srv.ClientURL(), store)
	for range 100 {
		if _, err := owes.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
			t.Fatal(err)
		}
	}
	owes.Release("r")
	if s := owes.Stats(); s.RemoteHits != 1 || s.Touches != 0 {
		t.Fatalf("after a pull and 99 hits: %d remote hits, %d touches sent at once, want 1, 0", s.RemoteHits, s.Touches)
	}
	waitFor(t, func() bool { return owes.Stats().Touches != 0 })
	if n := owes.Stats().Touches; n != 1 {
		t.Fatalf("%d touches for a pull and its hits, want 1", n)
	}
	// Interval 1 h, store TTL 1 h: the record may end before the interval
	// does, so its pull is touched at once.
	now := newCache(t, srv.ClientURL(), store, WithEvents(time.Hour))
	if _, path, err := now.GetOrComputePath(ctx, "r", ref(2), cnt.fn(2)); err != nil || path != PathRemoteHit {
		t.Fatalf("%v %v", path, err)
	}
	if n := now.Stats().Touches; n != 1 {
		t.Fatalf("a pull of a record ending within two intervals: %d touches, want 1", n)
	}
	if cnt.n[1].Load() != 1 || cnt.n[2].Load() != 1 {
		t.Fatal("computed more than once")
	}
}

// TestReconcilerFailover: the active reconciler dies; the standby takes
// over within the lease TTL (plus a campaign interval), and the value that
// expired meanwhile has its payload removed.
func TestReconcilerFailover(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	r1, stop1 := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return r1.Stats().Active })
	r2, _ := startReconciler(t, srv.ClientURL(), store)
	a := eventCache(t, srv.ClientURL(), store, WithStoreTTL(time.Second))
	var cnt counter
	a.GetOrCompute(context.Background(), "r", ref(4), cnt.fn(4))
	a.Release("r")
	killed := time.Now()
	stop1() // its lease is not released: the standby must wait it out
	waitFor(t, func() bool { return r2.Stats().Active })
	if took := time.Since(killed); took > time.Second+time.Second/3+2*time.Second {
		t.Fatalf("standby took over after %v", took)
	}
	// Its payload is deleted before its eviction is published and counted.
	waitFor(t, func() bool { return store.Bytes() == 0 && r2.Stats().Expired > 0 })
}

// TestReconcilerCatchesUpFromTheMarkers: a reconciler that starts a
// moment after the last one ended (its progress mark says where its loop
// got) reads the bucket's markers from then on: a value that expired in between
// is evicted without a sweep over the values.
func TestReconcilerCatchesUpFromTheMarkers(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	r1, stop1 := startReconciler(t, srv.ClientURL(), store)
	// Its first start sweeps: one cut short is done again by the next.
	waitFor(t, func() bool { return r1.Stats().Active && r1.Stats().Sweeps == 1 })
	a := eventCache(t, srv.ClientURL(), store, WithStoreTTL(time.Second))
	var cnt counter
	a.GetOrCompute(context.Background(), "r", ref(4), cnt.fn(4))
	a.Release("r")
	stop1()
	// The first one's lease ends with a marker; the value expires too.
	waitFor(t, func() bool {
		el, err := a.bucket().Read(context.Background(), reconciler.ElectionKey)
		return err == nil && !el.Live && el.Rev > 0 && !readRecord(t, a, ref(4)).Live
	})
	r2, _ := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return store.Bytes() == 0 && r2.Stats().Expired > 0 }) // deleted, then announced
	if s := r2.Stats(); s.Expired != 1 || s.Sweeps != 0 {
		t.Fatalf("the second reconciler: %+v, want one value expired and no sweep", s)
	}
}

// TestFirstReconcilerSweeps: the first reconciler of a bucket has no
// marker to start from (nor one whose marker is gone): it reads the last
// event of every value once and evicts those whose record is gone.
func TestFirstReconcilerSweeps(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, srv.ClientURL(), store, WithStoreTTL(time.Second))
	var cnt counter
	for i := range 3 {
		a.GetOrCompute(context.Background(), "r", ref(i), cnt.fn(i))
	}
	a.Release("r")
	waitFor(t, func() bool {
		if readRecord(t, a, ref(0)).Live {
			return false
		}
		stream, err := a.js.Stream(context.Background(), events.StreamName)
		if err != nil {
			return false
		}
		info, err := stream.Info(context.Background()) // the three published events are stored
		return err == nil && info.State.Msgs >= 3
	})
	r, _ := startReconciler(t, srv.ClientURL(), store)
	// Values 1 and 2 may expire after its start, and be evicted from their
	// markers: each is counted once its eviction is published, after its
	// payload is deleted.
	waitFor(t, func() bool { s := r.Stats(); return store.Bytes() == 0 && s.Sweeps > 0 && s.Expired >= 3 })
	if s := r.Stats(); s.Expired != 3 || s.Sweeps != 1 {
		t.Fatalf("the first reconciler: %+v, want three values expired by one sweep", s)
	}
}

// TestReplayMatchesRunningSystem: after commits, touches, an invalidation
// and an expiry, replaying the stream gives the set of committed records.
func TestReplayMatchesRunningSystem(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	rec, _ := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return rec.Stats().Active })
	a := eventCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	var cnt counter
	for k := range 6 {
		r := ref(k)
		r.Epoch = uint64(1 + k%2)
		if _, err := a.GetOrCompute(ctx, "r", r, cnt.fn(k)); err != nil {
			t.Fatal(err)
		}
	}
	a.Release("r")
	if err := a.Invalidate(ctx, "acme", "m", 2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return rec.Stats().Invalidated == 3 })
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	waitFor(t, func() bool {
		st, _, err := events.Replay(ctx, js)
		return err == nil && len(st.Live(time.Now())) == 3
	})
	st, _, _ := events.Replay(ctx, js)
	for obj := range st.Live(time.Now()) {
		cur := readRecord(t, a, Ref{Tenant: obj.Tenant, Key: obj.Key})
		if !cur.Live || cur.Record.State != lease.StateCommitted {
			t.Fatalf("replay says %v is live; the store disagrees", obj)
		}
	}
}

// TestInvalidationIsExact: invalidating (tenant, model, epoch) removes
// exactly those entries, locally on every worker and in the store.
func TestInvalidationIsExact(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	rec, _ := startReconciler(t, srv.ClientURL(), store)
	waitFor(t, func() bool { return rec.Stats().Active })
	a := eventCache(t, srv.ClientURL(), store)
	b := eventCache(t, srv.ClientURL(), store)
	ctx := context.Background()
	var cnt counter
	refs := map[string]Ref{}
	for i, v := range []struct {
		name, tenant, model string
		epoch               uint64
	}{{"target1", "acme", "m", 1}, {"target2", "acme", "m", 1}, {"newer", "acme", "m", 2},
		{"other-model", "acme", "n", 1}, {"other-tenant", "beta", "m", 1}} {
		r := ref(10 + i)
		r.Tenant, r.Model, r.Epoch = v.tenant, v.model, v.epoch
		refs[v.name] = r
		for _, c := range []*Cache{a, b} {
			if _, err := c.GetOrCompute(ctx, "r", r, cnt.fn(10+i)); err != nil {
				t.Fatal(err)
			}
			c.Release("r")
		}
	}
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return rec.Stats().Invalidated == 2 && b.Stats().Local.Entries == 3 })
	for name, r := range refs {
		stale := name == "target1" || name == "target2"
		if got := a.local.Contains(r.local()); got == stale {
			t.Errorf("%s: in a's cache = %v", name, got)
		}
		if got := b.local.Contains(r.local()); got == stale {
			t.Errorf("%s: in b's cache = %v", name, got)
		}
		if live := readRecord(t, a, r).Live; live == stale {
			t.Errorf("%s: record live = %v", name, live)
		}
	}
}

// TestGarbageEventsAreSkipped: bytes that are no event are counted and
// skipped; the worker goes on.
func TestGarbageEventsAreSkipped(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, srv.ClientURL(), store)
	js, _ := jetstream.New(connect(t, srv.ClientURL()))
	ctx := context.Background()
	valid, err := events.Encode(&events.Event{Kind: events.KindEvicted, Tenant: "acme",
		Key: ref(1).Key, Cause: events.CauseExpired, Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, garbage := range [][]byte{{0xc1}, []byte("{not msgpack"), {0x81, 0xa1, 'v', 0x07}, valid[:len(valid)/2]} {
		if _, err := js.Publish(ctx, "embcache.ev.acme.invalidated."+ref(1).Key.String(), garbage); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return a.Stats().EventsBad == 4 })
	var cnt counter
	if _, path, err := a.GetOrComputePath(ctx, "r", ref(5), cnt.fn(5)); err != nil || path != PathComputed {
		t.Fatal(path, err)
	}
	if err := a.Invalidate(ctx, "a.b", "m", 1); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Fatalf("invalidation with a bad tenant: %v", err)
	}
}

// TestInvalidationPerShard: a record's revisions are its shard's, so an
// invalidation is decided against the tombstone in the record's own
// shard. Shard 0 and shard 1 are driven to different revisions: a record
// of shard 1 reserved before the invalidation is refused though its
// revision is past shard 0's tombstone, and one of shard 2 reserved after
// it is served though shard 0's tombstone is past its revision. No
// reconciler runs: the readers' checks alone decide.
func TestInvalidationPerShard(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, srv.ClientURL(), store, WithLeaseShards(3))
	b := eventCache(t, srv.ClientURL(), store, WithLeaseShards(3))
	ctx := context.Background()
	var cnt counter
	inShard := func(shard, n int) (keys []int) {
		for i := 3; len(keys) < n; i++ {
			if lease.ShardOf(ref(i).KVKey(), 3) == shard {
				keys = append(keys, i)
			}
		}
		return keys
	}
	stale, fresh := inShard(1, 1)[0], inShard(2, 1)[0]
	// Two writes a key: shard 1 reaches revision 60 before the stale
	// record is reserved, shard 0 40 before its tombstone.
	for _, i := range append(inShard(1, 31)[1:], inShard(0, 20)...) {
		if _, err := a.GetOrCompute(ctx, "warm", ref(i), cnt.fn(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, path, err := a.GetOrComputePath(ctx, "r", ref(stale), cnt.fn(stale)); err != nil || path != PathComputed {
		t.Fatalf("key %d: %v %v", stale, path, err)
	}
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	if _, path, err := a.GetOrComputePath(ctx, "r", ref(fresh), cnt.fn(fresh)); err != nil || path != PathComputed {
		t.Fatalf("key %d: %v %v", fresh, path, err)
	}
	v, path, err := b.GetOrComputePath(ctx, "r", ref(stale), cnt.fn(stale))
	if err != nil || path != PathComputed || cnt.n[stale].Load() != 2 {
		t.Fatalf("shard 1's record reserved before the invalidation: %v %v, %d computes; want it refused and computed again",
			path, err, cnt.n[stale].Load())
	}
	sameValue(t, v, stale)
	v, path, err = b.GetOrComputePath(ctx, "r", ref(fresh), cnt.fn(fresh))
	if err != nil || path != PathRemoteHit || cnt.n[fresh].Load() != 1 {
		t.Fatalf("shard 2's record reserved after the invalidation: %v %v, %d computes; want it served",
			path, err, cnt.n[fresh].Load())
	}
	sameValue(t, v, fresh)
}

// TestShardedBucket: with the keys spread over three KV buckets, values
// are shared, waited for and invalidated as with one; an expired value in
// any shard is evicted (the reconciler follows every shard's stream), the
// number of shards is the bucket's (a process without the option adopts
// it, one with another is refused).
func TestShardedBucket(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, srv.ClientURL(), store, WithLeaseShards(3), WithStoreTTL(2*time.Second))
	rec := activeReconciler(t, srv.ClientURL(), store)
	b := eventCache(t, srv.ClientURL(), store, WithStoreTTL(2*time.Second))
	if _, err := New(context.Background(), connect(t, srv.ClientURL()), WithLeaseShards(2), WithNode("test-node"), WithMode(ModeStrict)); !errors.Is(err, ErrInvalidOption) ||
		!strings.Contains(err.Error(), "3 shards") {
		t.Fatalf("a cache asking for 2 shards of a bucket of 3: %v", err)
	}
	ctx := context.Background()
	var cnt counter
	shards := map[int]bool{}
	for i := range 12 {
		shards[lease.ShardOf(ref(i).KVKey(), 3)] = true
		if _, path, err := a.GetOrComputePath(ctx, "r", ref(i), cnt.fn(i)); err != nil || path != PathComputed {
			t.Fatalf("a, key %d: %v %v", i, path, err)
		}
		if _, path, err := b.GetOrComputePath(ctx, "r", ref(i), cnt.fn(i)); err != nil || path != PathRemoteHit {
			t.Fatalf("b, key %d: %v %v", i, path, err)
		}
	}
	a.Release("r")
	b.Release("r")
	if len(shards) != 3 {
		t.Fatalf("the keys landed in %d shards", len(shards))
	}
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return rec.Stats().Invalidated == 12 })
	for i := range 12 {
		if readRecord(t, a, ref(i)).Live {
			t.Fatalf("key %d (shard %d) outlived its invalidation", i, lease.ShardOf(ref(i).KVKey(), 3))
		}
	}
	// Computed again, then left to expire: every shard's values are evicted.
	for i := range 12 {
		if _, err := b.GetOrCompute(ctx, "s", ref(i), cnt.fn(i)); err != nil {
			t.Fatal(err)
		}
	}
	b.Release("s")
	deadline := time.Now().Add(20 * time.Second)
	for rec.Stats().Expired != 12 {
		if time.Now().After(deadline) {
			live := 0
			for i := range 12 {
				if readRecord(t, a, ref(i)).Live {
					live++
				}
			}
			t.Fatalf("reconciler %+v, %d records live", rec.Stats(), live)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
