package reconciler

import (
	"context"
	"errors"
	"math"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// applyInvalidation removes every committed record (and payload) of the
// event's tenant, model and epoch reserved before its tombstone in the
// record's shard (every one, in a shard without a tombstone: an older
// release's invalidate). A value computed since stays, also when the
// event is delivered again. An error is a shard it could not go through
// (a tombstone, a listing or a record unreadable): the event is handed
// back and applied again, never acknowledged with that shard's records
// left to their readers and expiry.
func (r *Reconciler) applyInvalidation(ctx context.Context, x *expirer, e events.Event) error {
	b := x.b
	var unfinished error
	for shard, kv := range b.Shards() {
		tctx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		t, err := b.Tombstone(tctx, shard, e.Tenant, e.Model, e.Epoch)
		tomb := t.Rev
		cancel()
		if err != nil {
			r.s.logger.Warn("embcache: invalidation: tombstone unreadable", "tenant", e.Tenant, "model", e.Model,
				"bucket", kv.Bucket(), "err", err)
			if !errors.Is(err, lease.ErrBadRecord) { // one that does not decode will not on the next try
				unfinished = err
			}
			continue
		}
		if tomb == 0 {
			tomb = math.MaxUint64
		}
		if err := r.invalidateShard(ctx, x, kv, tomb, e); err != nil {
			unfinished = err
		}
	}
	return unfinished
}

// invalidateShard carries out an invalidation in one shard: one key at a
// time, as the lister delivers them, so nothing is held of the tenant's
// keys.
func (r *Reconciler) invalidateShard(ctx context.Context, x *expirer, kv jetstream.KeyValue, tomb uint64, e events.Event) error {
	b := x.b
	lister, err := kv.ListKeysFiltered(ctx, e.Tenant+".>")
	if err != nil {
		r.s.logger.Warn("embcache: invalidation: listing keys failed", "tenant", e.Tenant, "bucket", kv.Bucket(), "err", err)
		return err
	}
	defer lister.Stop()
	var unfinished error
	for key := range lister.Keys() {
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		cur, err := r.read(octx, b, key)
		if err != nil && !errors.Is(err, lease.ErrBadRecord) { // a bad record is no value of the model's: counted by read
			unfinished = err
		}
		stale := err == nil && cur.Live && cur.Record.State == lease.StateCommitted &&
			cur.Record.Model == e.Model && cur.Record.Epoch == e.Epoch && cur.Record.Reserved < tomb
		// One that may have expired is left to the server (docs/protocol.md
		// 3.1): readers refuse it meanwhile, and its expiry is announced.
		stale = stale && !cur.Record.MayHaveExpired(r.s.clock.Now(), r.s.allowance)
		if stale {
			switch err := b.PurgeFor(octx, key, cur.Rev, events.CauseInvalidated); {
			case errors.Is(err, lease.ErrLost): // changed since the read: no longer that record
				stale = false
			case err != nil:
				unfinished, stale = err, false
			}
		}
		if stale {
			r.did(actionInvalidate)
			var known *events.Entry
			if loc := cur.Record.Location; loc != nil {
				obj, _ := loc.ObjectID()
				known = &events.Entry{Tenant: e.Tenant, Key: obj.Key, Model: e.Model, Epoch: e.Epoch, Location: *loc, Expires: cur.Record.Expires}
			}
			cancel()
			x.expire(ctx, key, events.CauseInvalidated, known)
			continue
		}
		cancel()
	}
	return unfinished
}
