package reconciler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
)

// sweepReaders is how many records a sweep reads at once.
const sweepReaders = 16

// sweep evicts every value the events call live whose record is gone: the
// markers of the time no reconciler ran may be gone too. It reads the
// last published and touched event of every value once, one batch at a
// time, and each one's record (sweepReaders at once); it holds nothing of
// them.
func (r *Reconciler) sweep(ctx context.Context, x *expirer) (done bool) {
	keys := make(chan string, sweepReaders)
	var wg sync.WaitGroup
	var unfinished atomic.Int64 // values whose record or eviction it could not settle
	for range sweepReaders {
		wg.Go(func() {
			for key := range keys {
				octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
				cur, err := r.read(octx, x.b, key)
				cancel()
				switch {
				case errors.Is(err, lease.ErrBadRecord):
					// It exists: its value is not gone (counted as bad by
					// read). Purged once old, beside the sweeps.
					x.bad.add(key)
				case err != nil:
					unfinished.Add(1)
				case cur.Live && cur.Record.State == lease.StateCommitted:
					// Its value lives (expire tells a committed record of
					// other bytes from the value the events name).
				case !x.expire(ctx, key, events.CauseExpired, nil):
					// A record gone, or a compute of the key again (live,
					// computing): the value the events name is gone.
					unfinished.Add(1)
				}
			}
		})
	}
	skipped, err := events.Scan(ctx, r.js, []events.Kind{events.KindPublished, events.KindTouched}, func(e events.Event) {
		select {
		case keys <- lease.ValueKey(e.Tenant, e.Key):
		case <-ctx.Done():
		}
	})
	close(keys)
	wg.Wait()
	if skipped > 0 {
		// The durable consumer counts them as it reaches them.
		r.s.logger.Warn("embcache: sweep skipped events that do not decode", "skipped", skipped)
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.s.logger.Warn("embcache: sweep ended early", "err", err)
	case unfinished.Load() > 0:
		r.s.logger.Warn("embcache: sweep left values unsettled (a read failed), to the next one", "values", unfinished.Load())
	default:
		r.did(actionSweep) // counted when done
		return true
	}
	return false
}
