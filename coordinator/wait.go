package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/lease"
)

// waiter is one request's wait for a key computed elsewhere: its
// subscription to the key's changes, and how it polls.
type waiter struct {
	waited  bool
	changes <-chan lease.Change
	done    func() // set while subscribed (a no-op if the subscription failed)
	polls   int    // waits without a change so far
}

func (w *waiter) subscribe(b *lease.Bucket, key string) error {
	w.polls = 0
	ch, done, err := b.Changes(key)
	w.changes, w.done = ch, done
	return err
}

// wait blocks until the key's stream stores a change worth acting on
// (returned, to be taken as a read) or the next poll is due (nil). A
// change at or below rev, the revision last read, is older than what the
// waiter knows (a new stream leader republishes its predecessor's last
// entries) and is ignored. The error is ctx's.
func (w *waiter) wait(ctx context.Context, poll time.Duration, rev uint64) (*lease.Change, error) {
	t := time.NewTimer(pollDelay(poll, w.polls))
	defer t.Stop()
	w.polls++
	for {
		select {
		case ch := <-w.changes:
			if ch.Entry.Rev <= rev {
				continue
			}
			return &ch, nil
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// stop ends the subscription, if there is one.
func (w *waiter) stop() {
	if w.done != nil {
		w.done()
		w.done, w.changes = nil, nil
	}
}

// pollDelay is how long the n-th wait of a request lasts without a
// change: 250 ms, then the poll interval. The early poll bounds what the
// subscription can miss in a wait's first moments (its interest reaching
// the stream leader's server after a direct get a follower answered, a
// change lost): rare, since a change is the stored message itself (3.3),
// so it comes late enough that a wait of a usual compute reads no more
// than the change.
func pollDelay(poll time.Duration, n int) time.Duration {
	if n == 0 {
		return min(poll, 250*time.Millisecond)
	}
	return poll
}

// waitEnded is the error of a wait for key, held at cur, whose ctx ended.
func (c *Cache) waitEnded(ctx context.Context, key string, cur lease.Entry) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: waiting for %s (owner %s): %w", ErrComputeTimeout, key, cur.Record.Owner, ctx.Err())
	}
	return ctx.Err()
}

// backOff waits before the attempt-th read of a key that keeps moving (a
// read that lags, a follower's direct get, could make the loop spin): 5 ms
// more each attempt, at most the poll interval.
func backOff(ctx context.Context, poll time.Duration, attempt int) error {
	return sleepCtx(ctx, min(poll, time.Duration(attempt)*5*time.Millisecond))
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
