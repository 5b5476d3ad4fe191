package coordinator

import (
	"context"
	"sync"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// eventLink connects a Cache to the event stream: it publishes what this
// process does and applies what concerns it: invalidations, and the
// evictions of values its node wrote (notices). It hears nothing of the
// other keys, so its traffic does not grow with the cluster.
type eventLink struct {
	c        *Cache
	pub      *events.Publisher
	sub      *events.Subscription
	notices  *events.NoticeSubscription
	interval time.Duration

	mu        sync.Mutex
	meta      map[localKey]*valueMeta   // values in the local cache; guarded by mu
	computing map[localKey]*computeMeta // computes between their reservation and their value's meta; guarded by mu
	heard     map[labels]uint64         // invalidated events applied, by tenant, model and epoch; guarded by mu
	heardAt   map[labels]time.Time      // the latest Time of those events; guarded by mu

	stop    chan struct{} // closed by close: ends tick
	flushed chan struct{} // closed when tick has returned
}

// valueMeta is what the event link knows of a local value, besides its
// key and labels (its localKey, which an invalidation matches): what a
// touched event needs, and when the copy's record is read again (its
// expiry, and whether it was hit since).
type valueMeta struct {
	value     *payload.Value // the copy it describes: a copy of the key evicted later (detached, released) forgets only its own
	loc       payload.Location
	lastTouch time.Time // when the last touched event was sent
	lastUse   time.Time // the last hit; after lastTouch: a touch is owed
	expires   time.Time // the copy's expiry: its record's, as last read
	hit       bool      // a local hit since the copy was made or its record last read
}

// computeMeta is a compute of this process that an invalidation must
// find before its value has a valueMeta: from before the reservation is
// sent until the value is published or the compute ends without one.
type computeMeta struct {
	n           int  // computes registered under the key (a Reservation beside a flight)
	invalidated bool // an invalidation of its model and epoch arrived meanwhile
	// exact: a compute under a lease, which reads its tombstone when
	// marked and drops its value if its reservation came first; a compute
	// without one (degraded) cannot tell, and its flight is discarded.
	exact bool
}

func (c *Cache) startEvents(ctx context.Context) error {
	stream, err := c.ensureEventStream(ctx)
	if err != nil {
		return err
	}
	interval := c.s.touchInterval
	if interval == 0 {
		interval = min(c.s.storeTTL/4, time.Minute)
	}
	l := &eventLink{c: c, pub: events.NewPublisher(c.js, events.PublisherOptions{Workers: 2, Queue: 4096, Logger: c.s.logger}), interval: interval,
		meta: make(map[localKey]*valueMeta), computing: make(map[localKey]*computeMeta), heard: make(map[labels]uint64),
		heardAt: make(map[labels]time.Time),
		stop:    make(chan struct{}), flushed: make(chan struct{})}
	onBad := func(r events.BadReason) {
		c.stats.eventsBad.Add(1)
		c.tel.EventBad(r)
	}
	handle := func(e events.Event) {
		c.stats.eventsDecoded.Add(1)
		c.tel.EventDecoded(e.Kind)
		l.apply(e)
	}
	// Invalidations reach everyone (one per weight update, not per value);
	// touches are the reconciler's; an eviction reaches the writer's node
	// alone, as a notice. Per tenant, the filter is in the consumer's
	// create subject, which per-tenant permissions can allow.
	// From this Cache's start (less two clock allowances: the leader stamps
	// the events by its clock), not from now: a copy made while the link
	// was not up (computed without the store, pulled or committed before
	// it came up) hears of the invalidations published meanwhile too.
	since := c.started.Add(-2 * c.s.clockAllowance) // this clock against the leader's: two allowances (3.1)
	opts := events.SubscribeOptions{Tenants: c.s.tenants, Kinds: []events.Kind{events.KindInvalidated},
		Since: since, Logger: c.s.logger, OnBad: onBad}
	sub, err := events.Subscribe(ctx, c.js, opts, func(e events.Event) error { handle(e); return nil })
	if err != nil {
		l.pub.Close(ctx)
		return err
	}
	notices, err := events.SubscribeNotices(c.nc, c.s.node, c.s.tenants, handle, onBad)
	if err != nil {
		sub.Stop()
		l.pub.Close(ctx)
		return err
	}
	l.sub, l.notices = sub, notices
	go l.tick()
	c.mu.Lock()
	c.events = l
	c.mu.Unlock()
	// The stream may not hold every event since then: then no copy made so
	// far can be proven current, and they go, and so do the flights in
	// progress (their values are still their callers').
	if !holdsSince(stream.CachedInfo(), since) {
		c.local.Invalidate(func(localKey, *payload.Value) bool { return true }, localcache.CauseStore)
		return nil
	}
	// A copy made before the link came up is unknown to it (no notes): its
	// hits would send no touch and its record would not be read before it
	// ends. It goes, and is pulled again, with its notes; a flight in
	// progress is left to the replay.
	c.local.Invalidate(func(k localKey, v *payload.Value) bool { return v != nil && !l.notes(k, v) }, localcache.CauseStore)
	return nil
}

// notes reports whether the link has notes of v, the copy of k.
func (l *eventLink) notes(k localKey, v *payload.Value) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.meta[k]
	return m != nil && m.value == v
}

// holdsSince reports whether a stream of info holds every event it
// stamped since since: it was made before, since is within its MaxAge, and
// it has discarded none of them (it discards its oldest events only when
// full: a stream near its MaxBytes whose oldest event is after since may
// have).
func holdsSince(info *jetstream.StreamInfo, since time.Time) bool {
	if info == nil || info.Created.After(since) || time.Since(since) >= info.Config.MaxAge-time.Hour {
		return false
	}
	full := info.Config.MaxBytes > 0 && info.State.Bytes >= uint64(info.Config.MaxBytes)/10*9
	return !full || !info.State.FirstTime.After(since)
}

// labels are what an invalidation names: a tenant's model and epoch.
type labels struct {
	tenant, model string
	epoch         uint64
}

// invalidationsHeard is how many invalidated events of ref's labels this
// process has applied, or -1 without an event link: a pull that read its
// record after taking it serves its value only if it is unchanged (a
// tombstone read from a lagging replica, in tenant mode, does not see an
// invalidation whose event has already arrived).
func (c *Cache) invalidationsHeard(ref Ref) int64 {
	l := c.eventLink()
	if l == nil {
		return -1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.heard[labels{ref.Tenant, ref.Model, ref.Epoch}])
}

// invalidationHeardAt is the Time of the latest invalidated event of
// ref's labels this process has applied, while its tombstone surely lives:
// every tombstone read of those labels must reflect it
// (lease.Bucket.Invalidated). The tombstone's TTL is the invalidator's
// (from its store TTL), so the shortest a tombstone lives is what counts,
// less two clock allowances (the event's Time is the invalidator's clock):
// after that a read that finds none may be right. Zero without one, or
// without an event link.
func (c *Cache) invalidationHeardAt(ref Ref) time.Time {
	l := c.eventLink()
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := labels{ref.Tenant, ref.Model, ref.Epoch}
	at := l.heardAt[k]
	if !at.IsZero() && c.s.clock.Now().Sub(at) > lease.TombstoneTTL(0)-2*c.s.clockAllowance {
		delete(l.heardAt, k)
		return time.Time{}
	}
	return at
}

func (c *Cache) eventLink() *eventLink {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events
}

func (l *eventLink) event(kind events.Kind, ref Ref) *events.Event {
	return &events.Event{Kind: kind, Tenant: ref.Tenant, Key: ref.Key,
		Model: ref.Model, Epoch: ref.Epoch, Node: l.c.s.node, Time: time.Now()}
}

// published records a value this process committed, and announces it.
func (l *eventLink) published(ref Ref, v *payload.Value, loc payload.Location, expires time.Time) {
	l.mu.Lock()
	l.meta[ref.local()] = &valueMeta{value: v, loc: loc, lastTouch: time.Now(), expires: expires}
	l.mu.Unlock()
	e := l.event(events.KindPublished, ref)
	e.Location, e.Expires = &loc, expires
	l.pub.Publish(e)
}

// startCompute records a compute of ref about to reserve it (exact) or
// to run without the store. Registered before the reservation is sent, it
// is found by every invalidation whose tombstone the reservation may
// precede: such an invalidation's event comes after its tombstone, which
// comes after the reservation. The returned end unregisters it and
// reports whether an invalidation of its model and epoch arrived
// meanwhile; call it after the value is noted (its valueMeta then covers
// it), or when the compute ends without one.
func (l *eventLink) startCompute(ref Ref, exact bool) (end func() (invalidated bool)) {
	k := ref.local()
	l.mu.Lock()
	m := l.computing[k]
	if m == nil {
		m = &computeMeta{exact: true}
		l.computing[k] = m
	}
	m.exact = m.exact && exact
	m.n++
	l.mu.Unlock()
	var once sync.Once
	var invalidated bool
	return func() bool {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			invalidated = m.invalidated
			if m.n--; m.n == 0 {
				delete(l.computing, k)
			}
		})
		return invalidated
	}
}

// noteAt records a value this process pulled from loc, named by a record
// that expires at expires: an invalidation of its model and epoch finds
// it, and its hits are touches. The pull is a use, whose touch is owed
// like a hit's (sent at the interval's end with the pull's time, with the
// hits since): one touch per key per interval, pulls included. A record
// that may end before that touch is applied (within two intervals) is
// touched at once.
func (l *eventLink) noteAt(ref Ref, v *payload.Value, loc payload.Location, expires time.Time) {
	m := &valueMeta{value: v, loc: loc, expires: expires}
	if now := time.Now(); expires.Sub(now) > 2*l.interval {
		m.lastTouch = now
	}
	l.mu.Lock()
	l.meta[ref.local()] = m
	l.mu.Unlock()
}

// note records a value this process holds with no record (computed
// without the store, or a commit refused): an invalidation of its model
// and epoch finds it; it has nothing to touch.
func (l *eventLink) note(ref Ref, v *payload.Value) {
	l.mu.Lock()
	l.meta[ref.local()] = &valueMeta{value: v}
	l.mu.Unlock()
}

// touched announces a hit, at most once per key per interval: the
// reconciler extends the store TTL. A hit inside the interval is owed a
// touch, which tick sends at the interval's end with that hit's
// expiry: an unused value goes one store TTL after its last use, not
// after its last touch.
// A local hit (hit) also marks the copy in use, so it follows its record
// past its expiry; a pull alone does not.
func (l *eventLink) touched(k localKey, hit bool) {
	now := time.Now()
	l.mu.Lock()
	m := l.meta[k]
	if m == nil || m.loc.Transport == "" { // unknown, or no record to touch
		l.mu.Unlock()
		return
	}
	m.lastUse = now
	m.hit = m.hit || hit
	if now.Sub(m.lastTouch) < l.interval {
		l.mu.Unlock()
		return
	}
	m.lastTouch = now
	e := l.touchLocked(k, m, now)
	l.mu.Unlock()
	l.publishTouch(e)
}

// touchLocked is the touched event of k's use at used.
func (l *eventLink) touchLocked(k localKey, m *valueMeta, used time.Time) *events.Event {
	e := l.event(events.KindTouched, k.ref())
	loc := m.loc
	e.Location, e.Expires = &loc, used.Add(l.c.s.storeTTL)
	return e
}

func (l *eventLink) publishTouch(e *events.Event) {
	l.c.stats.touches.Add(1)
	l.pub.Publish(e)
}

// tick looks four times per interval for the touches owed and the copies
// to refresh. A touch owed (a value hit since its last touched event,
// whose interval has passed) goes out at most a quarter interval late;
// the interval is at most a quarter of the store TTL, so its record still
// lives. A copy in use whose expiry is less than an interval away has its
// record read (refreshCopy), once per expiry; copies past their expiry
// leave the local cache.
func (l *eventLink) tick() {
	defer close(l.flushed)
	t := time.NewTicker(max(l.interval/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		var owed []*events.Event
		var due []copyDue
		expired := false
		l.mu.Lock()
		for k, m := range l.meta {
			expired = expired || (!m.expires.IsZero() && now.After(m.expires))
			if m.lastUse.After(m.lastTouch) && now.Sub(m.lastTouch) >= l.interval {
				m.lastTouch = now
				owed = append(owed, l.touchLocked(k, m, m.lastUse))
			}
			if m.loc.Transport != "" && !m.expires.IsZero() && m.expires.Sub(now) < l.interval && m.hit {
				m.hit = false
				due = append(due, copyDue{key: k, checksum: m.loc.Checksum, expires: m.expires})
			}
		}
		l.mu.Unlock()
		if expired {
			l.c.local.Sweep() // out of the index, not only expired
		}
		for _, e := range owed {
			l.publishTouch(e)
		}
		// A few at once: copies pulled together come due together, and
		// each read may wait out the op timeout during a leader election.
		sem := make(chan struct{}, refreshReaders)
		var reads sync.WaitGroup
		for _, d := range due {
			select {
			case <-l.stop:
				reads.Wait()
				return
			case sem <- struct{}{}:
			}
			reads.Go(func() {
				defer func() { <-sem }()
				l.c.refreshCopy(d)
			})
		}
		reads.Wait()
	}
}

// refreshReaders is how many copies' records tick reads at once.
const refreshReaders = 8

// extended records that k's copy now expires at expires.
func (l *eventLink) extended(k localKey, expires time.Time) {
	l.mu.Lock()
	if m := l.meta[k]; m != nil && expires.After(m.expires) {
		m.expires = expires
	}
	l.mu.Unlock()
}

func (l *eventLink) abandoned(ref Ref, cause error) {
	e := l.event(events.KindAbandoned, ref)
	e.Reason = cause.Error()
	l.pub.Publish(e)
}

// forget drops the metadata of a value that left the local cache.
func (l *eventLink) forget(k localKey, v *payload.Value) {
	l.mu.Lock()
	if m := l.meta[k]; m != nil && m.value == v {
		delete(l.meta, k)
	}
	l.mu.Unlock()
}

func (l *eventLink) close(ctx context.Context) {
	close(l.stop)
	<-l.flushed
	l.notices.Stop()
	l.sub.Stop()
	l.pub.Close(ctx)
}
