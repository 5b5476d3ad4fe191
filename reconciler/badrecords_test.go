package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/lease"
)

// Bad records at values' keys that nobody reads again (no TTL of their
// own: written by hand, or by a bug) are purged by the active reconciler
// once older than a lease TTL, without a reader: one its loop sees stored
// and one its sweep reads. A record written over a bad one stays, and a
// bad record under a tombstone's key is left (it may stand where a
// tombstone was). (They stayed for good, while the processes that met
// them computed without sharing; item 7 of issue 33.)
func TestBadRecordsNobodyRereadsArePurged(t *testing.T) {
	e := newWorld(t)
	ctx := context.Background()
	put := func(key, body string) {
		t.Helper()
		if _, err := e.b.KV(key).Put(ctx, key, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	// Before the term: a value's record replaced by junk, which the
	// term's first sweep reads (its value has a published event).
	e.commit(0, time.Hour)
	swept := lease.ValueKey(tenant, keyOf(0))
	put(swept, "not a record")

	r, _ := e.reconciler(e.store)
	// Its first progress mark comes after its loop follows the bucket.
	waitFor(t, "the loop following the bucket", func() bool { _, _, ok := e.progressOf(); return ok })
	seen := lease.ValueKey(tenant, keyOf(1))
	put(seen, "not a record")
	tombAtValue := lease.ValueKey(tenant, keyOf(2))
	put(tombAtValue, `{"v":1,"state":"invalidated","owner":"cli/1/x","model":"m","epoch":1}`)
	rewritten := lease.ValueKey(tenant, keyOf(3))
	put(rewritten, "not a record")
	now := time.Now()
	if _, err := e.b.Put(ctx, rewritten, lease.Record{V: lease.RecordVersion, State: lease.StateComputing,
		Owner: "w/1/x", Nonce: "n", Started: now, Heartbeat: now}, time.Hour); err != nil {
		t.Fatal(err)
	}
	notTomb := lease.TombstoneKey(tenant, "m", 1)
	put(notTomb, `{"v":1,"state":"computing","owner":"w/1/x"}`)

	waitFor(t, "three bad records purged", func() bool { return r.Stats().BadRecordsPurged == 3 })
	for _, key := range []string{swept, seen, tombAtValue} {
		if cur, err := e.b.Read(ctx, key); err != nil || cur.Live {
			t.Errorf("%s: live %v, %v; want purged", key, cur.Live, err)
		}
	}
	if cur, err := e.b.Read(ctx, rewritten); err != nil || !cur.Live {
		t.Errorf("the record written over a bad one: live %v, %v", cur.Live, err)
	}
	if _, err := e.b.Read(ctx, notTomb); !errors.Is(err, lease.ErrBadRecord) {
		t.Errorf("the bad record under a tombstone's key: %v, want it left", err)
	}
	waitFor(t, "the swept value's eviction", func() bool { return e.evicted(0) })
}
