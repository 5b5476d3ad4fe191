package coordinator

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go/jetstream"
)

// memoryCluster is one NATS server and a payload store its "processes"
// share.
func memoryCluster(t *testing.T) (url string, store *payload.MemoryStore) {
	t.Helper()
	return startServer(t).ClientURL(), payload.NewMemoryStore("test-node", 0)
}

// activeReconciler starts a reconciler and waits until it is the active one.
func activeReconciler(t *testing.T, url string, store payload.Transport, opts ...reconciler.Option) *reconciler.Reconciler {
	t.Helper()
	rec, _ := startReconciler(t, url, store, opts...)
	waitFor(t, func() bool { return rec.Stats().Active })
	return rec
}

// TestInvalidationWithoutReconciler: no reconciler runs. Once Invalidate
// returns, no process serves a record of the invalidated model and epoch:
// local copies go with the event, and a process that reads the record
// refuses it (the tombstone is later than its reservation), purges it and
// computes again; the recomputed value is shared as usual. Other epochs are
// untouched.
func TestInvalidationWithoutReconciler(t *testing.T) {
	url, store := memoryCluster(t)
	a, b := eventCache(t, url, store), eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	target, other := ref(1), ref(2)
	other.Epoch = 2
	for _, c := range []*Cache{a, b} {
		for i, r := range []Ref{target, other} {
			if _, err := c.GetOrCompute(ctx, "r", r, cnt.fn(i+1)); err != nil {
				t.Fatal(err)
			}
		}
		c.Release("r")
	}
	if !b.local.Contains(target.local()) || b.Stats().RemoteHits != 2 {
		t.Fatalf("b did not pull: %+v", b.Stats())
	}
	oldLoc := *readRecord(t, a, target).Record.Location
	if err := a.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !b.local.Contains(target.local()) })
	if !b.local.Contains(other.local()) {
		t.Fatal("another epoch's copy was dropped")
	}

	// A process that only looks finds nothing; one that computes computes.
	c := eventCache(t, url, store)
	if _, _, err := c.Get(ctx, "g", target); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Get of an invalidated value: %v", err)
	}
	// The new weights give the key other bytes (embedding 9). d starts
	// after its link's replay (from its start, less two 200 ms allowances)
	// would bring the invalidation: a time to pass, not an order.
	invalidated := time.Now()
	waitFor(t, func() bool { return time.Since(invalidated) > 600*time.Millisecond })
	d := eventCache(t, url, store)
	v, path, err := d.GetOrComputePath(ctx, "r", target, cnt.fn(9))
	if err != nil || path != PathComputed {
		t.Fatalf("after the invalidation: path %v, %v", path, err)
	}
	sameValue(t, v, 9)
	d.Release("r")
	// The eviction of the invalidated record (the old bytes) may reach d's
	// node after d's copy is in: the copy is of other bytes, and stays.
	d.eventLink().apply(events.Event{Kind: events.KindEvicted, Tenant: "acme", Key: target.Key,
		Cause: events.CauseInvalidated, Location: &oldLoc})
	if !d.local.Contains(target.local()) || d.Stats().Local.Evicted(localcache.CauseStore) != 0 {
		t.Fatalf("the recomputed copy was dropped: %+v", d.Stats().Local)
	}
	// An eviction of its own record's bytes while the record names them is
	// not its record's (committed again since): the copy stays too.
	newLoc := *readRecord(t, d, target).Record.Location
	evictNew := events.Event{Kind: events.KindEvicted, Tenant: "acme", Key: target.Key, Cause: events.CauseExpired, Location: &newLoc}
	d.eventLink().apply(evictNew)
	if !d.local.Contains(target.local()) {
		t.Fatal("an eviction of a record committed again took the copy")
	}
	if _, path, err := d.GetOrComputePath(ctx, "r", other, cnt.fn(2)); err != nil || path != PathRemoteHit {
		t.Fatalf("another epoch: path %v, %v", path, err)
	}
	if s := c.Stats().InvalidatedRecords + d.Stats().InvalidatedRecords; s == 0 {
		t.Fatal("no invalidated record counted")
	}
	// The value computed after the invalidation is shared again.
	e := eventCache(t, url, store)
	v, path, err = e.GetOrComputePath(ctx, "r", target, cnt.fn(1))
	if err != nil || path != PathRemoteHit {
		t.Fatalf("the recomputed value: path %v, %v", path, err)
	}
	sameValue(t, v, 9) // not the old bytes, though they were written under the same name
	if n := cnt.n[1].Load(); n != 1 {
		t.Fatalf("%d computes with the old weights, want 1", n)
	}
}

// TestLocalCopyEndsWithItsRecord: a local copy expires with its record,
// whatever the local TTL (an hour here): with no reconciler the record is
// never extended, local hits do not extend the copy, and every copy is
// gone when the server has expired the record.
func TestLocalCopyEndsWithItsRecord(t *testing.T) {
	url, store := memoryCluster(t)
	const storeTTL = 2 * time.Second
	a := eventCache(t, url, store, WithStoreTTL(storeTTL))
	b := eventCache(t, url, store, WithStoreTTL(storeTTL))
	ctx := context.Background()
	var cnt counter
	for _, c := range []*Cache{a, b} {
		if _, err := c.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
			t.Fatal(err)
		}
		c.Release("r")
	}
	expires := readRecord(t, a, ref(1)).Record.Expires
	// b hits its copy as long as it has one: the hits do not extend it.
	waitFor(t, func() bool {
		if !b.local.Contains(ref(1).local()) {
			return true
		}
		b.localHit("hit", ref(1))
		b.Release("hit")
		return false
	})
	if gone := time.Now(); gone.Before(expires) {
		t.Fatalf("the copy went at %v, before its record's expiry %v", gone, expires)
	}
	waitFor(t, func() bool { return !readRecord(t, a, ref(1)).Live })
	for _, c := range []*Cache{a, b} {
		if c.local.Contains(ref(1).local()) {
			t.Fatal("a copy outlived its record")
		}
		// Out of the index too (not only expired) once the watcher has
		// seen the record go.
		waitFor(t, func() bool {
			s := c.Stats().Local
			return s.Entries == 0 && s.Evicted(localcache.CauseTTL)+s.Evicted(localcache.CauseStore) == 1
		})
	}
}

// TestTouchedCopyFollowsItsRecord: with a reconciler, a value hit on one
// process keeps its record alive (each touch's TTL rounded up, so the
// record lives at least until its expires), and that process's copy
// follows the record past its first expiry (it reads the record before
// the copy ends). The copy on another process that does not use it ends
// at its own expiry, which was its record's when it was pulled: it never
// outlives the record, and it costs that process no read.
func TestTouchedCopyFollowsItsRecord(t *testing.T) {
	url, store := memoryCluster(t)
	// A touch goes out every quarter TTL, and a's copy reads its record a
	// quarter TTL before it ends: at 2 s a reconciler held up 0.5 s under
	// a loaded race run let the copy end (1 run in about 50).
	const storeTTL = 4 * time.Second
	rec := activeReconciler(t, url, store)
	a := eventCache(t, url, store, WithStoreTTL(storeTTL))
	b := eventCache(t, url, store, WithStoreTTL(storeTTL))
	ctx := context.Background()
	var cnt counter
	for _, c := range []*Cache{a, b} {
		if _, err := c.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
			t.Fatal(err)
		}
		c.Release("r")
	}
	first := readRecord(t, a, ref(1)).Record.Expires
	// a keeps using its copy until past the record's first expiry; every
	// hit is a local one.
	hits := a.Stats().LocalHits
	waitFor(t, func() bool {
		if _, path, err := a.GetOrComputePath(ctx, "hit", ref(1), cnt.fn(1)); err != nil || path != PathLocalHit {
			t.Fatalf("a's hit: path %v, %v", path, err)
		}
		a.Release("hit")
		return time.Now().After(first.Add(200 * time.Millisecond))
	})
	cur := readRecord(t, a, ref(1))
	if !cur.Live || !cur.Record.Expires.After(first) || rec.Stats().Touches == 0 {
		t.Fatalf("record not extended: %+v, reconciler %+v", cur, rec.Stats())
	}
	if end := cur.Stamp.Add(cur.TTL); end.Before(cur.Record.Expires) {
		t.Fatalf("the record's TTL ends at %v, before its expires %v", end, cur.Record.Expires)
	}
	if a.Stats().LocalHits == hits || a.Stats().RemoteHits != 0 {
		t.Fatalf("a's copy did not follow its record: %+v", a.Stats())
	}
	if b.local.Contains(ref(1).local()) {
		t.Fatal("b's unused copy outlived its first expiry")
	}
	// Unused, the record goes, and a's copy with it.
	waitFor(t, func() bool { return !a.local.Contains(ref(1).local()) })
	if cnt.n[1].Load() != 1 {
		t.Fatalf("%d computes", cnt.n[1].Load())
	}
}

// TestOneEvictedPerEviction: each value that leaves the store is announced
// once, with the true cause: invalidated (the reconciler's purge), corrupt
// (a reader found its payload gone and purged the record), expired (its
// TTL ran out).
func TestOneEvictedPerEviction(t *testing.T) {
	url, store := memoryCluster(t)
	const storeTTL = 6 * time.Second // ref(2) must be read (and found corrupt) well before its record may have expired, on a loaded machine too
	activeReconciler(t, url, store)
	a := eventCache(t, url, store, WithStoreTTL(storeTTL))
	ctx := context.Background()

	type seen struct {
		key   int
		cause events.Cause
	}
	var mu sync.Mutex
	counts := map[seen]int{}
	keys := map[payload.ObjectID]int{ref(1).Object(): 1, ref(2).Object(): 2, ref(3).Object(): 3}
	js, _ := jetstream.New(connect(t, url))
	sub, err := events.Subscribe(ctx, js, events.SubscribeOptions{Kinds: []events.Kind{events.KindEvicted}, New: true},
		func(e events.Event) error {
			mu.Lock()
			counts[seen{keys[payload.ObjectID{Tenant: e.Tenant, Key: e.Key}], e.Cause}]++
			mu.Unlock()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	count := func(key int, cause events.Cause) int {
		mu.Lock()
		defer mu.Unlock()
		return counts[seen{key, cause}]
	}

	var cnt counter
	stale := ref(1)
	stale.Epoch = 7
	for _, r := range []Ref{stale, ref(2), ref(3)} {
		if _, err := a.GetOrCompute(ctx, "r", r, cnt.fn(int(r.Key[0]))); err != nil {
			t.Fatal(err)
		}
	}
	a.Release("r")
	if err := a.Invalidate(ctx, "acme", "m", 7); err != nil {
		t.Fatal(err)
	}
	// Announced: the reconciler has read every event before the
	// invalidation, so it knows ref(2) (it takes events in order).
	waitFor(t, func() bool { return count(1, events.CauseInvalidated) > 0 })
	// ref(2)'s payload goes missing: the next reader purges its record.
	removePayload(t, store, *readRecord(t, a, ref(2)).Record.Location)
	b := eventCache(t, url, store, WithStoreTTL(storeTTL))
	if _, path, err := b.GetOrComputePath(ctx, "r", ref(2), cnt.fn(2)); err != nil || path != PathComputed {
		t.Fatalf("ref(2): %v %v", path, err)
	}
	// ref(3) expires unused; by the time its eviction is announced, every
	// announcement of the others has been made (one reconciler, in order).
	waitFor(t, func() bool { return count(3, events.CauseExpired) > 0 })
	want := map[seen]int{{1, events.CauseInvalidated}: 1, {2, events.CauseCorrupt}: 1, {3, events.CauseExpired}: 1}
	mu.Lock()
	defer mu.Unlock()
	for s, n := range counts {
		if s.key == 2 && s.cause == events.CauseExpired {
			continue // the recomputed value may have expired too
		}
		if want[s] != n {
			t.Errorf("key %d, cause %v: %d evicted events, want %d", s.key, s.cause, n, want[s])
		}
	}
	for s, n := range want {
		if counts[s] != n {
			t.Errorf("key %d, cause %v: %d evicted events, want %d", s.key, s.cause, counts[s], n)
		}
	}
}

// TestSweepRemovesOrphanPayloads: with no reconciler, a payload file whose
// record expired is removed by the node's own sweep (even when its epoch
// was invalidated since, which takes it out of every event's view), and
// the temp file of a writer that died mid-write (never removed: shm's
// Sweep had no caller); a file whose record lives stays.
func TestSweepRemovesOrphanPayloads(t *testing.T) {
	srv := startServer(t)
	url := srv.ClientURL()
	ctx := context.Background()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	shmOpts := []Option{shmRoute(t, store)}
	var cnt counter
	// The short-lived value, and one that outlives the test.
	short := eventCache(t, url, store, append(shmOpts, WithStoreTTL(time.Second), WithPayloadSweep(-1))...)
	long := eventCache(t, url, store, append(shmOpts, WithStoreTTL(time.Hour), WithPayloadSweep(-1))...)
	if _, err := short.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := long.GetOrCompute(ctx, "r", ref(2), cnt.fn(2)); err != nil {
		t.Fatal(err)
	}
	short.Release("r")
	long.Release("r")
	waitFor(t, func() bool { return !readRecord(t, short, ref(1)).Live })
	if err := short.Invalidate(ctx, "acme", "m", 1); err != nil { // both are epoch 1: ref(2)'s record stays, refused
		t.Fatal(err)
	}
	// And a temp file of a writer killed in the middle of a Put (no one
	// holds it locked, a minute old).
	dead := filepath.Join(store.Dir(), ".tmp", "1-dead")
	if err := os.WriteFile(dead, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if then := time.Now().Add(-2 * time.Minute); os.Chtimes(dead, then, then) != nil {
		t.Fatal("chtimes")
	}
	sweeper := eventCache(t, url, store, append(shmOpts, WithPayloadSweep(100*time.Millisecond))...)
	waitFor(t, func() bool { return sweeper.Stats().PayloadsSwept == 1 })
	waitFor(t, func() bool { _, err := os.Stat(dead); return errors.Is(err, os.ErrNotExist) })
	if _, err := os.Stat(store.Path(ref(1).Object())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the expired value's file: %v", err)
	}
	if _, err := os.Stat(store.Path(ref(2).Object())); err != nil {
		t.Fatalf("a live record's file went: %v", err)
	}
}

// TestUnusedValueGoesOneStoreTTLAfterItsLastUse: a hit inside the touch
// interval is not dropped by the coalescing: its touch goes out at the
// interval's end, so the record lives one store TTL past the last use.
func TestUnusedValueGoesOneStoreTTLAfterItsLastUse(t *testing.T) {
	url, store := memoryCluster(t)
	const storeTTL = 5 * time.Second // the owed touch must be applied before the record's first expiry, on a busy machine too
	activeReconciler(t, url, store)
	a := eventCache(t, url, store, WithStoreTTL(storeTTL), WithEvents(500*time.Millisecond))
	ctx := context.Background()
	var cnt counter
	if _, err := a.GetOrCompute(ctx, "r", ref(1), cnt.fn(1)); err != nil { // committed: counts as a touch
		t.Fatal(err)
	}
	a.Release("r")
	lastUse := time.Now()
	if _, ok, err := a.localHit("hit", ref(1)); !ok || err != nil { // inside the interval: owed
		t.Fatal(ok, err)
	}
	a.Release("hit")
	waitFor(t, func() bool {
		return !readRecord(t, a, ref(1)).Record.Expires.Before(lastUse.Add(storeTTL))
	})
}

// TestComputeSpanningAnInvalidation: a value whose compute started before
// an invalidation is handed to its caller, but neither kept nor shared.
// When the invalidation's event arrives while it computes, its copy never
// enters the local cache and its record goes at its commit; when the event
// comes after the commit (held back here), the copy goes on its arrival,
// and no other process is served the record meanwhile (its tombstone).
func TestComputeSpanningAnInvalidation(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "event-during-compute", true: "event-after-commit"}[late], func(t *testing.T) {
			url, store := memoryCluster(t)
			a, b := eventCache(t, url, store), eventCache(t, url, store)
			ctx := context.Background()
			if late {
				a.eventLink().sub.Stop() // its events are handed to it below
			}
			started, finish := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := a.GetOrCompute(ctx, "r", ref(1), func(context.Context) (*payload.Value, error) {
					close(started)
					<-finish
					return embedding(1), nil // the old weights' value
				})
				a.Release("r")
				done <- err
			}()
			<-started
			if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
				t.Fatal(err)
			}
			if !late {
				waitFor(t, func() bool { return computeMarked(a, ref(1)) }) // the event applied, not only decoded
			}
			close(finish)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if late {
				// Until its event arrives the copy is kept, as every copy of
				// an invalidated value is (docs/protocol.md 4.4).
				if !a.local.Contains(ref(1).local()) {
					t.Fatal("the event held back, yet the copy is not in the local cache: the late case is not tested")
				}
				// The event b published: its time is its tombstone's.
				tomb, err := a.bucket().Tombstone(ctx, 0, "acme", "m", 1)
				if err != nil || tomb.Rev == 0 {
					t.Fatalf("the tombstone: %+v %v", tomb, err)
				}
				a.eventLink().apply(events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1,
					Key: events.InvalidationKey("m", 1), Time: tomb.At})
			} else {
				waitFor(t, func() bool { return !readRecord(t, a, ref(1)).Live })
			}
			if a.local.Contains(ref(1).local()) {
				t.Fatal("a value computed across an invalidation is in the local cache after its event")
			}
			for _, c := range []*Cache{b, a} {
				v, path, err := c.GetOrComputePath(ctx, "r2", ref(1), func(context.Context) (*payload.Value, error) { return embedding(9), nil })
				if err != nil || (path != PathComputed && path != PathRemoteHit && path != PathWaited) {
					t.Fatal(path, err)
				}
				sameValue(t, v, 9)
				c.Release("r2")
			}
		})
	}
}

// TestComputeWithAnUnreadableTombstoneIsNotKept: a commit whose tombstone
// cannot be read (here it does not decode; after Close, a shared read is
// refused) leaves the question open: the caller gets its value and the
// record stays for its readers, who check the tombstone themselves, but
// the local copy, which nothing checks again, is not kept. Without events
// every commit reads its tombstone.
func TestComputeWithAnUnreadableTombstoneIsNotKept(t *testing.T) {
	url, store := memoryCluster(t)
	a := newCache(t, url, store)
	ctx := context.Background()
	key := lease.TombstoneKey("acme", "m", 1)
	if _, err := a.bucket().KV(key).Put(ctx, key, []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	var cnt counter
	v, path, err := a.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
	if err != nil || path != PathComputed {
		t.Fatalf("path %v, %v; want computed", path, err)
	}
	sameValue(t, v, 1)
	a.Release("r")
	if a.local.Contains(ref(1).local()) {
		t.Fatal("a value whose tombstone could not be read is in the local cache")
	}
	if !readRecord(t, a, ref(1)).Live {
		t.Fatal("the record was purged on a tombstone that could not be read")
	}
}

// computeMarked reports whether an invalidation's event has marked c's
// registered compute of r (eventLink.startCompute).
func computeMarked(c *Cache, r Ref) bool {
	l := c.eventLink()
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.computing[r.local()]
	return m != nil && m.invalidated
}

// TestReleasedOldCopyKeepsTheNewCopysNotes: a copy detached by an
// invalidation and released after the key was computed again must not
// take the new copy's notes with it, or the next invalidation would not
// find the new copy.
func TestReleasedOldCopyKeepsTheNewCopysNotes(t *testing.T) {
	url, store := memoryCluster(t)
	a := eventCache(t, url, store)
	b := eventCache(t, url, store) // invalidates: a hears each event once, from the stream
	ctx := context.Background()
	obj := ref(1).local()
	var cnt counter
	if _, err := a.GetOrCompute(ctx, "old", ref(1), cnt.fn(1)); err != nil { // pinned by "old"
		t.Fatal(err)
	}
	if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !a.local.Contains(obj) }) // detached, still pinned

	if _, path, err := a.GetOrComputePath(ctx, "new", ref(1), cnt.fn(1)); err != nil || path != PathComputed {
		t.Fatalf("after the invalidation: %v %v, want the key computed again", path, err)
	}
	a.Release("new")
	if !a.local.Contains(obj) {
		t.Fatal("the new copy is not in the local cache")
	}
	a.Release("old") // the old copy goes now
	if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !a.local.Contains(obj) })
}
