package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// TestAnInvalidationPurgesNothingWithinTheAllowanceOfItsExpiry: with an
// allowance of 5 s, a record that expires in 3 s by the reconciler's clock
// is left to the server by an invalidation, as a touch of it is not sent:
// its expiry marker would wipe the commit of the process that takes the
// key over after a purge (docs/protocol.md 3.1). (It was purged.)
func TestAnInvalidationPurgesNothingWithinTheAllowanceOfItsExpiry(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 1, WithLeaseTTL(10*time.Second), WithClockAllowance(5*time.Second))
	r := newReconciler()
	evs, err := events.EnsureStream(ctx, r.js, events.StreamConfig{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	pub := events.NewPublisher(r.js, events.PublisherOptions{Workers: 1, Queue: 16, Logger: r.s.logger})
	defer pub.Close(ctx)
	x := &expirer{r: r, b: b, pub: pub, events: evs}
	now := time.Now()
	key := lease.ValueKey("acme", cachekey.Key{1})
	loc, err := payload.NewMemoryStore("n1", 0).Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{1}},
		payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, 4}))
	if err != nil {
		t.Fatal(err)
	}
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "w/1/x", Nonce: "x", Started: now, Heartbeat: now,
		Model: "m", Epoch: 1, Reserved: 1, Expires: now.Add(3 * time.Second), Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String()}
	rev, err := b.Put(ctx, key, rec, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "cli", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	if err := b.PutTombstone(ctx, "acme", "m", 1, tomb, time.Hour); err != nil {
		t.Fatal(err)
	}
	e := events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1, Key: events.InvalidationKey("m", 1), Time: now}
	if err := r.applyInvalidation(ctx, x, e); err != nil {
		t.Fatal(err)
	}
	if cur, err := b.Read(ctx, key); err != nil || !cur.Live || cur.Rev != rev {
		t.Fatalf("a record within the allowance (5s) of its expiry (3s away) was purged: revision %d live %v (%v), want revision %d left",
			cur.Rev, cur.Live, err, rev)
	}
}

// TestATouchWithinTheStatedClockBoundIsNotSentPastTheExpiry: the touch's
// deadline is the record's expires less two allowances, as the skews add
// up (the processes' clocks against the servers', the servers' against
// each other; docs/protocol.md 3.1). With
// an allowance of 2 s: the committing worker's clock runs 2 s ahead of
// the reconciler's (which agrees with the server that stamped the record),
// and the stream leader that expires the record runs 2 s ahead of that
// server; every pair agrees within 2 s. The record (TTL 1 h) then expires
// 1 h - 2 s after its stamp by the reconciler's clock, while the
// reconciler sends touches until 1 h (expires, 1 h + 2 s, less 2 s): a
// touch at 1 h - 1 s is sent (and trusted), into the window where the
// expiry marker wipes it. The skews add up: the code needs the servers'
// skew plus the processes' within the allowance (or two allowances off
// expires). (It was one allowance.)
func TestATouchWithinTheStatedClockBoundIsNotSentPastTheExpiry(t *testing.T) {
	ctx := context.Background()
	const allowance = 2 * time.Second
	start := time.Now()
	clk := fakeclock.New(start)
	b, newReconciler := trackerWorld(t, 1, WithLeaseTTL(10*time.Second), WithClockAllowance(allowance), WithClock(clk))
	r := newReconciler()
	key := lease.ValueKey("acme", cachekey.Key{2})
	loc, err := payload.NewMemoryStore("n1", 0).Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{2}},
		payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, 4}))
	if err != nil {
		t.Fatal(err)
	}
	// Committed by a worker whose clock is an allowance ahead.
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "w/1/x", Nonce: "x", Started: start, Heartbeat: start,
		Model: "m", Epoch: 1, Reserved: 1, Expires: start.Add(allowance + time.Hour), Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String()}
	rev, err := b.Put(ctx, key, rec, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A leader an allowance ahead of the stamping server expires the
	// record at start + 1 h - allowance by this clock; a second later:
	clk.Advance(time.Hour - allowance + time.Second)
	e := events.Event{Kind: events.KindTouched, Tenant: "acme", Key: cachekey.Key{2}, Model: "m", Epoch: 1, Node: "w",
		Time: clk.Now(), Expires: clk.Now().Add(time.Hour), Location: &loc}
	r.applyTouch(ctx, b, e)
	if cur, err := b.Read(ctx, key); err != nil || cur.Rev != rev {
		t.Fatalf("a touch was sent %v after the record may have expired, with every clock within the stated bound: revision %d (%v), want %d",
			time.Second, cur.Rev, err, rev)
	}
}
