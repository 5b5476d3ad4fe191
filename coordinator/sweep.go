package coordinator

import (
	"context"
	"slices"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// payloadSweepEvery is the payload sweep's interval (WithPayloadSweep);
// 0 when it is off.
func (c *Cache) payloadSweepEvery() time.Duration {
	switch d := c.s.payloadSweep; {
	case d < 0:
		return 0
	case d > 0:
		return d
	}
	return min(max(c.s.storeTTL/2, 30*time.Second), 10*time.Minute)
}

func (c *Cache) sweepLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.life.Done():
			return
		case <-t.C:
			c.sweepPayloads(c.life, every)
		}
	}
}

// sweepPayloads removes the temp files of writers that died mid-write,
// and the shm files older than minAge that hold no live committed
// record's bytes: the record is gone (expired, invalidated, purged) or
// names other bytes (the key computed again, here or elsewhere, after an
// invalidation). A file with the bytes of the key's live record is kept
// wherever the record says they are: it is a copy of the live value, one
// an agent of the node pulled into the store for its clients included,
// and what the store's next pull of that value reuses. A key being computed
// keeps its file (its commit may be about to name it), and so does any
// file while the bucket cannot be read. It returns how many files it
// removed. Every process of a node may sweep the same directory: a
// removal is of the file's generation the listing saw, so it never takes
// a file put in place, or put again, since.
func (c *Cache) sweepPayloads(ctx context.Context, minAge time.Duration) int {
	b := c.bucket()
	if b == nil {
		return 0
	}
	// A process killed in the middle of a Put leaves its temp file: a
	// whole value's bytes of the node's tmpfs, which no record names.
	store := c.router.NodeStore()
	removed, err := store.Sweep()
	if err != nil {
		c.s.logger.Warn("embcache: payload sweep: temp files", "err", err)
	}
	for f := range store.Files() {
		obj, _ := f.Location.ObjectID()
		if time.Since(f.ModTime) < minAge || (len(c.s.tenants) > 0 && !slices.Contains(c.s.tenants, obj.Tenant)) {
			continue
		}
		select {
		case <-c.life.Done():
			return removed
		default:
		}
		octx, cancel := c.opContext(ctx)
		cur, err := b.Read(octx, obj.Tenant+"."+obj.Key.String())
		cancel()
		if err != nil || (cur.Live && cur.Record.State != lease.StateCommitted) || (cur.Live && holds(cur.Record, f.Location)) {
			continue
		}
		octx, cancel = c.opContext(ctx)
		err = store.Delete(octx, f.Location, f.Generation)
		cancel()
		if err == nil {
			removed++
			c.obs.swept()
		}
	}
	return removed
}

// holds reports whether the file at loc holds the bytes of the committed
// record rec.
func holds(rec lease.Record, loc payload.Location) bool {
	return rec.Location != nil && rec.Checksum == loc.Checksum.String()
}
