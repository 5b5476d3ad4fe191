package coordinator

import (
	"context"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

// holding returns the keys of this process's copies of e's value that
// are of the bytes whose checksum is sum (a copy computed again with other
// bytes is not). A copy of a record's bytes was pulled or committed under
// that record's labels, which an eviction names: that copy alone, found
// at once; an eviction that names no model (a notice of another's) is
// looked for among every copy.
func (l *eventLink) holding(e events.Event, sum payload.Checksum) []localKey {
	obj := payload.ObjectID{Tenant: e.Tenant, Key: e.Key}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Model != "" {
		k := localKey{obj: obj, model: e.Model, epoch: e.Epoch}
		if m := l.meta[k]; m != nil && m.loc.Transport != "" && m.loc.Checksum == sum {
			return []localKey{k}
		}
		return nil
	}
	var keys []localKey
	for k, m := range l.meta {
		if k.obj == obj && m.loc.Transport != "" && m.loc.Checksum == sum {
			keys = append(keys, k)
		}
	}
	return keys
}

// apply follows the others: an eviction (a notice: this node wrote the
// value) or an invalidation drops local copies (pinned ones stay with
// their holders until released), and an eviction the payload this node
// wrote. A touch says nothing to a local copy: it follows its record's
// expiry (refreshCopy), which only the reconciler extends.
func (l *eventLink) apply(e events.Event) {
	c := l.c
	switch e.Kind {
	case events.KindEvicted:
		if e.Location == nil {
			return
		}
		obj := payload.ObjectID{Tenant: e.Tenant, Key: e.Key}
		// A payload found corrupt is its reader's to remove (its store
		// did); a recompute may have put the value back under its name.
		// What the delete may remove is the payload as it is before the
		// record is read: a recompute that puts the same bytes after the
		// read (and commits them) gives it another generation.
		deletes := e.Location.Node == c.s.node && e.Cause != events.CauseCorrupt
		var seen payload.Generation
		if deletes {
			ctx, cancel := c.opContext(context.Background())
			var err error
			seen, err = c.router.Writer().Generation(ctx, *e.Location)
			cancel()
			deletes = err == nil
		}
		if c.recordMayName(obj, e.Location.Checksum) {
			// Computed and committed again since (an expired value is
			// recomputed under the same name): the copy and the file are
			// the new record's.
			return
		}
		cause := localcache.CauseStore
		if e.Cause == events.CauseInvalidated {
			cause = localcache.CauseInvalidated
		}
		for _, k := range l.holding(e, e.Location.Checksum) {
			c.local.Evict(k, cause)
		}
		if deletes {
			ctx, cancel := c.opContext(context.Background())
			c.router.Writer().Delete(ctx, *e.Location, seen)
			cancel()
		}
	case events.KindInvalidated:
		// Every copy in the local cache of the labels (its localKey, which
		// are its record's: the label rule, docs/protocol.md 4.4), however
		// it was made and whatever the link knew of it.
		stale := func(k localKey) bool {
			return k.obj.Tenant == e.Tenant && k.model == e.Model && k.epoch == e.Epoch
		}
		// A compute in progress under a lease is marked: it reads its
		// tombstone after the commit and drops its value if it is stale
		// (computeUnder: the event may be older than its reservation, as
		// is the invalidating process's own, applied twice). Every other
		// flight of the labels (a compute without a lease, a pull, one
		// the link never heard of) is discarded: its value stays out of
		// the local cache.
		exact := map[localKey]bool{}
		l.mu.Lock()
		l.heard[labels{e.Tenant, e.Model, e.Epoch}]++
		if k := (labels{e.Tenant, e.Model, e.Epoch}); e.Time.After(l.heardAt[k]) {
			l.heardAt[k] = e.Time
		}
		for k, m := range l.computing {
			if stale(k) {
				m.invalidated = true
				exact[k] = m.exact
			}
		}
		l.mu.Unlock()
		c.local.Invalidate(func(k localKey, v *payload.Value) bool {
			return stale(k) && (v != nil || !exact[k])
		}, localcache.CauseInvalidated)
		c.obs.invalidationApplied(e)
	}
}
