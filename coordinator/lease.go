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
//
// The revision alone does not fence the server's own writes: when a
// revision's TTL runs out, the stream leader later places a subject delete
// marker with no revision condition, and it wipes a write the server
// accepted on the revision in between (docs/jetstream-notes.md). So each
// revision has a deadline, the time the write that made it was sent plus
// that write's TTL, and an answer (an acknowledgement, or a read proving a
// write landed) counts only if it arrives before the deadline. A lease
// whose deadline passes without a renewal landing is lost
// (docs/protocol.md, section 3).
type Lease struct {
	c     *Cache
	ls    *leaseStore
	ref   Ref
	key   string // KV key
	ttl   time.Duration
	clock Clock

	// writeMu lets one writer at a time use the revision: a renewal, the
	// commit (which renews the lease itself while it retries) or the
	// abandon. Store calls are made under writeMu, never under mu.
	writeMu sync.Mutex
	pending []attempt // writes sent on rev whose outcome is unknown; guarded by writeMu

	mu       sync.Mutex
	rev      uint64    // guarded by mu
	deadline time.Time // when rev may expire: its write's send time plus its TTL; guarded by mu
	sent     time.Time // when the write that made rev was sent; guarded by mu
	rec      Record    // guarded by mu
	ended    bool      // committed, abandoned or lost; guarded by mu
	err      error     // why it was lost, or nil; guarded by mu

	done      chan struct{} // closed when the lease ends
	stopBeats chan struct{} // closed (once) to stop the heartbeat goroutine
	stopOnce  sync.Once
	beatsDone chan struct{}
}

// errCommitted ends a lease's renewals: its commit landed (found by a
// settle after the commit call had returned).
var errCommitted = errors.New("coordinator: the lease's commit landed")

// errRaced is a write refused because an earlier write of the same lease,
// whose acknowledgement was lost, had landed: write again.
var errRaced = errors.New("coordinator: an earlier write of this lease moved its revision")

// attempt is a write whose acknowledgement did not come back: it may land
// later. Its record is told apart from the others by its heartbeat time.
type attempt struct {
	heartbeat time.Time
	sent      time.Time
	ttl       time.Duration
}

// newLease starts renewing the lease at rev, made by a write sent at sent.
func newLease(c *Cache, ls *leaseStore, ref Ref, key string, rev uint64, rec Record, sent time.Time) *Lease {
	ttl := c.s.leaseTTL
	l := &Lease{c: c, ls: ls, ref: ref, key: key, ttl: ttl, clock: c.s.clock,
		rev: rev, sent: sent, deadline: sent.Add(ttl), rec: rec,
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

// heartbeat renews the lease a third of its TTL after the last renewal
// was sent (not answered: a slow answer must not eat into the next
// renewal's time), and sooner after a renewal whose outcome is unknown (a
// timeout during a leader election).
func (l *Lease) heartbeat() {
	next := l.untilRenewal()
	for {
		t := time.NewTimer(next)
		select {
		case <-l.stopBeats:
			t.Stop()
			return
		case <-t.C:
		}
		var ok bool
		if next, ok = l.beat(context.Background()); !ok {
			return
		}
	}
}

// beat renews the lease once and says when to renew next; false when the
// lease has ended. The lease is lost when a renewal is refused, lands too
// late to trust, or none has landed by the deadline.
func (l *Lease) beat(ctx context.Context) (time.Duration, bool) {
	l.writeMu.Lock()
	if l.isEnded() {
		l.writeMu.Unlock()
		return 0, false
	}
	err := l.renewLocked(ctx)
	l.writeMu.Unlock()
	switch {
	case err == nil:
		return l.untilRenewal(), true
	case errors.Is(err, errCommitted):
		l.finish()
		return 0, false
	case errors.Is(err, ErrLeaseLost):
		if l.lose(err) {
			l.c.stats.leasesLost.Add(1)
		}
		return 0, false
	}
	return l.ttl / 10, true
}

// untilRenewal is the time left until a third of the TTL has passed since
// the current revision's write was sent, and at least a twentieth of it.
func (l *Lease) untilRenewal() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.ttl/20, l.sent.Add(l.ttl/3).Sub(l.clock.Now()))
}

// renewLocked writes the computing record again with a fresh TTL.
func (l *Lease) renewLocked(ctx context.Context) error {
	rec := l.record()
	if rec.State == StateCommitted {
		return errCommitted // a commit whose answer was lost landed: nothing to renew
	}
	rec.Heartbeat = l.clock.Now()
	_, err := l.writeLocked(ctx, rec, l.ttl)
	return err
}

// writeLocked publishes rec on the lease's revision with ttl. nil: it landed
// in time, and the lease is at the new revision. ErrLeaseLost: the revision
// is someone else's, has run out, or what landed came too late to trust.
// Any other error: the outcome is unknown; the write is kept pending and
// the next one first finds out whether it landed.
func (l *Lease) writeLocked(ctx context.Context, rec Record, ttl time.Duration) (uint64, error) {
	if len(l.pending) > 0 {
		before := l.Revision()
		if err := l.settleLocked(ctx); err != nil {
			return 0, err
		}
		if l.Revision() != before {
			return 0, errRaced // rec was made for the old revision: the caller looks again
		}
	}
	rev, deadline := l.position()
	sent := l.clock.Now()
	left := deadline.Sub(sent)
	if left <= 0 {
		return 0, fmt.Errorf("%w: %s: no renewal of revision %d landed within the lease TTL", ErrLeaseLost, l.key, rev)
	}
	// An answer after the deadline is worthless: do not wait for one.
	octx, cancel := context.WithTimeout(ctx, min(l.c.s.opTimeout, left))
	l.pending = append(l.pending, attempt{heartbeat: rec.Heartbeat, sent: sent, ttl: ttl})
	newRev, err := l.ls.cas(octx, l.key, rev, rec, ttl)
	cancel()
	if h := l.c.s.answered; h != nil {
		err = h("write", err)
	}
	acked := l.clock.Now()
	switch {
	case err == nil:
		l.pending = nil
		if !acked.Before(deadline) {
			l.c.stats.lateWrites.Add(1)
			if rec.State == StateComputing {
				// Nobody renews it: let the waiters have the key now.
				pctx, cancel := l.c.opContext(ctx)
				l.ls.purge(pctx, l.key, newRev)
				cancel()
			}
			return 0, fmt.Errorf("%w: %s: revision %d acknowledged %v after its deadline (the server's TTL marker may wipe it)",
				ErrLeaseLost, l.key, newRev, acked.Sub(deadline))
		}
		l.advance(newRev, sent, ttl, rec)
		return newRev, nil
	case errors.Is(err, ErrLeaseLost) && len(l.pending) > 1:
		// An earlier write of ours may be what moved the key on.
		if serr := l.settleLocked(ctx); serr != nil {
			return 0, serr
		}
		return 0, errRaced // the next write goes on the revision settle found
	case errors.Is(err, ErrLeaseLost):
		l.pending = nil
		return 0, err
	case isRefusal(err):
		l.pending = l.pending[:len(l.pending)-1] // the server answered: nothing was stored
		return 0, err
	}
	return 0, err
}

// settleLocked finds out whether one of the pending writes landed by
// reading the key from the stream leader. The key still at the lease's
// revision: none landed (yet). Our record at a later revision: it is
// adopted, if the read answered before the deadline. Anything else: the
// lease is lost.
func (l *Lease) settleLocked(ctx context.Context) error {
	rev, deadline := l.position()
	left := deadline.Sub(l.clock.Now())
	if left <= 0 {
		return fmt.Errorf("%w: %s: the outcome of a write on revision %d is unknown past its deadline", ErrLeaseLost, l.key, rev)
	}
	octx, cancel := context.WithTimeout(ctx, min(l.c.s.opTimeout, left))
	cur, err := l.ls.read(octx, l.key)
	cancel()
	if h := l.c.s.answered; h != nil {
		err = h("read", err)
	}
	answered := l.clock.Now()
	if err != nil && !errors.Is(err, ErrBadRecord) {
		return err
	}
	nonce := l.record().Nonce
	switch {
	case err == nil && cur.live && cur.rev == rev:
		return nil
	case err != nil || !cur.live || cur.record.Nonce != nonce:
		l.pending = nil
		return fmt.Errorf("%w: %s moved past revision %d", ErrLeaseLost, l.key, rev)
	case !answered.Before(deadline):
		l.pending = nil
		l.c.stats.lateWrites.Add(1)
		return fmt.Errorf("%w: %s: our write at revision %d was seen only after the deadline", ErrLeaseLost, l.key, cur.rev)
	case l.ls.direct:
		// A follower may have applied the write before the leader, whose
		// TTL sweep can still wipe it: only the leader's answer proves it.
		l.pending = nil
		return fmt.Errorf("%w: %s: our write at revision %d was seen by a direct read, which does not prove it", ErrLeaseLost, l.key, cur.rev)
	}
	for _, a := range l.pending {
		if a.heartbeat.Equal(cur.record.Heartbeat) {
			l.pending = nil
			l.advance(cur.rev, a.sent, a.ttl, cur.record)
			return nil
		}
	}
	l.pending = nil
	return fmt.Errorf("%w: %s: revision %d holds a record of this lease that it did not send", ErrLeaseLost, l.key, cur.rev)
}

func (l *Lease) position() (uint64, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev, l.deadline
}

func (l *Lease) record() Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

func (l *Lease) advance(rev uint64, sent time.Time, ttl time.Duration, rec Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.sent, l.deadline, l.rec = rev, sent, sent.Add(ttl), rec
}

func (l *Lease) isEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// lose ends the lease with err; false if it had already ended.
func (l *Lease) lose(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.err = err
	l.endLocked()
	return true
}

// finish ends the lease without an error.
func (l *Lease) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked()
}

// endLocked ends the lease and tells its heartbeats to stop (without
// waiting: the heartbeat goroutine may be waiting for writeMu).
func (l *Lease) endLocked() {
	if l.ended {
		return
	}
	l.ended = true
	close(l.done)
	l.stopOnce.Do(func() { close(l.stopBeats) })
}

// Commit writes v through the payload plane and then, on the lease's
// revision, turns the record into a committed one with the store TTL. If
// the lease was lost, nothing is claimed and the error wraps ErrLeaseLost;
// v is still correct (keys are content addresses), it is just not the
// cluster's copy. A commit acknowledged too late to trust is such a case.
func (l *Lease) Commit(ctx context.Context, v *payload.Value) (payload.Location, error) {
	if err := l.check(); err != nil {
		l.refused(err, false)
		return payload.Location{}, err
	}
	// Past its deadline the key may be someone else's, and their value's
	// payload under the same name: a Put of other bytes would replace it.
	l.mu.Lock()
	deadline := l.deadline
	l.mu.Unlock()
	if now := l.clock.Now(); !now.Before(deadline) {
		err := fmt.Errorf("%w: %s past its deadline (%v ago) before the payload write", ErrLeaseLost, l.key, now.Sub(deadline))
		l.refused(err, l.lose(err))
		return payload.Location{}, err
	}
	// The write can be long: heartbeats go on while it runs.
	loc, err := l.c.router.put(ctx, l.ref.Object(), v)
	if err != nil {
		return payload.Location{}, err
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	rev, err := l.commitLocked(ctx, loc, v)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.refused(err, l.lose(err)) // counted once: by the commit, or by the heartbeat that lost it
		}
		return payload.Location{}, err
	}
	l.mu.Lock()
	l.endLocked()
	l.mu.Unlock()
	if l.c.s.onCommit != nil {
		l.c.s.onCommit(l.ref, rev)
	}
	if o := l.c.s.observer; o != nil {
		o.Committed(l.ref, rev, loc.Checksum)
	}
	return loc, nil
}

// refused reports a commit the lease could not make, and counts it if
// the commit is what found the lease lost.
func (l *Lease) refused(err error, count bool) {
	if count {
		l.c.stats.commitsRefused.Add(1)
	}
	if o := l.c.s.observer; o != nil {
		o.Refused(l.ref, l.Revision(), err)
	}
}

// commitLocked publishes the committed record on the lease's revision. A
// write whose outcome is unknown (a timeout during a leader election) is
// retried; the lease is renewed first whenever its revision is older than
// a third of its TTL, so a slow commit keeps the lease rather than racing
// its deadline. It ends by the deadline at the latest.
func (l *Lease) commitLocked(ctx context.Context, loc payload.Location, v *payload.Value) (uint64, error) {
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
			rec := l.record().committed(loc, v, l.clock.Now(), l.c.s.storeTTL)
			var rev uint64
			if rev, err = l.writeLocked(ctx, rec, l.c.s.storeTTL); err == nil {
				return rev, nil
			}
		}
		switch {
		case errors.Is(err, ErrLeaseLost) || ctx.Err() != nil || isRefusal(err):
			return 0, err
		case errors.Is(err, errRaced):
			continue // settled: the loop's top sees what landed
		case time.Now().After(giveUp):
			return 0, fmt.Errorf("coordinator: committing %v: gave up after %v: %w", l.ref, commitRetryFor, err)
		}
		if err := sleepCtx(ctx, l.ttl/10); err != nil {
			return 0, err
		}
	}
}

// commitRetryFor bounds how long a commit retries writes whose outcome is
// unknown; the lease stays renewed meanwhile.
const commitRetryFor = time.Minute

func (l *Lease) expires() time.Time {
	return l.record().Expires
}

// Abandon gives the key up after a failed compute: the record is purged
// (if the lease still holds it) so that a waiter or a later call can
// compute it. cause is only for the caller's logs.
func (l *Lease) Abandon(ctx context.Context, cause error) error {
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
	rev, _ := l.position()
	octx, cancel := l.c.opContext(ctx)
	defer cancel()
	if err := l.ls.purge(octx, l.key, rev); err != nil && !errors.Is(err, ErrLeaseLost) {
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
// process paused past its lease looks like. For tests, and for Close.
func (l *Lease) stopHeartbeats() {
	l.stopOnce.Do(func() { close(l.stopBeats) })
	<-l.beatsDone
}
