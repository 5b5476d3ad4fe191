package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/embcache/embcache/events"
)

// TombstoneKey is the KV key of the invalidation of a tenant's model and
// epoch: <tenant>.inv.<invalidation key>. Its three tokens keep it apart
// from every value's key (<tenant>.<keyhex>).
func TombstoneKey(tenant, model string, epoch uint64) string {
	return tenant + ".inv." + events.InvalidationKey(model, epoch).String()
}

// TombstoneTTL is how long a tombstone lives: longer than any record it
// refuses, which expire within a store TTL once nothing extends them, and
// at least as long as the event stream keeps the invalidated event.
func TombstoneTTL(storeTTL time.Duration) time.Duration {
	return max(events.MaxAge, 2*storeTTL)
}

// Invalidated reports whether rec, a committed record of tenant, was
// reserved before the latest invalidation of its model and epoch (the
// tombstone's revision is later than rec.Reserved). A tombstone that does
// not decode is an error wrapping ErrBadRecord.
func (b *Bucket) Invalidated(ctx context.Context, tenant string, rec Record) (bool, error) {
	rev, err := b.Tombstone(ctx, tenant, rec.Model, rec.Epoch)
	return rev > rec.Reserved, err
}

// Tombstone returns the revision of the tombstone of tenant's model and
// epoch, or 0 if there is none, read from the stream leader (a direct
// get with BucketConfig.Direct: see docs/protocol.md 4.4).
func (b *Bucket) Tombstone(ctx context.Context, tenant, model string, epoch uint64) (uint64, error) {
	if model == "" {
		return 0, nil // nothing can invalidate it
	}
	key := TombstoneKey(tenant, model, epoch)
	tomb, err := b.Read(ctx, key)
	if err != nil {
		return 0, err
	}
	if !tomb.Live {
		return 0, nil
	}
	if tomb.Record.State != StateInvalidated {
		return 0, fmt.Errorf("%w: %s is not a tombstone", ErrBadRecord, key)
	}
	return tomb.Rev, nil
}
