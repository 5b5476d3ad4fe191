package coordinator

import (
	"strings"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// A local copy lives as long as its record (docs/protocol.md 4.3).

// recordExpiry is the local cache's WithExpiry: a value pulled or
// committed expires with its record; any other (computed without the
// store) slides.
func (c *Cache) recordExpiry(obj payload.ObjectID, _ *payload.Value) (time.Time, bool) {
	t, ok := c.expiries.LoadAndDelete(obj)
	if !ok {
		return time.Time{}, false
	}
	return t.(time.Time), true
}

// recordChanged follows the bucket for the local copies: a record
// extended extends its copy; a record gone (expired, purged, deleted)
// takes its copy with it, unless the copy came from a later record (the
// watcher reports a purge this process made before it computed the key
// again).
func (c *Cache) recordChanged(key string, rev uint64, st *lease.Entry) {
	tenant, hexKey, ok := strings.Cut(key, ".")
	k, err := cachekey.Parse(hexKey)
	if !ok || err != nil {
		return // not a value's key (a tombstone, the reconciler's)
	}
	obj := payload.ObjectID{Tenant: tenant, Key: k}
	switch {
	case st == nil:
		if l := c.eventLink(); l != nil && l.newerCopy(obj, rev) {
			return
		}
		c.local.Evict(obj, localcache.CauseStore)
	case st.Record.State == lease.StateCommitted:
		c.local.Touch(obj, st.Record.Expires)
	}
}
