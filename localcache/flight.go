package localcache

import (
	"context"
	"errors"
	"fmt"
)

// ComputeFunc computes the value of a missing key. Its context carries the
// compute timeout and is not cancelled when a caller gives up.
type ComputeFunc[V Value] func(ctx context.Context) (V, error)

// flight is one running compute of a key.
type flight[V Value] struct {
	ctx     context.Context // the compute's context: ends at the compute timeout
	cancel  context.CancelFunc
	done    chan struct{}  // closed when value, err and finished are set
	waiters map[string]int // requests still waiting, with their pin counts; guarded by Cache.mu
	discard Cause          // set by an Invalidate while it ran: its value stays out of the index; guarded by Cache.mu
	value   V
	err     error
}

// GetOrCompute returns the value of key, pinned for req: from the cache if
// it holds a live entry, else from the compute already running for key,
// else by running fn once in a goroutine of its own. Every request still
// waiting when fn returns gets the value pinned, inserted before any of
// them can see it unpinned.
//
// A caller whose ctx ends returns ctx.Err() at once; the compute goes on
// for the others and lands in the cache. If fn fails, every waiter gets its
// error and the key can be computed again. Past the compute timeout, waiters
// get ErrComputeTimeout. A value over the byte budget is ErrTooLarge (and
// goes to OnEvict with CauseSize), a nil one or one of negative size
// ErrInvalidValue; a panic in fn is ErrComputePanicked.
func (c *Cache[K, V]) GetOrCompute(ctx context.Context, req string, key K, fn ComputeFunc[V]) (V, error) {
	return c.getOrCompute(ctx, req, key, fn, true)
}

// GetOrStart is GetOrCompute for a caller that must not wait for another
// caller's compute: if one is running for key, it returns ErrInFlight at
// once instead of joining it.
func (c *Cache[K, V]) GetOrStart(ctx context.Context, req string, key K, fn ComputeFunc[V]) (V, error) {
	return c.getOrCompute(ctx, req, key, fn, false)
}

// Wait returns once the compute running for key, if any, has ended (its
// value is in the cache, or it failed), or ctx has. It pins nothing,
// counts nothing and starts nothing.
func (c *Cache[K, V]) Wait(ctx context.Context, key K) error {
	c.mu.Lock()
	f := c.flights[key]
	c.mu.Unlock()
	if f == nil {
		return nil
	}
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Cache[K, V]) getOrCompute(ctx context.Context, req string, key K, fn ComputeFunc[V], join bool) (V, error) {
	var zero V
	if req == "" {
		return zero, ErrNoRequest
	}
	c.mu.Lock()
	e, evicted := c.lookupLocked(key)
	if e != nil {
		c.stats.Hits++
		c.pinLocked(req, e, 1)
		v := e.value
		c.unlockAndReport(evicted)
		return c.out(v), nil
	}
	c.stats.Misses++
	f := c.flights[key]
	switch {
	case f == nil:
		f = c.startLocked(ctx, key, fn)
	case !join:
		c.unlockAndReport(evicted)
		return zero, ErrInFlight
	default:
		c.stats.Waits++
	}
	f.waiters[req]++
	c.unlockAndReport(evicted)

	var giveUp error
	select {
	case <-f.done:
		return c.result(f)
	case <-ctx.Done():
		giveUp = ctx.Err()
	case <-f.ctx.Done():
		giveUp = fmt.Errorf("%w after %v", ErrComputeTimeout, c.s.computeTimeout)
	}
	c.mu.Lock()
	select {
	case <-f.done: // landed while we were giving up: the pin is ours
		c.mu.Unlock()
		return c.result(f)
	default:
	}
	if f.waiters[req]--; f.waiters[req] <= 0 {
		delete(f.waiters, req)
	}
	c.mu.Unlock()
	return zero, giveUp
}

func (c *Cache[K, V]) result(f *flight[V]) (V, error) {
	if f.err != nil {
		var zero V
		return zero, f.err
	}
	return c.out(f.value), nil
}

func (c *Cache[K, V]) startLocked(ctx context.Context, key K, fn ComputeFunc[V]) *flight[V] {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.s.computeTimeout)
	f := &flight[V]{ctx: fctx, cancel: cancel, done: make(chan struct{}), waiters: make(map[string]int)}
	c.flights[key] = f
	c.stats.Computes++
	go c.run(key, f, fn)
	return f
}

func (c *Cache[K, V]) run(key K, f *flight[V], fn ComputeFunc[V]) {
	defer f.cancel()
	v, err := call(f.ctx, fn)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && f.ctx.Err() != nil {
		err = fmt.Errorf("%w after %v: %w", ErrComputeTimeout, c.s.computeTimeout, err)
	}
	var size int64
	computed := err == nil // fn's value is ours to hand out, or to let go
	if computed {
		size, err = c.sizeOf(v)
	}

	c.mu.Lock()
	delete(c.flights, key)
	var evicted []eviction[K, V]
	var e *entry[V] // the entry already in the index, if any
	if err == nil && f.discard == 0 {
		e, evicted = c.lookupLocked(key)
	}
	if err == nil && e == nil {
		evicted, err = c.roomLocked(size, evicted)
	}
	switch {
	case err != nil:
		c.stats.ComputeErrors++
		if computed && errors.Is(err, ErrTooLarge) {
			// Never held, so never evicted: OnEvict releases it (a
			// mapping the compute made was left open).
			evicted = append(evicted, eviction[K, V]{key, v, CauseSize})
		}
	case f.discard != 0:
		// Invalidated while it ran: the waiters hold it, detached, and it
		// goes with their last release (now, if none is left).
		e := c.newEntryLocked(key, v, size)
		e.detached = f.discard
		for req, n := range f.waiters {
			c.pinLocked(req, e, n)
		}
		if e.pins == 0 {
			c.bytes -= size
			evicted = append(evicted, eviction[K, V]{key, v, f.discard})
		}
	default:
		if e == nil {
			e = c.insertLocked(key, v, size)
		}
		v = e.value // a Put during the compute wins: first writer
		for req, n := range f.waiters {
			c.pinLocked(req, e, n)
		}
		evicted = c.enforceLocked(evicted, 0)
	}
	f.value, f.err = v, err
	close(f.done)
	c.unlockAndReport(evicted)
}

// call runs fn, turning a panic into ErrComputePanicked: fn runs in a
// goroutine of its own, where a panic would take the process down.
func call[V Value](ctx context.Context, fn ComputeFunc[V]) (v V, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrComputePanicked, r)
		}
	}()
	return fn(ctx)
}
