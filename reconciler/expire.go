package reconciler

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

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
