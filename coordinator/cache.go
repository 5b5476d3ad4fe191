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

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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

	uncommitted *uncommittedSet // payloads put whose commit did not land (uncommitted.go)

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
	c := &Cache{s: s, started: time.Now(), leases: make(map[*lease.Lease]struct{}), settled: make(chan struct{}, 1), shut: make(chan struct{}),
		uncommitted: newUncommittedSet()}
	c.life, c.endLife = context.WithCancelCause(context.Background())
	c.obs = observations{c}
	local, err := localcache.New(localcache.Options[localKey, *payload.Value]{
		Budget:         s.local,
		ComputeTimeout: s.computeTimeout,
		Expiry:         c.recordExpiry,
		OnEvict: func(k localKey, v *payload.Value, cause localcache.Cause) {
			v.Close()
			c.obs.evicted(k, v, cause)
		},
	})
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
			return nil, fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, serverNames(nc), err)
		}
		s.logger.Warn("embcache: store unreachable, computing locally until it is back",
			"servers", serverNames(nc), "err", err)
		c.bg.Go(c.reconnectLoop)
	}
	c.bg.Go(c.uncommittedLoop)
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
		return nil, fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, url, err)
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
			// Not the bucket's fault, and the error says so: the
			// bucket's own deadline error points at the bucket.
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
	c.leaveUncommitted()
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
