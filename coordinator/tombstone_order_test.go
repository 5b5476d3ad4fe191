package coordinator

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
)

// lateInvalidation is an Invalidate of tenant's model and epoch whose
// clock reading (read) came before another invalidation of the same
// labels, and whose tombstone write lands after that one's: what
// writeTombstone does when its PutTombstone is slow (an R3 write waiting
// out an election, a GC pause, a write whose answer timed out and that
// landed after the caller's "invalidate again"). It writes the tombstone
// writeTombstone would have written with that reading, then publishes
// the event with the same Time, as publishInvalidation does.
func lateInvalidation(t *testing.T, c *Cache, read time.Time, tenant, model string, epoch uint64) {
	t.Helper()
	ctx := context.Background()
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "other-node/1/slow",
		Started: read, Heartbeat: read, Model: model, Epoch: epoch}
	if err := c.bucket().PutTombstone(ctx, tenant, model, epoch, tomb, lease.TombstoneTTL(c.s.storeTTL)); err != nil {
		t.Fatal(err)
	}
	pub := events.NewPublisher(c.js, events.PublisherOptions{Workers: 1, Queue: 1, Logger: slog.Default()})
	defer pub.Close(ctx)
	e := &events.Event{Kind: events.KindInvalidated, Tenant: tenant, Key: events.InvalidationKey(model, epoch),
		Model: model, Epoch: epoch, Node: "other-node", Time: read}
	if err := publishInvalidation(ctx, pub, e); err != nil {
		t.Fatal(err)
	}
}

// TestTwoInvalidationsLandingOutOfClockOrderKeepSharing: two
// invalidations of the same labels whose tombstone writes land in the
// other order than their clock readings (A reads its clock, B invalidates,
// A's write lands). The tombstone left carries the later reading (B's), so
// a process that heard both events trusts its reads: a key computed after
// both is shared, and the record reserved before both is purged and
// computed again. (Found by a review: A's earlier reading was left, every
// read was "behind" the later event, and nothing of the labels was shared
// for the tombstone's 25 h.)
func TestTwoInvalidationsLandingOutOfClockOrderKeepSharing(t *testing.T) {
	url, store := memoryCluster(t)
	writer := eventCache(t, url, store)
	reader := eventCache(t, url, store)
	waitFor(t, func() bool { return writer.eventLink() != nil && reader.eventLink() != nil })
	ctx := context.Background()
	var cnt counter
	if _, err := writer.GetOrCompute(ctx, "w", ref(4), cnt.fn(4)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")

	t1 := time.Now()                                               // invalidator A reads its clock...
	if err := writer.Invalidate(ctx, "acme", "m", 1); err != nil { // ...B invalidates (t2 > t1)...
		t.Fatal(err)
	}
	lateInvalidation(t, writer, t1, "acme", "m", 1) // ...and A's write lands last.
	waitFor(t, func() bool { return reader.invalidationsHeard(ref(4)) == 2 && writer.invalidationsHeard(ref(4)) == 3 })

	// The key computed again after both invalidations.
	if _, path, err := writer.GetOrComputePath(ctx, "w", ref(5), cnt.fn(5)); err != nil || path != PathComputed {
		t.Fatalf("the writer's compute of a new key: %v %v", path, err)
	}
	writer.Release("w")
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(5), cnt.fn(5)); err != nil || path != PathRemoteHit {
		t.Errorf("a record reserved after both invalidations, read by a process that heard both: %v %v, want remote-hit (computes of it: %d)",
			path, err, cnt.n[5].Load())
	}
	reader.Release("r")
	// The record reserved before both: refused, as it should be, but
	// never purged, so the key is never computed again and shared.
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(4), cnt.fn(4)); err != nil || path != PathComputed {
		t.Errorf("a record reserved before both invalidations: %v %v, want it purged and computed again (computed)", path, err)
	}
	reader.Release("r")
}

// TestTwoInvalidationsOutOfClockOrderLeaveStrictReadersServed: the same
// interleaving, a ModeStrict reader, which would answer ErrStoreUnavailable
// for an unreadable tombstone: it is served a record committed after both.
func TestTwoInvalidationsOutOfClockOrderLeaveStrictReadersServed(t *testing.T) {
	url, store := memoryCluster(t)
	writer := eventCache(t, url, store)
	reader := eventCache(t, url, store, WithMode(ModeStrict))
	waitFor(t, func() bool { return writer.eventLink() != nil && reader.eventLink() != nil })
	ctx := context.Background()
	var cnt counter
	t1 := time.Now()
	if err := writer.Invalidate(ctx, "acme", "m", 1); err != nil {
		t.Fatal(err)
	}
	lateInvalidation(t, writer, t1, "acme", "m", 1)
	waitFor(t, func() bool { return reader.invalidationsHeard(ref(6)) == 2 })
	if _, err := writer.GetOrCompute(ctx, "w", ref(6), cnt.fn(6)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(6), cnt.fn(6)); err != nil {
		t.Fatalf("a strict reader of a record committed after both invalidations: %v %v, want a remote hit", path, err)
	}
	reader.Release("r")
}

// TestAHeardInvalidationIsForgottenWhenItsTombstoneMayHaveExpired: a
// process keeps an invalidation's Time, against which it checks its
// tombstone reads, only as long as the shortest tombstone lives (25 h),
// whatever its own store TTL: the invalidator's store TTL set the
// tombstone's (`embcache invalidate --store-ttl` defaults to 1 h). 26 h
// after an invalidation whose tombstone has expired, a record committed
// since is shared by a worker with a 24 h store TTL. The 26 hours are
// emulated: the event is applied with a Time 26 h ago, and no tombstone is
// written.
func TestAHeardInvalidationIsForgottenWhenItsTombstoneMayHaveExpired(t *testing.T) {
	url, store := memoryCluster(t)
	writer := eventCache(t, url, store)
	reader := eventCache(t, url, store, WithStoreTTL(24*time.Hour))
	waitFor(t, func() bool { return writer.eventLink() != nil && reader.eventLink() != nil })
	invalidated := time.Now().Add(-26 * time.Hour)
	if invalidated.Add(lease.TombstoneTTL(time.Hour)).After(time.Now()) {
		t.Fatal("the tombstone of a 1 h store TTL would still live")
	}
	reader.eventLink().apply(events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1,
		Key: events.InvalidationKey("m", 1), Time: invalidated})
	ctx := context.Background()
	var cnt counter
	if _, err := writer.GetOrCompute(ctx, "w", ref(9), cnt.fn(9)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")
	if _, path, err := reader.GetOrComputePath(ctx, "r", ref(9), cnt.fn(9)); err != nil || path != PathRemoteHit {
		t.Errorf("a record committed 26 h after an invalidation whose tombstone has expired: %v %v, want remote-hit", path, err)
	}
	reader.Release("r")
}
