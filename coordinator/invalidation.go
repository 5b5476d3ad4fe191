package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// invalidatedRecord reports whether rec, ref's committed record, was
// reserved before the latest invalidation of its model and epoch: the
// tombstone in its shard has a later revision than the reservation. The
// tombstone is read from the stream leader, so an Invalidate that has
// returned is seen.
func (c *Cache) invalidatedRecord(ctx context.Context, b *lease.Bucket, ref Ref, rec lease.Record) (bool, error) {
	octx, cancel := c.opContext(ctx)
	defer cancel()
	stale, err := b.Invalidated(octx, ref.KVKey(), rec, c.invalidationHeardAt(ref))
	if errors.Is(err, ErrBadRecord) {
		c.badRecord(err) // maybe a newer version's tombstone: not shared, not purged
	}
	return stale, err
}

// startCompute registers a compute of ref, about to reserve it (exact)
// or to run without the store, with the event link
// (eventLink.startCompute); nil without events, where nothing else tells
// a compute of an invalidation.
func (c *Cache) startCompute(ref Ref, exact bool) func() bool {
	if l := c.eventLink(); l != nil {
		return l.startCompute(ref, exact)
	}
	return nil
}

// discard keeps the value of k being computed out of the local cache
// (its flight is marked; a copy already there goes too).
func (c *Cache) discard(k localKey) {
	c.local.Invalidate(func(lk localKey, _ *payload.Value) bool { return lk == k }, localcache.CauseInvalidated)
}

// errInvalidated is a pulled record refused (and purged) because its model
// and epoch were invalidated after its reservation.
var errInvalidated = errors.New("coordinator: the record was invalidated after its reservation")

// errInvalidatedKept is a pulled record refused because its model and
// epoch were invalidated after its reservation, and left to the server
// because it may have expired there (docs/protocol.md 3.1): its key is not
// shared until it is gone.
var errInvalidatedKept = errors.New("coordinator: the record was invalidated after its reservation, and may have expired: left to the server")

// tombstoneError is a tombstone that could not be read: whether the record
// is stale is unknown, so the value is not shared.
type tombstoneError struct{ err error }

func (e *tombstoneError) Error() string {
	return "coordinator: invalidation tombstone unreadable: " + e.err.Error()
}
func (e *tombstoneError) Unwrap() error { return e.err }

// dropInvalidated removes a committed record that an invalidation made
// stale (if nobody changed it meanwhile), so the key is computed again,
// and forgets what its pull noted for the local cache. A record that may
// have expired on the server is left to it (docs/protocol.md 3.1; readers
// refuse it meanwhile): false.
func (c *Cache) dropInvalidated(ctx context.Context, b *lease.Bucket, ref Ref, v *payload.Value, cur lease.Entry) bool {
	c.obs.invalidatedRecord(ref, v)
	if cur.Record.MayHaveExpired(c.s.clock.Now(), c.s.clockAllowance) {
		return false
	}
	octx, cancel := c.opContext(ctx)
	defer cancel()
	if err := b.PurgeFor(octx, ref.KVKey(), cur.Rev, events.CauseInvalidated); err != nil && !errors.Is(err, ErrLeaseLost) {
		c.s.logger.Warn("embcache: invalidated record not purged", "key", ref.KVKey(), "err", err)
	}
	return true
}

// Invalidate declares every value of tenant computed by model at weight
// epoch stale. It writes the invalidation's tombstone first: from then on
// no process serves a committed record of that model and epoch reserved
// before it, with or without a reconciler (docs/protocol.md 4.4). Then it
// publishes the invalidated event: every process drops its local copies
// when it arrives, and the reconciler removes the records and payloads.
// The bucket and the event stream must exist (ErrStoreUnavailable). An
// error that says the event was not published means that the tombstone
// is written: invalidate again.
func Invalidate(ctx context.Context, nc *nats.Conn, inv Invalidation) error {
	s := defaults()
	if inv.Bucket != "" {
		s.bucket = inv.Bucket
	}
	if inv.Node != "" {
		s.node = inv.Node
	}
	if inv.StoreTTL > 0 {
		s.storeTTL = inv.StoreTTL
	}
	if inv.Logger != nil {
		s.logger = inv.Logger
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	b, err := lease.BindBucket(ctx, nc, lease.BucketConfig{Name: s.bucket, MarkerTTL: s.markerTTL})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if _, err := js.Stream(ctx, events.StreamName); err != nil {
		return fmt.Errorf("%w: event stream: %w", ErrStoreUnavailable, err)
	}
	pub := events.NewPublisher(js, events.PublisherOptions{Workers: 1, Queue: 1, Logger: s.logger})
	defer pub.Close(context.WithoutCancel(ctx))
	_, err = invalidate(ctx, b, pub, s.node+"/invalidate", s.node, inv.Tenant, inv.Model, inv.Epoch, s.storeTTL)
	return err
}

// Invalidation is what Invalidate declares stale, and where it writes.
// Tenant and Model are required; zero values elsewhere are defaults.
type Invalidation struct {
	Tenant, Model string
	Epoch         uint64
	Bucket        string        // default lease.DefaultBucket
	Node          string        // who invalidates, in the tombstone's owner and the event (default: the host name)
	StoreTTL      time.Duration // the cluster's store TTL (default 1h): the tombstone lives max(25 h, 2 x it)
	Logger        *slog.Logger
}

// invalidate writes the tombstone, then publishes the event, and returns
// the event.
func invalidate(ctx context.Context, b *lease.Bucket, pub *events.Publisher, owner, node, tenant, model string,
	epoch uint64, storeTTL time.Duration) (*events.Event, error) {
	e, err := writeTombstone(ctx, b, owner, node, tenant, model, epoch, storeTTL)
	if err != nil {
		return nil, err
	}
	if err := publishInvalidation(ctx, pub, e); err != nil {
		return nil, err
	}
	return e, nil
}

// writeTombstone writes an invalidation's tombstone and returns the
// invalidated event to publish next.
func writeTombstone(ctx context.Context, b *lease.Bucket, owner, node, tenant, model string,
	epoch uint64, storeTTL time.Duration) (*events.Event, error) {
	if err := cachekey.ValidateTenant(tenant); err != nil {
		return nil, fmt.Errorf("coordinator: invalidate: %w", err)
	}
	if model == "" {
		return nil, errors.New("coordinator: invalidate: no model")
	}
	now := time.Now()
	tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: owner, Started: now, Heartbeat: now,
		Model: model, Epoch: epoch}
	if err := b.PutTombstone(ctx, tenant, model, epoch, tomb, lease.TombstoneTTL(storeTTL)); err != nil {
		return nil, err
	}
	return &events.Event{Kind: events.KindInvalidated, Tenant: tenant,
		Key: events.InvalidationKey(model, epoch), Model: model, Epoch: epoch, Node: node, Time: now}, nil
}

// publishInvalidation publishes e, the event of a tombstone written. Its
// error says so: the caller invalidates again.
func publishInvalidation(ctx context.Context, pub *events.Publisher, e *events.Event) error {
	if err := pub.PublishSync(ctx, e); err != nil {
		return fmt.Errorf("coordinator: invalidate: the tombstone is written but the invalidated event was not published (invalidate again): %w", err)
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
