package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// Get returns ref's value if it is cached, in this process or committed
// anywhere in the cluster, pinned for req until Release(req). Unlike
// GetOrCompute it never reserves the key and never waits for a compute: a
// key that is computing elsewhere, or not cached, is ErrNotCached at once,
// so a caller that only looks does not hold up the process that will
// compute it. A committed value that cannot be pulled is ErrNotCached too
// (counted and logged; GetOrCompute recomputes it).
func (c *Cache) Get(ctx context.Context, req string, ref Ref) (*payload.Value, Path, error) {
	v, ok, err := c.localHit(req, ref)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		return v, PathLocalHit, nil
	}
	obj := ref.Object()
	ls, _ := c.handles()
	if ls == nil {
		return nil, 0, ErrStoreUnavailable
	}
	octx, cancel := c.opContext(ctx)
	cur, err := ls.read(octx, ref.KVKey())
	cancel()
	if errors.Is(err, ErrBadRecord) {
		c.badRecord(err)
		return nil, 0, fmt.Errorf("%w: %w", ErrNotCached, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if !cur.live || cur.record.State != StateCommitted {
		return nil, 0, ErrNotCached
	}
	// Through a flight of its own, so that concurrent gets share one pull;
	// never through another's, which may be a compute (a wait).
	v, err = c.local.GetOrStart(ctx, req, obj, func(cctx context.Context) (*payload.Value, error) {
		return c.pull(cctx, ls, ref, cur)
	})
	if errors.Is(err, localcache.ErrInFlight) {
		return nil, 0, ErrNotCached
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNotCached, err)
	}
	return v, PathRemoteHit, nil
}

// pull fetches a committed record's value through the payload plane
// (checksum verified), counting it; an error is counted and logged. A
// record reserved before its model and epoch's invalidation is purged and
// is errInvalidated; a tombstone that cannot be read is a *tombstoneError.
// The check comes after the fetch and the note of the value's model and
// epoch, so an invalidation is seen either here (its tombstone) or by the
// event that will drop the copy (docs/protocol.md 4.4).
func (c *Cache) pull(ctx context.Context, ls *leaseStore, ref Ref, cur current) (*payload.Value, error) {
	rec := cur.record
	start := time.Now()
	v, err := c.router.get(ctx, *rec.Location)
	if err != nil {
		c.stats.payloadErrors.Add(1)
		c.tel.pullFailed(err)
		c.s.logger.Warn("embcache: committed payload unreadable", "key", ref.KVKey(),
			"location", rec.Location.Object, "node", rec.Location.Node, "err", err)
		return nil, err
	}
	l := c.eventLink()
	if l != nil {
		l.noteAt(ref, *rec.Location, cur.rev)
	}
	stale, err := c.invalidatedRecord(ctx, ls, ref.Tenant, rec)
	if err != nil || stale {
		v.Close()
		if l != nil {
			l.forget(ref.Object())
		}
		if err != nil {
			return nil, &tombstoneError{err}
		}
		c.dropInvalidated(ctx, ls, ref, cur)
		return nil, errInvalidated
	}
	c.expiries.Store(ref.Object(), rec.Expires)
	c.stats.remoteHits.Add(1)
	c.tel.pullBytes.Add(ctx, rec.Location.Size)
	c.tel.pullTime.Record(ctx, time.Since(start).Seconds())
	if l != nil {
		l.touched(ref.Object()) // a pull is a use
	}
	return v, nil
}
