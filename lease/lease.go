package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
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
// that write's TTL less the clock allowance, and an answer (an
// acknowledgement, or a read proving a write landed) counts only if it
// arrives before the deadline. A lease whose deadline passes without a
// renewal landing is lost, and nothing is written on a revision past its
// deadline, a purge included: the server's expiry marker may still come,
// and would wipe what a next holder wrote (docs/protocol.md, section 3.1).
type Lease struct {
	b     Store
	cfg   Config
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
	deadline time.Time // when rev may expire: its write's send time plus its TTL, less the allowance; guarded by mu
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
var errCommitted = errors.New("lease: the lease's commit landed")

// errRaced is a write refused because an earlier write of the same lease,
// whose acknowledgement was lost, had landed: write again.
var errRaced = errors.New("lease: an earlier write of this lease moved its revision")

// attempt is a write whose acknowledgement did not come back: it may land
// later. Its record is told apart from the others by its heartbeat time.
type attempt struct {
	heartbeat time.Time
	sent      time.Time
	ttl       time.Duration
}

// Acquire takes key with rec, a computing record, and starts renewing it
// every third of cfg.TTL. The record's Reserved is set to the revision the
// create made, and carried by the renewals and the commit. ErrHeld means
// the key is live; ErrLate that the create was acknowledged after its
// deadline (the record is left to expire: try again); ErrInvalidConfig and
// ErrBadRecord that cfg or rec cannot make a lease.
//
// A create once sent is waited for even if ctx ends meanwhile (at most the
// op timeout): one that lands for a caller gone by then is given back
// (purged on its revision, before its deadline), and Acquire returns
// ctx's error, so no record is left held for a lease TTL by a caller that
// stopped waiting. A create that goes unanswered is left to expire.
func Acquire(ctx context.Context, b Store, key string, rec Record, cfg Config) (*Lease, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if rec.State != StateComputing {
		return nil, fmt.Errorf("%w: a lease is taken with a computing record, not %v", ErrBadRecord, rec.State)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// An answer after the deadline is worthless (ErrLate): neither wait for
	// one nor send the create again (Bucket.Create resends a write refused
	// while another is in flight) past it.
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cfg.OpTimeout, cfg.TTL-cfg.ClockAllowance))
	sent := cfg.Clock.Now()
	rev, err := b.Create(octx, key, rec, cfg.TTL)
	cancel()
	if err != nil {
		return nil, err
	}
	deadline := cfg.deadline(sent, cfg.TTL)
	if late := cfg.Clock.Now().Sub(deadline); late >= 0 {
		// Not purged: the server may expire it any time now, and its
		// marker would wipe what a waiter that took the key over wrote.
		if h := cfg.Hooks.Late; h != nil {
			h(key)
		}
		return nil, fmt.Errorf("%w: %s acknowledged %v after its deadline", ErrLate, key, late)
	}
	if ctx.Err() != nil {
		// The caller is gone: the key goes back, as an abandon would
		// give it (nothing is written past the deadline).
		if left := deadline.Sub(cfg.Clock.Now()); left > 0 {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(cfg.OpTimeout, left))
			perr := b.Purge(pctx, key, rev)
			cancel()
			if perr != nil && !errors.Is(perr, ErrLost) {
				return nil, fmt.Errorf("lease: %s reserved after its caller stopped waiting, and not given back (it expires): %w (%w)", key, perr, ctx.Err())
			}
		}
		return nil, fmt.Errorf("lease: %s reserved after its caller stopped waiting, and given back: %w", key, ctx.Err())
	}
	rec.Reserved = rev
	l := &Lease{b: b, cfg: cfg, key: key, ttl: cfg.TTL, clock: cfg.Clock,
		rev: rev, sent: sent, deadline: deadline, rec: rec,
		done: make(chan struct{}), stopBeats: make(chan struct{}), beatsDone: make(chan struct{})}
	go func() {
		defer close(l.beatsDone)
		l.heartbeat()
		if h := cfg.Hooks.Ended; h != nil {
			h(l)
		}
	}()
	return l, nil
}

// Key returns the KV key the lease is on.
func (l *Lease) Key() string { return l.key }

// Revision returns the lease's current revision: its fencing token.
func (l *Lease) Revision() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev
}

// Done returns a channel that closes when the lease ends: committed,
// abandoned, lost or orphaned (then Err says why).
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns ErrLost (wrapped) if the lease was lost, Orphan's error if
// it was orphaned, else nil.
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
	case errors.Is(err, ErrLost):
		l.lose(err, OpRenew)
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
// in time, and the lease is at the new revision. ErrLost: the revision
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
		return 0, fmt.Errorf("%w: %s: no renewal of revision %d landed within the lease TTL", ErrLost, l.key, rev)
	}
	// An answer after the deadline is worthless: do not wait for one.
	octx, cancel := context.WithTimeout(ctx, min(l.cfg.OpTimeout, left))
	l.pending = append(l.pending, attempt{heartbeat: rec.Heartbeat, sent: sent, ttl: ttl})
	newRev, err := l.b.CompareAndSet(octx, l.key, rev, rec, ttl)
	cancel()
	acked := l.clock.Now()
	switch {
	case err == nil:
		l.pending = nil
		if !acked.Before(deadline) {
			// Not purged (nor is anything written on it): rev's expiry
			// marker may be pending, and would wipe what a waiter that took
			// the key over wrote. Waiters have the key when newRev expires.
			l.late()
			return 0, fmt.Errorf("%w: %s: revision %d acknowledged %v after its deadline (the server's TTL marker may wipe it)",
				ErrLost, l.key, newRev, acked.Sub(deadline))
		}
		l.advance(newRev, sent, ttl, rec)
		return newRev, nil
	case errors.Is(err, ErrLost) && len(l.pending) > 1:
		// An earlier write of ours may be what moved the key on.
		if serr := l.settleLocked(ctx); serr != nil {
			return 0, serr
		}
		return 0, errRaced // the next write goes on the revision settle found
	case errors.Is(err, ErrLost):
		l.pending = nil
		return 0, err
	case IsRefusal(err):
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
		return fmt.Errorf("%w: %s: the outcome of a write on revision %d is unknown past its deadline", ErrLost, l.key, rev)
	}
	octx, cancel := context.WithTimeout(ctx, min(l.cfg.OpTimeout, left))
	cur, err := l.b.Read(octx, l.key)
	cancel()
	answered := l.clock.Now()
	if err != nil && !errors.Is(err, ErrBadRecord) {
		return err
	}
	nonce := l.record().Nonce
	switch {
	case err == nil && cur.Live && cur.Rev == rev:
		return nil
	case err != nil || !cur.Live || cur.Record.Nonce != nonce:
		l.pending = nil
		return fmt.Errorf("%w: %s moved past revision %d", ErrLost, l.key, rev)
	case !answered.Before(deadline):
		l.pending = nil
		l.late()
		return fmt.Errorf("%w: %s: our write at revision %d was seen only after the deadline", ErrLost, l.key, cur.Rev)
	case l.b.Direct():
		// A follower may have applied the write before the leader, whose
		// TTL sweep can still wipe it: only the leader's answer proves it.
		l.pending = nil
		return fmt.Errorf("%w: %s: our write at revision %d was seen by a direct read, which does not prove it", ErrLost, l.key, cur.Rev)
	}
	for _, a := range l.pending {
		if a.heartbeat.Equal(cur.Record.Heartbeat) {
			l.pending = nil
			l.advance(cur.Rev, a.sent, a.ttl, cur.Record)
			return nil
		}
	}
	l.pending = nil
	return fmt.Errorf("%w: %s: revision %d holds a record of this lease that it did not send", ErrLost, l.key, cur.Rev)
}

func (l *Lease) position() (uint64, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev, l.deadline
}

// Record returns the record the lease last wrote.
func (l *Lease) Record() Record { return l.record() }

func (l *Lease) record() Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

func (l *Lease) late() {
	if h := l.cfg.Hooks.Late; h != nil {
		h(l.key)
	}
}

func (l *Lease) advance(rev uint64, sent time.Time, ttl time.Duration, rec Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.sent, l.deadline, l.rec = rev, sent, l.cfg.deadline(sent, ttl), rec
}

func (l *Lease) isEnded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// lose ends the lease with err, found during op, and tells the Lost hook,
// unless it had already ended.
func (l *Lease) lose(err error, during Op) {
	if l.end(err) {
		l.lost(err, during)
	}
}

// end ends the lease with err; false if it had already ended.
func (l *Lease) end(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.err = err
	l.endLocked()
	return true
}

func (l *Lease) lost(err error, during Op) {
	if h := l.cfg.Hooks.Lost; h != nil {
		h(l, during, err)
	}
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
	return fmt.Errorf("%w: lease on %s already ended", ErrLost, l.key)
}

// Stop stops renewing the lease without ending it (Done stays open) and
// waits for the heartbeats to stop: the key stays held until its TTL runs
// out on the server, as for a process that stopped. For tests of a paused
// holder; a holder that closes orphans its leases (Orphan).
func (l *Lease) Stop() {
	l.stopOnce.Do(func() { close(l.stopBeats) })
	<-l.beatsDone
}

// Orphan stops renewing the lease and ends it with err (Done closes, Err
// and Held return err), writing nothing: the key stays held until its TTL
// runs out on the server, as for a process that stopped. It waits for the
// heartbeats to stop. A lease that had ended keeps its end. For a
// holder's Close, as etcd's Session.Orphan.
func (l *Lease) Orphan(err error) {
	l.end(err)
	<-l.beatsDone
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
