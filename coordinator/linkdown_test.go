package coordinator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
)

// linkDown stops c's event link as if it had not come up yet: copies made
// until linkUp are noted nowhere.
func linkDown(t *testing.T, c *Cache) {
	t.Helper()
	l := c.eventLink()
	if l == nil {
		t.Fatal("no event link")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.close(ctx)
	c.mu.Lock()
	c.events = nil
	c.mu.Unlock()
}

// linkUp starts c's event link again, as its retry does.
func linkUp(t *testing.T, c *Cache) {
	t.Helper()
	if err := c.startEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestCopiesMadeWhileTheLinkWasDownAreDropped: a copy pulled while the
// event link was not up goes when it comes up (it may have missed an
// invalidation, and the link has no notes of it to touch it by); the next
// request pulls it again, with its notes, and its hits are touches. (It
// stayed, unknown to the link, for its record's whole life.)
func TestCopiesMadeWhileTheLinkWasDownAreDropped(t *testing.T) {
	url, store := memoryCluster(t)
	b := eventCache(t, url, store)
	waitFor(t, func() bool { return b.eventLink() != nil })
	made := time.Now() // the stream older than a's replay start (see below)
	waitFor(t, func() bool { return time.Since(made) > 500*time.Millisecond })
	a := eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	r := ref(1)
	if _, err := b.GetOrCompute(ctx, "b", r, cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	b.Release("b")
	linkDown(t, a)
	if _, path, err := a.GetOrComputePath(ctx, "a", r, cnt.fn(1)); err != nil || path != PathRemoteHit {
		t.Fatalf("a's pull: %v %v", path, err)
	}
	a.Release("a")
	linkUp(t, a)
	if _, path, err := a.GetOrComputePath(ctx, "a", r, cnt.fn(1)); err != nil || path != PathRemoteHit {
		t.Fatalf("after the link came up: %v %v, want the copy pulled again", path, err)
	}
	a.Release("a")
	before := a.Stats().Touches
	tick := time.NewTicker(50 * time.Millisecond) // hits for five touch intervals (200 ms): a time to pass
	defer tick.Stop()
	for end := time.Now().Add(time.Second); time.Now().Before(end); <-tick.C {
		if _, path, err := a.GetOrComputePath(ctx, "a", r, cnt.fn(1)); err != nil || path != PathLocalHit {
			t.Fatalf("a's hit: %v %v", path, err)
		}
		a.Release("a")
	}
	if a.Stats().Touches == before {
		t.Fatal("a second of hits sent no touch")
	}
}

// TestAComputeAcrossTheLinksStartHearsAnEarlierInvalidation: a compute
// without sharing that began before the event link came up, and ends
// after, is not kept if an invalidation of its labels was published
// meanwhile, long before the link came up: the link replays the stream's
// invalidations from the Cache's start. (Subscribed from "now", it missed
// it, and the copy was served.)
func TestAComputeAcrossTheLinksStartHearsAnEarlierInvalidation(t *testing.T) {
	url, store := memoryCluster(t)
	b := eventCache(t, url, store)
	waitFor(t, func() bool { return b.eventLink() != nil })
	// The stream must be older than a's start less two clock allowances
	// (400 ms at the 1 s lease), or a's link drops every copy and flight at
	// its start (holdsSince): a time to pass, not an order of goroutines.
	made := time.Now()
	waitFor(t, func() bool { return time.Since(made) > 500*time.Millisecond })
	a := eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	r := ref(2)
	other := r
	other.Epoch = 7 // the key's record carries other labels: a computes unshared
	if _, err := b.GetOrCompute(ctx, "b", other, cnt.fn(2)); err != nil {
		t.Fatal(err)
	}
	b.Release("b")
	linkDown(t, a)
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, path, err := a.GetOrComputePath(ctx, "a", r, func(context.Context) (*payload.Value, error) {
			close(started)
			<-release
			return embedding(2), nil
		})
		if err == nil && path != PathDegraded {
			err = errors.New("not computed unshared: " + path.String())
		}
		done <- err
	}()
	<-started
	if err := b.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	// Older than what a subscription from "now" replays (a second).
	invalidated := time.Now()
	waitFor(t, func() bool { return time.Since(invalidated) > 1500*time.Millisecond })
	linkUp(t, a)
	waitFor(t, func() bool { return a.Stats().EventsDecoded > 0 }) // the replay has come
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a.Release("a")
	if a.local.Contains(r.local()) {
		t.Fatal("a copy computed across the link's start was kept after an invalidation of its labels")
	}
}

// TestAnUnsharedCopyLivesALeaseTTL: a value computed without sharing (here
// the key's record carries other labels) is a local copy for one lease
// TTL from its compute, however often it is hit; then the store is asked
// again. (Its expiry slid on every hit: it was served for good.)
func TestAnUnsharedCopyLivesALeaseTTL(t *testing.T) {
	url, store := memoryCluster(t)
	owner, other := newCache(t, url, store), newCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	r := ref(3)
	if _, err := owner.GetOrCompute(ctx, "o", r, cnt.fn(3)); err != nil {
		t.Fatal(err)
	}
	mislabelled := r
	mislabelled.Epoch = 9
	if _, path, err := other.GetOrComputePath(ctx, "x", mislabelled, cnt.fn(3)); err != nil || path != PathDegraded {
		t.Fatalf("a compute under other labels: %v %v, want degraded", path, err)
	}
	other.Release("x")
	computed := time.Now()
	for {
		_, path, err := other.GetOrComputePath(ctx, "x", mislabelled, cnt.fn(3))
		other.Release("x")
		if err != nil {
			t.Fatal(err)
		}
		if path != PathLocalHit {
			break // asked the store again
		}
		if time.Since(computed) > 5*time.Second { // five lease TTLs of hits
			t.Fatal("the unshared copy is still served after five lease TTLs of hits")
		}
		time.Sleep(50 * time.Millisecond) // a hit every 50 ms: a sliding expiry never comes
	}
	if took := time.Since(computed); took < time.Second {
		t.Fatalf("the unshared copy went after %v, before its lease TTL", took)
	}
}

// hookedPull is a payload transport that runs onGet while a pull is under
// way (after the record was read, before the value arrives).
type hookedPull struct {
	*payload.MemoryStore
	onGet func()
}

func (h hookedPull) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	h.onGet()
	return h.MemoryStore.Get(ctx, loc)
}

// TestAnInvalidationHeardDuringAPullRefusesItsValue: an invalidated event
// of the caller's labels that arrives after the record was read refuses
// the value pulled, even when the tombstone read that follows the pull
// does not show the invalidation (here there is no tombstone: in tenant
// mode the read is a direct get, which a lagging replica answers).
// GetOrCompute computes its own value, unshared; Get misses. (The value
// was served, and kept as a copy.)
func TestAnInvalidationHeardDuringAPullRefusesItsValue(t *testing.T) {
	url, store := memoryCluster(t)
	writer := eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	for _, i := range []int{4, 5} {
		if _, err := writer.GetOrCompute(ctx, "w", ref(i), cnt.fn(i)); err != nil {
			t.Fatal(err)
		}
	}
	writer.Release("w")
	var reader *Cache
	heard := func() {
		reader.eventLink().apply(events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1,
			Key: events.InvalidationKey("m", 1)})
	}
	reader = eventCache(t, url, hookedPull{store, heard}, WithTenants("acme"))
	waitFor(t, func() bool { return reader.eventLink() != nil })
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(4), cnt.fn(4)); err != nil || path != PathDegraded {
		t.Fatalf("a pull during which an invalidation arrived: %v %v, want its own value (degraded)", path, err)
	}
	if _, _, err := reader.Get(ctx, "g", ref(5)); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Get, an invalidation arriving during its pull: %v, want ErrNotCached", err)
	}
	if reader.local.Contains(ref(5).local()) {
		t.Fatal("the refused pull left a copy")
	}
}

// TestATombstoneReadBehindAnInvalidationHeardIsNotTrusted: a process
// that has heard an invalidation reads, for a request begun after it, a
// committed record and a tombstone from a server that has not got that
// invalidation (in tenant mode a lagging or cut-off replica answers
// direct gets: the fault harness saw one serve the invalidated value for
// seconds, seed 11476156684601). Here the event is heard and no
// tombstone was ever written, which is what such a replica answers: the
// value is not served from the store; the request computes its own,
// unshared.
func TestATombstoneReadBehindAnInvalidationHeardIsNotTrusted(t *testing.T) {
	url, store := memoryCluster(t)
	writer := eventCache(t, url, store)
	ctx := context.Background()
	var cnt counter
	if _, err := writer.GetOrCompute(ctx, "w", ref(4), cnt.fn(4)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")
	reader := eventCache(t, url, store, WithTenants("acme"))
	waitFor(t, func() bool { return reader.eventLink() != nil })
	heard := time.Now()
	reader.eventLink().apply(events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1,
		Key: events.InvalidationKey("m", 1), Time: heard})
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(4), cnt.fn(4)); err != nil || path != PathDegraded {
		t.Fatalf("a record read after an invalidation was heard, its tombstone read behind it: %v %v, want its own value (degraded)", path, err)
	}
	reader.Release("r")
	reader.Drop(ref(4)) // its own copy, unshared: not the question here
	if _, _, err := reader.Get(ctx, "g", ref(4)); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Get of it: %v, want ErrNotCached", err)
	}
	// A record reserved after the invalidation, whose tombstone the read
	// reflects, is served again.
	if err := writer.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return reader.invalidationHeardAt(ref(4)).After(heard) })
	if _, err := writer.GetOrCompute(ctx, "w2", ref(4), cnt.fn(4)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, path, err := reader.GetOrComputePath(ctx, "r2", ref(4), cnt.fn(4))
		reader.Release("r2")
		return err == nil && path == PathRemoteHit
	})
}
