package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
)

// A tombstone write is a new revision whatever is there, and keeps the
// later Started of its own and the one it replaces, in every shard and in
// both read modes: an earlier clock reading written last (a slow
// invalidation) leaves the later one, which a reader that heard both
// events checks its reads against; a record reserved before the last
// write is refused.
func TestATombstoneKeepsTheLatestInvalidationsTime(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := context.Background()
	for _, direct := range []bool{false, true} {
		name := map[bool]string{false: "TOMBS", true: "TOMBS_DIRECT"}[direct]
		b, err := OpenBucket(ctx, nc, BucketConfig{Name: name, Shards: 3, MarkerTTL: time.Minute, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		t2 := t1.Add(time.Second)
		tomb := func(at time.Time) Record {
			return Record{V: RecordVersion, State: StateInvalidated, Owner: "o", Started: at, Heartbeat: at, Model: "m", Epoch: 1}
		}
		if err := b.PutTombstone(ctx, "acme", "m", 1, tomb(t2), time.Hour); err != nil {
			t.Fatal(err)
		}
		key := "acme." + strings.Repeat("04", 32) // shard 1
		rec := Record{V: RecordVersion, State: StateCommitted, Owner: "o", Started: t2, Heartbeat: t2, Model: "m", Epoch: 1}
		rev, err := b.Create(ctx, key, rec, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		rec.Reserved = rev
		if gone, err := b.Invalidated(ctx, key, rec, t2); err != nil || gone {
			t.Fatalf("direct %v: a record reserved after the tombstone: invalidated %v, %v", direct, gone, err)
		}
		if err := b.PutTombstone(ctx, "acme", "m", 1, tomb(t1), time.Hour); err != nil { // the slow one lands
			t.Fatal(err)
		}
		for shard := range b.Shards() {
			got, err := b.Tombstone(ctx, shard, "acme", "m", 1)
			if err != nil || !got.At.Equal(t2) {
				t.Fatalf("direct %v, shard %d: tombstone %+v, %v; want its time %v kept", direct, shard, got, err, t2)
			}
		}
		if gone, err := b.Invalidated(ctx, key, rec, t2); err != nil || !gone {
			t.Fatalf("direct %v: a record reserved before the last tombstone write: invalidated %v, %v", direct, gone, err)
		}
	}
}
