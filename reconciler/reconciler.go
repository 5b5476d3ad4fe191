package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
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
