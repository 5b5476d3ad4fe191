package coordinator

import (
	"context"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/decodestats"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// observations fan each decision of a Cache out to everyone who hears of
// it: the counters (Stats), the OpenTelemetry instruments, the user's
// Observer, the event link (events, and what a later invalidation must
// drop) and the local copies' expiries. The protocol code calls one method
// per decision and knows none of them.
type observations struct {
	c *Cache
}

// localHit: a request answered from this process's cache (a use).
func (o observations) localHit(k localKey) {
	o.c.stats.localHits.Add(1)
	if l := o.c.eventLink(); l != nil {
		l.touched(k, true)
	}
}

// waiting: a request waits for another process's compute (once per
// request).
func (o observations) waiting(ctx context.Context) {
	o.c.stats.waits.Add(1)
	o.c.tel.leaseWaits.Add(ctx, 1)
}

// tookOver: a key reserved after someone else had held it.
func (o observations) tookOver() { o.c.stats.takeovers.Add(1) }

// reserved: this process holds ref's lease at rev.
func (o observations) reserved(ref Ref, rev uint64) {
	if ob := o.c.s.observer; ob != nil {
		ob.Reserved(ref, rev)
	}
}

// computed: fn ran (took, err), under a lease or degraded.
func (o observations) computed(ctx context.Context, took time.Duration, err error) {
	o.c.tel.computeTime.Record(ctx, took.Seconds())
	if err != nil {
		o.c.stats.computeErrors.Add(1)
	} else {
		o.c.stats.computes.Add(1)
	}
}

// abandoned: a compute under ref's lease failed; the key was given up.
func (o observations) abandoned(ref Ref, err error) {
	if l := o.c.eventLink(); l != nil {
		l.abandoned(ref, err)
	}
}

// committed: a reservation's commit landed at rev.
func (o observations) committed(ref Ref, rev uint64, loc payload.Location) {
	if ob := o.c.s.observer; ob != nil {
		ob.Committed(ref, rev, loc.Checksum)
	}
}

// refused: a reservation could not commit: its lease was lost.
func (o observations) refused(ref Ref, rev uint64, err error) {
	if ob := o.c.s.observer; ob != nil {
		ob.Refused(ref, rev, err)
	}
}

// leaseLost: a lease was lost, found by a renewal or by the commit.
func (o observations) leaseLost(during lease.Op) {
	if during == lease.OpCommit {
		o.c.stats.commitsRefused.Add(1)
	} else {
		o.c.stats.leasesLost.Add(1)
	}
}

// lateWrite: a lease write acknowledged after its deadline.
func (o observations) lateWrite() { o.c.stats.lateWrites.Add(1) }

// published: this process committed ref's value at loc, until expires;
// its local copy lives as long.
func (o observations) published(ref Ref, v *payload.Value, loc payload.Location, expires time.Time) {
	o.c.expiries.Store(ref.local(), copyExpiry{v, expires})
	o.c.stats.written[transportIndex(loc.Transport)].Add(uint64(loc.Size))
	if l := o.c.eventLink(); l != nil {
		l.published(ref, v, loc, expires)
	}
}

// unshared: a value computed here that is not the cluster's copy (not
// committed, or computed without the store): a later invalidation of its
// model and epoch must still drop it. Its local copy lives a lease TTL from
// now, however often it is hit: then the store is asked again.
func (o observations) unshared(ref Ref, v *payload.Value) {
	o.c.expiries.Store(ref.local(), copyExpiry{v, o.c.s.clock.Now().Add(o.c.s.leaseTTL)})
	if l := o.c.eventLink(); l != nil {
		l.note(ref, v)
	}
}

// degraded: a request computed without the store.
func (o observations) degraded() { o.c.stats.degraded.Add(1) }

// fetched: a committed value of ref arrived from loc, its record
// expiring at expires; whether it may be served is decided next (its
// tombstone).
func (o observations) fetched(ref Ref, v *payload.Value, loc payload.Location, expires time.Time) {
	if l := o.c.eventLink(); l != nil {
		l.noteAt(ref, v, loc, expires)
	}
}

// pulled: a fetched value is served: a remote hit, and a use.
func (o observations) pulled(ctx context.Context, ref Ref, v *payload.Value, loc payload.Location, expires time.Time, took time.Duration) {
	o.c.expiries.Store(ref.local(), copyExpiry{v, expires})
	o.c.stats.remoteHits.Add(1)
	o.c.stats.pulled[transportIndex(loc.Transport)].Add(uint64(loc.Size))
	o.c.tel.pullBytes.Add(ctx, loc.Size)
	o.c.tel.pullTime.Record(ctx, took.Seconds())
	if l := o.c.eventLink(); l != nil {
		l.touched(ref.local(), false)
	}
}

// pullFailed: a committed value could not be fetched or verified.
func (o observations) pullFailed(ref Ref, loc payload.Location, err error) {
	o.c.stats.payloadErrors.Add(1)
	o.c.tel.pullFailed(err)
	o.c.s.logger.Warn("embcache: committed payload unreadable", "key", ref.KVKey(),
		"location", loc.Object, "node", loc.Node, "err", err)
}

// dropped: this process will not keep v, a copy of k (refused after
// its fetch, its record invalidated, or evicted): forget what was noted
// for it. Only for it: an older copy of the key, detached and released
// after a newer one was noted, must not take the newer one's notes (an
// invalidation would no longer find the newer copy).
func (o observations) dropped(k localKey, v *payload.Value) {
	if e, ok := o.c.expiries.Load(k); ok && e.(copyExpiry).value == v {
		o.c.expiries.CompareAndDelete(k, e)
	}
	if l := o.c.eventLink(); l != nil {
		l.forget(k, v)
	}
}

// invalidatedRecord: a committed record refused because an invalidation
// came after its reservation; v is the copy made of it.
func (o observations) invalidatedRecord(ref Ref, v *payload.Value) {
	o.c.stats.invalidatedRecords.Add(1)
	o.dropped(ref.local(), v)
}

// evicted: v, a copy of k, left the local cache.
func (o observations) evicted(k localKey, v *payload.Value, cause localcache.Cause) {
	o.c.tel.evicted(cause)
	o.dropped(k, v)
}

// staleTakeover and badRecordPurged: a key freed from a record nobody
// renews, or from one that does not decode.
// invalidationApplied is an invalidated event applied (eventLink.apply).
func (o observations) invalidationApplied(e events.Event) {
	if ob, ok := o.c.s.observer.(InvalidationObserver); ok {
		ob.Invalidated(e.Tenant, e.Model, e.Epoch, e.Time)
	}
}

func (o observations) staleTakeover()   { o.c.stats.staleTakeovers.Add(1) }
func (o observations) badRecordPurged() { o.c.stats.badRecordsPurged.Add(1) }

// badRecord: a record that did not decode, come upon by op (decodestats.OpRead
// or decodestats.OpWatch).
func (o observations) badRecord(err error, op decodestats.RecordOp) {
	if op == decodestats.OpWatch {
		o.c.stats.badRecordsWatched.Add(1)
	} else {
		o.c.stats.badRecords.Add(1)
	}
	o.c.tel.RecordBad(err, op)
}

// swept: the node sweep removed a payload file no record names.
func (o observations) swept() { o.c.stats.payloadsSwept.Add(1) }

// uncommittedDeleted: a conditional delete of a payload put whose commit
// did not land succeeded.
func (o observations) uncommittedDeleted() { o.c.stats.uncommittedDeleted.Add(1) }

// uncommittedLeft: such a payload is left to the node's sweep or the
// store's eviction.
func (o observations) uncommittedLeft(u uncommitted, why string) {
	o.c.stats.uncommittedLeft.Add(1)
	o.c.s.logger.Warn("embcache: an uncommitted payload is left in the store", "key", u.ref.KVKey(),
		"transport", u.loc.Transport, "object", u.loc.Object, "why", why)
}
