package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// ComputeFunc computes a value on a miss (runs the encoder).
type ComputeFunc func(ctx context.Context) (*payload.Value, error)

// Path says where GetOrCompute found a value.
type Path uint8

// Paths.
const (
	PathLocalHit  Path = iota + 1 // this process's cache
	PathCoalesced                 // an in-process compute or pull another request started
	PathRemoteHit                 // pulled a value another process had committed
	PathWaited                    // waited for another process to compute, then pulled
	PathComputed                  // reserved the key and computed it
	PathDegraded                  // computed locally, store unreachable: not shared
)

// String returns the path's name as spans and metrics label it.
func (p Path) String() string {
	switch p {
	case PathLocalHit:
		return "local-hit"
	case PathCoalesced:
		return "coalesced"
	case PathRemoteHit:
		return "remote-hit"
	case PathWaited:
		return "waited"
	case PathComputed:
		return "computed"
	case PathDegraded:
		return "degraded"
	}
	return "Path(" + strconv.Itoa(int(p)) + ")"
}

// Cache is the cluster-wide get-or-compute facade. Safe for concurrent use.
type Cache struct {
	s     settings
	nc    *nats.Conn
	js    jetstream.JetStream
	local *localcache.Cache[payload.ObjectID, *payload.Value]
	// expiries holds the record expiry of each value on its way into the
	// local cache (payload.ObjectID -> time.Time), taken at its insertion:
	// a local copy lives as long as its record (docs/protocol.md 4.3).
	expiries sync.Map
	router   *router
	owner    string
	stats    counters
	tel      *instruments

	mu     sync.Mutex
	ls     *leaseStore         // nil until the bucket is reachable; guarded by mu
	hub    *watchSet           // guarded by mu
	leases map[*Lease]struct{} // live leases; guarded by mu
	events *eventLink          // nil unless WithEvents and the stream is reachable; guarded by mu
	closed bool                // guarded by mu

	done chan struct{} // closed by Close
	bg   sync.WaitGroup
}

// New returns a Cache over the NATS connection nc (which the caller keeps
// and closes), creating the bucket if it is absent. If the bucket cannot
// be reached, ModeStrict fails with ErrStoreUnavailable naming the
// server; ModeDegrade starts anyway and keeps trying in the background.
func New(ctx context.Context, nc *nats.Conn, opts ...Option) (*Cache, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	s := defaults()
	for _, opt := range opts {
		if err := opt(&s); err != nil {
			return nil, err
		}
	}
	if s.pollInterval == 0 {
		s.pollInterval = s.leaseTTL / 5
	}
	if s.pullToShm && s.shm == nil {
		return nil, fmt.Errorf("%w: WithPullToShm needs WithShm", ErrInvalidOption)
	}
	if s.payloadSweep > 0 && s.shm == nil {
		return nil, fmt.Errorf("%w: WithPayloadSweep needs WithShm", ErrInvalidOption)
	}
	if s.putter == nil {
		mem := payload.NewMemoryStore(s.node, 0)
		s.putter = mem
		s.getters[payload.TransportMemory] = mem
	}
	c := &Cache{s: s, leases: make(map[*Lease]struct{}), done: make(chan struct{})}
	local, err := localcache.New[payload.ObjectID, *payload.Value](append([]localcache.Option{
		localcache.WithComputeTimeout(s.computeTimeout),
		localcache.WithExpiry(c.recordExpiry),
		localcache.WithOnEvict(func(k payload.ObjectID, v *payload.Value, cause localcache.Cause) {
			v.Close()
			c.expiries.Delete(k)
			c.tel.evicted(cause)
			if l := c.eventLink(); l != nil {
				l.forget(k)
			}
		}),
	}, s.local...)...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var nonce [4]byte
	rand.Read(nonce[:])
	c.nc, c.js, c.local = nc, js, local
	if c.tel, err = newInstruments(c, s.tracerProvider, s.meterProvider); err != nil {
		return nil, err
	}
	c.router = &router{node: s.node, putter: s.putter, getters: s.getters, shm: s.shm, pullToShm: s.pullToShm}
	c.owner = s.node + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(nonce[:])
	if err := c.connectStore(ctx); err != nil {
		if s.mode == ModeStrict {
			return nil, fmt.Errorf("%w: %s: %v", ErrStoreUnavailable, serverNames(nc), err)
		}
		s.logger.Warn("embcache: store unreachable, computing locally until it is back",
			"servers", serverNames(nc), "err", err)
		c.bg.Go(c.reconnectLoop)
	}
	if every := c.payloadSweepEvery(); s.shm != nil && every > 0 {
		c.bg.Go(func() { c.sweepLoop(every) })
	}
	return c, nil
}

// Connect dials NATS for a Cache. In ModeDegrade it returns a connection
// even when no server answers yet (it keeps retrying); in ModeStrict an
// unreachable server is ErrStoreUnavailable naming url.
func Connect(url string, mode Mode, opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.Name("embcache"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if mode == ModeDegrade {
		base = append(base, nats.RetryOnFailedConnect(true))
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrStoreUnavailable, url, err)
	}
	return nc, nil
}

func serverNames(nc *nats.Conn) string {
	if u := nc.ConnectedUrlRedacted(); u != "" {
		return u
	}
	return strings.Join(nc.Servers(), ",")
}

// connectStore binds (or creates) the bucket and starts the watcher.
func (c *Cache) connectStore(ctx context.Context) error {
	octx, cancel := c.opContext(ctx)
	defer cancel()
	ls, err := ensureBucket(octx, c.nc, c.js, c.s.bucket, c.s.replicas, c.s.markerTTL)
	if err != nil {
		return err
	}
	ls.direct = len(c.s.tenants) > 0
	hub, err := startWatchSet(c.nc, ls.kv, c.s.tenants, watchHooks{bad: c.badRecordWatched, changed: c.recordChanged})
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		hub.close()
		return ErrClosed
	}
	c.ls, c.hub = ls, hub
	c.mu.Unlock()
	if c.s.events {
		if err := c.startEvents(context.Background()); err != nil {
			// Sharing works without events meanwhile; TTLs are not kept in step.
			c.s.logger.Warn("embcache: event stream unavailable, retrying", "err", err)
			c.bg.Go(func() { c.retry(func() error { return c.startEvents(context.Background()) }) })
		}
	}
	return nil
}

// retry calls fn every retry interval until it succeeds or the Cache closes.
func (c *Cache) retry(fn func() error) {
	t := time.NewTicker(c.s.retryInterval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		if fn() == nil {
			return
		}
	}
}

func (c *Cache) reconnectLoop() {
	c.retry(func() error {
		err := c.connectStore(context.Background())
		if err == nil {
			c.s.logger.Info("embcache: store reachable again, sharing resumes", "servers", serverNames(c.nc))
		}
		return err
	})
}

func (c *Cache) handles() (*leaseStore, *watchSet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ls, c.hub
}

// opContext bounds one store operation by the op timeout.
func (c *Cache) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.s.opTimeout)
}

// GetOrCompute returns the value of ref, pinned for req until Release(req).
// See GetOrComputePath.
func (c *Cache) GetOrCompute(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, error) {
	v, _, err := c.GetOrComputePath(ctx, req, ref, fn)
	return v, err
}

// GetOrComputePath returns the value of ref and the path that produced it:
// the local cache; an in-process flight; a committed value pulled through
// the payload plane (checksum verified); a wait for the process computing
// it; or a reservation and a compute by fn, run once in the whole cluster
// while holders live. The value is pinned for req until Release(req), and
// must not be written to.
//
// A caller whose ctx ends returns ctx.Err() while the work goes on for
// others; past the compute timeout, waiters get localcache.ErrComputeTimeout.
// fn's error reaches every waiter and the key is released for a retry.
func (c *Cache) GetOrComputePath(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	start := time.Now()
	ctx, span := c.tel.tracer.Start(ctx, "embcache.GetOrCompute", trace.WithAttributes(
		attribute.String("embcache.tenant", ref.Tenant), attribute.String("embcache.key", ref.Key.String())))
	v, path, err := c.getOrCompute(ctx, req, ref, fn)
	c.tel.request(ctx, span, path, start, err)
	return v, path, err
}

// localHit validates ref and returns its value from this process's cache,
// pinned for req (touched, counted), if it is there.
func (c *Cache) localHit(req string, ref Ref) (*payload.Value, bool, error) {
	if err := c.validate(ref); err != nil {
		return nil, false, err
	}
	obj := ref.Object()
	v, ok, err := c.local.Get(req, obj)
	if err != nil || !ok {
		return nil, false, err
	}
	c.stats.localHits.Add(1)
	if l := c.eventLink(); l != nil {
		l.touched(obj)
	}
	return v, true, nil
}

func (c *Cache) getOrCompute(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	v, ok, err := c.localHit(req, ref)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		return v, PathLocalHit, nil
	}
	obj := ref.Object()
	var path atomic.Uint32
	path.Store(uint32(PathCoalesced))
	v, err = c.local.GetOrCompute(ctx, req, obj, func(cctx context.Context) (*payload.Value, error) {
		v, p, err := c.resolve(cctx, ref, fn)
		path.Store(uint32(p))
		return v, err
	})
	if err != nil {
		return nil, 0, err
	}
	return v, Path(path.Load()), nil
}

// resolve finds ref's value in the cluster or computes it; it runs once
// per process per key (inside the local cache's flight).
func (c *Cache) resolve(ctx context.Context, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	ls, hub := c.handles()
	if ls == nil {
		return c.degraded(ctx, ref, fn, ErrStoreUnavailable)
	}
	key := ref.KVKey()
	waited := false
	var seen *current // a change the watcher delivered: no need to read again
	for attempt := 0; ; attempt++ {
		wake, unsubscribe := hub.subscribe(key) // before the read: no change slips between
		cur, err := c.readOrSeen(ctx, ls, key, seen)
		seen = nil
		if errors.Is(err, ErrBadRecord) {
			c.badRecord(err)
			if c.purgeUnreadable(ctx, ls, key, cur, err) {
				unsubscribe()
				if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
					return nil, PathWaited, err
				}
				continue
			}
			c.s.logger.Warn("embcache: unreadable lease record, computing without sharing", "key", key, "err", err)
		}
		if err != nil {
			unsubscribe()
			return c.degraded(ctx, ref, fn, err)
		}
		if cur.live && cur.record.State == StateComputing && c.purgeStale(ctx, ls, key, cur) {
			unsubscribe()
			if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
				return nil, PathWaited, err
			}
			continue
		}
		switch {
		case !cur.live:
			unsubscribe()
			lease, err := c.reserve(ctx, ls, ref)
			if errors.Is(err, ErrHeld) || errors.Is(err, errLateReserve) {
				// Someone got there first: read what they wrote. A read that
				// lags (a follower's direct get) could make this spin; back off.
				if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
					return nil, PathWaited, err
				}
				continue
			}
			if err != nil {
				return c.degraded(ctx, ref, fn, err)
			}
			if attempt > 0 {
				c.stats.takeovers.Add(1)
			}
			return c.computeUnder(ctx, lease, fn)

		case cur.record.State == StateCommitted:
			unsubscribe()
			v, err := c.pull(ctx, ls, ref, cur)
			if errors.Is(err, errInvalidated) {
				continue // purged: compute it again
			}
			var unread *tombstoneError
			if errors.As(err, &unread) {
				return c.degraded(ctx, ref, fn, err)
			}
			if err == nil {
				if waited {
					return v, PathWaited, nil
				}
				return v, PathRemoteHit, nil
			}
			if attempt >= 3 {
				return c.degraded(ctx, ref, fn, err)
			}
			// Drop the record (if nobody changed it) so the key can be recomputed.
			octx, cancel := c.opContext(ctx)
			err = ls.purgeFor(octx, key, cur.rev, events.CauseCorrupt)
			cancel()
			if err != nil && !errors.Is(err, ErrLeaseLost) {
				return c.degraded(ctx, ref, fn, err)
			}

		default: // computing elsewhere: wait for a change, or poll
			if !waited {
				waited = true
				c.stats.waits.Add(1)
				c.tel.leaseWaits.Add(ctx, 1)
			}
			t := time.NewTimer(c.s.pollInterval)
			select {
			case seen = <-wake:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				unsubscribe()
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return nil, PathWaited, fmt.Errorf("%w: waiting for %s (owner %s): %w",
						localcache.ErrComputeTimeout, key, cur.record.Owner, ctx.Err())
				}
				return nil, PathWaited, ctx.Err()
			}
			t.Stop()
			unsubscribe()
		}
	}
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

// purgeStale removes a computing record nobody renews: one not written for
// two lease TTLs (or two of its own TTLs, if longer) belongs to a dead
// holder or was written by hand without a TTL, and would block its key
// forever. It is purged on its revision, so a holder that renews meanwhile
// keeps it. Reports whether the key should be read again.
func (c *Cache) purgeStale(ctx context.Context, ls *leaseStore, key string, cur current) bool {
	if cur.stamp.IsZero() {
		return false
	}
	age := c.s.clock.Now().Sub(cur.stamp)
	if age <= 2*max(c.s.leaseTTL, cur.ttl) {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := ls.purge(octx, key, cur.rev)
	cancel()
	if err == nil {
		c.stats.staleTakeovers.Add(1)
		c.s.logger.Warn("embcache: stale computing record purged, taking the key over", "key", key,
			"owner", cur.record.Owner, "age", age.Round(time.Millisecond))
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}

// purgeUnreadable removes a record that does not decode once it is older
// than a lease TTL and its own TTL (by the server's time stamp), so that
// its key is shared again; a younger one may be a newer version's record
// mid-upgrade, and is left alone meanwhile. Reports whether the key should
// be read again.
func (c *Cache) purgeUnreadable(ctx context.Context, ls *leaseStore, key string, cur current, cause error) bool {
	if cur.rev == 0 || cur.stamp.IsZero() || c.s.clock.Now().Sub(cur.stamp) <= max(c.s.leaseTTL, cur.ttl) {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := ls.purge(octx, key, cur.rev)
	cancel()
	if err == nil {
		c.stats.badRecordsPurged.Add(1)
		c.s.logger.Warn("embcache: unreadable lease record purged", "key", key, "rev", cur.rev, "err", cause)
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}

// readOrSeen returns the state the watcher delivered, if it is a committed
// record (the watcher reads from the stream leader), else reads the key.
func (c *Cache) readOrSeen(ctx context.Context, ls *leaseStore, key string, seen *current) (current, error) {
	if seen != nil && seen.live && seen.record.State == StateCommitted {
		return *seen, nil
	}
	octx, cancel := c.opContext(ctx)
	defer cancel()
	return ls.read(octx, key)
}

// computeUnder runs fn under lease and commits what it returns. A failed
// fn abandons the key; a failed commit still returns the (correct) value.
func (c *Cache) computeUnder(ctx context.Context, lease *Lease, fn ComputeFunc) (v *payload.Value, _ Path, err error) {
	defer func() {
		if r := recover(); r != nil {
			lease.Abandon(context.WithoutCancel(ctx), fmt.Errorf("panic: %v", r))
			panic(r) // the local cache turns it into an error for every waiter
		}
	}()
	l := c.eventLink()
	computeStart := time.Now()
	v, err = fn(ctx)
	c.tel.computeTime.Record(ctx, time.Since(computeStart).Seconds())
	if err != nil {
		c.stats.computeErrors.Add(1)
		if aerr := lease.Abandon(context.WithoutCancel(ctx), err); aerr != nil {
			c.s.logger.Warn("embcache: abandon failed; the lease will expire", "key", lease.key, "err", aerr)
		}
		if l != nil {
			l.abandoned(lease.ref, err)
		}
		return nil, PathComputed, err
	}
	c.stats.computes.Add(1)
	loc, err := lease.Commit(context.WithoutCancel(ctx), v)
	if err != nil {
		c.s.logger.Warn("embcache: value computed but not committed", "key", lease.key, "err", err)
		if !errors.Is(err, ErrLeaseLost) {
			lease.Abandon(context.WithoutCancel(ctx), err)
		}
		if l != nil {
			l.note(lease.ref)
		}
		return v, PathComputed, nil
	}
	c.expiries.Store(lease.ref.Object(), lease.expires())
	if l != nil {
		l.published(lease.ref, loc, lease.expires(), lease.Revision())
	}
	// An invalidation that came while it computed: the caller gets the
	// value it asked for, but the record and the local copy go (4.4). After
	// published, so that an event arriving from now on finds the copy.
	if ls, _ := c.handles(); ls != nil {
		rec := lease.record()
		if stale, err := c.invalidatedRecord(ctx, ls, lease.ref.Tenant, rec); err == nil && stale {
			c.dropInvalidated(ctx, ls, lease.ref, current{rev: lease.Revision()})
			obj := lease.ref.Object()
			c.local.Invalidate(func(k payload.ObjectID, _ *payload.Value) bool { return k == obj }, localcache.CauseInvalidated)
		}
	}
	return v, PathComputed, nil
}

// degraded computes without the store: counted in ModeDegrade, an error
// in ModeStrict.
func (c *Cache) degraded(ctx context.Context, ref Ref, fn ComputeFunc, cause error) (*payload.Value, Path, error) {
	if c.s.mode == ModeStrict {
		return nil, PathDegraded, fmt.Errorf("%w: %v", ErrStoreUnavailable, cause)
	}
	c.stats.degraded.Add(1)
	computeStart := time.Now()
	v, err := fn(ctx)
	c.tel.computeTime.Record(ctx, time.Since(computeStart).Seconds())
	if err != nil {
		c.stats.computeErrors.Add(1)
		return nil, PathDegraded, err
	}
	c.stats.computes.Add(1)
	if l := c.eventLink(); l != nil {
		l.note(ref) // an invalidation of its model and epoch drops it too
	}
	return v, PathDegraded, nil
}

// Reserve takes ref's lease for this process: the caller computes, then
// Commits or Abandons. ErrHeld means another process holds or has
// committed the key; ErrStoreUnavailable that the store cannot be reached;
// ErrLeaseLost that the reservation was acknowledged too late to trust
// (try again).
func (c *Cache) Reserve(ctx context.Context, ref Ref) (*Lease, error) {
	if err := c.validate(ref); err != nil {
		return nil, err
	}
	ls, _ := c.handles()
	if ls == nil {
		return nil, ErrStoreUnavailable
	}
	return c.reserve(ctx, ls, ref)
}

func (c *Cache) reserve(ctx context.Context, ls *leaseStore, ref Ref) (*Lease, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	now := time.Now()
	rec := Record{V: RecordVersion, State: StateComputing, Owner: c.owner, Nonce: hex.EncodeToString(nonce[:]),
		Started: now, Heartbeat: now, Model: ref.Model, Epoch: ref.Epoch}
	key := ref.KVKey()
	octx, cancel := c.opContext(ctx)
	sent := c.s.clock.Now()
	rev, err := ls.create(octx, key, rec, c.s.leaseTTL)
	cancel()
	if err != nil {
		return nil, err
	}
	if late := c.s.clock.Now().Sub(sent.Add(c.s.leaseTTL)); late >= 0 {
		c.stats.lateWrites.Add(1)
		octx, cancel := c.opContext(ctx)
		ls.purge(octx, key, rev)
		cancel()
		return nil, fmt.Errorf("%w: %s acknowledged %v after its lease TTL", errLateReserve, key, late)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		ls.purge(context.Background(), key, rev)
		return nil, ErrClosed
	}
	rec.Reserved = rev // carried by the renewals and the commit
	l := newLease(c, ls, ref, key, rev, rec, sent)
	c.leases[l] = struct{}{}
	if o := c.s.observer; o != nil {
		o.Reserved(ref, rev)
	}
	return l, nil
}

// validate checks ref, and that this Cache serves its tenant.
func (c *Cache) validate(ref Ref) error {
	if err := ref.validate(); err != nil {
		return err
	}
	if len(c.s.tenants) > 0 && !slices.Contains(c.s.tenants, ref.Tenant) {
		return fmt.Errorf("%w: %q", ErrTenant, ref.Tenant)
	}
	return nil
}

func (c *Cache) forget(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
	c.mu.Unlock()
}

// Release drops every pin req holds (the RFC's cleanup_request) and
// returns how many.
func (c *Cache) Release(req string) int { return c.local.Release(req) }

// Drop removes this process's copy of ref (a copy found corrupt) and
// reports whether there was one: the next request reads the record again.
// Requests that hold the copy keep it until they release it.
func (c *Cache) Drop(ref Ref) bool { return c.local.Remove(ref.Object()) }

// Close stops the watcher, the background reconnects and the heartbeats of
// leases still held (they expire on the server). The connection stays open.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	hub := c.hub
	leases := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	c.bg.Wait()
	for _, l := range leases {
		l.stopHeartbeats()
	}
	if hub != nil {
		hub.close()
	}
	for _, r := range c.tel.registrations {
		r.Unregister()
	}
	if l := c.eventLink(); l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.close(ctx)
		cancel()
	}
	return nil
}

// Invalidate declares every value of tenant computed by model at weight
// epoch stale, as the package's Invalidate does, and drops this process's
// copies at once (the others drop theirs when the invalidated event
// reaches them). It needs the event stream (WithEvents).
func (c *Cache) Invalidate(ctx context.Context, tenant, model string, epoch uint64) error {
	if len(c.s.tenants) > 0 && !slices.Contains(c.s.tenants, tenant) {
		return fmt.Errorf("%w: %q", ErrTenant, tenant)
	}
	l := c.eventLink()
	ls, _ := c.handles()
	if l == nil || ls == nil {
		return fmt.Errorf("%w: invalidation needs the bucket and the event stream", ErrStoreUnavailable)
	}
	octx, cancel := c.opContext(ctx)
	defer cancel()
	e, err := invalidate(octx, ls, l.pub, c.owner, c.s.node, tenant, model, epoch, c.s.storeTTL)
	if err != nil {
		return err
	}
	l.apply(*e)
	return nil
}

// EventStats returns the event publisher's and subscriber's counters, or
// false without the event stream.
func (c *Cache) EventStats() (events.PublisherStats, uint64, bool) {
	l := c.eventLink()
	if l == nil {
		return events.PublisherStats{}, 0, false
	}
	return l.pub.Stats(), l.sub.Bad(), true
}
