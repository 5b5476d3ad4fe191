package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// computeUnder runs fn under lease and commits what it returns. A failed
// fn abandons the key; a failed commit still returns the (correct) value.
// end, if set, is the compute's registration with the event link
// (startCompute), ended here.
//
// A compute that Close cancels fails as any other (its key is abandoned);
// one still running when Close stops waiting for it (compute) does
// nothing more with the store when it returns: no commit, no abandon
// (its lease, no longer renewed, expires).
func (c *Cache) computeUnder(ctx context.Context, r *Reservation, fn ComputeFunc, end func() bool) (v *payload.Value, _ Path, err error) {
	if end != nil {
		defer end()
	}
	defer func() {
		if p := recover(); p != nil {
			if !c.givenUp() {
				r.abandon(context.WithoutCancel(ctx), fmt.Errorf("panic: %v", p))
			}
			panic(p) // the local cache turns it into an error for every waiter
		}
	}()
	computeStart := time.Now()
	v, err = c.compute(ctx, fn)
	c.obs.computed(ctx, time.Since(computeStart), err)
	if errors.Is(err, errGivenUp) {
		return nil, PathComputed, err
	}
	if err != nil {
		if aerr := r.abandon(context.WithoutCancel(ctx), err); aerr != nil {
			c.s.logger.Warn("embcache: abandon failed; the lease will expire", "key", r.l.Key(), "err", aerr)
		}
		c.obs.abandoned(r.ref, err)
		return nil, PathComputed, err
	}
	// Not cut short by the compute timeout (the value is there), but by
	// Close: a commit cancelled then is abandoned below.
	cctx, cancel := c.bind(context.WithoutCancel(ctx))
	loc, err := r.commit(cctx, v)
	cancel()
	if err != nil {
		c.s.logger.Warn("embcache: value computed but not committed", "key", r.l.Key(), "err", err)
		if !errors.Is(err, ErrLeaseLost) {
			r.abandon(context.WithoutCancel(ctx), err)
		}
		c.obs.unshared(r.ref, v)
		if end != nil && end() {
			// An invalidation arrived while it computed: with no record
			// to compare with its tombstone, it is not kept.
			c.discard(r.ref.local())
		}
		return v, PathComputed, nil
	}
	rec := r.l.Record()
	c.obs.published(r.ref, v, loc, rec.Expires)
	// An invalidation that came while it computed: the caller gets the
	// value it asked for, but the record and the local copy go (4.4). After
	// published, so that an event arriving from now on finds the copy.
	// With the event link, an invalidation the reservation may precede is
	// one whose event has marked this compute (startCompute); the others'
	// tombstones came before the reservation. Without it, every commit
	// reads its tombstone.
	invalidated := true
	if end != nil {
		invalidated = end()
	}
	// A tombstone it could not read leaves the question open: the record
	// stays (its readers check the tombstone themselves), the copy, which
	// nothing checks again, goes.
	if b := c.bucket(); b != nil && invalidated {
		stale, err := c.invalidatedRecord(ctx, b, r.ref, rec)
		if err == nil && stale {
			c.dropInvalidated(ctx, b, r.ref, v, lease.Entry{Rev: r.Revision(), Record: rec})
		}
		if err != nil || stale {
			c.discard(r.ref.local())
		}
	}
	return v, PathComputed, nil
}

// degraded computes without the store: counted in ModeDegrade, an error
// in ModeStrict.
//
// A request whose ctx has ended (Close, the compute timeout) computes
// nothing: the store call that failed failed with it, and says nothing of
// the store.
func (c *Cache) degraded(ctx context.Context, ref Ref, fn ComputeFunc, cause error) (*payload.Value, Path, error) {
	if ctx.Err() != nil {
		return nil, PathDegraded, context.Cause(ctx)
	}
	if errors.Is(cause, ErrClosed) {
		return nil, PathDegraded, cause
	}
	if c.s.mode == ModeStrict {
		return nil, PathDegraded, fmt.Errorf("%w: %v", ErrStoreUnavailable, cause)
	}
	c.obs.degraded()
	return c.computeUnshared(ctx, ref, fn)
}

// computeUnshared runs fn for ref without the store: its value is the
// caller's and this process's (local cache), never the cluster's.
func (c *Cache) computeUnshared(ctx context.Context, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	// Registered until its copy is noted, as a compute under a lease is:
	// an invalidation that arrives meanwhile keeps it out of the local
	// cache (docs/protocol.md 4.4).
	if end := c.startCompute(ref, false); end != nil {
		defer end()
	}
	computeStart := time.Now()
	v, err := c.compute(ctx, fn)
	c.obs.computed(ctx, time.Since(computeStart), err)
	if err != nil {
		return nil, PathDegraded, err
	}
	c.obs.unshared(ref, v)
	return v, PathDegraded, nil
}

// reserveToCompute is reserve for a compute of this process's own,
// registered with the event link first (startCompute): end, nil without
// events, is the registration, ended already if there is no reservation.
func (c *Cache) reserveToCompute(ctx context.Context, b *lease.Bucket, ref Ref) (r *Reservation, end func() bool, err error) {
	end = c.startCompute(ref, true)
	defer func() { // an error or a panic: no compute to register
		if r == nil && end != nil {
			end()
		}
	}()
	r, err = c.reserve(ctx, b, ref)
	return r, end, err
}

// Reserve takes ref's lease for this process: the caller computes, then
// Commits or Abandons. ErrHeld means another process holds or has
// committed the key; ErrStoreUnavailable that the store cannot be reached;
// ErrLeaseLost that the reservation was acknowledged too late to trust
// (try again); ErrClosed (wrapped) that the Cache was closed before or
// meanwhile (the key was given back, or never taken); ErrTenant that this
// Cache does not serve ref's tenant; an error wrapping
// cachekey.ErrInvalidConfig that ref does not validate (Ref.Validate: a
// model is required). The record carries ref's labels.
func (c *Cache) Reserve(ctx context.Context, ref Ref) (*Reservation, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	if err := c.validate(ref); err != nil {
		return nil, err
	}
	b := c.bucket()
	if b == nil {
		return nil, ErrStoreUnavailable
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	r, err := c.reserve(ctx, b, ref)
	return r, closedErr(ctx, err)
}

func (c *Cache) reserve(ctx context.Context, b *lease.Bucket, ref Ref) (*Reservation, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: c.owner, Nonce: hex.EncodeToString(nonce[:]),
		Started: now, Heartbeat: now, Model: ref.Model, Epoch: ref.Epoch}
	var st lease.Store = b
	if wrap := c.s.leaseStore; wrap != nil {
		st = wrap(b)
	}
	l, err := lease.Acquire(ctx, st, ref.KVKey(), rec, lease.Config{TTL: c.s.leaseTTL, OpTimeout: c.s.opTimeout,
		Clock: c.s.clock, ClockAllowance: c.s.clockAllowance, Hooks: c.leaseHooks()})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed := c.closed.Load()
	select {
	case <-l.Done(): // already lost: its Ended hook may have run
	default:
		if !closed {
			c.leases[l] = struct{}{} // forgotten by the Ended hook, which waits for mu
		}
	}
	c.mu.Unlock()
	if closed {
		l.Abandon(context.Background())
		return nil, ErrClosed
	}
	c.obs.reserved(ref, l.Record().Reserved) // the create's revision, whatever a renewal did since
	return &Reservation{c: c, ref: ref, l: l}, nil
}
