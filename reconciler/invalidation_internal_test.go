package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// An invalidation the reconciler could not carry out in every shard (a
// shard unreadable) is an error, which hands its event back; one whose
// tombstone does not decode is not (it will not on the next try either).
func TestAnInvalidationNotCarriedOutInEveryShardIsHandedBack(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 2)
	r := newReconciler()
	x := &expirer{r: r, b: b}
	e := events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1, Key: events.InvalidationKey("m", 1), Time: time.Now()}
	now := time.Now()
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "cli", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	if err := b.PutTombstone(ctx, "acme", "m", 1, tomb, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := r.applyInvalidation(ctx, x, e); err != nil {
		t.Fatalf("every shard readable: %v", err)
	}
	if _, err := b.Shards()[1].Put(ctx, lease.TombstoneKey("acme", "m", 1), []byte("not a record")); err != nil {
		t.Fatal(err)
	}
	if err := r.applyInvalidation(ctx, x, e); err != nil {
		t.Fatalf("a tombstone that is no tombstone: %v, want nil (not retried)", err)
	}
	js, _ := jetstream.New(r.nc)
	if err := js.DeleteStream(ctx, "KV_"+b.Shards()[1].Bucket()); err != nil {
		t.Fatal(err)
	}
	if err := r.applyInvalidation(ctx, x, e); err == nil {
		t.Fatal("a shard gone: nil, want an error (the event handed back)")
	}
}

// A record whose purge the server refuses (not a conflict: the record did
// not change) leaves the invalidation unfinished: its event is handed
// back. (Such a purge was passed over, the event acknowledged and the
// record left to its readers.)
func TestAnInvalidationWhosePurgeIsRefusedIsHandedBack(t *testing.T) {
	ctx := context.Background()
	b, newReconciler := trackerWorld(t, 1)
	r := newReconciler()
	x := &expirer{r: r, b: b}
	now := time.Now()
	key := lease.ValueKey("acme", cachekey.Key{1})
	loc, err := payload.NewMemoryStore("n1", 0).Put(ctx, payload.ObjectID{Tenant: "acme", Key: cachekey.Key{1}},
		payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, 4}))
	if err != nil {
		t.Fatal(err)
	}
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "w/1/x", Nonce: "x", Started: now, Heartbeat: now,
		Model: "m", Epoch: 1, Reserved: 1, Expires: now.Add(time.Hour), Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String()}
	if _, err := b.Put(ctx, key, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "cli", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
	if err := b.PutTombstone(ctx, "acme", "m", 1, tomb, time.Hour); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(r.nc)
	s, err := js.Stream(ctx, "KV_"+b.Shards()[0].Bucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 10 // the purge's body is longer: refused; reads go on
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	e := events.Event{Kind: events.KindInvalidated, Tenant: "acme", Model: "m", Epoch: 1, Key: events.InvalidationKey("m", 1), Time: now}
	if err := r.applyInvalidation(ctx, x, e); err == nil {
		t.Fatal("a refused purge: nil, want an error (the event handed back)")
	}
	if cur, err := b.Read(ctx, key); err != nil || !cur.Live {
		t.Fatalf("the record: %+v %v", cur, err)
	}
}
