package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
)

// An expired value whose key is being computed again (its record is
// computing, and the payload of the same bytes, keys being content
// addresses, already written under the same name) is evicted without a
// delete: the file is the new value's. (The reconciler, held up by
// another delete, handled the old expiry late and deleted the file the
// new record then committed.)
//
// The other delete holds the loop until the recompute has written its
// payload, and no longer: the test lets it go, so the late case is put
// to the test however slow the machine (the 4 s op timeout bounds the
// reconciler's other calls). The recompute reserves the key only once
// value 1's marker has been sent to the reconciler's bucket watcher
// (handedOn): the reservation replaces the marker (the bucket keeps one
// message a key), and a marker replaced before the server sent it on is
// never seen by the loop, whose eviction then goes unannounced (a gap of
// the reconciler's, not this test's case).
func TestEvictionLeavesARecomputesPayload(t *testing.T) {
	e := newWorld(t)
	blocked := e.commit(0, time.Second)
	d := &blockingDeleter{store: e.store, object: blocked.Object, release: make(chan struct{})}
	r1, _ := e.reconciler(d, reconciler.WithOpTimeout(4*time.Second))
	waitFor(t, "r1 active", func() bool { return r1.Stats().Active })
	loc := e.commit(1, time.Second)
	waitFor(t, "r1 busy in a payload delete", d.entered.Load)
	kv := lease.ValueKey(tenant, keyOf(1))
	var marker uint64
	waitFor(t, "value 1 expired", func() bool { cur := e.record(1); marker = cur.Rev; return !cur.Live })
	waitFor(t, "value 1's marker handed to r1's loop", func() bool { return e.handedOn(kv, marker) })

	// A worker reserves key 1 again, and writes the payload (the same bytes:
	// keys are content addresses) before it commits.
	ctx := context.Background()
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: "w2/1/y", Nonce: "y", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	rev, err := e.b.Create(ctx, kv, rec, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	obj := payload.ObjectID{Tenant: tenant, Key: keyOf(1)}
	loc2, err := e.store.Put(ctx, obj, payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, 1}))
	if err != nil || loc2.Checksum != loc.Checksum {
		t.Fatal(err)
	}
	close(d.release) // the loop goes on, to value 1's expiry
	waitFor(t, "the old value's eviction", func() bool { return e.evicted(1) })
	// The commit lands.
	rec.State, rec.Reserved, rec.Location, rec.Size, rec.Checksum, rec.Expires = lease.StateCommitted, rev, &loc2, loc2.Size, loc2.Checksum.String(), time.Now().Add(time.Hour)
	if _, err := e.b.CompareAndSet(ctx, kv, rev, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	if cur := e.record(1); !cur.Live || cur.Record.State != lease.StateCommitted {
		t.Fatal("not committed")
	}
	if _, err := e.store.Get(ctx, loc2); err != nil {
		t.Fatalf("a live committed record names a payload the reconciler deleted: %v", err)
	}
}

// A value whose key is computed again after it expired, and whose new
// compute fails (abandoned), is still announced when the loop reaches its
// marker, and its payload deleted: the abandon is the later compute's,
// which published nothing. (An abandon within a second after the value's
// publish counted as its end: the expiry was never announced.)
//
// The other delete holds the loop until the recompute has failed, and
// no longer, and the recompute waits for the marker to be sent on (as
// above).
func TestAFailedRecomputeDoesNotHideAnExpiry(t *testing.T) {
	e := newWorld(t)
	blocked := e.commit(0, time.Second)
	d := &blockingDeleter{store: e.store, object: blocked.Object, release: make(chan struct{})}
	r, _ := e.reconciler(d, reconciler.WithOpTimeout(4*time.Second))
	waitFor(t, "active", func() bool { return r.Stats().Active })
	loc := e.commit(1, time.Second)
	waitFor(t, "the loop busy in a payload delete", d.entered.Load)
	kv := lease.ValueKey(tenant, keyOf(1))
	var marker uint64
	waitFor(t, "value 1 expired", func() bool { cur := e.record(1); marker = cur.Rev; return !cur.Live })
	waitFor(t, "value 1's marker handed to the loop", func() bool { return e.handedOn(kv, marker) })

	// A worker reserves key 1 again; its encoder fails: it purges its
	// reservation and says so.
	ctx := context.Background()
	now := time.Now()
	rev, err := e.b.Create(ctx, kv, lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: "w2/1/y", Nonce: "y",
		Started: now, Heartbeat: now, Model: "m", Epoch: 1}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Purge(ctx, kv, rev); err != nil { // as Lease.Abandon
		t.Fatal(err)
	}
	e.publish(&events.Event{Kind: events.KindAbandoned, Tenant: tenant, Key: keyOf(1), Model: "m", Epoch: 1, Node: "w2",
		Time: time.Now(), Reason: "encoder down"})
	close(d.release) // the loop goes on, to value 1's expiry and the abandon
	waitFor(t, "value 1's eviction", func() bool { return e.evicted(1) })
	waitFor(t, "value 1's payload deleted", func() bool {
		_, err := e.store.Get(ctx, loc)
		return errors.Is(err, payload.ErrNotFound)
	})
}

// A touch whose expiry is further than the longest store TTL by the
// reconciler's clock is not applied, whatever its own time says (an event
// of the year 2200 expiring an hour after it passed the decoder's bound,
// and gave the record a TTL of 173 years).
func TestATouchPastTheLongestStoreTTLIsNotApplied(t *testing.T) {
	e := newWorld(t)
	r, _ := e.reconciler(e.store)
	waitFor(t, "active", func() bool { return r.Stats().Active })
	far := e.commit(0, time.Hour)
	near := e.commit(1, time.Hour)
	before := e.record(0).Record.Expires
	then := time.Now().AddDate(175, 0, 0)
	e.publish(&events.Event{Kind: events.KindTouched, Tenant: tenant, Key: keyOf(0), Model: "m", Epoch: 1, Node: "w",
		Time: then, Expires: then.Add(time.Hour), Location: &far})
	e.publish(&events.Event{Kind: events.KindTouched, Tenant: tenant, Key: keyOf(1), Model: "m", Epoch: 1, Node: "w",
		Time: time.Now(), Expires: time.Now().Add(2 * time.Hour), Location: &near})
	waitFor(t, "the second touch applied (after the first: one loop)", func() bool { return r.Stats().Touches >= 1 })
	if n := r.Stats().Touches; n != 1 {
		t.Fatalf("%d touches applied, want 1", n)
	}
	if got := e.record(0).Record.Expires; !got.Equal(before) {
		t.Fatalf("the record's expiry moved from %v to %v", before, got)
	}
}

// An expired value whose payload delete fails (a Mooncake object a reader
// holds) is announced only once the delete has gone through: the marker's
// tries fail, a sweep tries again. (The eviction was announced after the
// failed delete and nothing removed the object later: a leak.)
func TestAnEvictionWaitsForItsPayloadDelete(t *testing.T) {
	for _, fails := range []int64{2, 5} { // within the marker's tries; past them, to a sweep
		e := newWorld(t)
		loc := e.commit(1, time.Second)
		d := &failingDeleter{store: e.store, object: loc.Object, fails: fails}
		e.reconciler(d)
		ctx := context.Background()
		waitFor(t, "value 1's eviction", func() bool { return e.evicted(1) })
		if _, err := e.store.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
			t.Fatalf("%d failed deletes: the eviction is announced and the payload stays (%v)", fails, err)
		}
		if got := d.tries.Load(); got != fails+1 {
			t.Fatalf("%d failed deletes, then %d tries in all; want %d", fails, got, fails+1)
		}
	}
}

// A touch is not sent within the clock allowance of the record's expiry
// (set by its committer's clock, while the server expires it by its own):
// with an allowance of 5 s, a record expiring in 3 s by the reconciler's
// clock is left to expire, and one expiring in an hour is extended.
func TestATouchWithinTheClockAllowanceOfExpiryIsNotSent(t *testing.T) {
	e := newWorld(t)
	r, _ := e.reconciler(e.store, reconciler.WithLeaseTTL(10*time.Second), reconciler.WithClockAllowance(5*time.Second))
	waitFor(t, "active", func() bool { return r.Stats().Active })
	soon := e.commit(0, 3*time.Second)
	later := e.commit(1, time.Hour)
	before := e.record(0).Record.Expires
	now := time.Now()
	for i, loc := range []payload.Location{soon, later} {
		e.publish(&events.Event{Kind: events.KindTouched, Tenant: tenant, Key: keyOf(i), Model: "m", Epoch: 1, Node: "w",
			Time: now, Expires: now.Add(2 * time.Hour), Location: &loc})
	}
	waitFor(t, "the second touch applied (after the first: one loop)", func() bool { return r.Stats().Touches >= 1 })
	if n := r.Stats().Touches; n != 1 {
		t.Fatalf("%d touches applied, want 1 (the record 3 s from expiry was extended)", n)
	}
	if got := e.record(0).Record.Expires; !got.Equal(before) {
		t.Fatalf("the record's expiry moved from %v to %v", before, got)
	}
}
