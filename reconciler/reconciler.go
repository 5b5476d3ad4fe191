package reconciler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/telemetry"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ElectionKey is the KV key the reconcilers elect their active one on.
// It has no '.', so it can never be a tenant's key.
const ElectionKey = "_reconciler"

// Durable is the durable consumer the active reconciler reads events
// with; a successor resumes where its predecessor acknowledged.
const Durable = "embcache-reconciler"

// ScopeName is the instrumentation scope of the package's metrics.
const ScopeName = "github.com/embcache/embcache/reconciler"

// Reconciler keeps the bucket in step with the events (see the package
// docs). Run any number; one is active at a time.
type Reconciler struct {
	s     settings
	nc    *nats.Conn
	js    jetstream.JetStream
	id    string
	stats counters
	tel   *instruments
}

type counters struct {
	elected  atomic.Uint64
	actions  [numActions]atomic.Uint64
	discards [numDiscards]atomic.Uint64
	active   atomic.Bool
}

// action is something the active reconciler does: its Stats and the
// embcache.reconciler.actions metric count each.
type action uint8

// Actions.
const (
	actionExtend          action = iota // a touch extended a committed record's TTL
	actionLateExtend                    // an extension acknowledged after the record's expiry: not trusted
	actionExpire                        // a value whose record expired was evicted (evicted event sent)
	actionInvalidate                    // a committed record removed by an invalidation
	actionDeletePayload                 // a payload removed
	actionSweep                         // a pass over the values the events know, done (after a gap in the markers)
	actionMoveLeader                    // a lease shard's leader asked to move to a server that leads fewer
	actionForeignLocation               // an eviction not announced: the record named another key's payload
	actionPurgeBad                      // a bad record at a value's key, older than a lease TTL, purged
	actionRestore                       // a committed record's location, which the event stream had no event of, published from the bucket
	actionRestoreSweep                  // a pass over the bucket's committed records for their locations, done
	numActions
)

var actionNames = [numActions]string{"extend", "late_extend", "expire", "invalidate", "delete_payload", "sweep", "move_leader", "foreign_location",
	"purge_bad", "restore", "restore_sweep"}

// String returns the action's name as the metrics label it.
func (a action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// did counts one action.
func (r *Reconciler) did(a action) {
	r.stats.actions[a].Add(1)
	r.tel.actions.Add(context.Background(), 1, actionAttrs[a])
}

// Stats counts what a reconciler did.
type Stats struct {
	Elected        uint64 // times it became active
	Touches        uint64 // record TTLs extended
	LateTouches    uint64 // touches acknowledged after the record's expiry: not trusted
	Expired        uint64 // expired records evicted
	Invalidated    uint64 // records removed by invalidations
	PayloadDeletes uint64 // payloads removed
	Sweeps         uint64 // passes over every value the events know, finished
	LeaderMoves    uint64 // lease shard leaders asked to move (SpreadLeaders)
	// ForeignLocations counts evictions not announced, and payloads not
	// deleted, because the record named another key's payload (a bug or a
	// forged write).
	ForeignLocations uint64
	// BadRecordsPurged counts records at values' keys that did not decode
	// (or held a state such a key does not hold), purged once older than a
	// lease TTL.
	BadRecordsPurged uint64
	// Restored counts committed records whose location the event stream
	// held no event of (a published event lost, or discarded by the
	// stream's limit), published again from the bucket; RestoreSweeps the
	// passes over the bucket that looked for them, finished.
	Restored      uint64
	RestoreSweeps uint64
	// DiscardingLive counts the looks at the event stream that found it
	// discarding events a live value may need (at its MaxBytes, its oldest
	// event younger than a store TTL); DiscardedUnread the terms that
	// started with events the reconciler had not read discarded.
	DiscardingLive  uint64
	DiscardedUnread uint64
	Active          bool
}

// New returns a reconciler over nc (which the caller keeps and closes).
// Run starts it. The error wraps ErrInvalidOption for a bad option.
func New(nc *nats.Conn, opts ...Option) (*Reconciler, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	s := defaults()
	for _, opt := range opts {
		if err := opt(&s); err != nil {
			return nil, err
		}
	}
	a, err := lease.ClockAllowance(s.leaseTTL, s.allowance)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	s.allowance = a
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	tel, err := newInstruments(s.meterProvider)
	if err != nil {
		return nil, err
	}
	var nonce [4]byte
	for i := range nonce {
		nonce[i] = byte(time.Now().UnixNano() >> (8 * i))
	}
	return &Reconciler{s: s, nc: nc, js: js, id: fmt.Sprintf("%s/reconciler/%x", s.node, nonce), tel: tel}, nil
}

// Stats returns the counters.
func (r *Reconciler) Stats() Stats {
	n := func(a action) uint64 { return r.stats.actions[a].Load() }
	return Stats{Elected: r.stats.elected.Load(), Touches: n(actionExtend), LateTouches: n(actionLateExtend),
		Expired: n(actionExpire), Invalidated: n(actionInvalidate),
		PayloadDeletes: n(actionDeletePayload), Sweeps: n(actionSweep), LeaderMoves: n(actionMoveLeader),
		ForeignLocations: n(actionForeignLocation), BadRecordsPurged: n(actionPurgeBad),
		Restored: n(actionRestore), RestoreSweeps: n(actionRestoreSweep),
		DiscardingLive: r.stats.discards[discardLive].Load(), DiscardedUnread: r.stats.discards[discardUnread].Load(),
		Active: r.stats.active.Load()}
}

// Run campaigns and, while elected, reconciles; it returns when ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
		b, err := r.bucket(ctx)
		if err == nil {
			var from resumePoint
			var el *lease.Lease
			from, err = r.resumeFrom(ctx, b)
			if err == nil {
				el, err = r.campaign(ctx, b)
			}
			if err == nil {
				r.stats.elected.Add(1)
				r.stats.active.Store(true)
				r.tel.elections.Add(ctx, 1)
				r.tel.active.Add(ctx, 1)
				r.s.logger.Info("embcache: reconciler active", "id", r.id)
				r.ensureRepublish(ctx, b)
				r.ensureLimits(ctx)
				err = r.active(ctx, b, el, from)
				r.stats.active.Store(false)
				r.tel.active.Add(context.WithoutCancel(ctx), -1)
				el.Stop()
				if ctx.Err() == nil {
					r.s.logger.Warn("embcache: reconciler stepped down", "id", r.id, "err", err)
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, lease.ErrHeld) && !errors.Is(err, lease.ErrLost) {
			r.s.logger.Debug("embcache: reconciler waiting", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.s.leaseTTL / 3):
		}
	}
}

// bucket makes sure the event stream and the bucket exist, and binds the
// bucket.
func (r *Reconciler) bucket(ctx context.Context) (*lease.Bucket, error) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if _, err := events.EnsureStream(octx, r.js, r.streamConfig()); err != nil {
		return nil, err
	}
	return lease.OpenBucket(octx, r.nc, lease.BucketConfig{Name: r.s.bucket, Replicas: r.s.replicas, MarkerTTL: r.s.markerTTL, Shards: r.s.shards})
}

// ensureRepublish gives a bucket of an earlier version the republishing
// its waiters listen to (the operator's process has the right to update
// it). Once per term, not per campaign: a standby would check every few
// seconds, and warn as often.
func (r *Reconciler) ensureRepublish(ctx context.Context, b *lease.Bucket) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if err := b.EnsureRepublish(octx, true); err != nil {
		r.s.logger.Warn("embcache: waiters will poll", "err", err)
	}
}

// streamConfig is what the reconciler asks of the event stream.
func (r *Reconciler) streamConfig() events.StreamConfig {
	cfg := r.s.stream
	cfg.Replicas = r.s.replicas
	return cfg
}

// ensureLimits gives the event stream the MaxBytes this reconciler was
// given (WithEventsMaxBytes), once per term: its process is the
// operator's, which may update the stream (docs/protocol.md 4).
func (r *Reconciler) ensureLimits(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	switch changed, err := events.EnsureLimits(octx, r.js, r.streamConfig(), true); {
	case err != nil:
		r.s.logger.Warn("embcache: the event stream's limits not set", "max_bytes", r.s.stream.MaxBytes, "err", err)
	case changed:
		r.s.logger.Info("embcache: the event stream's limits set", "max_bytes", r.s.stream.MaxBytes)
	}
}

// campaign tries once to take the election key: the election is a lease
// like any key's, held while this reconciler is active.
func (r *Reconciler) campaign(ctx context.Context, b *lease.Bucket) (*lease.Lease, error) {
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: r.id, Nonce: r.id, Started: now, Heartbeat: now}
	return lease.Acquire(ctx, b, ElectionKey, rec, lease.Config{TTL: r.s.leaseTTL, OpTimeout: r.s.opTimeout, Clock: r.s.clock, ClockAllowance: r.s.allowance})
}

// active reconciles until the lease is lost or ctx ends. It keeps nothing
// per value: what it needs of a value it reads from the stream when it
// needs it (events.Latest), so its memory grows with the work in hand,
// not with the records. It follows the bucket from since (as far as the
// previous active one's loop got: resumeFrom): the markers placed
// meanwhile are still in the bucket if that is less than a marker TTL
// ago; otherwise (or since unknown, or a sweep left unfinished) it sweeps
// every value the events know once.
func (r *Reconciler) active(ctx context.Context, b *lease.Bucket, el *lease.Lease, from resumePoint) error {
	since := from.since
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-el.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	evs, err := r.js.Stream(ctx, events.StreamName)
	if err != nil {
		return err
	}
	pub := events.NewPublisher(r.js, 1, 1024, r.s.logger)
	defer pub.Close(context.Background())
	x := &expirer{r: r, b: b, pub: pub, events: evs}
	// Before the durable consumer is handed anything: it then skips what
	// the stream no longer holds.
	r.checkUnread(ctx, evs)
	work := make(chan func(), 256)
	sub, err := events.Subscribe(ctx, r.js, events.SubscribeOptions{Durable: Durable, Logger: r.s.logger, OnBad: r.tel.EventBad},
		func(e events.Event) error {
			r.tel.EventDecoded(e.Kind)
			var fn func()
			var ferr error // fn's: set before applied is closed
			switch e.Kind {
			case events.KindTouched:
				fn = func() { r.applyTouch(ctx, b, e) }
			case events.KindInvalidated:
				fn = func() { ferr = r.applyInvalidation(ctx, x, e) }
			default:
				return nil
			}
			// Acknowledged once applied, not once queued: a reconciler that
			// steps down with it queued hands it back, and its successor,
			// which resumes the durable consumer, applies it (both apply
			// again harmlessly).
			applied := make(chan struct{})
			select {
			case work <- func() { fn(); close(applied) }:
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case <-applied:
				if ferr != nil {
					return ferr // handed back: applied again in a second
				}
			case <-ctx.Done():
			}
			return ctx.Err() // stepping down meanwhile: fn may have stopped short
		})
	if err != nil {
		return err
	}
	defer sub.Stop()
	sweep := since.IsZero() || r.tooFarBehind(time.Since(since))
	start := since
	if sweep {
		start = time.Now()
	}
	changes, stop, err := watchBucket(ctx, r.js, b, start)
	if err != nil {
		return err
	}
	defer stop()
	// The loop's progress, for a successor, and the sweeps: beside the
	// loop, not before it (a sweep of a million values takes minutes, and
	// the markers placed meanwhile must be read before their own TTL ends
	// them). The loop ends when ctx does, and so do they.
	var beside sync.WaitGroup
	defer beside.Wait()
	marks := newTracker(r, b, func(ctx context.Context) (bool, error) { return r.holds(ctx, b, el) }, start, sweep, from.rev,
		func(ctx context.Context) bool { return r.sweep(ctx, x) })
	marks.floor = from.handled
	beside.Go(func() { marks.run(ctx) })
	beside.Go(func() { r.purgeBadRecords(ctx, x) })
	beside.Go(func() { r.keepLocations(ctx, x) })
	r.spreadLeaders(ctx, b)
	spread := time.NewTicker(spreadEvery)
	defer spread.Stop()
	for {
		select {
		case <-ctx.Done():
			return el.Err()
		case <-spread.C:
			r.spreadLeaders(ctx, b)
		case fn := <-work:
			fn()
		case c := <-changes:
			m := c.msg
			key, _ := lease.KeyOfSubject(m.Subject())
			h := m.Headers()
			switch {
			case !strings.Contains(key, "."): // the election's, or another key of no value
			case h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "":
				if !r.expireOrRetry(ctx, x, key, lease.PurgeCause(m.Data())) && ctx.Err() == nil {
					marks.owe() // a sweep finds the value: its record is gone
				}
			default:
				if _, err := lease.DecodeRecord(key, m.Data()); err != nil {
					r.tel.RecordBad(err, telemetry.OpWatch)
					x.bad.add(key) // purged once old, if nobody writes the key again
				}
			}
			if ctx.Err() == nil {
				// Handled in full: one cut short by the step-down (a read
				// refused as canceled) is its successor's to handle.
				marks.done(c.shard, m)
			}
		}
	}
}

// holds reports whether this reconciler holds the election: its lease is
// not lost, and the election key's record is its own (a process stalled
// past its lease's end has not noticed yet; the key says). An error is a
// key that could not be read: the question stays open.
func (r *Reconciler) holds(ctx context.Context, b *lease.Bucket, el *lease.Lease) (bool, error) {
	if el.Err() != nil {
		return false, nil
	}
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cur, err := b.Read(octx, ElectionKey)
	if err != nil {
		return false, err
	}
	return cur.Live && cur.Record.Owner == r.id, nil
}

// spreadEvery is how often the active reconciler looks whether the lease
// shards' leaders share servers (after a server's restart they gather on
// the others).
const spreadEvery = 5 * time.Minute

// spreadLeaders moves lease shard leaders that share a server to servers
// that lead fewer (lease.Bucket.SpreadLeaders).
func (r *Reconciler) spreadLeaders(ctx context.Context, b *lease.Bucket) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	moved, err := b.SpreadLeaders(octx)
	for range moved {
		r.did(actionMoveLeader)
	}
	if err != nil {
		r.s.logger.Warn("embcache: lease shard leaders not spread", "err", err)
	} else if moved > 0 {
		r.s.logger.Info("embcache: lease shard leaders spread", "moved", moved)
	}
}

// watchBucket delivers every message of the bucket's shards' streams from
// start on, in order within each shard (an ordered consumer per shard,
// which resumes where it was after a stall or a leader change), until
// stop.
func watchBucket(ctx context.Context, js jetstream.JetStream, b *lease.Bucket, start time.Time) (<-chan shardMsg, func(), error) {
	ch := make(chan shardMsg, 256)
	quit := make(chan struct{}) // closed by stop: a handler waiting on ch gives up
	var running []jetstream.ConsumeContext
	stop := func() {
		close(quit)
		for _, cc := range running {
			cc.Stop()
			<-cc.Closed()
		}
	}
	for shard, kv := range b.Shards() {
		cons, err := js.OrderedConsumer(ctx, "KV_"+kv.Bucket(), jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
		if err != nil {
			stop()
			return nil, nil, err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case ch <- shardMsg{shard, m}:
			case <-quit:
			}
		})
		if err != nil {
			stop()
			return nil, nil, err
		}
		running = append(running, cc)
	}
	return ch, stop, nil
}

// expireRetries is how often the loop tries a marker's eviction that
// gave up (a read failed: a leader election) before it leaves the value
// to a sweep, expireBackoff the first wait between two (doubling).
const (
	expireRetries = 3
	expireBackoff = 100 * time.Millisecond
)

// expireOrRetry handles a marker's eviction, trying again a few times
// (the loop waits meanwhile: the markers behind it are in order) while
// it gives up; false if it never finished.
func (r *Reconciler) expireOrRetry(ctx context.Context, x *expirer, key string, cause events.Cause) bool {
	for attempt := 0; ; attempt++ {
		if x.expire(ctx, key, cause, nil) {
			return true
		}
		if attempt == expireRetries-1 {
			return false
		}
		select {
		case <-time.After(expireBackoff << attempt):
		case <-ctx.Done():
			return false
		}
	}
}

// shardMsg is a message of one of the bucket's shards' streams.
type shardMsg struct {
	shard int
	msg   jetstream.Msg
}

// applyTouch extends the committed record's TTL to the touch's expiry.
// Replaying a touch changes nothing: the record already lives that long.
func (r *Reconciler) applyTouch(ctx context.Context, b *lease.Bucket, e events.Event) {
	key := lease.ValueKey(e.Tenant, e.Key)
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cur, err := r.read(octx, b, key)
	if err != nil || !cur.Live || cur.Record.State != lease.StateCommitted || e.Location == nil ||
		cur.Record.Checksum != e.Location.Checksum.String() || !e.Expires.After(cur.Record.Expires) {
		return
	}
	if stale, err := b.Invalidated(octx, key, cur.Record, time.Time{}); err != nil || stale {
		return // an invalidated value is not kept alive (docs/protocol.md 4.4)
	}
	// The record may expire at its own expiry (set by its writer's clock
	// when it was written, before it was sent), less two clock allowances
	// (lease.Record.MayHaveExpired): a touch answered after that may be
	// wiped by the server's TTL marker, so it is not counted as applied,
	// and one sent after it is not sent at all. The record then expires as
	// unused.
	deadline := cur.Record.Expires.Add(-2 * r.s.allowance)
	now := r.s.clock.Now()
	ttl := e.Expires.Sub(now)
	if !now.Before(deadline) || ttl < time.Second {
		return
	}
	if ttl > events.MaxStoreTTL {
		// By this clock, not the event's own time (its sender's to say):
		// no store TTL is that long, and a record that outlived its last
		// event in the stream would never be announced.
		r.s.logger.Warn("embcache: touch past the longest store TTL, not applied", "key", key, "expires", e.Expires)
		return
	}
	rec := cur.Record
	rec.Expires = e.Expires
	// Nor sent again past it (a write refused while another is in flight
	// is resent until its context ends).
	cctx, ccancel := context.WithTimeout(octx, deadline.Sub(now))
	_, err = b.CompareAndSet(cctx, key, cur.Rev, rec, ttl)
	ccancel()
	if err != nil {
		return
	}
	if !r.s.clock.Now().Before(deadline) {
		r.did(actionLateExtend)
		r.s.logger.Warn("embcache: touch acknowledged after the record's expiry, not trusted", "key", key)
		return
	}
	r.did(actionExtend)
}

// read reads key, counting a record that does not decode.
func (r *Reconciler) read(ctx context.Context, b *lease.Bucket, key string) (lease.Entry, error) {
	cur, err := b.Read(ctx, key)
	if errors.Is(err, lease.ErrBadRecord) {
		r.tel.RecordBad(err, telemetry.OpRead)
	}
	return cur, err
}

// expirer announces evictions: the active reconciler's bucket, publisher
// and event stream.
type expirer struct {
	r      *Reconciler
	b      *lease.Bucket
	pub    *events.Publisher
	events jetstream.Stream
	// keys serializes expire per key (striped): the sweep and the bucket's
	// markers may both come upon one value, and the second must see the
	// first's evicted event.
	keys [64]sync.Mutex
	bad  badRecords // met by the loop or a sweep, to purge once old
}

// expire removes what is left of a value whose record is gone and
// announces it, once per value: an evicted event, and a notice to the
// node that wrote the payload. What the value was (its location, model and
// epoch) comes from its last published or touched event; a key whose last
// such event is followed by an evicted one (announced already; an
// abandoned one ends nothing: events.Latest), or whose record names that
// value again (committed since the message that sent us here), has
// nothing to evict. known, if set,
// stands in for a value the stream has no event of (a record the
// reconciler purged itself). A payload found corrupt is left to the reader
// that found it (its store removes a corrupt file; a recompute may
// already have put the value back). It reports whether it finished:
// false if it gave up (a read or the publish failed, or the step-down cut
// its delete short), for the caller to try again or to sweep.
func (x *expirer) expire(ctx context.Context, kvKey string, cause events.Cause, known *events.Entry) (finished bool) {
	r := x.r
	tenant, hexKey, ok := strings.Cut(kvKey, ".")
	key, err := cachekey.Parse(hexKey)
	if !ok || err != nil {
		return true // no value's key
	}
	mu := &x.keys[key[0]%byte(len(x.keys))]
	mu.Lock()
	defer mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	entry, live, found, err := events.Latest(octx, x.events, tenant, key)
	cancel()
	if err != nil {
		r.s.logger.Warn("embcache: eviction not announced: the value's events are unreadable", "key", kvKey, "err", err)
		return false
	}
	if !found && known != nil {
		entry, live = *known, true
	}
	if !live {
		return true
	}
	// What the delete may remove is the payload as it is before the record
	// is read: a compute of the key that puts the same bytes after the
	// read (and commits them) gives it another generation.
	obj := payload.ObjectID{Tenant: tenant, Key: key}
	var seen payload.Generation
	if entry.Location.Names(obj) {
		if seen, err = r.payloadGeneration(ctx, entry.Location); err != nil {
			r.s.logger.Warn("embcache: eviction not announced: the payload's generation is unreadable", "key", kvKey, "err", err)
			return false
		}
	}
	// The message that sent us here may be older than the value's last
	// events: a purge's marker read after the key was committed again.
	// The value is gone only if no record names it now.
	octx, cancel = context.WithTimeout(ctx, r.s.opTimeout)
	cur, err := r.read(octx, x.b, kvKey)
	cancel()
	if err != nil {
		r.s.logger.Warn("embcache: eviction not announced: the record is unreadable", "key", kvKey, "err", err)
		return false
	}
	if cur.Live && cur.Record.State == lease.StateCommitted && cur.Record.Checksum == entry.Location.Checksum.String() {
		return true
	}
	loc := entry.Location
	if !loc.Names(obj) {
		// A record's own location (known) is not checked when it is
		// decoded: one naming another key's payload must not get that
		// payload deleted (events are checked as they decode).
		r.did(actionForeignLocation)
		r.s.logger.Warn("embcache: eviction not announced: the location names another key's payload", "key", kvKey, "location", loc.Object)
		return true
	}
	// A payload found corrupt is its reader's to remove. A key being
	// computed again may put the same bytes under the same name (keys are
	// content addresses) before it commits: the old value's eviction is
	// announced, but the file is left to the new value (to the node's
	// payload sweep if its compute fails), and its node is not told to
	// delete it.
	deletes := cause != events.CauseCorrupt && !(cur.Live && cur.Record.State == lease.StateComputing)
	ev := &events.Event{Kind: events.KindEvicted, Tenant: tenant, Key: key, Model: entry.Model, Epoch: entry.Epoch,
		Node: r.s.node, Time: time.Now(), Cause: cause, Location: &loc}
	if deletes && !r.deletePayload(ctx, loc, seen, kvKey) {
		// Announced, the eviction would be done, and the payload would
		// stay: nothing removes a Mooncake object later, and a delete
		// fails while a reader holds the object. Left unannounced, the
		// value is tried again (a marker's a few times, then by a sweep;
		// a successor's, if this is cut short by the step-down).
		return false
	}
	// Published even if this reconciler is stepping down meanwhile: its
	// payload is deleted already. (A successor that handles the same
	// marker again finds the eviction announced and stops.)
	octx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.s.opTimeout)
	defer cancel()
	if err := x.pub.PublishSync(octx, ev); err != nil {
		r.s.logger.Warn("embcache: evicted event not published", "key", kvKey, "err", err)
		return false
	}
	if cause == events.CauseExpired {
		r.did(actionExpire) // counted once announced
	}
	// The writer's node deletes its payload and its processes drop their
	// copies; nobody else hears of it (copies elsewhere end with their
	// record, files there go with their node's sweep).
	if deletes && loc.Node != "" {
		if err := events.Notify(r.nc, ev); err != nil {
			r.s.logger.Warn("embcache: eviction notice not sent", "key", kvKey, "node", loc.Node, "err", err)
		}
	}
	return true
}

// deleter returns the Deleter of a payload this reconciler can reach:
// its own node's, or a shared store's (Mooncake); nil for another node's,
// which that node removes when the notice reaches it.
func (r *Reconciler) deleter(loc payload.Location) Deleter {
	t := r.s.deleters[loc.Transport]
	if t == nil || (loc.Node != r.s.node && loc.Transport != payload.TransportMooncake) {
		return nil
	}
	return t
}

// payloadGeneration reads the generation of the payload at loc, if this
// reconciler deletes it.
func (r *Reconciler) payloadGeneration(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	t := r.deleter(loc)
	if t == nil {
		return payload.Generation{}, nil
	}
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	return t.Generation(octx, loc)
}

// deletePayload removes a payload this reconciler can reach (deleter) if
// it is still in generation seen; false if that delete failed.
func (r *Reconciler) deletePayload(ctx context.Context, loc payload.Location, seen payload.Generation, kvKey string) (ok bool) {
	t := r.deleter(loc)
	if t == nil {
		return true // not this reconciler's to delete
	}
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if err := t.Delete(octx, loc, seen); err != nil {
		if ctx.Err() == nil {
			r.s.logger.Warn("embcache: eviction not announced: its payload delete failed", "key", kvKey, "transport", loc.Transport, "err", err)
		}
		return false
	}
	r.did(actionDeletePayload)
	return true
}

// sweepReaders is how many records a sweep reads at once.
const sweepReaders = 16

// sweep evicts every value the events call live whose record is gone: the
// markers of the time no reconciler ran may be gone too. It reads the
// last published and touched event of every value once, one batch at a
// time, and each one's record (sweepReaders at once); it holds nothing of
// them.
func (r *Reconciler) sweep(ctx context.Context, x *expirer) (done bool) {
	keys := make(chan string, sweepReaders)
	var wg sync.WaitGroup
	var unfinished atomic.Int64 // values whose record or eviction it could not settle
	for range sweepReaders {
		wg.Go(func() {
			for key := range keys {
				octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
				cur, err := r.read(octx, x.b, key)
				cancel()
				switch {
				case errors.Is(err, lease.ErrBadRecord):
					// It exists: its value is not gone (counted as bad by
					// read). Purged once old, beside the sweeps.
					x.bad.add(key)
				case err != nil:
					unfinished.Add(1)
				case cur.Live && cur.Record.State == lease.StateCommitted:
					// Its value lives (expire tells a committed record of
					// other bytes from the value the events name).
				case !x.expire(ctx, key, events.CauseExpired, nil):
					// A record gone, or a compute of the key again (live,
					// computing): the value the events name is gone.
					unfinished.Add(1)
				}
			}
		})
	}
	skipped, err := events.Scan(ctx, r.js, []events.Kind{events.KindPublished, events.KindTouched}, func(e events.Event) {
		select {
		case keys <- lease.ValueKey(e.Tenant, e.Key):
		case <-ctx.Done():
		}
	})
	close(keys)
	wg.Wait()
	if skipped > 0 {
		// The durable consumer counts them as it reaches them.
		r.s.logger.Warn("embcache: sweep skipped events that do not decode", "skipped", skipped)
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		r.s.logger.Warn("embcache: sweep ended early", "err", err)
	case unfinished.Load() > 0:
		r.s.logger.Warn("embcache: sweep left values unsettled (a read failed), to the next one", "values", unfinished.Load())
	default:
		r.did(actionSweep) // counted when done
		return true
	}
	return false
}

// applyInvalidation removes every committed record (and payload) of the
// event's tenant, model and epoch reserved before its tombstone in the
// record's shard (every one, in a shard without a tombstone: an older
// release's invalidate). A value computed since stays, also when the
// event is delivered again. An error is a shard it could not go through
// (a tombstone, a listing or a record unreadable): the event is handed
// back and applied again. (It was acknowledged, and the rest of that
// shard's records left to their readers and expiry: a helper's hunt.)
func (r *Reconciler) applyInvalidation(ctx context.Context, x *expirer, e events.Event) error {
	b := x.b
	var unfinished error
	for shard, kv := range b.Shards() {
		tctx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		t, err := b.Tombstone(tctx, shard, e.Tenant, e.Model, e.Epoch)
		tomb := t.Rev
		cancel()
		if err != nil {
			r.s.logger.Warn("embcache: invalidation: tombstone unreadable", "tenant", e.Tenant, "model", e.Model,
				"bucket", kv.Bucket(), "err", err)
			if !errors.Is(err, lease.ErrBadRecord) { // one that does not decode will not on the next try
				unfinished = err
			}
			continue
		}
		if tomb == 0 {
			tomb = math.MaxUint64
		}
		if err := r.invalidateShard(ctx, x, kv, tomb, e); err != nil {
			unfinished = err
		}
	}
	return unfinished
}

// invalidateShard carries out an invalidation in one shard: one key at a
// time, as the lister delivers them, so nothing is held of the tenant's
// keys.
func (r *Reconciler) invalidateShard(ctx context.Context, x *expirer, kv jetstream.KeyValue, tomb uint64, e events.Event) error {
	b := x.b
	lister, err := kv.ListKeysFiltered(ctx, e.Tenant+".>")
	if err != nil {
		r.s.logger.Warn("embcache: invalidation: listing keys failed", "tenant", e.Tenant, "bucket", kv.Bucket(), "err", err)
		return err
	}
	defer lister.Stop()
	var unfinished error
	for key := range lister.Keys() {
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		cur, err := r.read(octx, b, key)
		if err != nil && !errors.Is(err, lease.ErrBadRecord) { // a bad record is no value of the model's: counted by read
			unfinished = err
		}
		stale := err == nil && cur.Live && cur.Record.State == lease.StateCommitted &&
			cur.Record.Model == e.Model && cur.Record.Epoch == e.Epoch && cur.Record.Reserved < tomb
		// One that may have expired is left to the server (docs/protocol.md
		// 3.1): readers refuse it meanwhile, and its expiry is announced.
		stale = stale && !cur.Record.MayHaveExpired(r.s.clock.Now(), r.s.allowance)
		if stale {
			switch err := b.PurgeFor(octx, key, cur.Rev, events.CauseInvalidated); {
			case errors.Is(err, lease.ErrLost): // changed since the read: no longer that record
				stale = false
			case err != nil:
				unfinished, stale = err, false
			}
		}
		if stale {
			r.did(actionInvalidate)
			var known *events.Entry
			if loc := cur.Record.Location; loc != nil {
				obj, _ := loc.ObjectID()
				known = &events.Entry{Tenant: e.Tenant, Key: obj.Key, Model: e.Model, Epoch: e.Epoch, Location: *loc, Expires: cur.Record.Expires}
			}
			cancel()
			x.expire(ctx, key, events.CauseInvalidated, known)
			continue
		}
		cancel()
	}
	return unfinished
}
