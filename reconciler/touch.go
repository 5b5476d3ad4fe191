package reconciler

import (
	"context"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
)

// applyTouch extends the committed record's TTL to the touch's expiry.
// Replaying a touch changes nothing: the record already lives that long.
func (r *Reconciler) applyTouch(ctx context.Context, b *lease.Bucket, e events.Event) {
	key := lease.ValueKey(e.Tenant, e.Key)
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cur, err := r.read(octx, b, key)
	if err != nil || !cur.Live || cur.Record.State != lease.StateCommitted || e.Location == nil ||
		cur.Record.Checksum != e.Location.Checksum.String() || !e.Expires.After(cur.Record.Expires) {
		return
	}
	if stale, err := b.Invalidated(octx, key, cur.Record, time.Time{}); err != nil || stale {
		return // an invalidated value is not kept alive (docs/protocol.md 4.4)
	}
	// The record may expire at its own expiry (set by its writer's clock
	// when it was written, before it was sent), less two clock allowances
	// (lease.Record.MayHaveExpired): a touch answered after that may be
	// wiped by the server's TTL marker, so it is not counted as applied,
	// and one sent after it is not sent at all. The record then expires as
	// unused.
	deadline := cur.Record.Expires.Add(-2 * r.s.allowance)
	now := r.s.clock.Now()
	ttl := e.Expires.Sub(now)
	if !now.Before(deadline) || ttl < time.Second {
		return
	}
	if ttl > events.MaxStoreTTL {
		// By this clock, not the event's own time (its sender's to say):
		// no store TTL is that long, and a record that outlived its last
		// event in the stream would never be announced.
		r.s.logger.Warn("embcache: touch past the longest store TTL, not applied", "key", key, "expires", e.Expires)
		return
	}
	rec := cur.Record
	rec.Expires = e.Expires
	// Nor sent again past it (a write refused while another is in flight
	// is resent until its context ends).
	cctx, ccancel := context.WithTimeout(octx, deadline.Sub(now))
	_, err = b.CompareAndSet(cctx, key, cur.Rev, rec, ttl)
	ccancel()
	if err != nil {
		return
	}
	if !r.s.clock.Now().Before(deadline) {
		r.did(actionLateExtend)
		r.s.logger.Warn("embcache: touch acknowledged after the record's expiry, not trusted", "key", key)
		return
	}
	r.did(actionExtend)
}
