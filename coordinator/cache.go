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
	"github.com/embcache/embcache/lease"
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
	PathDegraded                  // computed locally, not shared: the store unreachable, or the key's record of other labels (docs/protocol.md 4.4)
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
	s       settings
	started time.Time // by the wall clock, which the event stream's leader's is compared with
	nc      *nats.Conn
	js      jetstream.JetStream
	local   *localcache.Cache[localKey, *payload.Value]
	// expiries holds the record expiry of each value on its way into the
	// local cache (localKey -> copyExpiry), taken at its insertion:
	// a local copy lives as long as its record (docs/protocol.md 4.3).
	expiries sync.Map
	router   *payload.Router
	owner    string
	stats    counters
	tel      *instruments
	obs      observations

	mu     sync.Mutex
	b      *lease.Bucket             // nil until the bucket is reachable; guarded by mu
	leases map[*lease.Lease]struct{} // live leases; guarded by mu
	events *eventLink                // nil unless WithEvents and the stream is reachable; guarded by mu
	closed atomic.Bool               // Close has begun; set under mu

	// The requests in flight, which Close cancels and waits for
	// (inflight.go).
	life     context.Context         // ends when Close begins, with the cause ErrClosed
	endLife  context.CancelCauseFunc // called by Close
	reqs     atomic.Int64            // requests in flight (and, for a moment, one refused)
	computes int                     // requests in flight running their caller's compute; guarded by mu
	gaveUp   bool                    // Close has stopped waiting for the computes left; guarded by mu
	settled  chan struct{}           // 1-buffered: a request ended or left its compute after Close began

	bg   sync.WaitGroup
	shut chan struct{} // closed when Close has finished: a second Close waits for it
}

// New returns a Cache over the NATS connection nc (which the caller keeps
// and closes), creating the bucket if it is absent. If the bucket cannot
// be reached, ModeStrict fails with ErrStoreUnavailable naming the
// server; ModeDegrade starts anyway and keeps trying in the background. A
// bucket of another shard count than WithLeaseShards is ErrInvalidOption
// (wrapping lease.ErrShards) in both modes.
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
	a, err := lease.ClockAllowance(s.leaseTTL, s.clockAllowance)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	s.clockAllowance = a
	if s.storeTTL <= 4*s.clockAllowance {
		// A committed record is touched only until two allowances before
		// its expiry (lease.Record.MayHaveExpired).
		return nil, fmt.Errorf("%w: store TTL %v within four clock allowances (%v)", ErrInvalidOption, s.storeTTL, s.clockAllowance)
	}
	if s.router == nil {
		mem := payload.NewMemoryStore(s.node, 0)
		s.router, _ = payload.NewRouter(s.node, payload.TransportMemory, mem) // valid: every argument is set
	}
	if s.router.Node() != s.node {
		return nil, fmt.Errorf("%w: the payload router is node %q's, the Cache is node %q's", ErrInvalidOption, s.router.Node(), s.node)
	}
	if s.payloadSweep > 0 && s.router.NodeStore() == nil {
		return nil, fmt.Errorf("%w: WithPayloadSweep needs a node store (payload.WithNodeStore)", ErrInvalidOption)
	}
	c := &Cache{s: s, started: time.Now(), leases: make(map[*lease.Lease]struct{}), settled: make(chan struct{}, 1), shut: make(chan struct{})}
	c.life, c.endLife = context.WithCancelCause(context.Background())
	c.obs = observations{c}
	local, err := localcache.New[localKey, *payload.Value](append([]localcache.Option{
		localcache.WithComputeTimeout(s.computeTimeout),
		localcache.WithExpiry(c.recordExpiry),
		localcache.WithOnEvict(func(k localKey, v *payload.Value, cause localcache.Cause) {
			v.Close()
			c.obs.evicted(k, v, cause)
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
	c.router = s.router
	c.owner = s.node + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(nonce[:])
	if err := c.connectStore(ctx); err != nil {
		if errors.Is(err, lease.ErrShards) {
			// A bucket of another shard count is a config to fix, never an
			// outage that ends: refused in both modes.
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		if s.mode == ModeStrict {
			return nil, fmt.Errorf("%w: %s: %v", ErrStoreUnavailable, serverNames(nc), err)
		}
		s.logger.Warn("embcache: store unreachable, computing locally until it is back",
			"servers", serverNames(nc), "err", err)
		c.bg.Go(c.reconnectLoop)
	}
	if every := c.payloadSweepEvery(); s.router.NodeStore() != nil && every > 0 {
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

// connectStore binds (or creates) the bucket and starts the event link.
func (c *Cache) connectStore(ctx context.Context) error {
	octx, cancel := c.opContext(ctx)
	defer cancel()
	b, err := lease.OpenBucket(octx, c.nc, lease.BucketConfig{Name: c.s.bucket, Replicas: c.s.replicas,
		MarkerTTL: c.s.markerTTL, Direct: len(c.s.tenants) > 0, Shards: c.s.shards})
	if err != nil {
		if !c.nc.IsConnected() {
			// Not the bucket's fault: "bucket EMBCACHE_LEASES: context
			// deadline exceeded" sent operators to look at the bucket.
			return fmt.Errorf("no NATS server answers: %w", err)
		}
		return err
	}
	c.mu.Lock()
	if c.closed.Load() {
		// Close has closed (or found no) bucket: this one, never used, is
		// closed here, as every bucket of the Cache's is.
		c.mu.Unlock()
		b.Close()
		return ErrClosed
	}
	c.b = b
	c.mu.Unlock()
	// A tenant's credentials may not update a stream (the update would go
	// unanswered): they only check.
	uctx, ucancel := c.opContext(ctx)
	err = b.EnsureRepublish(uctx, len(c.s.tenants) == 0)
	ucancel()
	if err != nil {
		c.s.logger.Warn("embcache: waiters will poll; start the reconciler or serve once with the operator's user", "err", err)
	}
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
		case <-c.life.Done():
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
			// At the level of the outage's start: an operator sees its end.
			c.s.logger.Warn("embcache: store reachable again, sharing resumes", "servers", serverNames(c.nc))
		}
		return err
	})
}

// bucket is the bucket, or nil while it cannot be reached.
func (c *Cache) bucket() *lease.Bucket {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b
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
// A Ref that does not validate (Ref.Validate: no model, a bad tenant) is
// an error wrapping cachekey.ErrInvalidConfig, and fn does not run; a
// tenant this Cache does not serve is ErrTenant. A record of the key
// that carries other labels (model, epoch) than ref is never served to
// it, nor taken over: fn computes ref's value without sharing it
// (PathDegraded, counted in Stats.LabelConflicts; docs/protocol.md 4.4).
//
// A caller whose ctx ends returns ctx.Err() while the work goes on for
// others; past the compute timeout, waiters get ErrComputeTimeout.
// fn's error reaches every waiter and the key is released for a retry.
// Close cancels the request, the work for others included (a compute's
// ctx ends, its key is abandoned): the caller gets an error wrapping
// ErrClosed, as does a call after Close has begun.
func (c *Cache) GetOrComputePath(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	start := time.Now()
	ctx, span := c.tel.tracer.Start(ctx, "embcache.GetOrCompute", trace.WithAttributes(
		attribute.String("embcache.tenant", ref.Tenant), attribute.String("embcache.key", ref.Key.String())))
	v, path, err := c.getOrCompute(ctx, req, ref, fn)
	c.tel.request(ctx, span, path, start, err)
	c.stats.request(path)
	return v, path, err
}

// localHit validates ref and returns its value from this process's cache,
// pinned for req (touched, counted), if it is there.
func (c *Cache) localHit(req string, ref Ref) (*payload.Value, bool, error) {
	if err := c.validate(ref); err != nil {
		return nil, false, err
	}
	k := ref.local()
	v, ok, err := c.local.Get(req, k)
	if err != nil || !ok {
		return nil, false, err
	}
	c.obs.localHit(k)
	return v, true, nil
}

func (c *Cache) getOrCompute(ctx context.Context, req string, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	if err := c.enter(); err != nil {
		return nil, 0, err
	}
	defer c.exit()
	v, ok, err := c.localHit(req, ref)
	if err != nil {
		return nil, 0, err
	}
	if ok {
		return v, PathLocalHit, nil
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	var path atomic.Uint32
	path.Store(uint32(PathCoalesced))
	v, err = c.local.GetOrCompute(ctx, req, ref.local(), func(cctx context.Context) (*payload.Value, error) {
		// The flight runs on a goroutine of its own, for every caller
		// that joins it: a request of its own, which Close ends too.
		if err := c.enter(); err != nil {
			return nil, err
		}
		defer c.exit()
		cctx, cancel := c.bind(cctx)
		defer cancel()
		v, p, err := c.resolve(cctx, ref, fn)
		path.Store(uint32(p))
		// Its callers may hear of it before their own ctx ends (each
		// ends on a goroutine of its own): it says why.
		return v, closedErr(cctx, err)
	})
	if err != nil {
		return nil, 0, closedErr(ctx, err)
	}
	return v, Path(path.Load()), nil
}

// resolve finds ref's value in the cluster or computes it; it runs once
// per process per key (inside the local cache's flight).
func (c *Cache) resolve(ctx context.Context, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	b := c.bucket()
	if b == nil {
		return c.degraded(ctx, ref, fn, ErrStoreUnavailable)
	}
	key := ref.KVKey()
	w := waiter{}
	defer w.stop()
	// Before the first read: an invalidation whose event arrives after it
	// refuses what this request pulls (heardSince).
	invalidations := c.invalidationsHeard(ref)
	var heard *lease.Change // a change the wait heard, taken instead of a read
	for attempt := 0; ; attempt++ {
		var cur lease.Entry
		var err error
		countBad := c.badRecord
		if heard != nil {
			cur, err, heard = heard.Entry, heard.Err, nil
			countBad = c.badRecordWatched
		} else {
			octx, cancel := c.opContext(ctx)
			cur, err = b.Read(octx, key)
			cancel()
		}
		if errors.Is(err, ErrBadRecord) {
			countBad(err)
			if c.purgeUnreadable(ctx, b, key, cur, err) {
				if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
					return nil, PathWaited, err
				}
				continue
			}
			c.s.logger.Warn("embcache: unreadable lease record, computing without sharing", "key", key, "err", err)
		}
		if err != nil {
			return c.degraded(ctx, ref, fn, err)
		}
		if cur.Live && cur.Record.State == lease.StateComputing && c.purgeStale(ctx, b, key, cur) {
			if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
				return nil, PathWaited, err
			}
			continue
		}
		if cur.Live && !ref.carries(cur.Record) {
			// Not a value for this caller, computing or committed: the
			// label rule (labels.go).
			if c.purgeUnlabelled(ctx, b, key, cur) {
				if err := backOff(ctx, c.s.pollInterval, attempt); err != nil {
					return nil, PathWaited, err
				}
				continue
			}
			w.stop()
			return c.labelConflict(ctx, ref, fn, cur.Record)
		}
		switch {
		case !cur.Live:
			w.stop()
			r, end, err := c.reserveToCompute(ctx, b, ref)
			if errors.Is(err, ErrHeld) || errors.Is(err, lease.ErrLate) {
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
				c.obs.tookOver()
			}
			return c.computeUnder(ctx, r, fn, end)

		case cur.Record.State == lease.StateCommitted:
			w.stop()
			v, err := c.pull(ctx, b, ref, cur)
			if err != nil && ctx.Err() != nil {
				// The request ended (Close, the compute timeout): a pull
				// cut short says nothing of the payload, which stays.
				return nil, PathRemoteHit, context.Cause(ctx)
			}
			if errors.Is(err, errInvalidated) {
				continue // purged: compute it again
			}
			if errors.Is(err, errInvalidatedKept) {
				return c.degraded(ctx, ref, fn, err) // not shared until the server removes it
			}
			var unread *tombstoneError
			if errors.As(err, &unread) {
				return c.degraded(ctx, ref, fn, err)
			}
			if err == nil && c.invalidationsHeard(ref) != invalidations {
				// An invalidation of its labels arrived since the record was
				// read: whether the record is older than its tombstone, a
				// lagging read may not tell. The caller's value is computed
				// here, unshared.
				v.Close()
				c.obs.invalidatedRecord(ref, v)
				return c.computeUnshared(ctx, ref, fn)
			}
			if err == nil {
				if w.waited {
					return v, PathWaited, nil
				}
				return v, PathRemoteHit, nil
			}
			if errors.Is(err, ErrNoTransport) || errors.Is(err, payload.ErrInvalidLocation) || errors.Is(err, payload.ErrUntrusted) {
				// Readable where it was written, not here (no transport
				// for it, another node's shm, a pull server this node does
				// not trust): not corrupt, so the record stays for those
				// who can read it.
				return c.degraded(ctx, ref, fn, err)
			}
			if attempt >= 3 {
				return c.degraded(ctx, ref, fn, err)
			}
			// Drop the record (if nobody changed it) so the key can be
			// recomputed; one that may have expired is left to the server
			// (3.1): its key is computed without sharing meanwhile.
			if cur.Record.MayHaveExpired(c.s.clock.Now(), c.s.clockAllowance) {
				return c.degraded(ctx, ref, fn, err)
			}
			octx, cancel := c.opContext(ctx)
			err = b.PurgeFor(octx, key, cur.Rev, events.CauseCorrupt)
			cancel()
			if err != nil && !errors.Is(err, ErrLeaseLost) {
				return c.degraded(ctx, ref, fn, err)
			}

		default: // computing elsewhere: wait for a change, or poll
			if !w.waited {
				w.waited = true
				c.obs.waiting(ctx)
			}
			if w.done == nil {
				// Subscribe, then read again: a change between the first
				// read and the subscription is in the second read, and any
				// after it reaches the subscription. Only a waiter
				// subscribes (a hit or a reservation needs no changes).
				// Without changes (a subscription refused, a bucket that
				// does not republish) the polls alone wake it.
				if err := w.subscribe(b, key); err != nil {
					c.s.logger.Debug("embcache: no changes for a key, polling", "key", key, "err", err)
				}
				continue
			}
			ch, err := w.wait(ctx, c.s.pollInterval, cur.Rev)
			if err != nil {
				return nil, PathWaited, c.waitEnded(ctx, key, cur)
			}
			heard = ch
		}
	}
}

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
// than the change. (With hints on the key's own subject the first poll
// came at 25 ms: a hint could arrive before the stream stored the commit.)
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

// purgeStale removes a computing record that nobody renews and nothing
// expires: one without a TTL of its own (written by hand), not written for
// two lease TTLs, would block its key forever. It is purged on its
// revision, so a write meanwhile keeps it. A record with a TTL is left to
// the server, whatever its age by this process's clock (which may run
// ahead): past its deadline a purge could start a next holder whose
// writes the server's expiry marker then wipes (docs/protocol.md 3.1).
// Reports whether the key should be read again.
func (c *Cache) purgeStale(ctx context.Context, b *lease.Bucket, key string, cur lease.Entry) bool {
	if cur.Stamp.IsZero() || cur.TTL > 0 {
		return false
	}
	age := c.s.clock.Now().Sub(cur.Stamp)
	if age <= 2*c.s.leaseTTL {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := b.Purge(octx, key, cur.Rev)
	cancel()
	if err == nil {
		c.obs.staleTakeover()
		c.s.logger.Warn("embcache: stale computing record purged, taking the key over", "key", key,
			"owner", cur.Record.Owner, "age", age.Round(time.Millisecond))
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}

// purgeUnreadable removes a record that does not decode under its key (a
// tombstone at a value's key included) and has no TTL of its own once it
// is older than a lease TTL by the server's time stamp
// (lease.Entry.Outlived), so that its key is shared again; a younger one
// may be a newer version's record mid-upgrade, and is left alone
// meanwhile. One with a TTL is left to the server's expiry, as purgeStale
// leaves a computing record. Reports whether the key should be read again.
func (c *Cache) purgeUnreadable(ctx context.Context, b *lease.Bucket, key string, cur lease.Entry, cause error) bool {
	if cur.TTL > 0 || !cur.Outlived(c.s.clock.Now(), c.s.leaseTTL) {
		return false
	}
	octx, cancel := c.opContext(ctx)
	err := b.Purge(octx, key, cur.Rev)
	cancel()
	if err == nil {
		c.obs.badRecordPurged()
		c.s.logger.Warn("embcache: unreadable lease record purged", "key", key, "rev", cur.Rev, "err", cause)
	}
	return err == nil || errors.Is(err, ErrLeaseLost)
}

// computeUnder runs fn under lease and commits what it returns. A failed
// fn abandons the key; a failed commit still returns the (correct) value.
// end, if set, is the compute's registration with the event link
// (startCompute), ended here.
//
// A compute that Close cancels fails as any other (its key is abandoned);
// one still running when Close stops waiting for it (compute) does
// nothing more with the store when it returns: no commit, no abandon
// (its lease, no longer renewed, expires).
func (c *Cache) computeUnder(ctx context.Context, r *Reservation, fn ComputeFunc, end func() bool) (v *payload.Value, _ Path, err error) {
	if end != nil {
		defer end()
	}
	defer func() {
		if p := recover(); p != nil {
			if !c.givenUp() {
				r.abandon(context.WithoutCancel(ctx), fmt.Errorf("panic: %v", p))
			}
			panic(p) // the local cache turns it into an error for every waiter
		}
	}()
	computeStart := time.Now()
	v, err = c.compute(ctx, fn)
	c.obs.computed(ctx, time.Since(computeStart), err)
	if errors.Is(err, errGivenUp) {
		return nil, PathComputed, err
	}
	if err != nil {
		if aerr := r.abandon(context.WithoutCancel(ctx), err); aerr != nil {
			c.s.logger.Warn("embcache: abandon failed; the lease will expire", "key", r.l.Key(), "err", aerr)
		}
		c.obs.abandoned(r.ref, err)
		return nil, PathComputed, err
	}
	// Not cut short by the compute timeout (the value is there), but by
	// Close: a commit cancelled then is abandoned below.
	cctx, cancel := c.bind(context.WithoutCancel(ctx))
	loc, err := r.commit(cctx, v)
	cancel()
	if err != nil {
		c.s.logger.Warn("embcache: value computed but not committed", "key", r.l.Key(), "err", err)
		if !errors.Is(err, ErrLeaseLost) {
			r.abandon(context.WithoutCancel(ctx), err)
		}
		c.obs.unshared(r.ref, v)
		if end != nil && end() {
			// An invalidation arrived while it computed: with no record
			// to compare with its tombstone, it is not kept.
			c.discard(r.ref.local())
		}
		return v, PathComputed, nil
	}
	rec := r.l.Record()
	c.obs.published(r.ref, v, loc, rec.Expires)
	// An invalidation that came while it computed: the caller gets the
	// value it asked for, but the record and the local copy go (4.4). After
	// published, so that an event arriving from now on finds the copy.
	// With the event link, an invalidation the reservation may precede is
	// one whose event has marked this compute (startCompute); the others'
	// tombstones came before the reservation. Without it, every commit
	// reads its tombstone.
	invalidated := true
	if end != nil {
		invalidated = end()
	}
	// A tombstone it could not read leaves the question open: the record
	// stays (its readers check the tombstone themselves), the copy, which
	// nothing checks again, goes.
	if b := c.bucket(); b != nil && invalidated {
		stale, err := c.invalidatedRecord(ctx, b, r.ref, rec)
		if err == nil && stale {
			c.dropInvalidated(ctx, b, r.ref, v, lease.Entry{Rev: r.Revision(), Record: rec})
		}
		if err != nil || stale {
			c.discard(r.ref.local())
		}
	}
	return v, PathComputed, nil
}

// degraded computes without the store: counted in ModeDegrade, an error
// in ModeStrict.
//
// A request whose ctx has ended (Close, the compute timeout) computes
// nothing: the store call that failed failed with it, and says nothing of
// the store.
func (c *Cache) degraded(ctx context.Context, ref Ref, fn ComputeFunc, cause error) (*payload.Value, Path, error) {
	if ctx.Err() != nil {
		return nil, PathDegraded, context.Cause(ctx)
	}
	if errors.Is(cause, ErrClosed) {
		return nil, PathDegraded, cause
	}
	if c.s.mode == ModeStrict {
		return nil, PathDegraded, fmt.Errorf("%w: %v", ErrStoreUnavailable, cause)
	}
	c.obs.degraded()
	return c.computeUnshared(ctx, ref, fn)
}

// computeUnshared runs fn for ref without the store: its value is the
// caller's and this process's (local cache), never the cluster's.
func (c *Cache) computeUnshared(ctx context.Context, ref Ref, fn ComputeFunc) (*payload.Value, Path, error) {
	// Registered until its copy is noted, as a compute under a lease is:
	// an invalidation that arrives meanwhile keeps it out of the local
	// cache (docs/protocol.md 4.4).
	if end := c.startCompute(ref, false); end != nil {
		defer end()
	}
	computeStart := time.Now()
	v, err := c.compute(ctx, fn)
	c.obs.computed(ctx, time.Since(computeStart), err)
	if err != nil {
		return nil, PathDegraded, err
	}
	c.obs.unshared(ref, v)
	return v, PathDegraded, nil
}

// reserveToCompute is reserve for a compute of this process's own,
// registered with the event link first (startCompute): end, nil without
// events, is the registration, ended already if there is no reservation.
func (c *Cache) reserveToCompute(ctx context.Context, b *lease.Bucket, ref Ref) (r *Reservation, end func() bool, err error) {
	end = c.startCompute(ref, true)
	defer func() { // an error or a panic: no compute to register
		if r == nil && end != nil {
			end()
		}
	}()
	r, err = c.reserve(ctx, b, ref)
	return r, end, err
}

// Reserve takes ref's lease for this process: the caller computes, then
// Commits or Abandons. ErrHeld means another process holds or has
// committed the key; ErrStoreUnavailable that the store cannot be reached;
// ErrLeaseLost that the reservation was acknowledged too late to trust
// (try again); ErrClosed (wrapped) that the Cache was closed before or
// meanwhile (the key was given back, or never taken); ErrTenant that this
// Cache does not serve ref's tenant; an error wrapping
// cachekey.ErrInvalidConfig that ref does not validate (Ref.Validate: a
// model is required). The record carries ref's labels.
func (c *Cache) Reserve(ctx context.Context, ref Ref) (*Reservation, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	if err := c.validate(ref); err != nil {
		return nil, err
	}
	b := c.bucket()
	if b == nil {
		return nil, ErrStoreUnavailable
	}
	ctx, cancel := c.bind(ctx)
	defer cancel()
	r, err := c.reserve(ctx, b, ref)
	return r, closedErr(ctx, err)
}

func (c *Cache) reserve(ctx context.Context, b *lease.Bucket, ref Ref) (*Reservation, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: c.owner, Nonce: hex.EncodeToString(nonce[:]),
		Started: now, Heartbeat: now, Model: ref.Model, Epoch: ref.Epoch}
	var st lease.Store = b
	if wrap := c.s.leaseStore; wrap != nil {
		st = wrap(b)
	}
	l, err := lease.Acquire(ctx, st, ref.KVKey(), rec, lease.Config{TTL: c.s.leaseTTL, OpTimeout: c.s.opTimeout,
		Clock: c.s.clock, ClockAllowance: c.s.clockAllowance, Hooks: c.leaseHooks()})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed := c.closed.Load()
	select {
	case <-l.Done(): // already lost: its Ended hook may have run
	default:
		if !closed {
			c.leases[l] = struct{}{} // forgotten by the Ended hook, which waits for mu
		}
	}
	c.mu.Unlock()
	if closed {
		l.Abandon(context.Background())
		return nil, ErrClosed
	}
	c.obs.reserved(ref, l.Record().Reserved) // the create's revision, whatever a renewal did since
	return &Reservation{c: c, ref: ref, l: l}, nil
}

// validate checks ref, and that this Cache serves its tenant.
func (c *Cache) validate(ref Ref) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	if len(c.s.tenants) > 0 && !slices.Contains(c.s.tenants, ref.Tenant) {
		return fmt.Errorf("%w: %q", ErrTenant, ref.Tenant)
	}
	return nil
}

func (c *Cache) forget(l *lease.Lease) {
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
func (c *Cache) Drop(ref Ref) bool { return c.local.Remove(ref.local()) }

// Close ends the Cache. It cancels the requests in flight
// (GetOrCompute, Get, Reserve, a Reservation's Commit and Abandon,
// Ping): their waits, pulls, reservations and commits stop, a caller's
// compute sees its ctx end, and a key it held is abandoned as after a
// failed compute, so other processes take it at once. Their callers get
// an error wrapping ErrClosed (but for a request that had its answer
// already), and so does every call made after Close has begun, at once.
// An Invalidate in flight is not cancelled but finished (its tombstone
// and its event, each within the op timeout): cut short between the two,
// it would leave a tombstone whose event no process hears.
//
// Close returns once those requests have returned, waiting at most a
// lease TTL (WithLeaseTTL) for the computes among them: the bound is the
// Cache's own, as etcd's Session.Close is bounded by its TTL, because a
// compute that ignores its ctx must not hold Close up for ever, and
// waiting longer buys other processes nothing (a lease Close stops
// renewing is theirs a TTL later). Such a compute is left running; when
// it returns, its value is dropped and its request does nothing more with
// the store (no commit, no abandon: its key expires with its lease). A
// request that is not computing (a read, a pull, an abandon, an
// invalidation, each ended by its ctx or its op timeout) is always waited
// for, so nothing is written to or read from the bucket for a request
// after Close has returned. A reservation whose create was sent before
// Close began is waited for too (within the op timeout) and, if it
// landed, given back as an abandon gives it (lease.Acquire).
//
// Then it stops the event link, the background reconnects, the heartbeats
// of leases still held (a Reservation not committed nor abandoned, a
// compute given up: they expire on the server, and such a Reservation
// ends, its Err wrapping ErrClosed) and the tombstone reads the bucket
// shares between requests (lease.Bucket.Close): none of the Cache's
// goroutines is left but those of computes still running. The connection
// stays open.
//
// A Close called while another is in progress waits for that one to
// finish; one called after it returns nil at once. So Close must not be
// called from code that runs inside a request Close waits for (an
// Observer's method, a payload transport's): it would wait for itself
// for ever. Called from a ComputeFunc, it returns once Close has given up
// on that compute, a lease TTL later. From such code, call it on a
// goroutine of its own.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		<-c.shut
		return nil
	}
	c.closed.Store(true)
	c.mu.Unlock()
	defer close(c.shut)
	c.endLife(ErrClosed)
	c.awaitRequests(c.s.leaseTTL)
	c.bg.Wait()
	c.mu.Lock()
	leases := make([]*lease.Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	for _, l := range leases {
		l.Orphan(errOrphaned)
	}
	for _, r := range c.tel.registrations {
		r.Unregister()
	}
	if l := c.eventLink(); l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.close(ctx)
		cancel()
	}
	// closed is set: connectStore sets no bucket from now on. A request
	// still running that would share a tombstone read gets lease.ErrClosed,
	// a tombstone it could not read: it serves no record on it (pull).
	if b := c.bucket(); b != nil {
		b.Close()
	}
	return nil
}

// Invalidate declares every value of tenant computed by model at weight
// epoch stale, as the package's Invalidate does, and drops this process's
// copies at once (the others drop theirs when the invalidated event
// reaches them). It needs the event stream (WithEvents). After Close has
// begun it is ErrClosed (wrapped). Close does not cancel one in flight but
// waits for it (its tombstone and its event, each within the op timeout):
// a tombstone written without its event would leave the other processes'
// copies of the labels in use. An error that says the event was not
// published (the caller's ctx ended, the stream did not answer) means
// that the tombstone is written: invalidate again.
func (c *Cache) Invalidate(ctx context.Context, tenant, model string, epoch uint64) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if len(c.s.tenants) > 0 && !slices.Contains(c.s.tenants, tenant) {
		return fmt.Errorf("%w: %q", ErrTenant, tenant)
	}
	l := c.eventLink()
	b := c.bucket()
	if l == nil || b == nil {
		return fmt.Errorf("%w: invalidation needs the bucket and the event stream", ErrStoreUnavailable)
	}
	// Not bound to the Cache's life (bind): a write Close cut short could
	// land all the same, and no one here would publish its event after
	// Close.
	octx, ocancel := c.opContext(ctx)
	e, err := writeTombstone(octx, b, c.owner, c.s.node, tenant, model, epoch, c.s.storeTTL)
	ocancel()
	if err != nil {
		return err
	}
	if h := c.s.tombstoneWritten; h != nil {
		h(c.life)
	}
	octx, ocancel = c.opContext(ctx)
	err = publishInvalidation(octx, l.pub, e)
	ocancel()
	if err != nil {
		return err
	}
	l.apply(*e)
	return nil
}
