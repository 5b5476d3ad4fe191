package coordinator

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
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReconcilerKey is the KV key the reconcilers elect their active one on.
// It has no '.', so it can never be a tenant's key.
const ReconcilerKey = "_reconciler"

// ReconcilerDurable is the durable consumer the active reconciler reads
// events with; a successor resumes where its predecessor acknowledged.
const ReconcilerDurable = "embcache-reconciler"

// Reconciler keeps the store in step with the events: it extends a
// committed record's TTL when its value is touched, removes payloads whose
// record expired and announces it (evicted), and carries out
// invalidations. Run any number; one is active at a time, elected with a
// lease on ReconcilerKey, and a standby takes over when it dies.
type Reconciler struct {
	s     settings
	nc    *nats.Conn
	js    jetstream.JetStream
	id    string
	stats reconcilerStats
	tel   *reconcilerInstruments
}

type reconcilerStats struct {
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

// ReconcilerStats counts what a reconciler did.
type ReconcilerStats struct {
	Elected        uint64 // times it became active
	Touches        uint64 // record TTLs extended
	LateTouches    uint64 // touches acknowledged after the record's expiry: not trusted
	Expired        uint64 // expired records evicted
	Invalidated    uint64 // records removed by invalidations
	PayloadDeletes uint64 // payloads removed
	Sweeps         uint64
	Active         bool
}

// NewReconciler returns a reconciler over nc. It uses the Cache options
// that concern it: bucket, replicas, lease and store TTLs, node, the
// transports it may delete payloads with (WithTransport, WithGetter),
// logger, meter provider (docs/metrics.md).
func NewReconciler(nc *nats.Conn, opts ...Option) (*Reconciler, error) {
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
	tel, err := newReconcilerInstruments(s.meterProvider)
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
func (r *Reconciler) Stats() ReconcilerStats {
	n := func(a action) uint64 { return r.stats.actions[a].Load() }
	return ReconcilerStats{Elected: r.stats.elected.Load(), Touches: n(actionExtend), LateTouches: n(actionLateExtend),
		Expired: n(actionExpire), Invalidated: n(actionInvalidate),
		PayloadDeletes: n(actionDeletePayload), Sweeps: n(actionSweep), Active: r.stats.active.Load()}
}

// Run campaigns and, while elected, reconciles; it returns when ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
		ls, err := r.store(ctx)
		if err == nil {
			var lease *Lease
			lease, err = r.campaign(ctx, ls)
			if err == nil {
				r.stats.elected.Add(1)
				r.stats.active.Store(true)
				r.tel.elections.Add(ctx, 1)
				r.tel.active.Add(ctx, 1)
				r.s.logger.Info("embcache: reconciler active", "id", r.id)
				err = r.active(ctx, ls, lease)
				r.stats.active.Store(false)
				r.tel.active.Add(context.WithoutCancel(ctx), -1)
				lease.stopHeartbeats()
				if ctx.Err() == nil {
					r.s.logger.Warn("embcache: reconciler stepped down", "id", r.id, "err", err)
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, ErrHeld) && !errors.Is(err, ErrLeaseLost) {
			r.s.logger.Debug("embcache: reconciler waiting", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.s.leaseTTL / 3):
		}
	}
}

func (r *Reconciler) store(ctx context.Context) (*leaseStore, error) {
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	if _, err := events.EnsureStream(octx, r.js, r.s.replicas); err != nil {
		return nil, err
	}
	return ensureBucket(octx, r.nc, r.js, r.s.bucket, r.s.replicas, r.s.markerTTL)
}

// campaign tries once to take the election key.
func (r *Reconciler) campaign(ctx context.Context, ls *leaseStore) (*Lease, error) {
	now := time.Now()
	rec := Record{V: RecordVersion, State: StateComputing, Owner: r.id, Nonce: r.id, Started: now, Heartbeat: now}
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	sent := r.s.clock.Now()
	rev, err := ls.create(octx, ReconcilerKey, rec, r.s.leaseTTL)
	if err != nil {
		return nil, err
	}
	if !r.s.clock.Now().Before(sent.Add(r.s.leaseTTL)) {
		ls.purge(octx, ReconcilerKey, rev)
		return nil, errLateReserve
	}
	c := &Cache{s: r.s, leases: map[*Lease]struct{}{}} // a lease needs a Cache for its settings only
	return newLease(c, ls, Ref{}, ReconcilerKey, rev, rec, sent), nil
}

// active reconciles until the lease is lost or ctx ends.
func (r *Reconciler) active(ctx context.Context, ls *leaseStore, lease *Lease) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Done():
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
	sub, err := events.Subscribe(ctx, r.js, events.SubscribeOptions{Durable: ReconcilerDurable, Logger: r.s.logger, OnBad: r.tel.eventBad},
		func(e events.Event) {
			r.tel.eventDecoded(e.Kind)
			state.Apply(e)
			var fn func()
			switch e.Kind {
			case events.KindTouched:
				fn = func() { r.applyTouch(ctx, ls, e) }
			case events.KindInvalidated:
				fn = func() { r.applyInvalidation(ctx, ls, pub, state, e) }
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
	w, err := ls.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer w.Stop()

	// Values that expired while no reconciler was active; then now and
	// then, in case a marker was missed (a watcher can stall).
	r.sweep(ctx, ls, pub, state)
	sweep := time.NewTicker(max(10*r.s.leaseTTL, 10*time.Second))
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return lease.Err()
		case fn := <-work:
			fn()
		case e := <-w.Updates():
			switch {
			case e == nil || e.Key() == ReconcilerKey:
			case e.Operation() != jetstream.KeyValuePut:
				r.expire(ctx, ls, pub, state, e.Key(), purgeCause(e.Value()))
			default:
				if _, err := DecodeRecord(e.Value()); err != nil {
					r.tel.recordBad(err, opWatch)
				}
			}
		case <-sweep.C:
			r.sweep(ctx, ls, pub, state)
		}
	}
}

// applyTouch extends the committed record's TTL to the touch's expiry.
// Replaying a touch changes nothing: the record already lives that long.
func (r *Reconciler) applyTouch(ctx context.Context, ls *leaseStore, e events.Event) {
	key := e.Tenant + "." + e.Key.String()
	octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	defer cancel()
	cur, err := r.read(octx, ls, key)
	if err != nil || !cur.live || cur.record.State != StateCommitted || e.Location == nil ||
		cur.record.Checksum != e.Location.Checksum.String() || !e.Expires.After(cur.record.Expires) {
		return
	}
	if stale, err := ls.invalidated(octx, e.Tenant, cur.record); err != nil || stale {
		return // an invalidated value is not kept alive (docs/protocol.md 4.4)
	}
	// The record may expire at its own expiry (set when it was written,
	// before it was sent): a touch answered after that may be wiped by the
	// server's TTL marker, so it is not counted as applied, and one sent
	// after it is not sent at all. The record then expires as unused.
	deadline := cur.record.Expires
	now := r.s.clock.Now()
	ttl := e.Expires.Sub(now)
	if !now.Before(deadline) || ttl < time.Second {
		return
	}
	rec := cur.record
	rec.Expires = e.Expires
	if _, err := ls.cas(octx, key, cur.rev, rec, ttl); err != nil {
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
func (r *Reconciler) read(ctx context.Context, ls *leaseStore, key string) (current, error) {
	cur, err := ls.read(ctx, key)
	if errors.Is(err, ErrBadRecord) {
		r.tel.recordBad(err, opRead)
	}
	return cur, err
}

// expire removes what is left of a value whose record is gone and tells
// the workers, once per value: a key the events do not call live (a
// computing record's, or a value already announced) has nothing to evict,
// and workers drop local copies when they see the record go. A payload
// found corrupt is left to the reader that found it (its store removes a
// corrupt file; a recompute may already have put the value back).
func (r *Reconciler) expire(ctx context.Context, ls *leaseStore, pub *events.Publisher, state *events.State, kvKey string, cause events.Cause) {
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
}

// deletePayload removes a payload this reconciler can reach: its own
// node's, or a shared store's (Mooncake). Other nodes remove theirs when
// the evicted event reaches them.
func (r *Reconciler) deletePayload(ctx context.Context, loc payload.Location) {
	t := r.s.getters[loc.Transport]
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
func (r *Reconciler) sweep(ctx context.Context, ls *leaseStore, pub *events.Publisher, state *events.State) {
	r.did(actionSweep)
	for obj := range state.Live(time.Unix(0, 0)) {
		key := obj.Tenant + "." + obj.Key.String()
		octx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
		cur, err := r.read(octx, ls, key)
		cancel()
		if err == nil && !cur.live {
			r.expire(ctx, ls, pub, state, key, events.CauseExpired)
		}
	}
}

// applyInvalidation removes every committed record (and payload) of the
// event's tenant, model and epoch reserved before its tombstone (every one,
// for an event without a tombstone: an older release's invalidate). A
// value computed since stays, also when the event is delivered again.
func (r *Reconciler) applyInvalidation(ctx context.Context, ls *leaseStore, pub *events.Publisher, state *events.State, e events.Event) {
	tctx, cancel := context.WithTimeout(ctx, r.s.opTimeout)
	tomb, err := ls.tombstone(tctx, e.Tenant, e.Model, e.Epoch)
	cancel()
	if err != nil {
		r.s.logger.Warn("embcache: invalidation: tombstone unreadable", "tenant", e.Tenant, "model", e.Model, "err", err)
		return
	}
	if tomb == 0 {
		tomb = math.MaxUint64
	}
	lister, err := ls.kv.ListKeysFiltered(ctx, e.Tenant+".>")
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
		cur, err := r.read(octx, ls, key)
		if err == nil && cur.live && cur.record.State == StateCommitted &&
			cur.record.Model == e.Model && cur.record.Epoch == e.Epoch && cur.record.Reserved < tomb {
			if ls.purgeFor(octx, key, cur.rev, events.CauseInvalidated) == nil {
				r.did(actionInvalidate)
				if loc := cur.record.Location; loc != nil {
					obj, _ := loc.ObjectID()
					if _, known := state.Get(obj); !known {
						state.Apply(events.Event{Kind: events.KindPublished, Tenant: e.Tenant,
							Key: obj.Key, Model: e.Model, Epoch: e.Epoch, Location: loc, Expires: cur.record.Expires})
					}
				}
				cancel()
				r.expire(ctx, ls, pub, state, key, events.CauseInvalidated)
				continue
			}
		}
		cancel()
	}
}
