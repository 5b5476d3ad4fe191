package reconciler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/embcache/embcache/lease"
)

// maxBadRecords bounds the bad records the active reconciler holds to
// purge: past it, a bad record is left to its readers, who purge it on
// the same rule, and to the next sweep that reads it.
const maxBadRecords = 1024

// badRecords are the keys of bad records at values' keys that the active
// reconciler came upon (its loop, as they were stored; a sweep), to purge
// once they are older than a lease TTL: one without a TTL of its own that
// no reader asks for again would stay for good. The zero value is empty.
type badRecords struct {
	mu   sync.Mutex
	keys map[string]struct{} // lazily made; guarded by mu
}

// add notes the bad record under key. One under a tombstone's key is not
// noted: it may stand where an invalidation's tombstone was, and purged it
// would let the records that tombstone refuses be served.
func (br *badRecords) add(key string) {
	if lease.IsTombstoneKey(key) {
		return
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.keys == nil {
		br.keys = map[string]struct{}{}
	}
	if len(br.keys) < maxBadRecords {
		br.keys[key] = struct{}{}
	}
}

// take returns the keys noted and forgets them.
func (br *badRecords) take() map[string]struct{} {
	br.mu.Lock()
	defer br.mu.Unlock()
	keys := br.keys
	br.keys = nil
	return keys
}

// purgeBadRecords rereads the bad records noted every lease TTL and
// purges each that is old enough (purgeBad), until ctx ends.
func (r *Reconciler) purgeBadRecords(ctx context.Context, x *expirer) {
	tick := time.NewTicker(r.s.leaseTTL)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for key := range x.bad.take() {
			if ctx.Err() != nil {
				return
			}
			if !r.purgeBad(ctx, x.b, key) {
				x.bad.add(key)
			}
		}
	}
}

// purgeBad purges key's record if it is still bad (lease.DecodeRecord), has
// no TTL of its own, and its message is older than a lease TTL by the
// server's time stamp (lease.Entry.Outlived), on the revision it read: a
// record a writer put in its place meanwhile stays. It reports whether key
// is settled: false if its record is bad and too young, or a read or the
// purge failed, to be tried again at the next pass.
func (r *Reconciler) purgeBad(ctx context.Context, b *lease.Bucket, key string) (settled bool) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	// Not counted as bad again: whoever noted it counted it.
	cur, why := b.Read(octx, key)
	switch {
	case !errors.Is(why, lease.ErrBadRecord):
		return why == nil // gone, or a record that decodes
	case cur.TTL > 0:
		return true // it ends with its own TTL
	case !cur.Outlived(r.s.clock.Now(), r.s.leaseTTL):
		return false // maybe a newer version's record, mid-upgrade
	}
	switch err := b.Purge(octx, key, cur.Rev); {
	case errors.Is(err, lease.ErrLost):
		return true // written since the read: the record is someone's
	case err != nil:
		return false
	}
	r.did(actionPurgeBad)
	r.s.logger.Warn("embcache: bad lease record purged", "key", key, "rev", cur.Rev, "err", why)
	return true
}
