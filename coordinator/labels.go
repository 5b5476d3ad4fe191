package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// The label rule (docs/protocol.md 4.4): a record's value is served only
// to a caller whose Ref carries the record's labels, its model and epoch.
// Invalidation follows the labels (a reader checks the tombstone of the
// record's), and the key hashes the config's model_id and weight_epoch,
// so a key has one right pair: a record and a Ref that disagree cannot
// both have it. Which one is wrong cannot be told from the key, so the
// reader neither serves the record nor takes it over: a record of other
// labels is not a value for this caller, and a caller of other labels
// cannot remove a record its correctly labelled readers use. It computes
// its value without sharing it (labelConflict). A record without a model
// is nobody's (every Ref has one): no invalidation could ever reach it,
// so a reader that meets a committed one purges it (purgeUnlabelled).

// labelConflictOf is the error that ref's record, rec, carries other
// labels: Get returns it wrapped with ErrNotCached.
func labelConflictOf(ref Ref, rec lease.Record) error {
	return fmt.Errorf("coordinator: the %v record of %s is model %q epoch %d's, the request's labels are model %q epoch %d",
		rec.State, ref.KVKey(), rec.Model, rec.Epoch, ref.Model, ref.Epoch)
}

// labelConflict answers a request whose key's record (computing or
// committed) carries other labels: fn computes its value, which is
// neither committed nor shared, in every mode (the store is there: this
// is not an outage, and failing would let one mislabelled caller deny the
// key to everyone else). The copy stays in the local cache under ref's
// labels (localKey), where an invalidation of them finds it.
func (c *Cache) labelConflict(ctx context.Context, ref Ref, fn ComputeFunc, rec lease.Record) (*payload.Value, Path, error) {
	c.stats.labelConflicts.Add(1)
	c.s.logger.Warn("embcache: the key's record carries other labels than the request; computing without sharing",
		"key", ref.KVKey(), "err", labelConflictOf(ref, rec))
	return c.computeUnshared(ctx, ref, fn)
}

// purgeUnlabelled removes a committed record without a model (written by
// an earlier release, or by hand), on its revision, so that the key is
// computed again with labels. Reports whether the key should be read
// again; false for any other record, which stays.
func (c *Cache) purgeUnlabelled(ctx context.Context, b *lease.Bucket, key string, cur lease.Entry) bool {
	if cur.Record.State != lease.StateCommitted || cur.Record.Model != "" {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := b.PurgeFor(octx, key, cur.Rev, events.CauseInvalidated)
	cancel()
	if err == nil {
		c.s.logger.Warn("embcache: a committed record without a model purged (no invalidation could reach it)",
			"key", key, "owner", cur.Record.Owner)
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}
