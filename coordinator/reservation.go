package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// Reservation is this process's lease on one Ref: the right to compute it
// for the whole cluster. Commit writes the value through the payload plane
// and commits its record; Abandon gives the key up. Its revision is the
// fencing token (package lease).
type Reservation struct {
	c   *Cache
	ref Ref
	l   *lease.Lease
}

// Ref returns the key the reservation is for.
func (r *Reservation) Ref() Ref { return r.ref }

// Revision returns the lease's current revision: its fencing token.
func (r *Reservation) Revision() uint64 { return r.l.Revision() }

// Done returns a channel that closes when the reservation ends: committed,
// abandoned, lost, or stopped by Close (then Err says why).
func (r *Reservation) Done() <-chan struct{} { return r.l.Done() }

// Err returns ErrLeaseLost (wrapped) if the lease was lost, ErrClosed
// (wrapped) if Close stopped it, else nil.
func (r *Reservation) Err() error { return r.l.Err() }

// Commit writes v through the payload plane and then, on the lease's
// revision, turns the record into a committed one with the store TTL. If
// the lease was lost, nothing is claimed and the error wraps ErrLeaseLost;
// v is still correct (keys are content addresses), it is just not the
// cluster's copy. A commit acknowledged too late to trust is such a case.
// A payload put for a commit that did not land is removed later, on the
// Cache's own goroutine, unless the key's record turns out to name it
// (docs/protocol.md 2.5).
//
// After Close has begun it is ErrClosed and writes nothing; one in flight
// when Close is called is cancelled, and its error wraps ErrClosed
// (whether its record landed is then unknown). Either way the
// reservation is left to expire: Close stops renewing it, and ends it.
func (r *Reservation) Commit(ctx context.Context, v *payload.Value) (payload.Location, error) {
	if err := r.c.enter(); err != nil {
		return payload.Location{}, err
	}
	defer r.c.exit()
	ctx, cancel := r.c.bind(ctx)
	defer cancel()
	loc, err := r.commit(ctx, v)
	return loc, closedErr(ctx, err)
}

// commit is Commit, for a request already in flight (computeUnder).
func (r *Reservation) commit(ctx context.Context, v *payload.Value) (payload.Location, error) {
	// A commit cancelled before it starts (by Close) writes nothing: not
	// even the payload, which no record would name.
	if err := ctx.Err(); err != nil {
		return payload.Location{}, err
	}
	// Past its deadline the key may be someone else's, and their value's
	// payload under the same name: a Put of other bytes would replace it.
	if err := r.l.Held(); err != nil {
		r.refused(err)
		return payload.Location{}, err
	}
	// The write can be long: heartbeats go on while it runs.
	loc, err := r.c.router.Put(ctx, r.ref.Object(), v)
	if err != nil {
		return payload.Location{}, err
	}
	rev, err := r.l.Commit(ctx, loc, v, r.c.s.storeTTL)
	if err != nil {
		// Refused, failed, or cut short, maybe after landing: the payload
		// goes unless the key's record turns out to name it.
		r.putUncommitted(loc)
		if errors.Is(err, ErrLeaseLost) {
			r.refused(err)
		}
		return payload.Location{}, err
	}
	r.c.obs.committed(r.ref, rev, loc)
	return loc, nil
}

func (r *Reservation) refused(err error) { r.c.obs.refused(r.ref, r.l.Revision(), err) }

// Abandon gives the key up after a failed compute: the record is purged
// (if the lease still holds it) so that a waiter or a later call can
// compute it. cause is only for the error's message. After Close has
// begun it is ErrClosed and purges nothing: the key expires with the
// lease, which Close stops renewing.
func (r *Reservation) Abandon(ctx context.Context, cause error) error {
	if err := r.c.enter(); err != nil {
		return err
	}
	defer r.c.exit()
	return r.abandon(ctx, cause)
}

// abandon is Abandon, for a request already in flight (computeUnder).
func (r *Reservation) abandon(ctx context.Context, cause error) error {
	err := r.l.Abandon(ctx)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return fmt.Errorf("%w (abandoned after: %v)", err, cause)
	}
	return err
}

// leaseHooks are what the Cache hears from its leases: losses and late
// writes are counted, an ended lease is forgotten.
func (c *Cache) leaseHooks() lease.Hooks {
	return lease.Hooks{
		Lost:  func(_ *lease.Lease, during lease.Op, _ error) { c.obs.leaseLost(during) },
		Late:  func(string) { c.obs.lateWrite() },
		Ended: c.forget,
	}
}
