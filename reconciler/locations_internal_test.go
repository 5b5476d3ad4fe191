package reconciler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// locationsWorld is a reconciler's expirer over a bucket and an event
// stream of max bytes, with a memory store its deleter.
func locationsWorld(t *testing.T, maxBytes int64, opts ...Option) (*expirer, *payload.MemoryStore) {
	t.Helper()
	ctx := context.Background()
	store := payload.NewMemoryStore("n1", 0)
	b, newReconciler := trackerWorld(t, 1, append([]Option{WithDeleter(payload.TransportMemory, store)}, opts...)...)
	r := newReconciler()
	evs, err := events.EnsureStream(ctx, r.js, events.StreamConfig{MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	pub := events.NewPublisher(r.js, events.PublisherOptions{Workers: 1, Queue: 16, Logger: r.s.logger})
	t.Cleanup(func() { pub.Close(context.Background()) })
	return &expirer{r: r, b: b, pub: pub, events: evs}, store
}

// committedAt writes key k's payload (bytes b) and a committed record of
// it, and returns the record.
func committedAt(t *testing.T, x *expirer, store *payload.MemoryStore, k cachekey.Key, b byte) lease.Record {
	t.Helper()
	ctx := context.Background()
	loc, err := store.Put(ctx, payload.ObjectID{Tenant: "acme", Key: k}, payload.NewTensor(cachekey.Float32, []int64{1}, []byte{1, 2, 3, b}))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateCommitted, Owner: "w/1/x", Nonce: "x", Started: now, Heartbeat: now,
		Model: "m", Epoch: 1, Reserved: 1, Expires: now.Add(time.Hour), Location: &loc, Size: loc.Size, Checksum: loc.Checksum.String()}
	if _, err := x.b.Put(ctx, lease.ValueKey("acme", k), rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	return rec
}

func publishedOf(rec lease.Record, k cachekey.Key) *events.Event {
	return &events.Event{Kind: events.KindPublished, Tenant: "acme", Key: k, Model: rec.Model, Epoch: rec.Epoch, Node: "w",
		Time: time.Now(), Expires: rec.Expires, Location: rec.Location}
}

// A record the restore's scan read, gone before it is handled, whose
// value the stream never named (its published event lost; its marker
// found no location): its location is published from the scan's copy and
// the value expired at once, payload deleted and eviction announced.
func TestARecordGoneSinceTheScanIsExpiredFromItsCopy(t *testing.T) {
	ctx := context.Background()
	x, store := locationsWorld(t, 0)
	k := cachekey.Key{1}
	rec := committedAt(t, x, store, k, 1)
	cur, err := x.b.Read(ctx, lease.ValueKey("acme", k))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.b.Purge(ctx, lease.ValueKey("acme", k), cur.Rev); err != nil { // gone, as by its expiry
		t.Fatal(err)
	}
	restored, settled := x.restoreOne(ctx, lease.ValueKey("acme", k), rec)
	if !restored || !settled {
		t.Fatalf("restored %v, settled %v", restored, settled)
	}
	if _, err := store.Get(ctx, *rec.Location); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("the gone value's payload stayed: %v", err)
	}
	if _, live, found, err := events.Latest(ctx, x.events, "acme", k); err != nil || !found || live {
		t.Fatalf("the stream says of the gone value: found %v, live %v (%v); want its eviction", found, live, err)
	}
}

// A record the scan read that has since been replaced by another value of
// the key (committed with other bytes) restores nothing: an event of the
// old value would become the key's newest, and the new value's expiry
// would then look for the old bytes and leave its own.
func TestARestoreLeavesANewerValueOfTheKeyAlone(t *testing.T) {
	ctx := context.Background()
	x, store := locationsWorld(t, 0)
	k := cachekey.Key{2}
	old := committedAt(t, x, store, k, 1)
	newer := committedAt(t, x, store, k, 2)
	if err := x.pub.PublishSync(ctx, publishedOf(newer, k)); err != nil {
		t.Fatal(err)
	}
	restored, settled := x.restoreOne(ctx, lease.ValueKey("acme", k), old)
	if restored || !settled {
		t.Fatalf("restored %v, settled %v; want nothing to do", restored, settled)
	}
	entry, live, found, err := events.Latest(ctx, x.events, "acme", k)
	if err != nil || !found || !live || entry.Location.Checksum != newer.Location.Checksum {
		t.Fatalf("the stream's newest of the key: found %v, live %v, checksum %v (%v); want the newer value's", found, live, entry.Location.Checksum, err)
	}
	if _, err := store.Get(ctx, *newer.Location); err != nil {
		t.Fatalf("the newer value's payload went: %v", err)
	}
}

// A stream discarding only events older than any live value's last (a
// store TTL, a quarter of it and a marker TTL: 7.25 s here) is not
// counted; one discarding younger ones is.
func TestOnlyDiscardsALiveValueMayNeedAreCounted(t *testing.T) {
	ctx := context.Background()
	// A store TTL of 5 s: a flood under load takes seconds, and the
	// stream's oldest events must still be younger than it when checked.
	x, _ := locationsWorld(t, events.MinMaxBytes, WithStoreTTL(5*time.Second), WithMarkerTTL(time.Second))
	r := x.r
	flood(t, r.js, 0, 3000)
	if !r.checkStream(ctx, x.events) || r.Stats().DiscardingLive != 1 {
		t.Fatalf("a stream discarding events younger than a store TTL: not counted (%d)", r.Stats().DiscardingLive)
	}
	poll, deadline := time.NewTicker(50*time.Millisecond), time.After(40*time.Second)
	defer poll.Stop()
	for {
		info, err := x.events.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Every event older than any live value's last (7.25 s), the
		// newest too: those the next flood leaves are (a flood under load
		// takes seconds; its first events' age said nothing of the rest).
		if info.TimeStamp.Sub(info.State.LastTime) > 8*time.Second {
			break
		}
		select {
		case <-poll.C:
		case <-deadline:
			t.Fatal("the stream's events never got 8 s old")
		}
	}
	flood(t, r.js, 3000, 100) // still at its limit, its oldest event older than the store TTL
	if r.checkStream(ctx, x.events) || r.Stats().DiscardingLive != 1 {
		t.Fatalf("a stream discarding only events older than a store TTL counted: %d", r.Stats().DiscardingLive)
	}
}

// flood publishes n abandoned events of keys from..from+n.
func flood(t *testing.T, js jetstream.JetStream, from, n int) {
	t.Helper()
	reason := strings.Repeat("out of memory ", 16)
	for i := from; i < from+n; i++ {
		ev := &events.Event{Kind: events.KindAbandoned, Tenant: "other", Key: cachekey.Key{byte(i), byte(i >> 8)}, Node: "w", Time: time.Now(), Reason: reason}
		data, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(ev.Subject(), data); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
}
