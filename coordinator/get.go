package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// Get returns ref's value if it is cached, in this process or committed
// anywhere in the cluster, pinned for req until Release(req). Unlike
// GetOrCompute it never reserves the key and never waits for a compute: a
// key that is computing elsewhere, or not cached, is ErrNotCached at once,
// so a caller that only looks does not hold up the process that will
// compute it. A committed value that cannot be pulled is ErrNotCached too
// (counted and logged; GetOrCompute recomputes it), and so is a record
// that carries other labels (model, epoch) than ref: it is not ref's
// value, and stays (docs/protocol.md 4.4). A Ref that does not validate
// (Ref.Validate) is an error wrapping cachekey.ErrInvalidConfig. Close
// cancels it, and it is then an error wrapping ErrClosed, as is a call
// after Close has begun.
func (c *Cache) Get(ctx context.Context, req string, ref Ref) (*payload.Value, Path, error) {
	if err := c.enter(); err != nil {
		return nil, 0, err
	}
	defer c.exit()
	v, ok, err := c.localHit(req, ref)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		c.stats.request(PathLocalHit)
		return v, PathLocalHit, nil
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	v, err = c.get(ctx, req, ref)
	if err != nil {
		return nil, 0, closedErr(ctx, err)
	}
	c.stats.request(PathRemoteHit)
	return v, PathRemoteHit, nil
}

// get is Get past the local cache: a read of the record and a pull.
func (c *Cache) get(ctx context.Context, req string, ref Ref) (*payload.Value, error) {
	b := c.bucket()
	if b == nil {
		return nil, ErrStoreUnavailable
	}
	invalidations := c.invalidationsHeard(ref) // before the read, as resolve's
	octx, cancel := c.opContext(ctx)
	cur, err := b.Read(octx, ref.KVKey())
	cancel()
	if errors.Is(err, ErrBadRecord) {
		c.badRecord(err)
		return nil, fmt.Errorf("%w: %w", ErrNotCached, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if !cur.Live || cur.Record.State != lease.StateCommitted {
		return nil, ErrNotCached
	}
	if !ref.carries(cur.Record) {
		c.stats.labelConflicts.Add(1)
		return nil, fmt.Errorf("%w: %w", ErrNotCached, labelConflictOf(ref, cur.Record))
	}
	// Through a flight of its own, so that concurrent gets share one pull;
	// never through another's, which may be a compute (a wait). The
	// flight is a request of its own, as GetOrCompute's is.
	v, err := c.local.GetOrStart(ctx, req, ref.local(), func(cctx context.Context) (*payload.Value, error) {
		if err := c.enter(); err != nil {
			return nil, err
		}
		defer c.exit()
		cctx, cancel := c.bind(cctx)
		defer cancel()
		v, err := c.pull(cctx, b, ref, cur)
		if err == nil && c.invalidationsHeard(ref) != invalidations {
			// An invalidation of its labels arrived since the record was
			// read (resolve does the same).
			v.Close()
			c.obs.invalidatedRecord(ref, v)
			return nil, errInvalidated
		}
		return v, closedErr(cctx, err)
	})
	if errors.Is(err, localcache.ErrInFlight) {
		return nil, ErrNotCached
	}
	if errors.Is(err, ErrClosed) {
		return nil, err // not ErrNotCached: nothing was looked at
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotCached, err)
	}
	return v, nil
}

// WaitFlight returns once the flight of ref in this process, if any (a
// GetOrCompute's compute, wait or pull, or a Get's pull), has ended, or
// ctx has. It pins nothing, counts nothing and starts nothing: it is for
// a caller that knows the flight ends soon (the agent, for a commit it
// has answered, until the value is stored).
func (c *Cache) WaitFlight(ctx context.Context, ref Ref) error {
	return c.local.Wait(ctx, ref.local())
}

// pull fetches a committed record's value through the payload plane
// (checksum verified), counting it; an error is counted and logged. A
// record reserved before its model and epoch's invalidation is purged and
// is errInvalidated (errInvalidatedKept, not purged, if it may have
// expired); a tombstone that cannot be read is a *tombstoneError.
// The check comes after the fetch and the note of the value's model and
// epoch, so an invalidation is seen either here (its tombstone) or by the
// event that will drop the copy (docs/protocol.md 4.4).
func (c *Cache) pull(ctx context.Context, b *lease.Bucket, ref Ref, cur lease.Entry) (*payload.Value, error) {
	rec := cur.Record
	start := time.Now()
	v, err := c.fetch(ctx, ref, *rec.Location)
	if err != nil {
		c.obs.pullFailed(ref, *rec.Location, err)
		return nil, err
	}
	c.obs.fetched(ref, v, *rec.Location, rec.Expires)
	stale, err := c.invalidatedRecord(ctx, b, ref, rec)
	if err != nil || stale {
		v.Close()
		c.obs.dropped(ref.local(), v)
		if err != nil {
			return nil, &tombstoneError{err}
		}
		if !c.dropInvalidated(ctx, b, ref, v, cur) {
			return nil, errInvalidatedKept
		}
		return nil, errInvalidated
	}
	c.obs.pulled(ctx, ref, v, *rec.Location, rec.Expires, time.Since(start))
	return v, nil
}

// fetch gets the value at loc, which must be ref's own payload: another
// key's location verifies (its checksum is its own bytes') and would serve
// that key's value, so a record that names one (a bug, a forged write) is
// corrupt, purged and computed again like one whose bytes are wrong.
func (c *Cache) fetch(ctx context.Context, ref Ref, loc payload.Location) (*payload.Value, error) {
	if !loc.Names(ref.Object()) {
		return nil, fmt.Errorf("%w: the record of %s names the payload %s", payload.ErrCorrupt, ref.KVKey(), loc.Object)
	}
	return c.router.Get(ctx, loc)
}
