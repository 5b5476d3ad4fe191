package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embcache/embcache/payload"
)

// A request in flight is one call of the Cache's that may use the store
// (GetOrCompute, Get, Reserve, a Reservation's Commit and Abandon,
// Invalidate, Ping), or one flight of the local cache that resolves a key
// for such calls (it runs on a goroutine of its own, for every caller
// that joins it). Each enters (enter) and exits (exit); its ctx ends when
// Close begins (bind), but for an Invalidate's, which is finished. Close
// waits for them (awaitRequests), but only up to its bound for those
// running their caller's compute (compute).
//
// The count is an atomic, not mu: a local hit enters too, and must not
// queue behind the other requests for a lock. It pairs with closed as a
// flag and a counter do: enter adds, then reads closed; Close sets closed,
// then reads the count; each sees the other's write (Go's atomics are
// sequentially consistent), so no request enters unseen.

// errGivenUp is a compute that returned after Close had stopped waiting
// for it: its request does nothing more with the store.
var errGivenUp = fmt.Errorf("%w: the compute returned after Close had stopped waiting for it", ErrClosed)

// errOrphaned ends a lease that Close stopped renewing (a Reservation
// neither committed nor abandoned, a compute given up): its record
// expires with its lease TTL.
var errOrphaned = fmt.Errorf("%w: the lease is no longer renewed; its record expires with its TTL", ErrClosed)

// enter registers a request; exit must follow when it returns. After
// Close has begun it is ErrClosed, and nothing is registered.
func (c *Cache) enter() error {
	c.reqs.Add(1)
	if c.closed.Load() {
		c.exit()
		return ErrClosed
	}
	return nil
}

// exit ends a request registered by enter.
func (c *Cache) exit() {
	c.reqs.Add(-1)
	if c.closed.Load() {
		c.settle()
	}
}

// settle tells a Close waiting for requests that one has ended or left
// its compute (it looks again).
func (c *Cache) settle() {
	select {
	case c.settled <- struct{}{}:
	default: // Close has a wake-up pending already
	}
}

// bind returns a ctx that also ends, with the cause ErrClosed, when Close
// begins: the request's reads, waits, pulls, reservations and commits stop
// then.
func (c *Cache) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.life, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// closedErr is err, the failure of a request whose ctx (from bind) Close
// ended, as an error wrapping ErrClosed: what failed (a read, a wait cut
// short) failed because of Close. Any other err is returned as it is.
func closedErr(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, ErrClosed) || !errors.Is(context.Cause(ctx), ErrClosed) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrClosed, err)
}

// compute runs fn, the caller's compute, counted as one: once its bound
// has passed, Close stops waiting for requests whose compute is all that
// is left, since a compute may ignore its ctx. No compute starts after
// Close has begun (ErrClosed). One that returns after Close stopped
// waiting for it is errGivenUp, its value closed: its request must do
// nothing more with the store, since Close may have returned. Whether
// Close gave up on a compute cannot change once it has left (givenUp): a
// request that left its compute before is in flight, so Close waits for
// it.
func (c *Cache) compute(ctx context.Context, fn ComputeFunc) (*payload.Value, error) {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: the compute was not started", ErrClosed)
	}
	c.computes++
	c.mu.Unlock()
	left := false
	defer func() {
		if !left { // fn panicked: the caller's recover asks givenUp
			c.leaveCompute()
		}
	}()
	v, err := fn(ctx)
	left = true
	if c.leaveCompute() {
		if v != nil {
			v.Close()
		}
		return nil, errGivenUp
	}
	return v, err
}

// leaveCompute counts a compute out and reports whether Close had given
// up on it.
func (c *Cache) leaveCompute() (gaveUp bool) {
	c.mu.Lock()
	c.computes--
	gaveUp = c.gaveUp
	c.mu.Unlock()
	if c.closed.Load() {
		c.settle()
	}
	return gaveUp
}

// givenUp reports whether Close has stopped waiting for the requests
// still computing. For a request that has left its compute, it says
// whether Close had given up on that compute (see compute).
func (c *Cache) givenUp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gaveUp
}

// awaitRequests waits until no request is in flight or, once bound has
// passed, until every request left is running its caller's compute: Close
// gives up on those (compute). Requests that are not computing end by
// their ctx, which Close has ended, or their op timeout (an abandon), and
// are always waited for: none uses the store after Close has returned.
func (c *Cache) awaitRequests(bound time.Duration) {
	t := time.NewTimer(bound)
	defer t.Stop()
	past := false
	for {
		c.mu.Lock()
		// computes changes under mu, and only falls once Close has begun;
		// reqs only falls too, but for a refused enter's moment.
		n := c.reqs.Load()
		if n == 0 || past && n == int64(c.computes) {
			c.gaveUp = true
			c.mu.Unlock()
			if n > 0 {
				c.s.logger.Warn("embcache: closed with computes still running; their keys expire with their leases",
					"computes", n, "waited", bound)
			}
			return
		}
		c.mu.Unlock()
		select {
		case <-c.settled:
		case <-t.C:
			past = true
		}
	}
}
