package coordinator

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// GetOrCompute returns the value of ref, pinned for req until Release(req).
// See GetOrComputePath.
func (c *Cache) GetOrCompute(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, error) {
	v, _, err := c.GetOrComputePath(ctx, req, ref, fn)
	return v, err
}

// GetOrComputePath returns the value of ref and the path that produced it:
// the local cache; an in-process flight; a committed value pulled through
// the payload plane (checksum verified); a wait for the process computing
// it; or a reservation and a compute by fn, run once in the whole cluster
// while holders live. The value is pinned for req until Release(req), and
// must not be written to.
//
// A Ref that does not validate (Ref.Validate: no model, a bad tenant) is
// an error wrapping cachekey.ErrInvalidConfig, and fn does not run; a
// tenant this Cache does not serve is ErrTenant. A record of the key
// that carries other labels (model, epoch) than ref is never served to
// it, nor taken over: fn computes ref's value without sharing it
// (PathDegraded, counted in Stats.LabelConflicts; docs/protocol.md 4.4).
//
// A caller whose ctx ends returns ctx.Err() while the work goes on for
// others; past the compute timeout, waiters get ErrComputeTimeout.
// fn's error reaches every waiter and the key is released for a retry.
// Close cancels the request, the work for others included (a compute's
// ctx ends, its key is abandoned): the caller gets an error wrapping
// ErrClosed, as does a call after Close has begun.
func (c *Cache) GetOrComputePath(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	start := time.Now()
	ctx, span := c.tel.tracer.Start(ctx, "embcache.GetOrCompute", trace.WithAttributes(
		attribute.String("embcache.tenant", ref.Tenant), attribute.String("embcache.key", ref.Key.String())))
	v, path, err := c.getOrCompute(ctx, req, ref, fn)
	c.tel.request(ctx, span, path, start, err)
	c.stats.request(path)
	return v, path, err
}

// localHit validates ref and returns its value from this process's cache,
// pinned for req (touched, counted), if it is there.
func (c *Cache) localHit(req string, ref Ref) (*payload.Value, bool, error) {
	if err := c.validate(ref); err != nil {
		return nil, false, err
	}
	k := ref.local()
	v, ok, err := c.local.Get(req, k)
	if err != nil || !ok {
		return nil, false, err
	}
	c.obs.localHit(k)
	return v, true, nil
}

func (c *Cache) getOrCompute(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	if err := c.enter(); err != nil {
		return nil, 0, err
	}
	defer c.exit()
	v, ok, err := c.localHit(req, ref)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		return v, PathLocalHit, nil
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	var path atomic.Uint32
	path.Store(uint32(PathCoalesced))
	v, err = c.local.GetOrCompute(ctx, req, ref.local(), func(cctx context.Context) (*payload.Value, error) {
		// The flight runs on a goroutine of its own, for every caller
		// that joins it: a request of its own, which Close ends too.
		if err := c.enter(); err != nil {
			return nil, err
		}
		defer c.exit()
		cctx, cancel := c.bind(cctx)
		defer cancel()
		v, p, err := c.resolve(cctx, ref, fn)
		path.Store(uint32(p))
		// Its callers may hear of it before their own ctx ends (each
		// ends on a goroutine of its own): it says why.
		return v, closedErr(cctx, err)
	})
	if err != nil {
		return nil, 0, closedErr(ctx, err)
	}
	return v, Path(path.Load()), nil
}

// resolve finds ref's value in the cluster or computes it; it runs once
// per process per key (inside the local cache's flight). Each turn of its
// loop reads the key's record once (or takes the change a wait heard) and
// acts on what it finds: a step that did not end it looks again, after a
// back-off where the record it acted on may not have moved yet.
func (c *Cache) resolve(ctx context.Context, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	b := c.bucket()
	if b == nil {
		return c.degraded(ctx, ref, fn, ErrStoreUnavailable)
	}
	r := &resolution{c: c, b: b, ref: ref, key: ref.KVKey(), fn: fn,
		// Before the first read: an invalidation whose event arrives after
		// it refuses what this request pulls (heardSince).
		invalidations: c.invalidationsHeard(ref)}
	defer r.w.stop()
	for attempt := 0; ; attempt++ {
		o := r.step(ctx, attempt)
		switch o.next {
		case stepDone:
			return o.v, o.path, o.err
		case stepBackOff:
			if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
				return nil, PathWaited, err
			}
		}
	}
}

// resolution is one resolve: what its turns share.
type resolution struct {
	c             *Cache
	b             *lease.Bucket
	ref           Ref
	key           string        // ref.KVKey()
	fn            ComputeFunc   // computes ref's value when this process must
	invalidations int64         // c.invalidationsHeard(ref) before the first read
	w             waiter        // the wait for a computing record's change
	heard         *lease.Change // a change the wait heard, taken instead of a read
}

// nextStep is what a turn of resolve's loop leads to. Its zero value
// reads the key again: an outcome left unset is never taken for an
// answer.
type nextStep int

const (
	stepAgain   nextStep = iota // read the key again now
	stepBackOff                 // read it again after a back-off
	stepDone                    // the answer is the outcome's
)

// outcome is what a turn decided.
type outcome struct {
	next nextStep
	v    *payload.Value
	path Path
	err  error
}

// answer is the outcome that answers with v, path and err.
func answer(v *payload.Value, path Path, err error) outcome {
	return outcome{next: stepDone, v: v, path: path, err: err}
}

// step reads the key (or takes the change the wait heard) and acts on the
// record it finds.
func (r *resolution) step(ctx context.Context, attempt int) outcome {
	c := r.c
	cur, purged, err := r.read(ctx)
	if purged {
		return outcome{next: stepBackOff}
	}
	if err != nil {
		return answer(c.degraded(ctx, r.ref, r.fn, err))
	}
	if cur.Live && cur.Record.State == lease.StateComputing && c.purgeStale(ctx, r.b, r.key, cur) {
		return outcome{next: stepBackOff}
	}
	if cur.Live && !r.ref.carries(cur.Record) {
		// Not a value for this caller, computing or committed: the label
		// rule (labels.go).
		if c.purgeUnlabelled(ctx, r.b, r.key, cur) {
			return outcome{next: stepBackOff}
		}
		r.w.stop()
		return answer(c.labelConflict(ctx, r.ref, r.fn, cur.Record))
	}
	// A free key or a committed value ends the wait: its changes are no
	// longer needed.
	switch {
	case !cur.Live:
		r.w.stop()
		return r.reserve(ctx, attempt)
	case cur.Record.State == lease.StateCommitted:
		r.w.stop()
		return r.committed(ctx, cur, attempt)
	default:
		return r.computing(ctx, cur)
	}
}

// read returns the key's record: the change the wait heard, or a read. A
// record that does not decode is counted, and purged if it may be
// (purgeUnreadable): then purged is true, and the key is to be read
// again. Left in place, it is the error: the caller computes without
// sharing.
func (r *resolution) read(ctx context.Context) (cur lease.Entry, purged bool, err error) {
	c := r.c
	countBad := c.badRecord
	if r.heard != nil {
		cur, err, r.heard = r.heard.Entry, r.heard.Err, nil
		countBad = c.badRecordWatched
	} else {
		octx, cancel := c.opContext(ctx)
		cur, err = r.b.Read(octx, r.key)
		cancel()
	}
	if errors.Is(err, ErrBadRecord) {
		countBad(err)
		if c.purgeUnreadable(ctx, r.b, r.key, cur, err) {
			return lease.Entry{}, true, nil
		}
		c.s.logger.Warn("embcache: unreadable lease record, computing without sharing", "key", r.key, "err", err)
	}
	return cur, false, err
}

// reserve takes the lease of a key with no live record and computes.
func (r *resolution) reserve(ctx context.Context, attempt int) outcome {
	c := r.c
	res, end, err := c.reserveToCompute(ctx, r.b, r.ref)
	if errors.Is(err, ErrHeld) || errors.Is(err, lease.ErrLate) {
		// Someone got there first: read what they wrote. A read that lags
		// (a follower's direct get) could make this spin; back off.
		return outcome{next: stepBackOff}
	}
	if err != nil {
		return answer(c.degraded(ctx, r.ref, r.fn, err))
	}
	if attempt > 0 {
		c.obs.tookOver()
	}
	return answer(c.computeUnder(ctx, res, r.fn, end))
}

// committed pulls a committed record's value. A payload that cannot be
// read (missing, corrupt) has its record purged, so that the key is
// computed again; from resolve's fourth turn on (attempt counts every
// turn, waits included) the caller computes without sharing instead.
func (r *resolution) committed(ctx context.Context, cur lease.Entry, attempt int) outcome {
	c, ref, fn := r.c, r.ref, r.fn // read in most of its branches
	v, err := c.pull(ctx, r.b, ref, cur)
	if err != nil && ctx.Err() != nil {
		// The request ended (Close, the compute timeout): a pull cut short
		// says nothing of the payload, which stays.
		return answer(nil, PathRemoteHit, context.Cause(ctx))
	}
	if errors.Is(err, errInvalidated) {
		return outcome{next: stepAgain} // purged: compute it again
	}
	if errors.Is(err, errInvalidatedKept) {
		return answer(c.degraded(ctx, ref, fn, err)) // not shared until the server removes it
	}
	var unread *tombstoneError
	if errors.As(err, &unread) {
		return answer(c.degraded(ctx, ref, fn, err))
	}
	if err == nil && c.invalidationsHeard(ref) != r.invalidations {
		// An invalidation of its labels arrived since the record was read:
		// whether the record is older than its tombstone, a lagging read
		// may not tell. The caller's value is computed here, unshared.
		v.Close()
		c.obs.invalidatedRecord(ref, v)
		return answer(c.computeUnshared(ctx, ref, fn))
	}
	if err == nil {
		if r.w.waited {
			return answer(v, PathWaited, nil)
		}
		return answer(v, PathRemoteHit, nil)
	}
	if errors.Is(err, ErrNoTransport) || errors.Is(err, payload.ErrInvalidLocation) || errors.Is(err, payload.ErrUntrusted) ||
		errors.Is(err, payload.ErrStoreUnreachable) {
		// Readable where it was written, not here (no transport for it,
		// another node's shm, a pull server this node does not trust, a
		// store this process cannot reach at all): not corrupt, so the
		// record stays for those who can read it. The bucket answered:
		// no outage of the store ModeStrict is about, so the caller's
		// value is computed here, unshared, in either mode.
		c.obs.degraded()
		return answer(c.computeUnshared(ctx, ref, fn))
	}
	if attempt >= 3 {
		return answer(c.degraded(ctx, ref, fn, err))
	}
	// Drop the record (if nobody changed it) so the key can be recomputed;
	// one that may have expired is left to the server (3.1): its key is
	// computed without sharing meanwhile.
	if cur.Record.MayHaveExpired(c.s.clock.Now(), c.s.clockAllowance) {
		return answer(c.degraded(ctx, ref, fn, err))
	}
	octx, cancel := c.opContext(ctx)
	err = r.b.PurgeFor(octx, r.key, cur.Rev, events.CauseCorrupt)
	cancel()
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return answer(c.degraded(ctx, ref, fn, err))
	}
	return outcome{next: stepAgain}
}

// computing waits for a change of a record another process computes
// under, or polls.
func (r *resolution) computing(ctx context.Context, cur lease.Entry) outcome {
	c := r.c
	if !r.w.waited {
		r.w.waited = true
		c.obs.waiting(ctx)
	}
	if r.w.done == nil {
		// Subscribe, then read again: a change between the first read and
		// the subscription is in the second read, and any after it
		// reaches the subscription. Only a waiter subscribes (a hit or a
		// reservation needs no changes). Without changes (a subscription
		// refused, a bucket that does not republish) the polls alone wake
		// it.
		if err := r.w.subscribe(r.b, r.key); err != nil {
			c.s.logger.Debug("embcache: no changes for a key, polling", "key", r.key, "err", err)
		}
		return outcome{next: stepAgain}
	}
	ch, err := r.w.wait(ctx, c.s.pollInterval, cur.Rev)
	if err != nil {
		return answer(nil, PathWaited, c.waitEnded(ctx, r.key, cur))
	}
	r.heard = ch
	return outcome{next: stepAgain}
}

// purgeStale removes a computing record that nobody renews and nothing
// expires: one without a TTL of its own (written by hand), not written for
// two lease TTLs, would block its key forever. It is purged on its
// revision, so a write meanwhile keeps it. A record with a TTL is left to
// the server, whatever its age by this process's clock (which may run
// ahead): past its deadline a purge could start a next holder whose
// writes the server's expiry marker then wipes (docs/protocol.md 3.1).
// Reports whether the key should be read again.
func (c *Cache) purgeStale(ctx context.Context, b *lease.Bucket, key string, cur lease.Entry) bool {
	if cur.Stamp.IsZero() || cur.TTL > 0 {
		return false
	}
	age := c.s.clock.Now().Sub(cur.Stamp)
	if age <= 2*c.s.leaseTTL {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := b.Purge(octx, key, cur.Rev)
	cancel()
	if err == nil {
		c.obs.staleTakeover()
		c.s.logger.Warn("embcache: stale computing record purged, taking the key over", "key", key,
			"owner", cur.Record.Owner, "age", age.Round(time.Millisecond))
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}

// purgeUnreadable removes a record that does not decode under its key (a
// tombstone at a value's key included) and has no TTL of its own once it
// is older than a lease TTL by the server's time stamp
// (lease.Entry.Outlived), so that its key is shared again; a younger one
// may be a newer version's record mid-upgrade, and is left alone
// meanwhile. One with a TTL is left to the server's expiry, as purgeStale
// leaves a computing record. Reports whether the key should be read again.
func (c *Cache) purgeUnreadable(ctx context.Context, b *lease.Bucket, key string, cur lease.Entry, cause error) bool {
	if cur.TTL > 0 || !cur.Outlived(c.s.clock.Now(), c.s.leaseTTL) {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := b.Purge(octx, key, cur.Rev)
	cancel()
	if err == nil {
		c.obs.badRecordPurged()
		c.s.logger.Warn("embcache: unreadable lease record purged", "key", key, "rev", cur.Rev, "err", cause)
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}
