package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
)

// The wildcards a view subscribes to match the subjects every shard's
// stream republishes to: a tenant's values and tombstones, in whichever
// shard, by its tenant's wildcard and not another's; a key of no tenant
// (the reconcilers' election) by its own.
func TestStoredWildcardsMatchWhatShardsRepublish(t *testing.T) {
	b, err := OpenBucket(context.Background(), natstest.Conn(t), BucketConfig{Name: "SHARDED", Shards: 3, MarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tombstone := TombstoneKey("acme", "m", 1)
	for _, c := range []struct {
		key     string
		filter  string
		matches bool
	}{
		{"acme." + strings.Repeat("04", 32), StoredTenantWildcard("acme"), true}, // shard 1
		{"acme." + strings.Repeat("00", 32), StoredTenantWildcard("acme"), true}, // shard 0
		{tombstone, StoredTenantWildcard("acme"), true},
		{"acme." + strings.Repeat("04", 32), StoredTenantWildcard("acme2"), false},
		{"_reconciler", StoredTenantWildcard("acme"), false},
		{"_reconciler", StoredKeysWildcard("_reconciler"), true},
		{"acme." + strings.Repeat("04", 32), StoredWildcard, true},
		{"_reconciler", StoredWildcard, true},
	} {
		subject := b.StoredSubject(c.key)
		if got := server.SubjectMatchesFilter(subject, c.filter); got != c.matches {
			t.Errorf("%s matches %s: %v, want %v", subject, c.filter, got, c.matches)
		}
	}
}
