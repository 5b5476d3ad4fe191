package reconciler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const tenant = "acme"
const node = "n1"

type world struct {
	t     *testing.T
	url   string
	nc    *nats.Conn
	js    jetstream.JetStream
	b     *lease.Bucket
	store *payload.MemoryStore
}

func newWorld(t *testing.T) *world {
	srv := natstest.Server(t)
	nc := natstest.Connect(t, srv.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	b, err := lease.OpenBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket, MarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, url: srv.ClientURL(), nc: nc, js: js, b: b, store: payload.NewMemoryStore(node, 0)}
}

func keyOf(i int) cachekey.Key {
	var k cachekey.Key
	k[0], k[1], k[2] = byte(i), byte(i>>8), byte(i>>16)
	k[31] = 0x5a
	return k
}

// commit writes key i's payload, a committed record that expires in ttl, and
// its published event; it returns the location.
func (e *world) commit(i int, ttl time.Duration) payload.Location {
	e.t.Helper()
	loc, exp := e.commitRecord(i, ttl)
	e.publish(&events.Event{Kind: events.KindPublished, Tenant: tenant, Key: keyOf(i), Model: "m", Epoch: 1,
		Node: "w", Time: time.Now(), Expires: exp, Location: &loc})
	return loc
}

// commitRecord writes key i's payload and a committed record that expires
// in ttl, and no event (its published event lost); it returns the
// location and the expiry.
func (e *world) commitRecord(i int, ttl time.Duration) (payload.Location, time.Time) {
	e.t.Helper()
	ctx := context.Background()
	obj := payload.ObjectID{Tenant: tenant, Key: keyOf(i)}
	loc, err := e.store.Put(ctx, obj, payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, byte(i)}))
	if err != nil {
		e.t.Fatal(err)
	}
	now := time.Now()
	exp := now.Add(ttl)
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "w/1/x", Nonce: "x", Started: now, Heartbeat: now,
		Model: "m", Epoch: 1, Reserved: 1, Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String(), Expires: exp}
	if _, err := e.b.Put(ctx, lease.ValueKey(tenant, keyOf(i)), rec, ttl); err != nil {
		e.t.Fatal(err)
	}
	return loc, exp
}

func (e *world) publish(ev *events.Event) uint64 {
	e.t.Helper()
	data, err := events.Encode(ev)
	if err != nil {
		e.t.Fatal(err)
	}
	ack, err := e.js.Publish(context.Background(), ev.Subject(), data)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

func (e *world) record(i int) lease.Entry {
	e.t.Helper()
	cur, err := e.b.Read(context.Background(), lease.ValueKey(tenant, keyOf(i)))
	if err != nil {
		e.t.Fatal(err)
	}
	return cur
}

// handedOn reports whether message seq of kvKey's shard stream (a marker,
// say) has been sent to a consumer of that stream: the active
// reconciler's bucket watcher, the only one in these tests. Its loop is
// then handed the message even if the stream replaces it. (One the
// stream replaces before sending it, as a create over a marker does
// within the bucket's history of one, the loop never sees.)
func (e *world) handedOn(kvKey string, seq uint64) bool {
	e.t.Helper()
	ctx := context.Background()
	shards := e.b.Shards()
	s, err := e.js.Stream(ctx, "KV_"+shards[lease.ShardOf(kvKey, len(shards))].Bucket())
	if err != nil {
		e.t.Fatal(err)
	}
	consumers := s.ListConsumers(ctx)
	sent := false
	for info := range consumers.Info() {
		sent = sent || info.Delivered.Stream >= seq
	}
	if err := consumers.Err(); err != nil {
		e.t.Fatal(err)
	}
	return sent
}

// evicted reports whether the stream holds an evicted event of key i.
func (e *world) evicted(i int) bool {
	s, err := e.js.Stream(context.Background(), events.StreamName)
	if err != nil {
		e.t.Fatal(err)
	}
	ev := events.Event{Kind: events.KindEvicted, Tenant: tenant, Key: keyOf(i)}
	_, err = s.GetLastMsgForSubject(context.Background(), ev.Subject())
	return err == nil
}

func (e *world) reconciler(d reconciler.Deleter, opts ...reconciler.Option) (*reconciler.Reconciler, func()) {
	e.t.Helper()
	nc := natstest.Connect(e.t, e.url)
	base := []reconciler.Option{reconciler.WithLeaseTTL(time.Second), reconciler.WithNode(node),
		reconciler.WithDeleter(payload.TransportMemory, d)}
	r, err := reconciler.New(nc, append(base, opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r, run(e.t, r)
}

// blockingDeleter blocks the delete of one object (of every one, with
// all) until its context ends, or until release is closed (if set), and
// then deletes: it holds the reconciler's loop, or its sweep's readers,
// as a slow store's delete would, for as long as the test needs.
type blockingDeleter struct {
	store   *payload.MemoryStore
	object  string
	all     bool
	release chan struct{} // nil: blocked until the context ends
	entered atomic.Bool
}

func (d *blockingDeleter) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	return d.store.Generation(ctx, loc)
}

func (d *blockingDeleter) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	if d.all || loc.Object == d.object {
		d.entered.Store(true)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.release:
		}
	}
	return d.store.Delete(ctx, loc, seen)
}

// renewedAfter reports whether the active reconciler's lease was last
// renewed more than two lease TTLs (of 1 s) and the second of clock skew
// after t: from then on, its renewals alone no longer say that a marker
// placed before t may not have been handled.
func (e *world) renewedAfter(t time.Time) bool {
	cur, err := e.b.Read(context.Background(), reconciler.ElectionKey)
	return err == nil && cur.Stamp.After(t.Add(3*time.Second))
}

// failingDeleter fails the first fails deletes of one object (as
// Mooncake's does while a reader holds it), then deletes it; it counts
// the tries.
type failingDeleter struct {
	store  *payload.MemoryStore
	object string
	fails  int64
	tries  atomic.Int64
}

func (d *failingDeleter) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	return d.store.Generation(ctx, loc)
}

func (d *failingDeleter) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	if loc.Object == d.object && d.tries.Add(1) <= d.fails {
		return errors.New("object busy")
	}
	return d.store.Delete(ctx, loc, seen)
}
