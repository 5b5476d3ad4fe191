package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/embcache/embcache/payload"
)

// Lease is this process's exclusive right to compute one key, held on the
// KV bucket. Its revision is the fencing token: every write it makes is
// conditional on it, so once the lease is lost nothing it writes lands.
type Lease struct {
	c   *Cache
	ls  *leaseStore
	ref Ref
	key string // KV key

	mu       sync.Mutex
	rev      uint64    // guarded by mu
	rec      Record    // guarded by mu
	ended    bool      // committed, abandoned or lost; guarded by mu
	err      error     // why it was lost, or nil; guarded by mu
	lastBeat time.Time // guarded by mu

	done      chan struct{} // closed when the lease ends
	stopBeats chan struct{} // closed (once) to stop the heartbeat goroutine
	stopOnce  sync.Once
	beatsDone chan struct{}
}

func newLease(c *Cache, ls *leaseStore, ref Ref, key string, rev uint64, rec Record) *Lease {
	l := &Lease{c: c, ls: ls, ref: ref, key: key, rev: rev, rec: rec, lastBeat: time.Now(),
		done: make(chan struct{}), stopBeats: make(chan struct{}), beatsDone: make(chan struct{})}
	go func() {
		defer close(l.beatsDone)
		l.heartbeat()
		c.forget(l)
	}()
	return l
}

// Ref returns the key the lease is for.
func (l *Lease) Ref() Ref { return l.ref }

// Revision returns the lease's current revision: its fencing token.
func (l *Lease) Revision() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev
}

// Done returns a channel that closes when the lease ends: committed,
// abandoned, or lost (then Err says why).
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns ErrLeaseLost (wrapped) if the lease was lost, else nil.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// heartbeat renews the lease every third of its TTL with a CAS publish
// that carries the TTL again. A refused CAS means another process has the
// key (or it expired): the lease is lost. A heartbeat that fails for
// another reason (a timeout during a leader election) is retried: the
// revision fences every write, so holding on is safe, and giving up would
// throw away a compute the key may still be waiting for.
func (l *Lease) heartbeat() {
	ttl := l.c.s.leaseTTL
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stopBeats:
			return
		case <-t.C:
		}
		l.mu.Lock()
		if l.ended {
			l.mu.Unlock()
			return
		}
		rec := l.rec
		rec.Heartbeat = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), ttl/3)
		rev, err := l.ls.cas(ctx, l.key, l.rev, rec, ttl)
		cancel()
		switch {
		case err == nil:
			l.rev, l.rec, l.lastBeat = rev, rec, time.Now()
		case errors.Is(err, ErrLeaseLost):
			l.loseLocked(err)
		}
		lost := l.ended
		l.mu.Unlock()
		if lost {
			l.c.stats.leasesLost.Add(1)
			return
		}
	}
}

func (l *Lease) loseLocked(err error) {
	l.err = err
	l.endLocked()
}

// endLocked ends the lease and tells its heartbeats to stop (without
// waiting: the heartbeat goroutine may be waiting for l.mu).
func (l *Lease) endLocked() {
	l.ended = true
	close(l.done)
	l.stopOnce.Do(func() { close(l.stopBeats) })
}

// Commit writes v through the payload plane and then, on the lease's
// revision, turns the record into a committed one with the store TTL. If
// the lease was lost, nothing is committed and the error wraps
// ErrLeaseLost; v is still correct (keys are content addresses), it is
// just not the cluster's copy.
func (l *Lease) Commit(ctx context.Context, v *payload.Value) (payload.Location, error) {
	if err := l.check(); err != nil {
		if o := l.c.s.observer; o != nil {
			o.Refused(l.ref, l.Revision(), err)
		}
		return payload.Location{}, err
	}
	// The write can be long: heartbeats go on while it runs.
	loc, err := l.c.router.put(ctx, l.ref.Object(), v)
	if err != nil {
		return payload.Location{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return payload.Location{}, l.endedErr()
	}
	rec := l.rec.committed(loc, v, time.Now(), l.c.s.storeTTL)
	rev, err := l.commitLocked(ctx, rec)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.loseLocked(err)
			l.c.stats.commitsRefused.Add(1)
			if o := l.c.s.observer; o != nil {
				o.Refused(l.ref, l.rev, err)
			}
		}
		return payload.Location{}, err
	}
	l.rev, l.rec = rev, rec
	l.endLocked()
	if l.c.s.onCommit != nil {
		l.c.s.onCommit(l.ref, rev)
	}
	if o := l.c.s.observer; o != nil {
		o.Committed(l.ref, rev, loc.Checksum)
	}
	return loc, nil
}

// commitRetryFor bounds how long a commit retries transient failures.
const commitRetryFor = time.Minute

// commitLocked publishes the committed record on the lease's revision. A
// transient failure (a timeout during a leader election) is retried; the
// revision check makes that safe. Since a lost acknowledgement looks like a
// failure, each retry first reads the key: our committed record there means
// the earlier attempt landed.
func (l *Lease) commitLocked(ctx context.Context, rec Record) (uint64, error) {
	deadline := time.Now().Add(commitRetryFor)
	for attempt := 0; ; attempt++ {
		octx, cancel := l.c.opContext(ctx)
		if attempt > 0 {
			cur, err := l.ls.read(octx, l.key)
			switch {
			case err != nil:
			case cur.live && cur.record.Nonce == rec.Nonce && cur.record.State == StateCommitted:
				cancel()
				return cur.rev, nil
			case !cur.live || cur.rev != l.rev:
				cancel()
				return 0, fmt.Errorf("%w: %s moved past revision %d", ErrLeaseLost, l.key, l.rev)
			}
		}
		rev, err := l.ls.cas(octx, l.key, l.rev, rec, l.c.s.storeTTL)
		cancel()
		if err == nil || errors.Is(err, ErrLeaseLost) || time.Now().After(deadline) || ctx.Err() != nil {
			return rev, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(l.c.s.leaseTTL / 10):
		}
	}
}

func (l *Lease) expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Expires
}

// Abandon gives the key up after a failed compute: the record is purged
// (if the lease still holds it) so that a waiter or a later call can
// compute it. cause is only for the caller's logs.
func (l *Lease) Abandon(ctx context.Context, cause error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return l.endedErr()
	}
	l.endLocked()
	octx, cancel := l.c.opContext(ctx)
	defer cancel()
	if err := l.ls.purge(octx, l.key, l.rev); err != nil && !errors.Is(err, ErrLeaseLost) {
		return fmt.Errorf("coordinator: abandoning %v after %v: %w", l.ref, cause, err)
	}
	return nil
}

func (l *Lease) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return l.endedErr()
	}
	return nil
}

func (l *Lease) endedErr() error {
	if l.err != nil {
		return l.err
	}
	return fmt.Errorf("%w: lease on %v already ended", ErrLeaseLost, l.ref)
}

// stopHeartbeats stops renewing the lease without ending it: what a
// process paused past its lease looks like. For tests.
func (l *Lease) stopHeartbeats() {
	l.stopOnce.Do(func() { close(l.stopBeats) })
	<-l.beatsDone
}
