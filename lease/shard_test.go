package lease

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
)

// Keys spread over shards by their first byte; keys that are not a
// value's stay in shard 0. A bucket opened with another number of shards
// than it was created with is refused; without one, it adopts them.
func TestShards(t *testing.T) {
	for key, want := range map[string]int{
		"acme." + strings.Repeat("00", 32): 0, "acme." + strings.Repeat("04", 32): 1, "acme." + strings.Repeat("ff", 32): 0,
		"acme.inv." + strings.Repeat("04", 32): 0, "_reconciler": 0, "acme.zz" + strings.Repeat("0", 62): 0,
	} {
		if got := ShardOf(key, 3); got != want {
			t.Errorf("%s: shard %d, want %d", key, got, want)
		}
	}
	nc := natstest.Conn(t)
	ctx := context.Background()
	b, err := OpenBucket(ctx, nc, BucketConfig{Name: "SHARDED", Shards: 3, MarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Shards()); n != 3 || b.Shards()[2].Bucket() != "SHARDED_2" {
		t.Fatalf("%d shards", n)
	}
	if _, err := OpenBucket(ctx, nc, BucketConfig{Name: "SHARDED", Shards: 2}); !errors.Is(err, ErrShards) {
		t.Fatalf("opened with 2 shards: %v", err)
	}
	if _, err := OpenBucket(ctx, nc, BucketConfig{Name: "SHARDED", Shards: MaxShards + 1}); !errors.Is(err, ErrShards) {
		t.Fatalf("opened with too many shards: %v", err)
	}
	again, err := BindBucket(ctx, nc, BucketConfig{Name: "SHARDED"})
	if err != nil || len(again.Shards()) != 3 {
		t.Fatalf("bound: %v", err)
	}
	key := "acme." + strings.Repeat("04", 32)
	now := time.Now()
	rec := Record{V: RecordVersion, State: StateComputing, Owner: "o", Nonce: "n", Started: now, Heartbeat: now}
	if _, err := b.Create(ctx, key, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Shards()[1].Get(ctx, key); err != nil {
		t.Fatalf("the key is not in shard 1: %v", err)
	}
	if cur, err := again.Read(ctx, key); err != nil || !cur.Live {
		t.Fatalf("read through another handle: %+v %v", cur, err)
	}
}
