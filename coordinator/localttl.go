package coordinator

import (
	"context"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// A local copy lives as long as its record (docs/protocol.md 4.3).

// recordExpiry is the local cache's Options.Expiry: a value pulled or
// committed expires with its record; one not shared (computed without the
// store, or its commit refused) a lease TTL after it was computed.
func (c *Cache) recordExpiry(k localKey, _ *payload.Value) (time.Time, bool) {
	e, ok := c.expiries.LoadAndDelete(k)
	if !ok {
		return time.Time{}, false
	}
	return e.(copyExpiry).expires, true
}

// copyExpiry is a value's record expiry on its way into the local cache
// (Cache.expiries), with the value it is for.
type copyExpiry struct {
	value   *payload.Value
	expires time.Time
}

// copyDue is a local copy whose expiry is near: its record is read again.
type copyDue struct {
	key      localKey
	checksum payload.Checksum // of the value the copy holds
	expires  time.Time        // the copy's expiry
}

// refreshCopy reads the record of a copy in use before the copy expires:
// a record extended (by the reconciler, applying touches) extends the
// copy to the record's new expiry; a record gone, naming other bytes or
// carrying other labels than the copy's, takes the copy with it. A read
// that fails changes nothing: the copy ends at its own expiry, which is
// at most its record's. So a copy never outlives its record's expiry,
// and this process hears of a record only when one of its copies is
// about to end (docs/protocol.md 4.3).
func (c *Cache) refreshCopy(d copyDue) {
	b := c.bucket()
	if b == nil {
		return
	}
	ctx, cancel := c.opContext(context.Background())
	ref := d.key.ref()
	cur, err := b.Read(ctx, ref.KVKey())
	cancel()
	switch {
	case err != nil:
	case !cur.Live || cur.Record.State != lease.StateCommitted || cur.Record.Checksum != d.checksum.String() ||
		!ref.carries(cur.Record):
		c.local.Evict(d.key, localcache.CauseStore)
	case cur.Record.Expires.After(d.expires):
		if c.local.Touch(d.key, cur.Record.Expires) {
			if l := c.eventLink(); l != nil {
				l.extended(d.key, cur.Record.Expires)
			}
		}
	}
}

// recordMayName reports whether obj's record may still name the bytes
// whose checksum is sum: false only when a read from the stream leader
// shows no committed record of them (an eviction announced after the
// value was committed again under the same name is not its record's) and
// no compute of the key (which may commit the same bytes, already written
// under the same name).
func (c *Cache) recordMayName(obj payload.ObjectID, sum payload.Checksum) bool {
	b := c.bucket()
	if b == nil {
		return true
	}
	ctx, cancel := c.opContext(context.Background())
	defer cancel()
	cur, err := b.Read(ctx, obj.Tenant+"."+obj.Key.String())
	return err != nil || cur.Live && (cur.Record.State == lease.StateComputing ||
		cur.Record.State == lease.StateCommitted && cur.Record.Checksum == sum.String())
}
