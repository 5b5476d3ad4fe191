package lease

import (
	"context"
	"slices"
	"testing"
	"time"
)

// SpreadLeaders on a 3-node cluster: three shards whose leaders were all
// moved to one server end up led by three servers.
func TestSpreadLeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _, b := clusterBucket(t, ctx, BucketConfig{Name: DefaultBucket, MarkerTTL: time.Minute, Shards: 3})
	until(t, ctx, "every shard has a leader", func() bool { return !slices.Contains(b.Leaders(ctx), "") })
	first := b.Leaders(ctx)[0]
	for i, kv := range b.Shards() {
		if b.Leaders(ctx)[i] != first {
			if err := b.stepDown(ctx, kv.Bucket(), first); err != nil {
				t.Fatal(err)
			}
		}
	}
	until(t, ctx, "every shard led by "+first, func() bool {
		l := b.Leaders(ctx)
		return l[0] == first && l[1] == first && l[2] == first
	})
	moved, err := b.SpreadLeaders(ctx)
	if err != nil || moved != 2 {
		t.Fatalf("moved %d: %v", moved, err)
	}
	until(t, ctx, "three leaders", func() bool {
		l := b.Leaders(ctx)
		slices.Sort(l)
		return len(slices.Compact(l)) == 3 && l[0] != ""
	})
	if moved, err := b.SpreadLeaders(ctx); err != nil || moved != 0 {
		t.Fatalf("spread leaders moved %d again: %v", moved, err)
	}
}

// until polls cond (a cluster's state, moved by its servers) every 50ms
// until it holds or ctx ends.
func until(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
