package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/payload"
)

// Held returns nil while the lease is held: not ended, and before its
// revision's deadline. Past the deadline the key may already be someone
// else's (and a payload written under its name theirs), so the lease is
// lost and the error wraps ErrLost. Call it before a write that must not
// happen unless the lease is held, such as a value's payload.
func (l *Lease) Held() error {
	l.mu.Lock()
	if l.ended {
		defer l.mu.Unlock()
		return l.endedErr()
	}
	deadline := l.deadline
	l.mu.Unlock()
	if now := l.clock.Now(); !now.Before(deadline) {
		err := fmt.Errorf("%w: %s past its deadline (%v ago)", ErrLost, l.key, now.Sub(deadline))
		l.lose(err, OpCommit)
		return l.check()
	}
	return nil
}

// Commit turns the record into the committed record of v at loc, on the
// lease's revision, with ttl (the store TTL), and returns the revision it
// landed at; the lease then ends. If the lease was lost nothing is
// claimed and the error wraps ErrLost; a commit acknowledged too late to
// trust is such a case.
func (l *Lease) Commit(ctx context.Context, loc payload.Location, v *payload.Value, ttl time.Duration) (uint64, error) {
	l.writeMu.Lock()
	rev, err := l.commitLocked(ctx, loc, v, ttl)
	ended := false
	if err == nil {
		l.finish()
	} else if errors.Is(err, ErrLost) {
		ended = l.end(err) // under writeMu: no renewal can find the loss first
	}
	l.writeMu.Unlock()
	if ended {
		l.lost(err, OpCommit) // the hook may call back into the lease
	}
	if err != nil {
		return 0, err
	}
	return rev, nil
}

// commitLocked publishes the committed record on the lease's revision. A
// write whose outcome is unknown (a timeout during a leader election) is
// retried; the lease is renewed first whenever its revision is older than
// a third of its TTL, so a slow commit keeps the lease rather than racing
// its deadline. It ends by the deadline at the latest.
func (l *Lease) commitLocked(ctx context.Context, loc payload.Location, v *payload.Value, ttl time.Duration) (uint64, error) {
	giveUp := time.Now().Add(commitRetryFor)
	for {
		err := l.check()
		if err == nil && len(l.pending) > 0 {
			// The last attempt's answer was lost: it may have landed.
			err = l.settleLocked(ctx)
		}
		if err == nil && l.record().State == StateCommitted {
			return l.Revision(), nil // an earlier attempt landed, proven in time
		}
		if err == nil {
			l.mu.Lock()
			age := l.clock.Now().Sub(l.sent)
			l.mu.Unlock()
			if age > l.ttl/3 {
				err = l.renewLocked(ctx)
			}
		}
		if err == nil {
			rec := l.record().Committed(loc, v, l.clock.Now(), ttl)
			var rev uint64
			if rev, err = l.writeLocked(ctx, rec, ttl); err == nil {
				return rev, nil
			}
		}
		switch {
		case errors.Is(err, ErrLost) || ctx.Err() != nil || IsRefusal(err):
			return 0, err
		case errors.Is(err, errRaced):
			continue // settled: the loop's top sees what landed
		case time.Now().After(giveUp):
			return 0, fmt.Errorf("lease: committing %s: gave up after %v: %w", l.key, commitRetryFor, err)
		}
		if err := sleepCtx(ctx, l.ttl/10); err != nil {
			return 0, err
		}
	}
}

// commitRetryFor bounds how long a commit retries writes whose outcome is
// unknown; the lease stays renewed meanwhile.
const commitRetryFor = time.Minute

// Abandon gives the key up: the record is purged (if the lease still
// holds it, before its deadline) so that a waiter or a later call can take
// it. Past the deadline nothing is written: the record expires on the
// server. On a lease that has already ended it returns that end's error
// (wrapping ErrLost).
func (l *Lease) Abandon(ctx context.Context) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.mu.Lock()
	if l.ended {
		defer l.mu.Unlock()
		return l.endedErr()
	}
	l.endLocked()
	l.mu.Unlock()
	if len(l.pending) > 0 {
		l.settleLocked(ctx) // purge the revision a pending write made, if one did
	}
	rev, deadline := l.position()
	left := deadline.Sub(l.clock.Now())
	if left <= 0 {
		return nil // it may expire any time now: a purge could start a next holder that its marker wipes
	}
	// Nor sent again past it (Purge resends a write refused while another is in flight).
	octx, cancel := context.WithTimeout(ctx, min(l.cfg.OpTimeout, left))
	defer cancel()
	if err := l.b.Purge(octx, l.key, rev); err != nil && !errors.Is(err, ErrLost) {
		return fmt.Errorf("lease: abandoning %s: %w", l.key, err)
	}
	return nil
}
