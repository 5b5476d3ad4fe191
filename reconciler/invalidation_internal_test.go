package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
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
