package reconciler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
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
	elected atomic.Uint64
	actions [numActions]atomic.Uint64
	active  atomic.Bool
}

// action is something the active reconciler does: its Stats and the
// embcache.reconciler.actions metric count each.
type action uint8

// Actions.
const (
	actionExtend        action = iota // a touch extended a committed record's TTL
	actionLateExtend                  // an extension acknowledged after the record's expiry: not trusted
	actionExpire                      // a value whose record expired was evicted (evicted event sent)
	actionInvalidate                  // a committed record removed by an invalidation
	actionDeletePayload               // a payload removed
	actionSweep                       // a pass over the live values for records gone unnoticed
	numActions
)

var actionNames = [numActions]string{"extend", "late_extend", "expire", "invalidate", "delete_payload", "sweep"}

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
	Sweeps         uint64
	Active         bool
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
		PayloadDeletes: n(actionDeletePayload), Sweeps: n(actionSweep), Active: r.stats.active.Load()}
}

// Run campaigns and, while elected, reconciles; it returns when ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
		b, err := r.bucket(ctx)
		if err == nil {
			var el *lease.Lease
			el, err = r.campaign(ctx, b)
			if err == nil {
				r.stats.elected.Add(1)
				r.stats.active.Store(true)
				r.tel.elections.Add(ctx, 1)
				r.tel.active.Add(ctx, 1)
				r.s.logger.Info("embcache: reconciler active", "id", r.id)
				err = r.active(ctx, b, el)
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
	if _, err := events.EnsureStream(octx, r.js, r.s.replicas); err != nil {
		return nil, err
	}
	return lease.OpenBucket(octx, r.nc, lease.BucketConfig{Name: r.s.bucket, Replicas: r.s.replicas, MarkerTTL: r.s.markerTTL})
}

// campaign tries once to take the election key: the election is a lease
// like any key's, held while this reconciler is active.
func (r *Reconciler) campaign(ctx context.Context, b *lease.Bucket) (*lease.Lease, error) {
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: r.id, Nonce: r.id, Started: now, Heartbeat: now}
	return lease.Acquire(ctx, b, ElectionKey, rec, lease.Config{TTL: r.s.leaseTTL, OpTimeout: r.s.opTimeout, Clock: r.s.clock})
}

// active reconciles until the lease is lost or ctx ends.
func (r *Reconciler) active(ctx context.Context, b *lease.Bucket, el *lease.Lease) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-el.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	state, skipped, err := events.Replay(ctx, r.js)
	if err != nil {
		return err
	}
	if skipped > 0 {
		// The durable consumer below counts them as it reaches them.
		r.s.logger.Warn("embcache: replay skipped events that do not decode", "skipped", skipped)
	}
	pub := events.NewPublisher(r.js, 1, 1024, r.s.logger)
	defer pub.Close(context.Background())
	work := make(chan func(), 256)
	sub, err := events.Subscribe(ctx, r.js, events.SubscribeOptions{Durable: Durable, Logger: r.s.logger, OnBad: r.tel.EventBad},
		func(e events.Event) {
			r.tel.EventDecoded(e.Kind)
			state.Apply(e)
			var fn func()
			switch e.Kind {
			case events.KindTouched:
				fn = func() { r.applyTouch(ctx, b, e) }
			case events.KindInvalidated:
				fn = func() { r.applyInvalidation(ctx, b, pub, state, e) }
			default:
				return
			}
			select {
			case work <- fn:
			case <-ctx.Done():
			}
		})
	if err != nil {
		return err
	}
	defer sub.Stop()
	w, err := b.KV().WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer w.Stop()

	// Values that expired while no reconciler was active; then now and
	// then, in case a marker was missed (a watcher can stall).
	r.sweep(ctx, b, pub, state)
	sweep := time.NewTicker(max(10*r.s.leaseTTL, 10*time.Second))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return el.Err()
		case fn := <-work:
			fn()
		case e := <-w.Updates():
			switch {
			case e == nil || e.Key() == ElectionKey:
			case e.Operation() != jetstream.KeyValuePut:
				r.expire(ctx, b, pub, state, e.Key(), lease.PurgeCause(e.Value()))
			default:
				if _, err := lease.DecodeRecord(e.Value()); err != nil {
					r.tel.RecordBad(err, telemetry.OpWatch)
				}
			}
		case <-sweep.C:
			r.sweep(ctx, b, pub, state)
		}
	}
}

// applyTouch extends the committed record's TTL to the touch's expiry.
// Replaying a touch changes nothing: the record already lives that long.
func (r *Reconciler) applyTouch(ctx context.Context, b *lease.Bucket, e events.Event) {
	key := e.Tenant + "." + e.Key.String()
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cur, err := r.read(octx, b, key)
	if err != nil || !cur.Live || cur.Record.State != lease.StateCommitted || e.Location == nil ||
		cur.Record.Checksum != e.Location.Checksum.String() || !e.Expires.After(cur.Record.Expires) {
		return
	}
	if stale, err := b.Invalidated(octx, e.Tenant, cur.Record); err != nil || stale {
		return // an invalidated value is not kept alive (docs/protocol.md 4.4)
	}
	// The record may expire at its own expiry (set when it was written,
	// before it was sent): a touch answered after that may be wiped by the
	// server's TTL marker, so it is not counted as applied, and one sent
	// after it is not sent at all. The record then expires as unused.
	deadline := cur.Record.Expires
	now := r.s.clock.Now()
	ttl := e.Expires.Sub(now)
	if !now.Before(deadline) || ttl < time.Second {
		return
	}
	rec := cur.Record
	rec.Expires = e.Expires
	if _, err := b.CompareAndSet(octx, key, cur.Rev, rec, ttl); err != nil {
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

// expire removes what is left of a value whose record is gone and
// announces it, once per value: an evicted event, and a notice to the
// node that wrote the payload. A key the events do not call live (a
// computing record's, or a value already announced) has nothing to evict. A payload
// found corrupt is left to the reader that found it (its store removes a
// corrupt file; a recompute may already have put the value back).
func (r *Reconciler) expire(ctx context.Context, b *lease.Bucket, pub *events.Publisher, state *events.State, kvKey string, cause events.Cause) {
	tenant, hexKey, ok := strings.Cut(kvKey, ".")
	key, err := cachekey.Parse(hexKey)
	if !ok || err != nil {
		return
	}
	obj := payload.ObjectID{Tenant: tenant, Key: key}
	entry, known := state.Get(obj)
	if !known {
		return
	}
	loc := entry.Location
	ev := &events.Event{Kind: events.KindEvicted, Tenant: tenant, Key: key, Model: entry.Model, Epoch: entry.Epoch,
		Node: r.s.node, Time: time.Now(), Cause: cause, Location: &loc}
	if cause != events.CauseCorrupt {
		r.deletePayload(ctx, loc)
	}
	if cause == events.CauseExpired {
		r.did(actionExpire)
	}
	state.Apply(*ev)
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if err := pub.PublishSync(octx, ev); err != nil {
		r.s.logger.Warn("embcache: evicted event not published", "key", kvKey, "err", err)
	}
	// The writer's node deletes its payload and its processes drop their
	// copies; nobody else hears of it (copies elsewhere end with their
	// record, files there go with their node's sweep).
	if cause != events.CauseCorrupt && loc.Node != "" {
		if err := events.Notify(r.nc, ev); err != nil {
			r.s.logger.Warn("embcache: eviction notice not sent", "key", kvKey, "node", loc.Node, "err", err)
		}
	}
}

// deletePayload removes a payload this reconciler can reach: its own
// node's, or a shared store's (Mooncake). Other nodes remove theirs when
// the evicted event reaches them.
func (r *Reconciler) deletePayload(ctx context.Context, loc payload.Location) {
	t := r.s.deleters[loc.Transport]
	if t == nil || (loc.Node != r.s.node && loc.Transport != payload.TransportMooncake) {
		return
	}
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if err := t.Delete(octx, loc); err == nil {
		r.did(actionDeletePayload)
	}
}

// sweep evicts every value the events call live whose record is gone:
// markers can be missed while no reconciler runs.
func (r *Reconciler) sweep(ctx context.Context, b *lease.Bucket, pub *events.Publisher, state *events.State) {
	r.did(actionSweep)
	for obj := range state.Live(time.Unix(0, 0)) {
		key := obj.Tenant + "." + obj.Key.String()
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		cur, err := r.read(octx, b, key)
		cancel()
		if err == nil && !cur.Live {
			r.expire(ctx, b, pub, state, key, events.CauseExpired)
		}
	}
}

// applyInvalidation removes every committed record (and payload) of the
// event's tenant, model and epoch reserved before its tombstone (every one,
// for an event without a tombstone: an older release's invalidate). A
// value computed since stays, also when the event is delivered again.
func (r *Reconciler) applyInvalidation(ctx context.Context, b *lease.Bucket, pub *events.Publisher, state *events.State, e events.Event) {
	tctx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	tomb, err := b.Tombstone(tctx, e.Tenant, e.Model, e.Epoch)
	cancel()
	if err != nil {
		r.s.logger.Warn("embcache: invalidation: tombstone unreadable", "tenant", e.Tenant, "model", e.Model, "err", err)
		return
	}
	if tomb == 0 {
		tomb = math.MaxUint64
	}
	lister, err := b.KV().ListKeysFiltered(ctx, e.Tenant+".>")
	if err != nil {
		r.s.logger.Warn("embcache: invalidation: listing keys failed", "tenant", e.Tenant, "err", err)
		return
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	for _, key := range keys {
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		cur, err := r.read(octx, b, key)
		if err == nil && cur.Live && cur.Record.State == lease.StateCommitted &&
			cur.Record.Model == e.Model && cur.Record.Epoch == e.Epoch && cur.Record.Reserved < tomb {
			if b.PurgeFor(octx, key, cur.Rev, events.CauseInvalidated) == nil {
				r.did(actionInvalidate)
				if loc := cur.Record.Location; loc != nil {
					obj, _ := loc.ObjectID()
					if _, known := state.Get(obj); !known {
						state.Apply(events.Event{Kind: events.KindPublished, Tenant: e.Tenant,
							Key: obj.Key, Model: e.Model, Epoch: e.Epoch, Location: loc, Expires: cur.Record.Expires})
					}
				}
				cancel()
				r.expire(ctx, b, pub, state, key, events.CauseInvalidated)
				continue
			}
		}
		cancel()
	}
}
